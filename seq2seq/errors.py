"""The one exception type for a user's mistake.

A `UserError` carries a single line that names the problem and the fix. The
command-line scripts print it (no traceback unless --verbose) and exit with
status 2; anything else that escapes is a bug in seq2seq.
"""


class UserError(Exception):
  """A mistake in the user's config, data or workdir, explained in one line."""
