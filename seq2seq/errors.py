"""The one exception type for a user's mistake, and how a command ends on a signal.

A `UserError` carries a single line that names the problem and the fix. The
command-line scripts print it (no traceback unless --verbose) and exit with
status 2; anything else that escapes is a bug in seq2seq.
"""

import contextlib
import os
import signal


class UserError(Exception):
  """A mistake in the user's config, data or workdir, explained in one line."""


def describe(error: Exception) -> str:
  """A library's exception as `Type: first line` (orbax's, tensorstore's and TFDS's run to
  pages): the cause inside one line of ours."""
  first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
  return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


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
  processes stop together at its first agreement (`train.StopSignals`).
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

  The scripts call this before their slow imports (JAX, TensorFlow), where Python's own
  KeyboardInterrupt can be swallowed by an import-time callback; nothing exists yet to clean.
  """
  def leave(signum, frame):
    del frame
    os.write(2, f"stopped by {signal.Signals(signum).name} while starting.\n".encode())
    os._exit(130)

  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, leave)
