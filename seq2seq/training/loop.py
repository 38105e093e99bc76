"""Training: `train_and_evaluate(config, workdir)` creates or resumes the run in `workdir`.

This module starts the run (joins its processes, takes its workdir, restores its checkpoint)
and drives the loop: it dispatches the train steps of the `trainer.Trainer` (pure `steps`,
jitted) and calls the run's `actions` when they are due. Batches and dropout keys are
functions of the step, so a resumed run sees what the uninterrupted run would have. Across
hosts, every process runs this program on its rows of each batch; process 0 writes.
"""

import contextlib
import logging
import time
from pathlib import Path

import jax
import ml_collections

from seq2seq import config as config_lib
from seq2seq import models
from seq2seq.runs import parents
from seq2seq.runs.claim import Claim, writing_in
from seq2seq.runs.full_disk import write_fault_is_user_error
from seq2seq.runs.match import save_run_config
from seq2seq.runs.train_state import TrainState
from seq2seq.runtime import compiling, distributed, signals
from seq2seq.training import actions, steps
from seq2seq.training.trainer import Trainer

log = logging.getLogger("seq2seq")
# What an interrupted start-up leaves: the end of `cli.run_main`'s one line.
INTERRUPTED = ("nothing half-written was kept (a new run's workdir is removed until its first"
               " checkpoint)")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """Trains `config` in `workdir`, resuming if it already holds a run. A full disk at any
  write ends in one `UserError` line naming the last good checkpoint, which the same command
  resumes from.

  Returns:
    The last validation metrics (with `step`), or the saved ones if the run
    was already complete.
  """
  claim = None
  with started(config), write_fault_is_user_error(writing_in(workdir),
                                                lambda: claim and claim.latest_step()):
    try:
      claim = Claim(config, workdir)
      if (done := claim.finished()) is not None:
        return done
      with claim.held():
        parent = parents.of(config, claim.workdir, claim.latest_step())  # Before compiling.
        trainer = Trainer(config, claim.workdir)
        state, step = compile_and_restore(trainer, [claim], lambda: (
            claim.checkpoints.restore_latest_good(
                trainer.run_abstract, parents.starter(trainer, parent, [claim.workdir]))))
        return run_loop(trainer, state, step, lambda progress, compile_log: actions.RunActions(
            trainer, claim.checkpoints, claim.workdir, step, progress, compile_log))[0]
    finally:
      if claim is not None:
        claim.close()


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises `UserError` in one line if `config` cannot train: a bad field (`config.validate`,
  `parents.check_fields`), what its model family cannot build (`models.check_config`), or a
  loss term or loop action it chooses that is not registered (`steps.LOSS_TERMS`,
  `actions.ACTIONS`; `models.check_config` imports the run's own files that may register
  them first, `config.train.extensions`)."""
  config_lib.validate(config)
  parents.check_fields(config)
  models.check_config(config)
  steps.LOSS_TERMS.chosen(config.train.loss_terms)
  actions.ACTIONS.chosen(config.train.actions)


@contextlib.contextmanager
def started(config: ml_collections.ConfigDict):
  """Checks `config` (`check_config`) and joins the run's processes; within, they start and
  stop together (interrupts deferred), and process 0 reports for the run."""
  check_config(config)
  distributed.initialize_distributed(config.distributed)  # Before anything touches a device.
  compiling.check_options(config)  # XLA's word on its options, before a workdir is made.
  if jax.process_index() != 0:
    log.setLevel(logging.WARNING)
  with signals.defer_interrupts(jax.process_count() > 1):
    yield


def compile_and_restore(trainer: Trainer, claims: list[Claim], restore) -> tuple[TrainState, int]:
  """Says what the run is about to train, and compiles the train step while the checkpoints
  are read (`restore()`: the step restored, None if new, and the state); returns the state to
  train from and its step (a new run's: `Trainer.start_step`). The other programs compile once
  the first step has run (`reports.CompileLog`)."""
  config, batches = trainer.config, trainer.train_batches
  log.info("Model: %s, %.2fM parameters; %d training pairs (%d dropped by length), %d batches"
           " per epoch; devices: %d.", config.model.family, trainer.num_params / 1e6,
           batches.num_examples, batches.num_dropped, batches.batches_per_epoch,
           jax.device_count())
  if config.train.fsdp > 1:
    log.info("FSDP: %.0f%% of the parameters (every matrix) and their optimizer state are split"
             " over %d devices.", 100 * trainer.num_sharded_params / trainer.num_params,
             config.train.fsdp)
  compile_start = time.perf_counter()
  trainer.compile()
  restored, state = restore()
  if jax.process_index() == 0:
    for claim in claims:
      save_run_config(claim.workdir, claim.config)  # Only once the run fits its workdir.
  if restored is not None:
    log.info("Resumed %s at step %d.", ", ".join(str(c.workdir) for c in claims), restored)
  log.info(compiling.report(trainer.train_programs, compile_start))
  return state, restored or trainer.start_step


def run_loop(trainer: Trainer, state: TrainState, step: int, make_run) -> list[dict | Exception]:
  """From `step` to the last step: dispatches the train steps and calls the actions of the
  run that `make_run(progress, compile_log)` builds (`actions.LoopActions`) when they are due.

  Returns:
    Per run (`RunActions.results`), its last validation metrics, with `early_stopped` or
    `interrupted` (and the step) where patience or a signal ended it before
    config.train.num_steps; or the error that ended one of several runs trained together.
  """
  try:
    with actions.LoopActions(trainer, step, make_run) as loop:
      results = _loop(trainer, loop, state, step)
      if not any(isinstance(r, dict) and "interrupted" in r for r in results):
        loop.compile_log.at_end(max((r.get("step", trainer.config.train.num_steps)
                                     for r in results if isinstance(r, dict)), default=step))
      return results
  finally:  # A run that ends early compiles no more.
    for programs in trainer.background_programs:
      programs.cancel()


def _loop(trainer: Trainer, loop: actions.LoopActions, state: TrainState,
          start: int) -> list[dict | Exception]:
  """The steps from `start`, `run_loop`'s loop: calls of config.train.steps_per_call steps
  where they fit before the next action (`Trainer.call_size`), single steps elsewhere; until
  the run has ended."""
  num_steps, run = trainer.config.train.num_steps, loop.run
  if early := loop.stop.agreed(start, boundary=True):  # A signal during start-up, anywhere.
    raise signals.Interrupted(early)
  step = start
  while step < num_steps and run.training:
    size = trainer.call_size(step, loop.next_boundary(step, trainer.config.train.steps_per_call))
    state, metrics = trainer.train(state, step, size)
    loop.dispatched(metrics, size)
    done = step + size
    if step == start:
      loop.compile_log.first_step(done, metrics)
    step = done
    due = run.due(done)
    stopping = loop.stop.agreed(done, boundary=any(due))
    run.after_step(state, done, due, stopping)
  return run.results
