"""The commands' one entry point: the `seq2seq-*` console scripts (pyproject.toml) and
scripts/*.py each call one function here, which runs `seq2seq.commands.<name>`.

Every command's process starts the same way, before the command module is imported (it
imports JAX): SIGINT/SIGTERM end the start-up with one line (`signals.exit_on_signals`; a
KeyboardInterrupt raised during the slow imports can be swallowed by an import-time callback),
and glibc keeps freed memory for reuse (`allocator.keep_freed_memory`, before XLA starts its
threads). So this module imports nothing slow itself (tests/test_cli.py checks it).
"""

import functools
import importlib
import os
import sys

from absl import app, flags

from seq2seq import allocator, signals


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
  from seq2seq import compiling  # Imports JAX: after the preamble.

  compiling.enable_cache()


def _show_in_help(command) -> None:
  """absl's --help prints the main module's docstring and key flags: make them the command's,
  that is its module's flags and those seq2seq.cli's helpers defined for it (--workdir,
  --config, --verbose, ...), not the libraries' (absl.logging's, orbax's)."""
  sys.modules["__main__"].__doc__ = command.__doc__
  by_module = flags.FLAGS.flags_by_module_dict()
  for module in (command.__name__, "seq2seq.cli"):
    for flag in by_module.get(module, []):
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run(name: str) -> None:
  """Runs the command `seq2seq.commands.<name>` on `sys.argv` as absl's program; exits."""
  prepare_process()
  command = importlib.import_module(f"seq2seq.commands.{name}")
  from seq2seq import cli  # Imports JAX: after the preamble.

  _show_in_help(command)
  app.run(command.main, flags_parser=functools.partial(
      cli.parse_flags, positional=getattr(command, "POSITIONAL", "")))


def train() -> None:
  """`seq2seq-train`: trains (or resumes) a run."""
  run("train")


def evaluate() -> None:
  """`seq2seq-evaluate`: scores a run's checkpoint with sacreBLEU."""
  run("evaluate")


def translate() -> None:
  """`seq2seq-translate`: translates text, one output line per input line."""
  run("translate")


def compare() -> None:
  """`seq2seq-compare`: compares runs (scores, significance, seed statistics, plots)."""
  run("compare")


def sweep() -> None:
  """`seq2seq-sweep`: trains the cross product of config values."""
  run("sweep")


def benchmark() -> None:
  """`seq2seq-benchmark`: training and decoding speed at fixed shapes."""
  run("benchmark")


def plot_attention() -> None:
  """`seq2seq-plot-attention`: draws the attention of a run's model on one sentence."""
  run("plot_attention")


def side_by_side() -> None:
  """`seq2seq-side-by-side`: this project's speed against flax examples/wmt."""
  run("side_by_side")
