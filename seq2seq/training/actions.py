"""The training loop's actions: what runs after a train step, each when it is due.

As clu's periodic actions and t5x's TerminateOnNanAction and EarlyStoppingAction: the
divergence check, validation with its checkpoint, the periodic checkpoint, patience
(`claim.EarlyStopping`), and the records of `reports`; and the stop signals agreed across
processes (`signals.StopSignals`). Each owns one job; `RunActions.after_step` calls a run's in
their order, then those that config.train.actions chooses from the registry `ACTIONS`.
"""

import logging
import math
import time
from pathlib import Path
from typing import NamedTuple

import jax
import optax

from seq2seq.errors import UserError
from seq2seq.registry import Registry
from seq2seq.runs import claim
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.full_disk import write_fault_is_user_error
from seq2seq.runs.metrics_writer import MetricsWriter
from seq2seq.runtime import signals
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
    self.trainer, self.checkpoints, self.label = trainer, checkpoints, label  # Before lines.
    self.writer, self.progress, self.interval = writer, progress, interval
    self.split, self.train_start = trainer.config.eval.split, time.perf_counter()

  def __call__(self, state, done: int) -> dict:
    """The validation metrics of step `done`, with `step` and `train_wall_seconds`."""
    train_wall_seconds = time.perf_counter() - self.train_start
    result = {"step": done, **self.trainer.evaluate(state.params)}
    if not math.isfinite(result["loss"]):  # Finite training losses, diverged parameters.
      raise diverged(f"{self.split} loss is {result['loss']}", done,
                     self.checkpoints.latest_step())
    result["train_wall_seconds"] = train_wall_seconds
    workdir = self.checkpoints.directory.parent  # A full disk: the checkpoint would not fit.
    with write_fault_is_user_error(f"writing the {self.split} metrics of step {done} in"
                                   f" {workdir}", self.checkpoints.latest_step):
      self.writer.write(done, self.split, result)
    self.checkpoints.save(done, state, metrics={"bleu": result["bleu"], "loss": result["loss"]})
    if self.writer.enabled:  # tqdm.write prints even where the bar is disabled.
      self.progress.write(f"{self.label}step {done}: {self.split} loss {result['loss']:.3f} BLEU"
                          f" {result['bleu']:.2f} ({result['bleu_signature']})")
    self.interval.start = time.perf_counter()  # Evaluation time is not training throughput.
    return result


# The actions that config.train.actions adds after the built-in ones, by name ("param_norm"):
# classes built per run as `cls(run: RunActions, config)`, with `due(done) -> bool` and
# `__call__(state, done)` (the run's own state), called in the config's order. Registered with
# `@register_action(name)` (docs/extending.md, "A loop action"). The built-in ones are not
# chosen: the divergence check, validation with its checkpoint, the periodic checkpoint and
# patience always run, in their order, from `RunActions.after_step`.
ACTIONS = Registry("loop action", "config.train.actions", "param_norm")
register_action = ACTIONS.register


@register_action("param_norm")
class ParamNorm:
  """The parameters' global norm, with each train record (every config.train.log_every_steps
  and after the last step): metrics.jsonl's split "param_norm", as `{"norm": ...}`. A norm
  that climbs step after step is a run about to diverge."""

  def __init__(self, run, config):
    self.writer, self.every_steps = run.writer, config.train.log_every_steps
    self.num_steps, self.norm = config.train.num_steps, jax.jit(optax.tree.norm)

  def due(self, done: int) -> bool:
    return due_every(self.every_steps, done, self.num_steps)

  def __call__(self, state, done: int) -> None:
    self.writer.write(done, "param_norm", {"norm": float(self.norm(state.params))})


class Due(NamedTuple):
  """The actions on an interval that are due after a step."""
  train_record: bool
  validation: bool  # With its checkpoint.
  checkpoint: bool  # A periodic one.
  extra: bool = False  # One of those config.train.actions chooses (`ACTIONS`).


class RunActions:
  """A run's actions: its metrics writer, interval, records, validation, checkpoints and
  patience, called by `after_step` in their order. `own_state` and `own_metrics` read the
  run's own out of what the train programs return, where they train several."""

  label = ""  # Before the run's lines where several train together.

  def __init__(self, trainer, checkpoints: Checkpoints, workdir: Path, start: int,
               progress: Progress, compile_log: CompileLog):
    config = trainer.config
    self.checkpoints, self.workdir = checkpoints, workdir
    self.num_steps, self.compile_log = config.train.num_steps, compile_log
    self.writer = MetricsWriter(workdir, start)
    compile_log.writers.append(self.writer)
    self.interval = Interval(self.own_metrics)
    self.check_finite = TerminateOnNonFinite(self.interval, checkpoints)
    self.train_log = TrainLog(config.train, self.writer, progress, self.interval)
    self.validate = ValidateAndSave(trainer, checkpoints, self.writer, progress,
                                    self.interval, self.label)
    self.every = (config.train.log_every_steps, config.eval.every_steps,  # Read by `due`.
                  config.checkpoint.every_steps)
    self.early_stopping = claim.EarlyStopping(config, checkpoints)
    self.extra = [ACTIONS[name](self, config) for name in ACTIONS.chosen(config.train.actions)]
    self.last_eval: dict = {}
    self.ended: dict | Exception | None = None  # What the run returns, once it has ended.

  def own_state(self, state):
    return state

  def own_metrics(self, metrics: dict) -> dict:
    return metrics

  @property
  def training(self) -> bool:
    return self.ended is None

  @property
  def results(self) -> list[dict | Exception]:
    """What the run returns: its last validation metrics, or how it ended."""
    return [self.ended if self.ended is not None else self.last_eval]

  def due(self, done: int) -> Due:
    """Which of the actions on an interval are due after `done`: the train record every
    config.train.log_every_steps and validation every config.eval.every_steps (both after the
    last step too), a periodic checkpoint every config.checkpoint.every_steps (0: none)."""
    record, validation, checkpoint = self.every
    return Due(due_every(record, done, self.num_steps), due_every(validation, done, self.num_steps),
               bool(checkpoint) and done % checkpoint == 0,
               any(action.due(done) for action in self.extra))

  def dispatched(self, metrics: dict, size: int) -> None:
    """A call of `size` train steps was dispatched; `metrics` are its (future) metrics."""
    if self.training:  # A run that has ended gathers nothing.
      self.interval.add(metrics, size)

  def after_step(self, state, done: int, due: Due, stopping: str | None) -> None:
    """The actions after step `done` (`state`: what the train programs returned): the
    divergence check, the train record, validation (or a periodic checkpoint), patience,
    those config.train.actions chooses; at a `stopping` signal, a checkpoint and the end."""
    if any(due) or stopping:
      self.check_finite(done)  # Before anything is saved: no checkpoint holds a diverged state.
    if due.train_record:
      self.train_log(done)
    if due.validation:
      self.compile_log.before_validation(done)  # Once, before the first run's validation.
      self.last_eval = self.validate(self.own_state(state), done)  # With a checkpoint.
      if self.early_stopping.exhausted(done) and done < self.num_steps:
        log.info("%s%s", self.label, self.early_stopping.message(done))
        self.end({**self.last_eval, "early_stopped": True})
    elif due.checkpoint:  # Kept by LatestOfSchedule only (avg:N), written in the background.
      self.checkpoints.save(done, self.own_state(state), wait=False)
    for action in self.extra if due.extra else []:
      if action.due(done):
        action(self.own_state(state), done)
    if stopping and done < self.num_steps and self.training:
      self.save_on_stop(self.own_state(state), done, stopping)
      self.end({**self.last_eval, "step": done, "interrupted": stopping})

  def end(self, result: dict | Exception) -> None:
    """The run has ended with `result`: the metrics of its steps not yet recorded are dropped,
    and none are added after (`dispatched`)."""
    self.ended = result
    self.interval.restart()

  def save_on_stop(self, state, done: int, received: str) -> None:
    """Saves step `done` (unless validation just did) and says how to resume."""
    if self.checkpoints.latest_step() != done:
      self.checkpoints.save(done, state, on_stop=True)
    log.info("%sReceived %s: saved a checkpoint at step %d in %s; run the same command to"
             " resume.", self.label, received, done, self.workdir)

  def close(self) -> None:
    self.writer.close()


class LoopActions:
  """What the loop drives: `run` (a `RunActions`, or an object with its interface that fans
  out to several runs' own), built by `make_run(progress, compile_log)`, and what they share:
  the progress bar, the compile log and the stop signals. As a context, it closes them and
  restores the signal handlers."""

  def __init__(self, trainer, start: int, make_run):
    self.progress, self.run = Progress(start, trainer.config.train.num_steps), None
    self.compile_log = CompileLog(trainer, self.progress)
    try:
      self.run = make_run(self.progress, self.compile_log)
      # Last: from here, SIGINT/SIGTERM are recorded, and every process stops after one step.
      self.stop = signals.StopSignals()
    except BaseException:
      self._close()
      raise

  def dispatched(self, metrics: dict, size: int = 1) -> None:
    """A call of `size` train steps was dispatched; `metrics` are its (future) metrics."""
    self.run.dispatched(metrics, size)
    self.progress.dispatched(metrics, size)

  def next_boundary(self, step: int, within: int) -> int:
    """The first step after `step`, at most `step + within`, at which an action is due (a
    train record, validation, a periodic checkpoint; the last step is a record's): no call of
    several steps runs past it."""
    for done in range(step + 1, step + within):
      if any(self.run.due(done)):
        return done
    return step + within

  def __enter__(self):
    return self

  def __exit__(self, *exc_info) -> None:
    self.stop.restore()
    self._close()

  def _close(self) -> None:  # The progress bar and every run's metrics writer.
    self.progress.close()
    if self.run is not None:
      self.run.close()
