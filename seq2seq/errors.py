"""The one exception type for a user's mistake.

A `UserError` carries a single line that names the problem and the fix. Every
command prints it (`cli.run_main`, `cli.parse_flags`: no traceback unless --verbose)
and exits with status 2; anything else that escapes is a bug in seq2seq.
"""

import errno
import importlib
import os
import sys
from collections.abc import Callable, Iterator


class UserError(Exception):
  """A mistake in the user's config, data or workdir, explained in one line."""


def describe(error: Exception) -> str:
  """A library's exception as `Type: first line` (orbax's, tensorstore's and TFDS's run to
  pages): the cause inside one line of ours."""
  first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
  return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


def chained(error: BaseException | None) -> Iterator[BaseException]:
  """`error` and every error it wraps (`__cause__`, `__context__`, an exception group's
  members), each once: libraries bury an OSError inside their own exceptions."""
  seen, todo = set(), [error]
  while todo:
    e = todo.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    yield e
    todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]


# errno values of a full disk, and of a path the user may not write.
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)


def file_fault(error: BaseException) -> UserError | None:
  """The one line for a full disk or a read-only (or forbidden) path found in `error` or the
  errors it wraps, naming the path and the fix; None if it is something else: a file that
  cannot be written where the user pointed is the user's to fix, not a bug."""
  for e in chained(error):
    if isinstance(e, OSError) and e.errno in FULL_DISK + _DENIED:
      where = f" ({e.filename})" if e.filename else ""
      fix = ("free some space and run the command again" if e.errno in FULL_DISK
             else "make it writable, or pass a path you may write")
      return UserError(f"{e.strerror or os.strerror(e.errno)}{where}; {fix}.")
  return None


def require_extra(extra: str, command: str, modules: tuple[str, ...]) -> None:
  """Imports `modules`, the optional extra `extra`'s that `command` needs: one that is not
  installed is the user's to install, in one line, before the command does any work."""
  for module in modules:
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as error:
      raise UserError(f"{command} needs the [{extra}] extra ({error.name or module} is not"
                      f" installed); install it with pip install -e \".[{extra}]\".") from None


def handle_unraisable(handled: Callable[[object], bool], marker: str) -> None:
  """Chains `handled(unraisable)` before `sys.unraisablehook` (once per `marker`): what it
  returns True for is not reported (an exception a callback or finalizer could not raise)."""
  if getattr(sys.unraisablehook, marker, False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    if not handled(unraisable):
      previous(unraisable)

  setattr(hook, marker, True)
  sys.unraisablehook = hook

