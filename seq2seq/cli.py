"""What every command shares (seq2seq/commands/): flag helpers, and user errors as one line,
not a traceback."""

import logging
import os
import sys
import traceback
from pathlib import Path

from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from seq2seq import compiling, signals
from seq2seq import config as config_lib
from seq2seq.errors import UserError, file_fault
from seq2seq.signals import Interrupted

flags.DEFINE_bool("verbose", False, "Show the full traceback of a user error (still status 2).")


def _one_line(error: Exception) -> str:
  """The message on one line, whatever a library put in it."""
  return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


class _ConfigFileParser(flags.ArgumentParser):
  """Parses config_flags' `--config=FILE[:ARG]`, but the file runs once, and a mistake in it
  is a `UserError` naming the file and line (`config.load_config_file`)."""

  def parse(self, argument):
    config = config_lib.load_config_file(argument)
    config.lock()
    return config

  def flag_type(self):
    return "config object"


def define_config_flag(flag_values: flags.FlagValues = flags.FLAGS,
                       sys_argv: list[str] | None = None) -> flags.FlagHolder:
  """`--config=FILE[:ARG]` with `--config.<field>=VALUE` overrides, as config_flags defines
  it (overrides are read from `sys_argv`, by default `sys.argv` at parse time)."""
  holder = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                           flag_values=flag_values, lock_config=True,
                                           sys_argv=sys_argv)
  flag_values["config"].parser = _ConfigFileParser()
  return holder


HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS,
                positional: str = "") -> list[str]:
  """`app.run`'s flags parser: a bad flag is `error: <message>` and status 2, too, and so is
  an argument that is not a flag, unless the command takes `positional` ones (named so).
  --help prints the usage and exits 0.

  `--config.<field>` overrides are checked against the base config first, so an
  unknown field or a value of the wrong type names the flag and the fix instead
  of ending in config_flags' traceback.
  """
  signals.catch_interrupts()  # From here on, before the slow parts (config files, start-up).
  try:
    for i, arg in enumerate(argv[1:], start=1):
      if arg == "--":
        break
      if arg.startswith("-") and arg.lstrip("-").startswith(("config.", "noconfig.")):
        config_lib.check_override(arg, argv[i + 1] if i + 1 < len(argv) else None)
    try:
      rest = flag_values(argv)
    except SystemExit as e:  # absl's --help prints the usage, then exits 1.
      sys.exit(0 if e.code == 1 and set(HELP_FLAGS) & set(argv[1:]) else e.code)
    if len(rest) > 1 and not positional:
      raise UserError(f"unexpected argument {rest[1]!r}: this command takes flags only"
                      f" (--name=value); see {Path(rest[0]).name} --help.")
    return rest
  except (UserError, flags.Error) as e:
    _user_error(e, "--verbose" in argv)


def _verbose() -> bool:
  return flags.FLAGS.is_parsed() and flags.FLAGS.verbose


def _user_error(error: Exception, verbose: bool) -> None:
  """Exits with status 2 after one line `error: <message>` (and, `verbose`, the traceback)."""
  if verbose:
    traceback.print_exception(error)
  print(f"error: {_one_line(error)}", file=sys.stderr)
  sys.exit(2)


def run_main(fn, interrupted: str = "nothing half-written was kept") -> None:
  """Runs `fn()`; a `UserError` prints `error: <message>` and exits with status 2, and so
  does a full disk or a read-only destination (`errors.file_fault`).

  SIGINT/SIGTERM print `stopped by <signal>; <interrupted>: the same command starts again.`
  and exit with status 130.
  """
  # orbax and JAX log every save at INFO through absl; keep the console for progress.
  absl_logging.set_verbosity(absl_logging.WARNING)
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
  logger = logging.getLogger("seq2seq")
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False
  signals.catch_interrupts()
  try:
    compiling.enable_cache()
    fn()
  except UserError as e:
    _user_error(e, _verbose())
  except Exception as e:  # A full disk or a read-only path, wherever the write was.
    fault = file_fault(e)
    if fault is None:
      raise
    _user_error(fault, _verbose())
  except (Interrupted, KeyboardInterrupt) as e:
    name = str(e) or "SIGINT"
    print(f"stopped by {name}; {interrupted}: the same command starts again.", file=sys.stderr)
    # Every `finally` has run. Native threads may still be busy (SentencePiece training,
    # XLA), and the interpreter's shutdown can crash under them: leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


def define_run_flags(beam_size: int = 4, ensemble: bool = False) -> dict:
  """The flags of every command that decodes with a run: workdir, checkpoint, search; and,
  where ensembles decode (`ensemble`), --ensemble."""
  flags_ = {} if not ensemble else {"ensemble": flags.DEFINE_list(
      "ensemble", [], "Other runs (comma-separated workdirs) decoding with --workdir's as one"
      " model: the mean of their log-probabilities at every step; each at the --checkpoint it"
      " names for it. They must share --workdir's vocabulary.")}
  return {**flags_,
      "workdir": flags.DEFINE_string("workdir", None, "Directory of a training run.",
                                     required=True),
      "checkpoint": flags.DEFINE_string(
          "checkpoint", "best", "best, latest, a step, avg:N, selected (chosen on validation by"
          " seq2seq-evaluate --checkpoint=best,avg:N --split=val), or ensemble:N (the last N"
          " checkpoints as an ensemble)."),
      "beam_size": flags.DEFINE_integer("beam_size", beam_size, "Beam size (1: greedy)."),
      "alpha": flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent."),
  }
