"""Training: `train_and_evaluate(config, workdir)` creates or resumes the run in `workdir`;
`train_seeds(config, {seed: workdir})` trains the runs of several seeds as one program.

This module starts the run (joins its processes, takes its workdir, restores its checkpoint)
and drives the loop: it dispatches the train steps and calls the loop's actions
(`actions`: logging, validation, checkpoints, patience, stops) when they are due. The
`trainer.Trainer` holds the data and the compiled programs: pure step functions (`steps`)
jitted over a device mesh (`distributed`), the train state donated. Batches and dropout keys
are functions of the step, so a resumed run sees exactly what the uninterrupted run would
have. Across hosts (`config.distributed`), every process runs this same program on its own
rows of each global batch; only process 0 writes logs and metrics.
"""

import contextlib
import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import jax
import ml_collections

from seq2seq import config as config_lib
from seq2seq import models
from seq2seq.data import tokenizer
from seq2seq.errors import UserError
from seq2seq.runs import workdirs
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.full_disk import full_disk_is_user_error
from seq2seq.runs.match import check_run_config, save_run_config
from seq2seq.runs.train_state import TrainState
from seq2seq.runtime import compiling, signals
from seq2seq.training import actions, distributed
from seq2seq.training.trainer import Trainer

log = logging.getLogger("seq2seq")
# What an interrupted start-up leaves: the end of `cli.run_main`'s one line.
INTERRUPTED = ("nothing half-written was kept (a new run's workdir is removed until its first"
               " checkpoint)")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """Trains `config` in `workdir`, resuming if it already holds a run.

  Returns:
    The last validation metrics (with `step`), or the saved ones if the run
    was already complete.
  """
  _prepare(config)
  with signals.defer_interrupts(jax.process_count() > 1):  # Processes start and stop together.
    return _train_in(config, workdir)


def train_seeds(config: ml_collections.ConfigDict,
                workdirs: Mapping[int, str | Path]) -> dict[int, dict | Exception]:
  """Trains the run of `config` with each config.train.seed in `workdirs` (seed -> its
  workdir) as one program: a seed group (`Trainer(seeds=...)`). Each member is an ordinary
  run in its workdir, the one `train_and_evaluate` would have trained with that seed (to
  float rounding), and resumes as one or alone.

  Returns:
    Per seed: what `train_and_evaluate` returns, or the `UserError` that ended that member
    alone while the others trained on: its workdir in use or holding another run, its
    divergence, a full disk at its save. Errors of the whole group are raised.
  """
  _prepare(config)
  with signals.defer_interrupts(jax.process_count() > 1):
    return _train_group(config, {seed: Path(w) for seed, w in workdirs.items()})


def _prepare(config: ml_collections.ConfigDict) -> None:
  config_lib.validate(config)
  models.check_config(config)
  distributed.initialize_distributed(config.distributed)  # Before anything touches a device.
  compiling.check_options(config)  # XLA's word on its options, before a workdir is made.


class _Claim:
  """A workdir taken for training: checked, created if new, with its checkpoints open."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | Path):
    workdirs.check_is_run_or_new(workdir)  # The text as given: an empty one is not ".".
    workdir = Path(workdir)
    self.config, self.workdir, self.checkpoints = config, workdir, None
    workdirs.check_writable(workdir)
    self.created = jax.process_index() == 0 and workdirs.create_workdir(workdir)
    check_run_config(workdir, config)
    self.checkpoints = Checkpoints(workdir, config.checkpoint.keep)

  def latest_step(self) -> int | None:
    return self.checkpoints and self.checkpoints.latest_step()

  def finished(self) -> dict | None:
    """What the run returns if it has nothing left to train (complete, or out of patience);
    raises `UserError` if its vocabulary is gone while checkpoints need it."""
    latest, num_steps = self.latest_step(), self.config.train.num_steps
    if latest is not None and latest >= num_steps:
      log.info(f"The run in {self.workdir} is complete: its checkpoint is at step {latest} and"
               f" config.train.num_steps={num_steps}. Nothing to do; pass a larger"
               " --config.train.num_steps to train further.")
      return {"step": latest, "complete": True,
              **(self.checkpoints.manager.metrics(latest) or {})}
    early_stopping = actions.EarlyStopping(self.config, self.checkpoints)
    if latest is not None and early_stopping.exhausted(latest):
      log.info("The run in %s is complete. %s", self.workdir, early_stopping.message(latest))
      return {"step": latest, "complete": True, "early_stopped": True}
    if latest is not None and not (self.workdir / workdirs.VOCAB).is_file():
      # Retraining it would give the checkpoints a vocabulary of chance.
      raise UserError(f"{self.workdir / workdirs.VOCAB} is missing but {self.workdir} holds"
                      " checkpoints trained with it; put it back from a copy of the run, or"
                      " train in a new --workdir.")
    return None

  @contextlib.contextmanager
  def held(self):
    """Within: the run's lock. A new workdir is removed again when its start fails before the
    first checkpoint, but only by the start whose `mkdir` made it, and while it holds the
    lock: of two simultaneous first starts, the one refused the lock removes nothing."""
    with workdirs.WorkdirLock(self.workdir, enabled=jax.process_index() == 0):
      finished = False
      try:
        self._remove_leftover_vocabulary()
        yield
        finished = True
      finally:
        if self.created and not finished:  # This start made the workdir and holds its lock.
          saved = self.checkpoints.latest_step() is not None
          self.checkpoints.close()  # Waits for orbax's threads, which may create directories.
          if not saved:
            # A start that failed (or was interrupted) before its first checkpoint leaves
            # nothing; removed before the lock is released, so no other start trains in it.
            shutil.rmtree(self.workdir, ignore_errors=True)

  def _remove_leftover_vocabulary(self) -> None:
    """A vocabulary beside no config.json and no checkpoint was left by a first start killed
    before it saved its config: of a config unknown, so trained (or copied) again. Only with
    the lock held: a start in progress keeps the vocabulary it is training with."""
    vocab = self.workdir / workdirs.VOCAB.parent
    if (jax.process_index() == 0 and vocab.is_dir() and self.latest_step() is None
        and not (self.workdir / workdirs.CONFIG).exists()):
      log.info("%s holds a vocabulary but no config.json: left by a start that was stopped;"
               " training it again for this config.", self.workdir)
      shutil.rmtree(vocab)

  def close(self) -> None:
    if self.checkpoints is not None:
      self.checkpoints.close()


def _writing_in(workdir: str | Path):
  """What a full disk interrupted, for `full_disk_is_user_error`: the file its error names (the
  run's config, vocabulary or metrics), else the workdir."""
  return lambda error: f"writing {error.filename or f'in {workdir}'}"


def _train_in(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """`train_and_evaluate` once the run's processes have joined. A full disk at any write
  ends in one `UserError` line naming the last good checkpoint, which the same command
  resumes from."""
  if jax.process_index() != 0:
    log.setLevel(logging.WARNING)  # Process 0 reports for the run.
  claim = None
  with full_disk_is_user_error(_writing_in(workdir), lambda: claim and claim.latest_step()):
    try:
      claim = _Claim(config, workdir)
      if (done := claim.finished()) is not None:
        return done
      with claim.held():
        return _train(config, [claim])[0]
    finally:
      if claim is not None:
        claim.close()


def _train_group(config: ml_collections.ConfigDict,
                 runs: dict[int, Path]) -> dict[int, dict | Exception]:
  """`train_seeds` once the processes have joined: the members with steps left train as one
  program from one step (a `UserError` if they are at different steps)."""
  if jax.process_index() != 0:
    log.setLevel(logging.WARNING)
  claims, results = {}, {}
  first = next(iter(runs.values()))

  def last_step() -> int | None:  # The group's: that of every member.
    steps = [claim.latest_step() for claim in claims.values()]
    return None if not steps or None in steps else min(steps)

  with contextlib.ExitStack() as stack, full_disk_is_user_error(_writing_in(first), last_step):
    for seed, workdir in runs.items():
      member = config_lib.copied(config)
      member.train.seed = seed
      try:  # A member that does not fit its workdir ends alone; the others train.
        claim = _Claim(member, workdir)
        stack.callback(claim.close)
        if (done := claim.finished()) is not None:
          results[seed] = done
        else:
          claims[seed] = claim
      except UserError as e:
        results[seed] = e
    for seed, claim in list(claims.items()):
      try:
        stack.enter_context(claim.held())
      except workdirs.WorkdirInUse as e:  # Another training's: the other members train on.
        results[seed] = e
        del claims[seed]
    if claims:
      trained = _train(config, list(claims.values()), seeds=list(claims))
      results.update(zip(claims, trained, strict=True))
  return {seed: results[seed] for seed in runs}


def _share_vocabulary(claims: list[_Claim]) -> None:
  """A seed group's members share the first one's vocabulary (trained with one seed,
  `trainer.VOCAB_SEED`): copied where missing, checked where present."""
  if jax.process_index() != 0:
    return
  first = claims[0].workdir
  for claim in claims[1:]:
    if not (claim.workdir / workdirs.VOCAB).is_file():
      workdirs.copy_vocabulary(first, claim.workdir)
    elif tokenizer.fingerprint(claim.workdir / workdirs.VOCAB) != tokenizer.fingerprint(
        first / workdirs.VOCAB):
      raise UserError(f"{claim.workdir / workdirs.VOCAB} is not the vocabulary of"
                      f" {first / workdirs.VOCAB}: the runs cannot train as one program; train"
                      " them one by one (seq2seq-sweep --one_by_one).")


def _report_start(trainer) -> None:
  """What the run is about to train."""
  config = trainer.config
  seeds = f"; seeds {', '.join(map(str, trainer.seeds))} as one program" if trainer.seeds else ""
  log.info("Model: %s, %.2fM parameters; %d training pairs (%d dropped by length), %d batches"
           " per epoch; devices: %d%s.", config.model.family, trainer.num_params / 1e6,
           trainer.train_batches.num_examples, trainer.train_batches.num_dropped,
           trainer.train_batches.batches_per_epoch, jax.device_count(), seeds)
  if config.train.fsdp > 1:
    log.info("FSDP: %.0f%% of the parameters (every matrix) and their optimizer state are split"
             " over %d devices.", 100 * trainer.num_sharded_params / trainer.num_params,
             config.train.fsdp)


def _restore(trainer: Trainer, claims: list[_Claim]) -> tuple[TrainState, int | None]:
  """The state to train from, the latest good checkpoint's (of every member, which must be
  at one step) or a new one, and the step restored (None: new)."""
  if trainer.seeds is None:
    return claims[0].checkpoints.restore_latest_good(trainer.new_state())[::-1]
  restored = [claim.checkpoints.restore_latest_good(trainer.member_abstract)
              for claim in claims]
  steps = [step for step, _ in restored]
  if len(set(steps)) > 1:
    raise UserError("The runs " + ", ".join(f"{c.workdir} (step {s})" for c, s in
                                            zip(claims, steps, strict=True))
                    + " are at different steps and cannot resume as one program; train them"
                    " one by one (seq2seq-sweep --one_by_one).")
  if steps[0] is None:
    return trainer.new_state(), None
  return trainer.group_state([state for _, state in restored]), steps[0]


def _start(trainer: Trainer, claims: list[_Claim]) -> tuple[TrainState, int]:
  """Compiles the train step while the checkpoints are read; returns the state to train
  from and its step. The other programs compile once the first step has run
  (`actions.CompileLog`)."""
  _report_start(trainer)
  compile_start = time.perf_counter()
  trainer.compile()
  state, restored = _restore(trainer, claims)
  if jax.process_index() == 0:
    for claim in claims:
      save_run_config(claim.workdir, claim.config)  # Only once the run fits its workdir.
  if restored is not None:
    log.info("Resumed %s at step %d.", ", ".join(str(c.workdir) for c in claims), restored)
  log.info(compiling.report(trainer.train_programs, time.perf_counter() - compile_start))
  return state, int(state.step[0] if trainer.seeds else state.step)


def _train(config: ml_collections.ConfigDict, claims: list[_Claim],
           seeds: list[int] | None = None) -> list[dict | Exception]:
  """The runs themselves (one, or a seed group's members), from building the trainer to the
  last step: dispatches the train steps and calls the loop's actions when they are due.

  Returns:
    Per run, its last validation metrics, with `early_stopped` or `interrupted` (and the
    step) where patience or a signal ended it before config.train.num_steps; or the error
    that ended a group's member alone.
  """
  trainer = Trainer(config, claims[0].workdir, seeds)
  if seeds:
    _share_vocabulary(claims)
  try:
    state, start = _start(trainer, claims)
    with actions.LoopActions(trainer, [(c.checkpoints, c.workdir) for c in claims],
                                   start) as run:
      results = _loop(trainer, run, state, start)
      if not any(isinstance(r, dict) and "interrupted" in r for r in results):
        run.compile_log.at_end(max((r.get("step", config.train.num_steps) for r in results
                                    if isinstance(r, dict)), default=start))
      return results
  finally:  # A run that ends early compiles no more.
    for programs in trainer.background_programs:
      programs.cancel()


def _loop(trainer: Trainer, run: actions.LoopActions, state: TrainState,
          start: int) -> list[dict | Exception]:
  """The steps from `start`, `_train`'s loop: calls of config.train.steps_per_call steps
  where they fit before the next action (`Trainer.call_size`), single steps elsewhere; until
  every run has ended (a group's member may end early, alone)."""
  num_steps = trainer.config.train.num_steps
  run.stop.before_start(start)
  step = start
  while step < num_steps and run.training:
    size = trainer.call_size(step, run.next_boundary(step, trainer.config.train.steps_per_call))
    state, metrics = trainer.train(state, step, size)
    run.dispatched(metrics, size)
    done = step + size
    if step == start:
      run.compile_log.first_step(done, metrics)
    step = done
    due = run.due(done)
    stopping = run.stop.agreed(done, boundary=any(due))
    for member, one in run.training:
      try:
        _actions(trainer, run, one, state, member, done, due, stopping)
      except UserError as e:
        if trainer.seeds is None:
          raise
        log.error("%s%s", one.label, e)  # The other members train on.
        one.end(e)
    if stopping and done < num_steps:
      for member, one in run.training:
        one.save_on_stop(trainer.member_state(state, member), done, stopping)
        one.end({**one.last_eval, "step": done, "interrupted": stopping})
  return [one.ended if one.ended is not None else one.last_eval for one in run.runs]


def _actions(trainer: Trainer, runs: actions.LoopActions, run: actions.RunActions,
             state: TrainState, member: int, done: int, due: actions.Due,
             stopping: str | None) -> None:
  """One run's actions after step `done`: the divergence check, the train record,
  validation (or a periodic checkpoint), patience, then those of `actions.EXTRA_ACTIONS`."""
  if any(due) or stopping:
    run.check_finite(done)  # Before anything is saved: no checkpoint holds a diverged state.
  if due.train_record:
    run.train_log(done)
  if due.validation:
    runs.compile_log.before_validation(done)  # Once, before the first run's validation.
    run.last_eval = run.validate(trainer.member_state(state, member), done)  # With a checkpoint.
    if run.early_stopping.exhausted(done) and done < trainer.config.train.num_steps:
      log.info("%s%s", run.label, run.early_stopping.message(done))
      run.end({**run.last_eval, "early_stopped": True})
  elif due.checkpoint:
    run.periodic_save(trainer.member_state(state, member), done)
  if due.extra:
    for action in run.extra:
      if action.due(done):
        action(trainer.member_state(state, member), done)
