"""Sweeps: the cross product of config values, one workdir per combination.

`run_sweep(config, ["model.attention=dot,general", "train.seed=0,1"], root)`
trains every combination in `root/<readable name>`: finished runs are
skipped, unfinished ones resume, and a failure is recorded without stopping
the others. The runs that differ only in train.seed (the seeds of one point)
train as one program (`seeds.train_seeds`) where they start from one step, or share one
that those ahead go back to, unless `one_by_one`; either way each is an ordinary run in its
own workdir.
"""

import concurrent.futures
import gc
import itertools
import logging
import multiprocessing
import os
import signal
from pathlib import Path
from typing import NamedTuple

import jax
import ml_collections

from seq2seq import config as config_lib
from seq2seq.errors import UserError
from seq2seq.runs import workdirs
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.claim import shared_step
from seq2seq.runtime import process, signals

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
    parsed = [config_lib.parse_as(default, v.strip()) for v in values.split(",")]
  except ValueError as e:
    example = ("true,false" if isinstance(default, bool) else f"{default},{default + 1}"
               if isinstance(default, int) else f"{default},{default * 2}"
               if isinstance(default, float) else default)
    raise UserError(f"--sweep={spec}: {e}; give values of config.{key}'s type, e.g."
                    f" --sweep={key}={example}.") from None
  twice = next((v for i, v in enumerate(parsed) if v in parsed[:i]), None)
  if twice is not None:  # Both runs would be one workdir: it trains once, with one value.
    raise UserError(f"--sweep={spec} lists {twice} twice (as a value of config.{key}); list each"
                    " value once: each is a run of its own.")
  return key, parsed


def expand(config: ml_collections.ConfigDict,
           specs: list[str]) -> list[tuple[str, ml_collections.ConfigDict]]:
  """Every combination of the swept values: (readable name, its config)."""
  sweeps = [parse_sweep(spec, config) for spec in specs]
  for i, (key, values) in enumerate(sweeps):
    # The product would set the field twice in every run: the last value wins, and the runs
    # that differ only in the first share one name (one trains, the rest never start).
    first = next((j for j in range(i) if sweeps[j][0] == key), None)
    if first is not None:
      merged = ",".join(str(v) for v in dict.fromkeys(sweeps[first][1] + values))
      raise UserError(f"--sweep={specs[first]} and --sweep={specs[i]} both sweep {key}; give its"
                      f" values in one --sweep, e.g. --sweep={key}={merged}.")
  runs = []
  for values in itertools.product(*(vals for _, vals in sweeps)):
    run = config_lib.copied(config)
    parts = []
    for (key, _), value in zip(sweeps, values, strict=True):
      section, field = key.split(".")
      run[section][field] = value
      parts.append(f"{field}-{value}")
    runs.append(("_".join(parts) or "base", run))
  return runs


def _stopped(result: dict) -> str | None:
  """How a run was stopped early (e.g. "stopped by SIGTERM at step 7"), if it was."""
  if result.get("interrupted"):
    return f"stopped by {result['interrupted']} at step {result['step']}"
  return None


def _train(config_json: str, workdirs_by_seed: dict[int, str]) -> dict[int, str | Exception | None]:
  """Trains one run, or the seeds of one point as one program (more than one workdir); per
  seed, how it was stopped early (`_stopped`), or the error that ended that member alone."""
  from seq2seq.training import loop, seeds  # In a fresh process when run in parallel.

  config = config_lib.from_json(config_json)
  if len(workdirs_by_seed) == 1:
    return {seed: _stopped(loop.train_and_evaluate(config, workdir))
            for seed, workdir in workdirs_by_seed.items()}
  results = seeds.train_seeds(config, workdirs_by_seed)
  return {seed: r if isinstance(r, Exception) else _stopped(r) for seed, r in results.items()}


def _seed_groups(todo: list[tuple[str, ml_collections.ConfigDict]], steps: dict[str, list[int]],
                 one_by_one: bool) -> list[list[tuple[str, ml_collections.ConfigDict]]]:
  """The runs to train, in groups trained as one program: the seeds of one point (runs
  whose configs differ in train.seed alone) that start from one step, or share a checkpoint
  step (`steps`, by run name: those ahead go back to it, `claim.shared_step`); each other run
  alone."""
  points = {}
  for name, run in todo:
    point = config_lib.copied(run)
    point.train.seed = 0
    points.setdefault(config_lib.to_json(point), []).append((name, run))
  groups = []
  for runs in points.values():
    if one_by_one or len(runs) == 1 or not _one_program(runs, steps):
      groups += [[one] for one in runs]
    else:
      groups.append(runs)
  return groups


def _one_program(runs: list[tuple[str, ml_collections.ConfigDict]],
                 steps: dict[str, list[int]]) -> bool:
  """Whether the seeds of a point train as one program: they are at one step, or share a
  checkpoint step (a stop during the group's save left some a save ahead); if not, one line
  says why they train one by one."""
  held = [steps[name] for name, _ in runs]
  if len({tuple(s[-1:]) for s in held}) == 1:
    return True
  try:
    shared_step([Path(name) for name, _ in runs], held)
  except UserError:
    log.info("%s: at steps %s, with no checkpoint step in common; trained one by one.",
             " + ".join(name for name, _ in runs),
             ", ".join(str(s[-1]) if s else "new" for s in held))
    return False
  return True


def _steps(workdir: Path, config: ml_collections.ConfigDict) -> list[int]:
  """The steps of the run's checkpoints (none: a new run)."""
  if not (workdir / workdirs.CHECKPOINTS).is_dir():
    return []
  checkpoints = Checkpoints(workdir, config.checkpoint.keep)
  try:
    return checkpoints.all_steps()
  finally:
    checkpoints.close()


class _Task(NamedTuple):
  """One program of a sweep: a run, or a seed group's runs."""
  config_json: str  # The config of its first run (its members differ in train.seed alone).
  workdirs: dict[int, str]  # Seed -> workdir.
  names: dict[int, str]  # Seed -> run name.


def run_sweep(config: ml_collections.ConfigDict, specs: list[str], root: str | Path,
              parallel: int = 1, one_by_one: bool = False) -> dict[str, str]:
  """Trains every combination, the seeds of each point as one program unless `one_by_one`;
  returns run name -> "trained", "skipped", "failed: ...", "in use by another training ..."
  (another sweep trains it), "stopped by SIGTERM at step N" or "not started" (after a stop)."""
  if parallel < 1:
    raise UserError(f"--parallel={parallel} must be at least 1 (runs trained at once).")
  if parallel > 1:  # The trainers' processes share the devices; this one reads files only.
    jax.config.update("jax_platforms", "cpu")
  root = Path(root)
  runs = expand(config, specs)
  from seq2seq.training import loop  # Its check reads the loss terms and loop actions.
  for _, run in runs:
    loop.check_config(run)  # Every combination is checked before any trains.
  status = _Status()
  steps = {name: _steps(root / name, run) for name, run in runs}  # Read once.
  todo = []
  for name, run in runs:
    if steps[name] and steps[name][-1] >= run.train.num_steps:
      status.record(name, "skipped", quiet=True)
    else:
      todo.append((name, run))
  groups = _seed_groups(todo, steps, one_by_one)
  together = [group for group in groups if len(group) > 1]
  log.info("Sweep of %d runs in %s: %d finished, %d to train%s.", len(runs), root,
           len(runs) - len(todo), len(todo),
           "; seeds as one program: " + "; ".join(" + ".join(name for name, _ in group)
                                                  for group in together)
           if together else "; seeds one by one (--one_by_one)" if one_by_one else "")
  tasks = [_Task(config_lib.to_json(group[0][1]),
                 {run.train.seed: str(root / name) for name, run in group},
                 {run.train.seed: name for name, run in group}) for group in groups]
  # A run stopped by SIGTERM/SIGINT (it saved a checkpoint) stops the sweep: running the same
  # command again resumes it. Runs that did not start say so.
  if parallel <= 1:
    for task in tasks:
      try:
        status.trained(task.names, _train(task.config_json, task.workdirs))
      except Exception as e:  # noqa: BLE001 (one failure must not stop the sweep)
        status.failed(task.names, e)
      if status.stopped:
        break
  else:
    _train_in_pool(tasks, parallel, status)
  return {name: status.get(name, "not started") for name, _ in runs}


class _Status(dict):
  """Run name -> what became of it, each logged as it is recorded."""

  stopped = False  # A run was stopped by a signal: the sweep stops.

  def record(self, name: str, what: str, quiet: bool = False) -> None:
    self[name] = what
    self.stopped = self.stopped or what.startswith("stopped")
    if not quiet:
      log.info("%s: %s", name, what)

  def trained(self, names: dict[int, str], results: dict) -> None:
    """A task's results (`_train`): per seed, how it stopped, or its own error."""
    for seed, result in results.items():
      if isinstance(result, Exception):
        self.failed({seed: names[seed]}, result)
      else:
        self.record(names[seed], result or "trained")

  def failed(self, names: dict[int, str], error: Exception) -> None:
    for name in names.values():
      if isinstance(error, workdirs.WorkdirInUse):  # Another sweep's (or training's) run.
        self.record(name, f"in use by another training ({error.holder}); not trained here:"
                    " run the sweep again once it ends")
      else:
        self.record(name, f"failed: {type(error).__name__}: {error}")


def _train_in_pool(tasks: list[_Task], parallel: int, status: _Status) -> None:
  """`tasks` trained `parallel` at a time, each in a process of its own, with its share of
  each device's memory (`process.start_worker`)."""
  context = multiprocessing.get_context("spawn")  # JAX does not survive fork.
  # Each new process turns on the compilation cache, which they share (only reads race).
  with concurrent.futures.ProcessPoolExecutor(parallel, mp_context=context,
                                              initializer=process.start_worker,
                                              initargs=(parallel,)) as pool:
    futures = {pool.submit(_train, task.config_json, task.workdirs): task.names
               for task in tasks}
    try:
      _collect(futures, status, pool)
    except (signals.Interrupted, KeyboardInterrupt) as e:
      # A signal to the sweep alone (`kill PID`, a scheduler) stops its trainers too: each
      # saves its step. Their outcomes are recorded, then the sweep ends as the signal asks.
      interrupted = e
      for future in futures:
        future.cancel()  # The runs not begun.
      for worker in multiprocessing.active_children():
        os.kill(worker.pid, signal.SIGTERM)
      with signals.defer_interrupts():
        _collect(futures, status, pool, stopped_by=str(e) or "SIGINT")
        # The pool's thread tells the workers to end and waits for them. (A shutdown without
        # waiting left that to the thread, which the command's exit could cut short: once in
        # a slow run, both workers waited for work forever, each with a trainer's memory.)
        pool.shutdown(wait=True)
    else:
      return
  del pool, futures  # The pool's queues, closed before the command leaves (os._exit).
  gc.collect()
  raise interrupted


def _collect(futures: dict, status: _Status, pool, stopped_by: str = "") -> None:
  """Records each task's outcome as it ends; a stopped run stops the sweep. After a signal
  (`stopped_by`), a worker that ended without a result was stopped while it started."""
  for future in concurrent.futures.as_completed(futures):
    if future.cancelled():
      continue
    error = future.exception()
    if error is None:
      status.trained(futures[future], future.result())
      if status.stopped and not stopped_by:
        pool.shutdown(wait=True, cancel_futures=True)
    elif stopped_by:
      for name in futures[future].values():
        status.record(name, f"stopped by {stopped_by} while it started")
    else:
      status.failed(futures[future], error)
