"""What every command shares (seq2seq/commands/): flag helpers, and user errors as one line,
not a traceback."""

import difflib
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import ml_collections
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from seq2seq import config as config_lib
from seq2seq.errors import UserError, file_fault
from seq2seq.runtime import compiling, persistent_cache, process, signals
from seq2seq.runtime.signals import Interrupted

flags.DEFINE_bool("verbose", False, "Show the full traceback of a user error (still status 2).")


def _check_override(arg: str, following: str | None = None) -> None:
  """Checks one `--config.<section>.<field>[=value]` flag against the base config.

  ml_collections' config_flags would raise a traceback (unknown field) or a
  generic flag error (wrong type); this names the flag and the fix first.
  `following` is the next command-line argument: the value of `--config.x.y VALUE`.

  Raises:
    UserError: the field does not exist (suggesting the closest one), or the
      value does not parse as the field's type.
  """
  flag, _, text = arg.lstrip("-").partition("=")
  negated = flag.startswith("noconfig.")
  name = flag[len("noconfig." if negated else "config."):]
  base = config_lib.base_config()
  fields = [f"{section}.{key}" for section in base for key in base[section]]
  if name not in fields:
    section, _, key = name.partition(".")
    same_key = [f for f in fields if f.endswith("." + key)]
    close = same_key or (
        difflib.get_close_matches(name, [f for f in fields if f.startswith(section + ".")], n=1)
        or difflib.get_close_matches(name, fields, n=1))
    fix = (f"did you mean --config.{close[0]}?" if close else
           f"the fields are listed in seq2seq/config.py (sections: {', '.join(base)}).")
    raise UserError(f"--{flag} is not a config field; {fix}")
  section, key = name.split(".")
  default = base[section][key]
  kind = type(default)
  example = (f"--config.{name}=true or --config.{name}=false" if kind is bool else
             f"one such as --config.{name}={default}")
  if "=" not in arg:
    if kind is bool:
      return
    if following is None or negated:
      raise UserError(f"--{flag} needs a value; pass {example}.")
    text = following  # absl also takes `--flag value`.
  try:
    config_lib.parse_as(default, text)
  except ValueError:
    raise UserError(f"--config.{name}={text} is not {config_lib.TYPE_NAMES[kind]};"
                    f" pass {example}.") from None


def _one_line(error: Exception) -> str:
  """The message on one line, whatever a library put in it."""
  return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


class _ConfigFileParser(flags.ArgumentParser):
  """Parses config_flags' `--config=FILE[:ARG]`, but the file runs once, and a mistake in it
  is a `UserError` naming the file and line (`config.load_config_file`)."""

  def parse(self, argument):
    config = load_config_file(argument)
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
        _check_override(arg, argv[i + 1] if i + 1 < len(argv) else None)
    try:
      rest = flag_values(argv)
    except SystemExit as e:  # absl's --help prints the usage, then exits 1.
      sys.exit(0 if e.code == 1 and set(HELP_FLAGS) & set(argv[1:]) else e.code)
    if len(rest) > 1 and not positional:
      raise UserError(f"unexpected argument {rest[1]!r}: this command takes flags only"
                      f" (--name=value); see {Path(rest[0]).name} --help.")
    return rest
  except (UserError, flags.Error) as e:
    _say_error(e, "--verbose" in argv)
    sys.exit(2)  # (`main.run` ends the process through `process.end`, as `run_main` does.)


def _verbose() -> bool:
  return flags.FLAGS.is_parsed() and flags.FLAGS.verbose


def _say_error(error: Exception, verbose: bool) -> None:
  """Prints one line `error: <message>` (and, `verbose`, the traceback first)."""
  if verbose:
    traceback.print_exception(error)
  print(f"error: {_one_line(error)}", file=sys.stderr)


def end(status: int,
        interrupted: str | Callable[[], str] = "nothing half-written was kept") -> None:
  """Ends the process with `status` through `process.end`: its exit handlers run (JAX's
  clean-up, the logs' flush) with SIGINT/SIGTERM deferred, so that a signal as it ends is the
  command's line and status 130, as during its work, not a traceback from an exit handler or
  status -15 and no word from Python's own shutdown (which also joins threads). Programs still
  compiling in the background (a run stopped early) would crash JAX's clean-up under their
  native threads, and hold the interpreter's exit until XLA had finished them, minutes on a
  GPU: then the process leaves at once, without the handlers, once it has left a
  multi-process run (`process.leave_multi_process_run`: its peers would abort otherwise).
  (`interrupted`: what the signal's line says was kept.)"""
  try:
    process.end(status, exit_handlers=not compiling.unfinished())
  except Interrupted as e:
    if status == 130:  # A second signal as it ends: its line is printed already; leave at once.
      process.end(130, exit_handlers=False, leave_run=False)
    _interrupted(e, interrupted)


def _interrupted(signal_: BaseException, kept: str | Callable[[], str]) -> None:
  """Prints `stopped by <signal>; <kept>: the same command starts again.` and ends with
  status 130 (`kept`: what was kept, or a function that says it then)."""
  name = str(signal_) or "SIGINT"
  said = kept() if callable(kept) else kept
  print(f"stopped by {name}; {said}: the same command starts again.", file=sys.stderr)
  end(130)


def check_flags_given_once() -> None:
  """Refuses a flag of one value given more than once (`--gold_alignment=A --gold_alignment=B`):
  the last would silently replace the others. Flags that take several (`--sweep`, `--earlier`)
  may repeat."""
  for name in sorted({flags.FLAGS[n].name for n in flags.FLAGS}):
    flag = flags.FLAGS[name]
    if flag.present > 1 and not isinstance(flag, flags.MultiFlag):
      raise UserError(f"--{name} was given {flag.present} times, and only its last value would"
                      f" count; give it once (--{name}={flag.value}, if the last was meant).")


def _status_of(fn: Callable[[], int | None]) -> int:
  """Runs `fn()`: its exit status (an `int` it returns, else 0), or 2 after a `UserError`'s
  line, or a full disk's or a read-only destination's (`errors.file_fault`)."""
  try:
    check_flags_given_once()
    persistent_cache.enable_cache()
    status = fn()
    return status if type(status) is int else 0  # (`train_and_evaluate` returns its record.)
  except BrokenPipeError:  # The output's reader left (`| head`): nothing more is wanted.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Nor at the end's flush.)
    return 141  # As a shell reports a process that SIGPIPE ended (128 + 13).
  except UserError as e:
    _say_error(e, _verbose())
  except Exception as e:  # A full disk or a read-only path, wherever the write was.
    fault = file_fault(e)
    if fault is None:
      raise
    _say_error(fault, _verbose())
  return 2


def run_main(fn: Callable[[], int | None],
             interrupted: str | Callable[[], str] = "nothing half-written was kept") -> None:
  """Runs `fn()` and ends the process (`end`) with its status: 0, or the `int` it returns
  (the sweep's 1 when a run failed). A `UserError` prints `error: <message>` and exits with
  status 2, and so does a full disk or a read-only destination (`errors.file_fault`).

  SIGINT/SIGTERM, during `fn` or as the process ends, print `stopped by <signal>;
  <interrupted>: the same command starts again.` and exit with status 130 (`interrupted`: what
  was kept, or a function that says it then). Every `finally` has run by then.
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
    end(_status_of(fn), interrupted)
  except (Interrupted, KeyboardInterrupt) as e:
    _interrupted(e, interrupted)


def define_run_flags(beam_size: int = 4, ensemble: bool = False, choices: bool = False) -> dict:
  """The flags of every command that decodes with a run: workdir, checkpoint, search; and,
  where ensembles decode (`ensemble`), --ensemble. With `choices` (seq2seq-evaluate),
  --beam_size and --alpha take several values, each a candidate on validation data
  (`search_values` reads them)."""
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
      **(_search_flags(beam_size) if choices else {
          "beam_size": flags.DEFINE_integer("beam_size", beam_size, "Beam size (1: greedy)."),
          "alpha": flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent.")}),
  }


def _search_flags(beam_size: int) -> dict:
  """--beam_size and --alpha as lists: several values score every pair on --split=val."""
  several = (" Several, comma-separated, on --split=val: each pair of beam size and alpha"
             " is a candidate, and the best is recorded with the checkpoint (selected).")
  return {"beam_size": flags.DEFINE_list("beam_size", [str(beam_size)],
                                         "Beam size (1: greedy)." + several),
          "alpha": flags.DEFINE_list("alpha", ["0.6"], "GNMT length-penalty exponent." + several)}


def search_values(run_flags: dict) -> tuple[list[int], list[float]]:
  """The beam sizes and alphas of --beam_size and --alpha as `define_run_flags(choices=True)`
  defines them; `UserError` for a value that is not a number."""
  def read(name, kind, example):
    values = []
    for text in run_flags[name].value:
      try:
        values.append(kind(text))
      except ValueError:
        raise UserError(f"--{name}={','.join(run_flags[name].value)}: {text!r} is not"
                        f" {example}; pass numbers, comma-separated.") from None
    return values or [kind(run_flags[name].default[0])]
  return read("beam_size", int, "an integer (4)"), read("alpha", float, "a number (0.6)")


def selected_search(run_flags: dict, beam_size: int, alpha: float) -> tuple[int, float]:
  """The search of a --checkpoint=selected that was chosen with its beam size and alpha
  (`selection.selected_search`): theirs where --beam_size and --alpha are not given;
  `UserError` where either is given otherwise. Else (`beam_size`, `alpha`), as the flags say."""
  from seq2seq.runs import selection  # Lazily: it reads checkpoints (orbax), which start slowly.
  chosen = (selection.selected_search(Path(run_flags["workdir"].value))
            if run_flags["checkpoint"].value == "selected" else None)
  if chosen is None:
    return beam_size, alpha
  for name, value, choice in (("beam_size", beam_size, chosen[0]), ("alpha", alpha, chosen[1])):
    if run_flags[name].present and value != choice:
      raise UserError(f"--{name}={value:g}: --checkpoint=selected was chosen on validation at"
                      f" --beam_size={chosen[0]} --alpha={chosen[1]:g}; leave out --beam_size"
                      " and --alpha to decode with them, or choose again at this search.")
  return chosen


# `seq2seq.models.linear.MATRIX_DOTS`'s names, without importing the models to define a flag.
MATMUL_DTYPES = ("float32", "bfloat16")


def define_matmul_flag() -> flags.FlagHolder:
  """--matmul_dtype, as every command that decodes with a run's search takes it."""
  return flags.DEFINE_enum(
      "matmul_dtype", "float32", list(MATMUL_DTYPES), "The inputs' dtype of the model's dense"
      " products (every projection and the output layer), summed in float32; bfloat16 decodes"
      " faster in large batches where the CPU has AVX-512 BF16 or AMX (the checkpoint is read"
      " as it is; all else stays float32). A Transformer trained in float32 only.")


def define_alignment_flags() -> dict:
  """--gold_alignment and its two options, as seq2seq-evaluate and seq2seq-compare take them."""
  return {
      "gold_alignment": flags.DEFINE_string(
          "gold_alignment", "", "Gold word alignment of the test set: score the attention on"
          " the references by AER."),
      "gold_one_based": flags.DEFINE_bool("gold_one_based", False,
                                          "--gold_alignment counts words from 1."),
      "alignment_layer": flags.DEFINE_integer(
          "alignment_layer", -2, "The cross-attention layer (heads averaged) --gold_alignment"
          " scores; -2: the penultimate (1 layer: that one)."),
  }


def check_alignment_flags(alignment_flags: dict) -> None:
  """A `UserError` when --alignment_layer or --gold_one_based come without --gold_alignment."""
  if ((alignment_flags["alignment_layer"].present or alignment_flags["gold_one_based"].present)
      and not alignment_flags["gold_alignment"].value):
    raise UserError("--alignment_layer and --gold_one_based apply to --gold_alignment only;"
                    " add --gold_alignment=FILE, or drop them.")


def _check_config_arg(spec: str, get_config, arg: str) -> None:
  """Raises `UserError` if `--config=FILE[:ARG]` passes an argument that get_config() does
  not take, or none where it needs one."""
  try:
    inspect.signature(get_config).bind(*([arg] if arg else []))
  except TypeError:
    path = spec.partition(":")[0]
    if arg:
      raise UserError(f"--config={spec} passes {arg!r} to get_config(), which takes no"
                      f" argument in {path}; drop ':{arg}' and set fields with"
                      " --config.<field>=VALUE instead.") from None
    raise UserError(f"get_config() in {path} needs an argument; pass it as"
                    f" --config={path}:ARG.") from None
  except ValueError:
    return  # No signature to read (a builtin): let the call say.


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Runs `--config=FILE[:ARG]`'s `get_config(ARG)` once, as config_flags would, but a
  mistake in the file is a `UserError` naming the file and line, not a traceback."""
  path, _, arg = spec.partition(":")  # config_flags takes FILE[:ARG].
  if not Path(path).is_file():
    raise UserError(f"--config={path} is not a file; pass an experiment config such as"
                    " --config=configs/tiny.py.")
  try:
    code = compile(Path(path).read_bytes(), path, "exec")
  except SyntaxError as e:
    raise UserError(f"{path}:{e.lineno}: {e.msg}; fix the config file's syntax.") from e
  namespace = {"__name__": Path(path).stem, "__file__": path}
  try:
    exec(code, namespace)  # noqa: S102 (the user's own experiment file, as config_flags runs it)
    get_config = namespace.get("get_config")
    if not callable(get_config):
      raise UserError(f"{path} defines no get_config(); an experiment config returns its"
                      " ConfigDict from get_config() (see configs/tiny.py).")
    _check_config_arg(spec, get_config, arg)
    config = get_config(arg) if arg else get_config()
  except UserError:
    raise
  except Exception as e:
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == path]
    at = f"{path}:{lines[-1]}" if lines else path
    raise UserError(f"{at}: {type(e).__name__}: {e} (raised while loading the config);"
                    " fix the config file.") from e
  config_lib.check_structure(config, f"{path}'s get_config()")
  return config
