"""Sweeps: the cross product of config values, one workdir per combination.

`run_sweep(config, ["model.attention=dot,general", "train.seed=0,1"], root)`
trains every combination in `root/<readable name>`: finished runs are
skipped, unfinished ones resume, and a failure is recorded without stopping
the others.
"""

import concurrent.futures
import itertools
import logging
import multiprocessing
from pathlib import Path

import ml_collections

from seq2seq import config as config_lib
from seq2seq import main, models, workdirs
from seq2seq.checkpoint import Checkpoints
from seq2seq.errors import UserError

log = logging.getLogger("seq2seq")


def parse_sweep(spec: str, config: ml_collections.ConfigDict) -> tuple[str, list]:
  """"model.attention=dot,general" -> ("model.attention", ["dot", "general"])."""
  key, sep, values = spec.partition("=")
  section, _, field = key.partition(".")
  if not sep or not values:
    raise UserError(f"--sweep={spec} is not FIELD=V1,V2,...; e.g. model.attention=dot,general.")
  if section not in config or field not in config[section]:
    raise UserError(f"--sweep={spec}: config has no field {key}; see seq2seq/config.py.")
  default = config[section][field]
  try:
    return key, [config_lib.parse_as(default, v.strip()) for v in values.split(",")]
  except ValueError as e:
    example = ("true,false" if isinstance(default, bool) else f"{default},{default + 1}"
               if isinstance(default, int) else f"{default},{default * 2}"
               if isinstance(default, float) else default)
    raise UserError(f"--sweep={spec}: {e}; give values of config.{key}'s type, e.g."
                    f" --sweep={key}={example}.") from None


def expand(config: ml_collections.ConfigDict,
           specs: list[str]) -> list[tuple[str, ml_collections.ConfigDict]]:
  """Every combination of the swept values: (readable name, its config)."""
  sweeps = [parse_sweep(spec, config) for spec in specs]
  runs = []
  for values in itertools.product(*(vals for _, vals in sweeps)):
    run = config_lib.from_json(config_lib.to_json(config))
    parts = []
    for (key, _), value in zip(sweeps, values, strict=True):
      section, field = key.split(".")
      run[section][field] = value
      parts.append(f"{field}-{value}")
    runs.append(("_".join(parts) or "base", run))
  return runs


def is_complete(workdir: Path, config: ml_collections.ConfigDict) -> bool:
  if not (workdir / workdirs.CHECKPOINTS).is_dir():
    return False
  checkpoints = Checkpoints(workdir, config.checkpoint.keep)
  try:
    latest = checkpoints.latest_step()
  finally:
    checkpoints.close()
  return latest is not None and latest >= config.train.num_steps


def _train(config_json: str, workdir: str) -> str | None:
  """Trains one run; returns how it was stopped early (e.g. "stopped by SIGTERM at step 7")."""
  from seq2seq import train  # In a fresh process when run in parallel.

  result = train.train_and_evaluate(config_lib.from_json(config_json), workdir)
  if result.get("interrupted"):
    return f"stopped by {result['interrupted']} at step {result['step']}"
  return None


def run_sweep(config: ml_collections.ConfigDict, specs: list[str], root: str | Path,
              parallel: int = 1) -> dict[str, str]:
  """Trains every combination; returns run name -> "trained", "skipped", "failed: ...",
  "in use by another training ..." (another sweep trains it), "stopped by SIGTERM at step N"
  or "not started" (after a stop)."""
  if parallel < 1:
    raise UserError(f"--parallel={parallel} must be at least 1 (runs trained at once).")
  root = Path(root)
  runs = expand(config, specs)
  for _, run in runs:
    config_lib.validate(run)  # Every combination is checked before any trains.
    models.check_config(run)
  status, todo = {}, []
  for name, run in runs:
    if is_complete(root / name, run):
      status[name] = "skipped"
    else:
      todo.append((name, run))
  log.info("Sweep of %d runs in %s: %d finished, %d to train.", len(runs), root,
           len(runs) - len(todo), len(todo))

  def record(name, stopped=None, error=None):
    if isinstance(error, workdirs.WorkdirInUse):  # Another sweep's (or training's) run: not ours.
      status[name] = (f"in use by another training ({error.holder}); not trained here: run the"
                      " sweep again once it ends")
    else:
      status[name] = (f"failed: {type(error).__name__}: {error}" if error
                      else stopped or "trained")
    log.info("%s: %s", name, status[name])

  # A run stopped by SIGTERM/SIGINT (it saved a checkpoint) stops the sweep: running the same
  # command again resumes it. Runs that did not start say so.
  if parallel <= 1:
    for name, run in todo:
      try:
        record(name, stopped=_train(config_lib.to_json(run), str(root / name)))
      except Exception as e:  # noqa: BLE001 (one failure must not stop the sweep)
        record(name, error=e)
      if status[name].startswith("stopped"):
        break
  else:
    context = multiprocessing.get_context("spawn")  # JAX does not survive fork.
    # Each new process turns on the compilation cache, which they share (only reads race).
    with concurrent.futures.ProcessPoolExecutor(parallel, mp_context=context,
                                                initializer=main.start_worker) as pool:
      futures = {pool.submit(_train, config_lib.to_json(run), str(root / name)): name
                 for name, run in todo}
      for future in concurrent.futures.as_completed(futures):
        if future.cancelled():
          continue
        error = future.exception()
        if error is None:
          record(futures[future], stopped=future.result())
          if status[futures[future]].startswith("stopped"):
            pool.shutdown(wait=True, cancel_futures=True)
        else:
          record(futures[future], error=error)
  return {name: status.get(name, "not started") for name, _ in runs}
