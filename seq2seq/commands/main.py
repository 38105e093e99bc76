"""The commands' one entry point: the `seq2seq-*` console scripts (pyproject.toml) and
scripts/*.py each call one function here, which runs `seq2seq.commands.<name>`.

Every command's process starts the same way (`seq2seq.runtime.process.prepare_process`),
before the command module is imported (it imports JAX). So this module imports nothing slow
itself (tests/test_cli.py checks it).
"""

import functools
import importlib
import sys

from absl import app, flags

from seq2seq.runtime import process


def _show_in_help(command) -> None:
  """absl's --help prints the main module's docstring and key flags: make them the command's,
  that is its module's flags and those seq2seq.commands.cli's helpers defined for it (--workdir,
  --config, --verbose, ...), not the libraries' (absl.logging's, orbax's)."""
  sys.modules["__main__"].__doc__ = command.__doc__
  by_module = flags.FLAGS.flags_by_module_dict()
  for module in (command.__name__, "seq2seq.commands.cli"):
    for flag in by_module.get(module, []):
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


def run(name: str) -> None:
  """Runs the command `seq2seq.commands.<name>` on `sys.argv` as absl's program; exits."""
  run_module(f"seq2seq.commands.{name}")


def run_module(module: str) -> None:
  """Runs the command module `module`, written as those of seq2seq/commands/ are (its flags,
  its `main(argv)`, its docstring the --help), on `sys.argv` as absl's program; exits. The
  reproductions outside the package (benchmarks/) run theirs through it."""
  process.prepare_process()
  command = importlib.import_module(module)
  from seq2seq.commands import cli  # Imports JAX: after the preamble.

  _show_in_help(command)
  try:
    app.run(command.main, flags_parser=functools.partial(
        cli.parse_flags, positional=getattr(command, "POSITIONAL", "")))
  except SystemExit as e:  # A bad flag's end (2; `run_main` ends itself), as the command's.
    if not e.code:  # --help: nothing was done that a signal could interrupt.
      raise
    cli.end(e.code if isinstance(e.code, int) else 2)


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


def serve() -> None:
  """`seq2seq-serve`: a translation API and the attention explorer over HTTP."""
  run("serve")


def export() -> None:
  """`seq2seq-export`: converts a run's checkpoint into a CTranslate2 model."""
  run("export")
