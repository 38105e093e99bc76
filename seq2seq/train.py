"""Training: `train_and_evaluate(config, workdir)` creates or resumes the run in `workdir`.

This module starts the run (joins its processes, takes its workdir, restores its checkpoint)
and drives the loop: it dispatches the train steps and calls the loop's actions
(`train_actions`: logging, validation, checkpoints, patience, stops) when they are due. The
`trainer.Trainer` holds the data and the compiled programs: pure step functions (`steps`)
jitted over a device mesh (`distributed`), the train state donated. Batches and dropout keys
are functions of the step, so a resumed run sees exactly what the uninterrupted run would
have. Across hosts (`config.distributed`), every process runs this same program on its own
rows of each global batch; only process 0 writes logs and metrics.
"""

import logging
import shutil
import time
from pathlib import Path

import jax
import ml_collections

from seq2seq import compiling, distributed, models, signals, train_actions, workdirs
from seq2seq import config as config_lib
from seq2seq.checkpoint import Checkpoints
from seq2seq.errors import UserError
from seq2seq.full_disk import full_disk_is_user_error
from seq2seq.run_match import check_run_config, save_run_config
from seq2seq.train_state import TrainState
from seq2seq.trainer import Trainer

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
  config_lib.validate(config)
  models.check_config(config)
  distributed.initialize_distributed(config.distributed)  # Before anything touches a device.
  with signals.defer_interrupts(jax.process_count() > 1):  # Processes start and stop together.
    return _train_in(config, Path(workdir))


def _train_in(config: ml_collections.ConfigDict, workdir: Path) -> dict:
  """`train_and_evaluate` once the run's processes have joined.

  A new workdir is removed again when its start fails before the first checkpoint, but only
  by the start whose `mkdir` made it, and while it holds the run's lock: of two simultaneous
  first starts, the one refused the lock removes nothing. A full disk at any write ends in one
  `UserError` line naming the last good checkpoint, which the same command resumes from.
  """
  if jax.process_index() != 0:
    log.setLevel(logging.WARNING)  # Process 0 reports for the run.
  workdirs.check_writable(workdir)
  checkpoints = None
  with full_disk_is_user_error(workdir, lambda: checkpoints and checkpoints.latest_step()):
    created = jax.process_index() == 0 and workdirs.create_workdir(workdir)
    check_run_config(workdir, config)
    num_steps = config.train.num_steps
    checkpoints = Checkpoints(workdir, config.checkpoint.keep)
    latest = checkpoints.latest_step()
    if latest is not None and latest >= num_steps:
      message = (f"The run in {workdir} is complete: its checkpoint is at step {latest} and"
                 f" config.train.num_steps={num_steps}. Nothing to do; pass a larger"
                 " --config.train.num_steps to train further.")
      log.info(message)
      checkpoints.close()
      return {"step": latest, "complete": True, **(checkpoints.manager.metrics(latest) or {})}
    early_stopping = train_actions.EarlyStopping(config, checkpoints)
    if latest is not None and early_stopping.exhausted(latest):
      log.info("The run in %s is complete. %s", workdir, early_stopping.message(latest))
      checkpoints.close()
      return {"step": latest, "complete": True, "early_stopped": True}

    if latest is not None and not (workdir / workdirs.VOCAB).is_file():
      checkpoints.close()  # Retraining it would give the checkpoints a vocabulary of chance.
      raise UserError(f"{workdir / workdirs.VOCAB} is missing but {workdir} holds checkpoints"
                      " trained with it; put it back from a copy of the run, or train in a new"
                      " --workdir.")
    try:
      with workdirs.WorkdirLock(workdir, enabled=jax.process_index() == 0):
        finished = False
        try:
          result = _train(config, workdir, checkpoints)
          finished = True
        finally:
          if created and not finished:  # This start made the workdir and holds its lock.
            saved = checkpoints.latest_step() is not None
            checkpoints.close()  # Waits for orbax's threads, which may still create directories.
            if not saved:
              # A start that failed (or was interrupted) before its first checkpoint leaves
              # nothing; removed before the lock is released, so no other start trains in it.
              shutil.rmtree(workdir, ignore_errors=True)
      return result
    finally:
      checkpoints.close()


def _report_start(trainer) -> None:
  """What the run is about to train."""
  config = trainer.config
  log.info("Model: %s, %.2fM parameters; %d training pairs (%d dropped by length), %d batches"
           " per epoch; devices: %d.", config.model.family, trainer.num_params / 1e6,
           trainer.train_batches.num_examples, trainer.train_batches.num_dropped,
           trainer.train_batches.batches_per_epoch, jax.device_count())
  if config.train.fsdp > 1:
    log.info("FSDP: %.0f%% of the parameters (every matrix) and their optimizer state are split"
             " over %d devices.", 100 * trainer.num_sharded_params / trainer.num_params,
             config.train.fsdp)


def _start(trainer: Trainer, workdir: Path, checkpoints: Checkpoints) -> tuple[TrainState, int]:
  """Compiles the train step while the checkpoint is read; returns the state to train from
  (the latest good checkpoint's, or a new one) and its step. The other programs compile
  once the first step has run (`train_actions.CompileLog`)."""
  _report_start(trainer)
  compile_start = time.perf_counter()
  trainer.compile()
  restored, state = checkpoints.restore_latest_good(trainer.new_state())
  if jax.process_index() == 0:
    save_run_config(workdir, trainer.config)  # Only once the run fits its workdir.
  if restored is not None:
    log.info("Resumed %s at step %d.", workdir, restored)
  start = int(state.step)
  log.info(compiling.report(trainer.train_programs, time.perf_counter() - compile_start))
  return state, start


def _train(config: ml_collections.ConfigDict, workdir: Path, checkpoints: Checkpoints) -> dict:
  """The run itself, from building the trainer to the last step (see `train_and_evaluate`):
  dispatches the train steps and calls the loop's actions when they are due.

  Returns:
    The last validation metrics, with `early_stopped` or `interrupted` (and the step) where
    patience or a signal ended the run before config.train.num_steps.
  """
  num_steps = config.train.num_steps
  trainer = Trainer(config, workdir)
  try:
    state, start = _start(trainer, workdir, checkpoints)
    with train_actions.LoopActions(trainer, checkpoints, workdir, start) as run:
      result = _loop(trainer, run, state, start)
      if "interrupted" not in result:
        run.compile_log.at_end(int(result.get("step", num_steps)))
      return result
  finally:  # A run that ends early compiles no more.
    for programs in trainer.background_programs:
      programs.cancel()


def _loop(trainer: Trainer, run: train_actions.LoopActions, state: TrainState,
          start: int) -> dict:
  """The steps from `start`, `_train`'s loop: calls of config.train.steps_per_call steps
  where they fit before the next action (`Trainer.call_size`), single steps elsewhere."""
  num_steps = trainer.config.train.num_steps
  last_eval = {}
  run.stop.before_start(start)
  step = start
  while step < num_steps:
    size = trainer.call_size(step, run.next_boundary(step, trainer.config.train.steps_per_call))
    state, metrics = trainer.train(state, step, size)
    run.dispatched(metrics, size)
    done = step + size
    if step == start:
      run.compile_log.first_step(done, metrics)
    step = done
    log_now, evaluate_now = run.train_log.due(done), run.validate.due(done)
    save_now = run.periodic_save.due(done)
    stopping = run.stop.agreed(done, boundary=log_now or evaluate_now or save_now)
    if log_now or evaluate_now or save_now or stopping:
      run.check_finite(done)  # Before anything is saved: no checkpoint holds a diverged state.
    if log_now:
      run.train_log(done)
    if evaluate_now:
      run.compile_log.before_validation(done)
      last_eval = run.validate(state, done)  # Saves the checkpoint of `done` too.
      if run.early_stopping.exhausted(done) and done < num_steps:
        log.info(run.early_stopping.message(done))
        return {**last_eval, "early_stopped": True}
    elif save_now:
      run.periodic_save(state, done)
    if stopping and done < num_steps:
      run.stop(state, done, stopping)
      return {**last_eval, "step": done, "interrupted": stopping}
  return last_eval
