"""The one exception type for a user's mistake.

A `UserError` carries a single line that names the problem and the fix. Every
command prints it (`cli.run_main`, `cli.parse_flags`: no traceback unless --verbose)
and exits with status 2; anything else that escapes is a bug in seq2seq.
"""


class UserError(Exception):
  """A mistake in the user's config, data or workdir, explained in one line."""


def describe(error: Exception) -> str:
  """A library's exception as `Type: first line` (orbax's, tensorstore's and TFDS's run to
  pages): the cause inside one line of ours."""
  first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
  return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__











