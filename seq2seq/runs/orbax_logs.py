"""What orbax, tensorstore and asyncio print and leave running around a failure that our one
line reports.

A full disk, a checkpoints folder made read-only or a damaged checkpoint makes orbax's threads
log a traceback each, asyncio log every task that a failed save or read abandoned, and Python
print the "exception ignored" of tensorstore completing that work into orbax's closed event
loop: pages of text before the one `UserError` line that explains the failure. Importing this
module installs the log filter (`_library_log_shown`) on the absl and asyncio loggers;
`Checkpoints` installs the unraisable-exception hook (`ignore_abandoned_orbax_work`), reads
through `quiet()`, and ends the threads of a failed save (`release_failed_save`), which would
otherwise wait 300 s for a step directory that was never made, and hold the process's exit.
"""

import contextlib
import logging
import os
import threading
import warnings

import orbax.checkpoint as ocp
from orbax.checkpoint._src.futures import future as orbax_future
from orbax.checkpoint._src.futures import synchronization

from seq2seq.errors import chained, handle_unraisable
from seq2seq.runs.full_disk import fault_code, write_fault

_ORBAX = os.path.dirname(ocp.__file__) + os.sep  # Where orbax's code (and its coroutines) live.


def _library_log_shown(record: logging.LogRecord) -> bool:
  """False for the log lines of orbax (absl) and asyncio that our one-line messages replace."""
  # A step saved between evaluations has no BLEU by design (LatestN keeps it, BestN ignores it);
  # a periodic checkpoint is written in the background, and the next save waits for it.
  if ("did not provide metrics" in record.getMessage()
      or "Waiting for previous save to complete" in record.getMessage()):
    return False
  # orbax's work that a failed save or read left behind: asyncio logs the error of each of its
  # tasks and tensorstore futures ("... exception was never retrieved"), which the one-line
  # message has reported.
  if record.name == "asyncio" and (_ORBAX in record.getMessage()
                                   or "OCDBT database" in record.getMessage()
                                   or _raised_in_orbax(record.exc_info)):
    return False
  # A full disk or a denied write: each of orbax's threads logs its traceback;
  # `Checkpoints.save` says it once.
  if record.levelno >= logging.ERROR and fault_code(record.getMessage()):
    return False
  return write_fault(record.exc_info[1] if record.exc_info else None) is None


def _raised_in_orbax(exc_info) -> bool:
  """Whether a logged exception (or one it was raised from) passed through orbax's code: a
  read of a damaged checkpoint fails in tensorstore, under orbax's gathering future."""
  for exc in chained(exc_info[1] if exc_info else None):
    tb = exc.__traceback__
    while tb is not None:
      if tb.tb_frame.f_code.co_filename.startswith(_ORBAX):
        return True
      tb = tb.tb_next
  return False


for _name in ("absl", "asyncio"):
  logging.getLogger(_name).addFilter(_library_log_shown)


def _abandoned_orbax_work(unraisable) -> bool:
  """Whether an unraisable exception is orbax's work left behind by a failed save or read:
  tensorstore completing it into orbax's closed event loop, or its coroutine collected."""
  exc, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
  return ((isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed")
          or (code is not None and code.co_filename.startswith(_ORBAX)))


def ignore_abandoned_orbax_work() -> None:
  """From now on, orbax's work that a failed save or read left running reports to no one: the
  failure is reported once, in one line, and these print pages (until the process exits)."""
  handle_unraisable(_abandoned_orbax_work, "ignores_abandoned_orbax_work")
  # The writes such a save had not started yet are coroutines that Python reports at exit,
  # through `warnings` rather than the hook.
  warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)


@contextlib.contextmanager
def quiet():
  """Silences orbax's (absl) log while a read that may fail runs: a damaged checkpoint
  makes its threads log hundreds of lines before the one exception the caller explains."""
  absl_log = logging.getLogger("absl")
  previous, absl_log.disabled = absl_log.disabled, True
  try:
    yield
  finally:
    absl_log.disabled = previous


def current_operation() -> str:
  """The id of orbax's latest operation: a save takes the next one as it starts, and its
  threads carry it (`release_failed_save`)."""
  return synchronization.OperationIdGenerator.get_current_operation_id()


def release_failed_save(operation: str) -> None:
  """Ends orbax's threads of the failed save `operation`: each is cancelled, then given the
  signals it waits for, so that it wakes and leaves without running. A save whose step
  directory could not be made (a read-only folder) never sends the signal that its other
  threads wait for: they would wait orbax's 300 s each, log a traceback, and hold the
  interpreter's exit as long."""
  threads = [thread for thread in threading.enumerate()
             if isinstance(thread, orbax_future._SignalingThread)  # noqa: SLF001 (orbax's own)
             and thread._operation_id == operation]  # noqa: SLF001
  for thread in threads:
    with contextlib.suppress(RuntimeError):  # Its event loop closed: it has ended.
      thread.cancel()
  for thread in threads:
    orbax_future.set_signals(thread._receive_signals, operation_id=operation)  # noqa: SLF001
