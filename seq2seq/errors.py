"""The one exception type for a user's mistake.

A `UserError` carries a single line that names the problem and the fix. Every
command prints it (`cli.run_main`, `cli.parse_flags`: no traceback unless --verbose)
and exits with status 2; anything else that escapes is a bug in seq2seq.
"""

import errno
import os


class UserError(Exception):
  """A mistake in the user's config, data or workdir, explained in one line."""


def describe(error: Exception) -> str:
  """A library's exception as `Type: first line` (orbax's, tensorstore's and TFDS's run to
  pages): the cause inside one line of ours."""
  first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
  return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


# A file that cannot be written where the user pointed: the user's to fix, not a bug.
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)


def file_fault(error: BaseException) -> UserError | None:
  """The one line for a full disk or a read-only (or forbidden) path found in `error` or the
  errors it wraps, naming the path and the fix; None if it is something else."""
  seen, todo = set(), [error]
  while todo:
    e = todo.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _FULL + _DENIED:
      where = f" ({e.filename})" if e.filename else ""
      fix = ("free some space and run the command again" if e.errno in _FULL
             else "make it writable, or pass a path you may write")
      return UserError(f"{e.strerror or os.strerror(e.errno)}{where}; {fix}.")
    todo += [e.__cause__, e.__context__]
  return None

