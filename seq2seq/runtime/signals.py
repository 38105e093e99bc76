"""Signals, in one place: how SIGINT/SIGTERM end a command, and how the training loop
turns them into a checkpoint and a clean stop.

- Before the slow imports, `exit_on_signals` makes a signal print one line and exit 130.
- Once a command runs (`cli.run_main`), `catch_interrupts` makes a signal raise
  `Interrupted`, which unwinds through every `finally` and exits 130.
- Multi-process start-ups `defer_interrupts`: a signal is recorded in `RECEIVED`, and the
  training loop (`StopSignals`) stops every process at the same step.
"""

import _thread
import contextlib
import os
import signal
import sys
import threading
import time

from seq2seq.errors import handle_unraisable


class Interrupted(BaseException):  # noqa: N818 (like KeyboardInterrupt, not an error)
  """SIGINT or SIGTERM outside the training loop (which checkpoints instead): ends the
  command promptly, through every `finally` on the way, with exit status 130."""


# Signals received outside the training loop. Raised from a signal handler, `Interrupted` can
# land in a callback whose exceptions are ignored (a garbage-collection hook): the record
# stays, and the next `raise_if_interrupted()` ends the command anyway.
RECEIVED: list[str] = []
_deferred = False


def interrupts_deferred() -> bool:
  """Whether a signal is only recorded now (`defer_interrupts`), not raised."""
  return _deferred



@contextlib.contextmanager
def defer_interrupts(enabled: bool = True):
  """Within: SIGINT/SIGTERM are recorded in RECEIVED but do not end the command.

  For multi-process runs: a process that left during start-up on its own would leave the
  others waiting for it in a collective. The training loop reads the record instead and all
  processes stop together at its first agreement (`StopSignals`).
  """
  global _deferred
  previous, _deferred = _deferred, enabled or _deferred
  try:
    yield
  finally:
    _deferred = previous


def raise_if_interrupted() -> None:
  if RECEIVED and not _deferred:
    raise Interrupted(RECEIVED[0])


def exit_on_signals() -> None:
  """Until a command installs its own handlers: SIGINT/SIGTERM print one line and exit 130.

  `seq2seq.commands.main` calls this before a command's slow imports (JAX, TensorFlow), where
  Python's own KeyboardInterrupt can be swallowed by an import-time callback; nothing exists
  yet to clean.
  """
  def leave(signum, frame):
    del frame
    os.write(2, f"stopped by {signal.Signals(signum).name} while starting.\n".encode())
    os._exit(130)

  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, leave)


def catch_interrupts() -> None:
  """Start-up (tokenizer training, compilation) and decoding end at once on SIGINT/SIGTERM
  (`Interrupted`); the training loop installs its own handlers, which checkpoint first. An
  `Interrupted` that a callback swallowed is delivered again (`_redeliver_swallowed`)."""
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, _interrupt)
  handle_unraisable(_redeliver_swallowed, "redelivers_interrupts")


def _redeliver_swallowed(unraisable) -> bool:
  """Whether `unraisable` is an `Interrupted` that a callback swallowed (JAX's garbage-
  collection hook, a `__del__`): if so, the signal is raised again in the main thread, from
  where the command's code runs, which then ends as the signal asks."""
  if not isinstance(unraisable.exc_value, Interrupted):
    return False
  name = str(unraisable.exc_value)
  if name in signal.Signals.__members__ and not interrupts_deferred():
    threading.Thread(target=_interrupt_main_outside_the_hook, daemon=True,
                     args=(threading.main_thread().ident, signal.Signals[name])).start()
  return True


def _interrupt_main_outside_the_hook(main: int, sig: signal.Signals) -> None:
  """Raises `sig` in the main thread (thread id `main`) once it has left
  `sys.unraisablehook`: raised inside the hook, it would be reported and dropped again. (A
  timer of 10 ms fired inside the hook when the machine was busy.)"""
  hook = getattr(sys.unraisablehook, "__code__", None)
  while hook is not None and _running(main, hook):
    time.sleep(0.005)
  _thread.interrupt_main(sig)


def _running(thread: int, code) -> bool:
  """Whether `code` is on the stack of the thread whose id is `thread`."""
  frame = sys._current_frames().get(thread)  # noqa: SLF001 (no public way to look)
  while frame is not None and frame.f_code is not code:
    frame = frame.f_back
  return frame is not None


def _interrupt(signum, frame):
  del frame
  RECEIVED.append(signal.Signals(signum).name)
  if not interrupts_deferred():
    raise Interrupted(RECEIVED[-1])


STOP_AGREEMENT_EVERY = 10  # Multi-process runs agree on stopping at least this often (steps).


class StopSignals:
  """From creation until `restore()`, SIGTERM/SIGINT are recorded instead of killing
  the process, so the training loop can checkpoint the current step and exit cleanly."""

  def __init__(self):
    raise_if_interrupted()  # A start-up signal that a library callback swallowed.
    # ... or one deferred during a multi-process start-up: the first agreement stops all.
    self.received: str | None = RECEIVED[0] if RECEIVED else None
    self._previous = {}
    if threading.current_thread() is threading.main_thread():  # Python's rule for handlers.
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    self.received = signal.Signals(signum).name

  def agreed(self, done: int, boundary: bool) -> str | None:
    """The signal to stop after step `done`, the same on every process.

    One process reads its own record. Several combine theirs (one small all-gather) every
    STOP_AGREEMENT_EVERY steps and at every log, evaluation or save step, so that a signal
    reaching only some of them (or at different steps) stops all at the same step instead
    of sending some into a checkpoint save and the others into the next train step.
    """
    # Imported here: `seq2seq.commands.main` imports this module before the slow imports.
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
      return self.received
    if not boundary and done % STOP_AGREEMENT_EVERY:
      return None
    flags = multihost_utils.process_allgather(np.int32(self.received is not None))
    if not np.any(flags):
      return None
    return self.received or "a signal on another process"

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
