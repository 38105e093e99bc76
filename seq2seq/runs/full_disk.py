"""A write that fails while a run writes (a full disk, or a path it may not write), told in
one line.

Neither is a bug of ours nor a damaged run: the command stops with one `UserError` that says
what was being written, which checkpoint is the last good one, and that the same command
resumes once there is space, or once the path is writable again (a workdir made read-only
mid-run). The libraries bury the cause: orbax wraps the OSError in its own exceptions, and
tensorstore reports the errno only inside its message text (`os_error_code='28'`), so the
error is found by walking the whole exception chain.

`write_fault_is_user_error` is the one guard: the training loop wraps its writes in it, and
`Checkpoints` its saves, with a clean-up that removes the half-written step and drops a
failure that orbax repeats when the save is waited for or closed (reported already).
"""

import contextlib
import errno
import os
import re
from collections.abc import Callable
from pathlib import Path

from seq2seq.errors import FULL_DISK, UserError, chained

# errno values of a path the run may not write: a read-only filesystem, its mode or owner.
DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)
# tensorstore reports a failed write's errno only inside its message text.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def write_fault(error: BaseException | None) -> OSError | None:
  """The full-disk (ENOSPC, EDQUOT) or denied (EROFS, EACCES, EPERM) error in `error` or its
  chain (`__cause__`, `__context__`, an exception group's members), as an OSError; None if
  there is none.

  orbax wraps an OSError, and tensorstore's writes raise a ValueError that carries the code
  only in its text ("... No space left on device [os_error_code='28']").
  """
  for e in chained(error):
    if isinstance(e, OSError) and e.errno in FULL_DISK + DENIED:
      return e
    if not isinstance(e, UserError) and (code := fault_code(str(e))):
      return OSError(code, os.strerror(code))
  return None


def fault_code(text: str) -> int | None:
  """The full-disk or denied errno that a library's message reports, if it reports one."""
  match = _OS_ERROR_CODE.search(text)
  code = int(match[1]) if match else errno.ENOSPC if os.strerror(errno.ENOSPC) in text else None
  return code if code in FULL_DISK + DENIED else None


def write_fault_error(error: BaseException, doing: str,
                      last_step: int | None) -> UserError | None:
  """The one line for a full disk or a denied write found in `error` (None if it is something
  else): what was being written (`doing`), the last good checkpoint, and that the same command
  resumes once there is space, or once the path it names is writable again."""
  found = write_fault(error)
  if found is None:
    return None
  last = (f"the last good checkpoint is step {last_step}" if last_step is not None
          else "no checkpoint was saved yet")
  again = "resume" if last_step is not None else "start again"
  reason = found.strerror or os.strerror(found.errno)
  if found.errno in FULL_DISK:
    return UserError(f"{reason} while {doing}; {last}. Free some space and run the same"
                     f" command to {again}.")
  return UserError(f"{reason} while {doing}; {last}. Make {_refused(found)} writable again"
                   f" and run the same command to {again}.")


def _refused(error: OSError) -> str:
  """What a denied write could not write: the file it names, or the folder where it could not
  be made (orbax's `<step>.orbax-checkpoint-tmp`: the checkpoints folder)."""
  if not error.filename:
    return "the workdir"
  path = Path(os.fsdecode(error.filename))
  return str(path if path.exists() else path.parent)


@contextlib.contextmanager
def write_fault_is_user_error(doing: str | Callable[[OSError], str],
                              last_step: Callable[[], int | None],
                              cleanup: Callable[[], bool] | None = None):
  """Within: a full disk or a denied write is one `UserError` line (`write_fault_error`):
  what was being written (`doing`, or `doing(error)` to name the file the error names) and the
  last good checkpoint (`last_step()`). `cleanup()` runs first and removes what the failed
  write left; it returns False where the failure was reported already, and then nothing is
  raised. Any other error passes through."""
  try:
    yield
  except UserError:
    raise
  except Exception as e:
    found = write_fault(e)
    if found is None:
      raise
    if cleanup is not None and not cleanup():
      return
    raise write_fault_error(e, doing(found) if callable(doing) else doing, last_step()) from e
