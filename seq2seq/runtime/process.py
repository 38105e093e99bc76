"""A process of ours: how it starts, how it ends, and its share of the devices when several
share them.

Every command's process, and every worker one spawns, starts the same way, before JAX is
imported: SIGINT/SIGTERM end the start-up with one line (`signals.exit_on_signals`; a
KeyboardInterrupt raised during the slow imports can be swallowed by an import-time callback),
and glibc keeps freed memory for reuse (`allocator.keep_freed_memory`, before XLA starts its
threads). So this module imports nothing slow itself. Every command ends through `end`
(`cli.run_main`), so that a signal at its very end still ends it as one during its work does.
"""

import atexit
import os
import sys

from seq2seq.runtime import allocator, signals


def prepare_process() -> None:
  """What a command's process does first, before JAX is imported."""
  signals.exit_on_signals()
  allocator.keep_freed_memory()


# Of each device's memory, the share that the processes sharing it may take in all (each
# takes this over their number, `start_worker`): XLA's default for one process is 0.75.
SHARED_DEVICE_MEMORY = 0.9


def share_device_memory(processes: int) -> None:
  """This process takes its share of each device's memory when `processes` share them (before
  JAX starts; unless the user chose, with XLA_PYTHON_CLIENT_MEM_FRACTION or _PREALLOCATE)."""
  if processes > 1 and not {"XLA_PYTHON_CLIENT_MEM_FRACTION",
                            "XLA_PYTHON_CLIENT_PREALLOCATE"} & set(os.environ):
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{SHARED_DEVICE_MEMORY / processes:.3f}"


def start_worker(processes: int = 1) -> None:
  """The start of a process a command spawns to do part of its work (`seq2seq-sweep
  --parallel`'s trainers, as a pool's initializer): the same preamble, a fair share of
  device memory for each of the `processes` sharing the devices (unless the user set
  XLA_PYTHON_CLIENT_MEM_FRACTION or XLA_PYTHON_CLIENT_PREALLOCATE), then the compilation
  cache, which they share. Spawned processes run the main script's module, whose command
  is guarded by `__name__ == "__main__"`, so nothing else sets them up."""
  prepare_process()
  share_device_memory(processes)
  from seq2seq.runtime import persistent_cache  # Imports JAX: after the preamble.

  persistent_cache.enable_cache()


def end(status: int, exit_handlers: bool = True, leave_run: bool = True) -> None:
  """Ends the command's process with `status`, its work done and its output written: the exit
  handlers (`atexit`: JAX's clean-up, the log's flush) run with SIGINT/SIGTERM recorded, then
  the process leaves at once. A signal meanwhile raises `signals.Interrupted`, for the
  command's line and status 130 (`cli.run_main`). Python's own shutdown resets the signal
  handlers before it tears the modules down (half a second with JAX loaded): a SIGTERM then
  ended a sweep with status -15 and no word. `exit_handlers=False` skips them, for a process
  whose programs still compile (their threads would crash JAX's clean-up); it still leaves
  a multi-process run (`leave_multi_process_run`) unless `leave_run=False`."""
  received = len(signals.RECEIVED)
  with signals.defer_interrupts():
    if exit_handlers:
      atexit._run_exitfuncs()  # noqa: SLF001 (the interpreter's own exit, run while ours)
    elif leave_run:
      leave_multi_process_run()
  if len(signals.RECEIVED) > received:
    raise signals.Interrupted(signals.RECEIVED[-1])
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (BrokenPipeError, ValueError):  # A reader gone (`| head`), or a stream closed:
      pass  # what it did not take is not wanted, and the status stands.
  os._exit(status)


def leave_multi_process_run() -> None:
  """Leaves the multi-process run this process joined (`jax.distributed`), if any: its
  shutdown barrier, which JAX's clean-up would pass. Process 0 hosts the run's coordination
  service; had it left without the barrier, the others, waiting at theirs, lost the service
  and aborted (SIGABRT: a signal that stopped a run while its evaluation programs compiled)."""
  jax = sys.modules.get("jax")  # Not imported here: a process that never loaded JAX has none.
  if jax is not None and jax.distributed.is_initialized():
    jax.distributed.shutdown()
