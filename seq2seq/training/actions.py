"""The training loop's actions: what runs after a train step, each when it is due.

In the spirit of clu's periodic actions and t5x's TerminateOnNanAction and
EarlyStoppingAction, the driver (`loop._train`) dispatches the steps and calls these:
the divergence (non-finite) check, validation with its checkpoint, the periodic checkpoint,
patience, and stops agreed across processes; and those of `reports`: the progress bar, the
train record and the compile log. Each owns
one job; the driver owns their order and what the run returns.
"""

import logging
import math
import time
from pathlib import Path
from typing import NamedTuple

import ml_collections

from seq2seq.errors import UserError
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.full_disk import full_disk_error
from seq2seq.runtime import signals
from seq2seq.training.metrics_writer import MetricsWriter
from seq2seq.training.reports import CompileLog, Interval, Progress, TrainLog, due_every

log = logging.getLogger("seq2seq")

def diverged(what: str, step: int, last_checkpoint: int | None) -> UserError:
  """The error that ends a diverged run: what was not finite, and where to resume from."""
  where = (f"the last good checkpoint is step {last_checkpoint}" if last_checkpoint is not None
           else "no checkpoint was saved yet")
  return UserError(f"The {what} at step {step}; {where}. Lower config.train.learning_rate or"
                   " raise config.train.warmup_steps.")


class TerminateOnNonFinite:
  """Stops training at the first unchecked step whose loss or gradient norm is not finite:
  its update spoiled the parameters. Called before anything is saved, so that no checkpoint
  holds a diverged state."""

  def __init__(self, interval: Interval, checkpoints: Checkpoints):
    self.interval, self.checkpoints = interval, checkpoints

  def __call__(self, done: int) -> None:
    """Checks the interval's unchecked steps, the last of which is `done`."""
    fetched = self.interval.unchecked()
    for i, m in enumerate(fetched):
      loss, grad_norm = float(m["loss"]), float(m["grad_norm"])
      if not (math.isfinite(loss) and math.isfinite(grad_norm)):  # (Not waiting for a write.)
        raise diverged(f"training loss is {loss} (gradient norm {grad_norm})",
                       done - len(fetched) + i + 1, self.checkpoints.latest_step())


class ValidateAndSave:
  """Every config.eval.every_steps: validation, then the checkpoint with its metrics (which
  `best` and patience read). A diverged validation loss stops the run instead."""

  def __init__(self, trainer, checkpoints: Checkpoints, writer: MetricsWriter,
               progress: Progress, interval: Interval, label: str = ""):
    self.trainer, self.checkpoints = trainer, checkpoints
    self.writer, self.progress, self.interval = writer, progress, interval
    self.label = label  # A seed group's member: "seed 1: " before its lines.
    self.every_steps = trainer.config.eval.every_steps
    self.num_steps = trainer.config.train.num_steps
    self.split = trainer.config.eval.split
    self.train_start = time.perf_counter()

  def due(self, done: int) -> bool:
    return due_every(self.every_steps, done, self.num_steps)

  def __call__(self, state, done: int) -> dict:
    """The validation metrics of step `done`, with `step` and `train_wall_seconds`."""
    train_wall_seconds = time.perf_counter() - self.train_start
    result = {"step": done, **self.trainer.evaluate(state.params)}
    if not math.isfinite(result["loss"]):  # Finite training losses, diverged parameters.
      raise diverged(f"{self.split} loss is {result['loss']}", done,
                     self.checkpoints.latest_step())
    result["train_wall_seconds"] = train_wall_seconds
    self._write(done, result)
    self.checkpoints.save(done, state, metrics={"bleu": result["bleu"], "loss": result["loss"]})
    if self.writer.enabled:  # tqdm.write prints even where the bar is disabled.
      self.progress.write(f"{self.label}step {done}: {self.split} loss {result['loss']:.3f} BLEU"
                          f" {result['bleu']:.2f} ({result['bleu_signature']})")
    self.interval.start = time.perf_counter()  # Evaluation time is not training throughput.
    return result

  def _write(self, done: int, result: dict) -> None:
    try:
      self.writer.write(done, self.split, result)
    except OSError as e:  # The checkpoint would not fit either.
      workdir = self.checkpoints.directory.parent
      error = full_disk_error(e, f"writing the {self.split} metrics of step {done} in {workdir}",
                              self.checkpoints.latest_step())
      if error is None:
        raise
      raise error from e


class PeriodicSave:
  """Every config.checkpoint.every_steps (0: never), a checkpoint without metrics: kept by
  the LatestN policy only, e.g. for --checkpoint=avg:N."""

  def __init__(self, every_steps: int, checkpoints: Checkpoints):
    self.every_steps, self.checkpoints = every_steps, checkpoints

  def due(self, done: int) -> bool:
    return bool(self.every_steps) and done % self.every_steps == 0

  def __call__(self, state, done: int) -> None:
    # Written while training goes on: the next save or read of the steps waits for it.
    self.checkpoints.save(done, state, wait=False)


def evaluations_without_improvement(checkpoints: Checkpoints, step: int,
                                    every_steps: int) -> int:
  """Evaluations in (best step, `step`]: evaluations happen at multiples of `every_steps`,
  so this is a function of the checkpoints alone and a resumed run counts as it would have."""
  best = checkpoints.best_step()
  return 0 if best is None else step // every_steps - best // every_steps


class EarlyStopping:
  """Patience (config.train.patience, 0: none): the run stops once validation BLEU has not
  improved for that many evaluations. Read from the checkpoints' metrics alone, so a resumed
  run stops where the uninterrupted one would have."""

  def __init__(self, config: ml_collections.ConfigDict, checkpoints: Checkpoints):
    self.patience, self.every_steps = config.train.patience, config.eval.every_steps
    self.checkpoints = checkpoints

  def exhausted(self, step: int) -> bool:
    """Whether the evaluations up to `step` end the run."""
    return bool(self.patience) and evaluations_without_improvement(
        self.checkpoints, step, self.every_steps) >= self.patience

  def message(self, step: int) -> str:
    best = self.checkpoints.best_step()
    bleu = self.checkpoints.manager.metrics(best)["bleu"]
    return (f"Stopped early at step {step}: validation BLEU has not improved for"
            f" {self.patience} evaluations (config.train.patience); the best is {bleu:.2f} at"
            f" step {best}.")


class AgreedStop:
  """SIGINT/SIGTERM during the loop: every process stops after the same step
  (`signals.StopSignals`); each run saves a checkpoint of it (`RunActions.save_on_stop`)."""

  def __init__(self):  # Installs the handlers.
    self.signals = signals.StopSignals()

  def before_start(self, start: int) -> None:
    """A signal during start-up, on any process, ends the run before its first step."""
    if early := self.signals.agreed(start, boundary=True):
      raise signals.Interrupted(early)

  def agreed(self, done: int, boundary: bool) -> str | None:
    """The signal to stop after step `done` (read once: one arriving later stops a later
    step); `boundary`: a step that logs, evaluates or saves, where several processes always
    compare their records."""
    return self.signals.agreed(done, boundary)


# Actions of your own, run after the built-in ones when due: each a class built per run as
# `cls(run: RunActions, config)`, with `due(done) -> bool` and `__call__(state, done)` (the
# run's own state: a seed group's member's). docs/extending.md, "Adding an action to the
# training loop"; a new one is its class plus one line here.
EXTRA_ACTIONS: list[type] = []


class RunActions:
  """One run's actions: its metrics writer, interval, records, validation, checkpoints and
  patience. A seed group has one per member (`member`, its index in the group's arrays)."""

  def __init__(self, trainer, checkpoints: Checkpoints, workdir: Path, start: int,
               progress: Progress, member: int | None = None):
    config = trainer.config
    self.checkpoints, self.workdir = checkpoints, workdir
    self.label = f"seed {trainer.seeds[member]}: " if member is not None else ""
    self.writer = MetricsWriter(workdir, start)
    self.interval = Interval(member)
    self.check_finite = TerminateOnNonFinite(self.interval, checkpoints)
    self.train_log = TrainLog(config.train, self.writer, progress, self.interval)
    self.validate = ValidateAndSave(trainer, checkpoints, self.writer, progress,
                                    self.interval, self.label)
    self.periodic_save = PeriodicSave(config.checkpoint.every_steps, checkpoints)
    self.early_stopping = EarlyStopping(config, checkpoints)
    self.extra = [action(self, config) for action in EXTRA_ACTIONS]
    self.last_eval: dict = {}
    self.ended: dict | Exception | None = None  # What the run returns, once it has ended.

  def end(self, result: dict | Exception) -> None:
    """The run has ended with `result`: the metrics of its steps not yet recorded are dropped,
    and none are added after (`LoopActions.dispatched`)."""
    self.ended = result
    self.interval.restart()

  def save_on_stop(self, state, done: int, received: str) -> None:
    """Saves step `done` (unless validation just did) and says how to resume."""
    if self.checkpoints.latest_step() != done:
      self.checkpoints.save(done, state)
    log.info("%sReceived %s: saved a checkpoint at step %d in %s; run the same command to"
             " resume.", self.label, received, done, self.workdir)


class Due(NamedTuple):
  """The actions on an interval that are due after a step."""
  train_record: bool
  validation: bool  # With its checkpoint.
  checkpoint: bool  # A periodic one.
  extra: bool = False  # One of EXTRA_ACTIONS.


class LoopActions:
  """The actions of the runs trained together (one, or a seed group's members) and what they
  share: the progress bar and the compile log. As a context, it closes them and restores the
  signal handlers."""

  def __init__(self, trainer, runs: list[tuple[Checkpoints, Path]], start: int):
    self.progress, self.runs = Progress(start, trainer.config.train.num_steps), []
    try:
      for i, (checkpoints, workdir) in enumerate(runs):
        self.runs.append(RunActions(trainer, checkpoints, workdir, start, self.progress,
                                    None if trainer.seeds is None else i))
      self.compile_log = CompileLog(trainer, [run.writer for run in self.runs], self.progress)
      self.stop = AgreedStop()  # Last: from here, signals are recorded.
    except BaseException:
      self._close()
      raise

  @property
  def training(self) -> list[tuple[int, RunActions]]:
    """The runs that have not ended, with their member index."""
    return [(i, run) for i, run in enumerate(self.runs) if run.ended is None]

  def dispatched(self, metrics: dict, size: int = 1) -> None:
    """A call of `size` train steps was dispatched; `metrics` are its (future) metrics."""
    for _, run in self.training:  # A member that has ended gathers nothing.
      run.interval.add(metrics, size)
    self.progress.dispatched(metrics, size)

  def due(self, done: int) -> "Due":
    """Which of the actions on an interval are due after `done` (the same for every run
    trained together: they share the config's intervals)."""
    run = self.runs[0]
    return Due(run.train_log.due(done), run.validate.due(done), run.periodic_save.due(done),
               any(action.due(done) for action in run.extra))

  def next_boundary(self, step: int, within: int) -> int:
    """The first step after `step`, at most `step + within`, at which an action is due (a
    train record, validation, a periodic checkpoint; the last step is a record's): no call of
    several steps runs past it."""
    for done in range(step + 1, step + within):
      if any(self.due(done)):
        return done
    return step + within

  def __enter__(self):
    return self

  def __exit__(self, *exc_info) -> None:
    self.stop.signals.restore()
    self._close()

  def _close(self) -> None:  # The progress bar and every run's metrics writer.
    self.progress.close()
    for run in self.runs:
      run.writer.close()
