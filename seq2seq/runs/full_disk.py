"""A full disk while a run writes, told in one line.

A full disk is not a bug of ours nor a damaged run: the command stops with one `UserError`
that says what was being written, which checkpoint is the last good one, and that the same
command resumes once there is space. The libraries bury the cause: orbax wraps the OSError
in its own exceptions, and tensorstore reports the errno only inside its message text
(`os_error_code='28'`), so the error is found by walking the whole exception chain.

`full_disk_is_user_error` is the one guard: the training loop wraps its writes in it, and
`Checkpoints` its saves, with a clean-up that removes the half-written step and drops a
failure that orbax repeats when the save is waited for or closed (reported already).
"""

import contextlib
import errno
import os
import re
from collections.abc import Callable

from seq2seq.errors import FULL_DISK, UserError, chained

# tensorstore reports a full disk's errno (FULL_DISK) only inside its message text.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def full_disk(error: BaseException | None) -> OSError | None:
  """The full-disk error (ENOSPC, EDQUOT) in `error` or its chain (`__cause__`, `__context__`,
  an exception group's members), as an OSError; None if there is none.

  orbax wraps an OSError, and tensorstore's writes raise a ValueError that carries the code
  only in its text ("... No space left on device [os_error_code='28']").
  """
  for e in chained(error):
    if isinstance(e, OSError) and e.errno in FULL_DISK:
      return e
    if not isinstance(e, UserError) and (code := full_disk_code(str(e))):
      return OSError(code, os.strerror(code))
  return None


def full_disk_code(text: str) -> int | None:
  """The full-disk errno that a library's message reports, if it reports one."""
  match = _OS_ERROR_CODE.search(text)
  code = int(match[1]) if match else errno.ENOSPC if os.strerror(errno.ENOSPC) in text else None
  return code if code in FULL_DISK else None


def full_disk_error(error: BaseException, doing: str, last_step: int | None) -> UserError | None:
  """The one line for a full disk found in `error` (None if it is something else): what was
  being written (`doing`), the last good checkpoint, and that the same command resumes."""
  found = full_disk(error)
  if found is None:
    return None
  last = (f"the last good checkpoint is step {last_step}" if last_step is not None
          else "no checkpoint was saved yet")
  again = "resume" if last_step is not None else "start again"
  return UserError(f"{found.strerror or os.strerror(found.errno)} while {doing}; {last}. Free"
                   f" some space and run the same command to {again}.")


@contextlib.contextmanager
def full_disk_is_user_error(doing: str | Callable[[OSError], str],
                            last_step: Callable[[], int | None],
                            cleanup: Callable[[], bool] | None = None):
  """Within: a full disk at any write is one `UserError` line (`full_disk_error`): what was
  being written (`doing`, or `doing(error)` to name the file the error names) and the last
  good checkpoint (`last_step()`). `cleanup()` runs first and removes what the failed write
  left; it returns False where the failure was reported already, and then nothing is raised.
  Any other error passes through."""
  try:
    yield
  except UserError:
    raise
  except Exception as e:
    found = full_disk(e)
    if found is None:
      raise
    if cleanup is not None and not cleanup():
      return
    raise full_disk_error(e, doing(found) if callable(doing) else doing, last_step()) from e
