"""The training loop's actions: what runs after a train step, each when it is due.

In the spirit of clu's periodic actions and t5x's TerminateOnNanAction and
EarlyStoppingAction, the driver (`train._train`) dispatches the steps and calls these:
the progress bar, the divergence (non-finite) check, the train record, validation with its
checkpoint, the periodic checkpoint, patience, and stops agreed across processes. Each owns
one job; the driver owns their order and what the run returns.
"""

import collections
import logging
import math
import time
from pathlib import Path

import jax
import ml_collections
import tqdm

from seq2seq import compiling, signals
from seq2seq.checkpoint import Checkpoints
from seq2seq.errors import UserError
from seq2seq.full_disk import full_disk_error
from seq2seq.metrics_writer import MetricsWriter
from seq2seq.train_state import learning_rate_schedule

log = logging.getLogger("seq2seq")

MAX_STEPS_AHEAD = 2  # Train calls (of config.train.steps_per_call steps) dispatched but not
# finished, at most.


def _every(steps: int, done: int, num_steps: int) -> bool:
  """Whether an action every `steps` steps (and after the last) runs after step `done`."""
  return done % steps == 0 or done == num_steps


class Progress:
  """The progress bar (process 0's only). It counts finished steps, asking without waiting:
  no host sync per step. It also keeps dispatch at most MAX_STEPS_AHEAD steps ahead."""

  def __init__(self, start: int, num_steps: int):
    self.bar = tqdm.tqdm(total=num_steps, initial=start, unit="step", dynamic_ncols=True,
                         mininterval=2.0, disable=jax.process_index() != 0)
    self.unshown = collections.deque()  # Dispatched steps not yet counted by the bar.

  def dispatched(self, metrics: dict, size: int = 1) -> None:
    """A call of `size` train steps was dispatched; `metrics` are its (future) metrics."""
    self.unshown.append((metrics["tokens"], size))
    while self.unshown and self.unshown[0][0].is_ready():
      self.bar.update(self.unshown.popleft()[1])
    if len(self.unshown) > MAX_STEPS_AHEAD:
      # Dispatch runs at most this far ahead of the device: a signal stops within a few
      # calls, the bar stays current, and queued batches do not pile up in memory.
      tokens, size = self.unshown.popleft()
      tokens.block_until_ready()
      self.bar.update(size)

  def logged(self, done: int, record: dict) -> None:
    """Every step up to `done` has finished (its record was fetched)."""
    self.bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_sec']:.0f}")
    self.bar.update(done - self.bar.n)
    self.unshown.clear()

  def write(self, line: str) -> None:
    self.bar.write(line)

  def close(self) -> None:
    self.bar.close()


class Interval:
  """The steps since the last train record: their metrics, and when their training began.
  A seed group's member (`member`: its index) reads its own of the group's stacked metrics."""

  def __init__(self, member: int | None = None):
    self.member = member
    self.restart()

  def restart(self) -> None:
    self.calls, self.metrics, self.start = [], [], time.perf_counter()

  def add(self, metrics: dict, size: int) -> None:
    """A call of `size` steps: its metrics (on the device; stacked `[size]` if size > 1)."""
    self.calls.append((metrics, size))

  def unchecked(self) -> list[dict]:
    """Per step, the metrics of the calls not yet checked, fetched to the host once: they
    stay there (`metrics`, every step's since the record) for the log."""
    fetched = []
    for metrics, size in jax.device_get(self.calls):  # One transfer, however many members.
      if self.member is not None:
        metrics = {k: v[self.member] for k, v in metrics.items()}
      fetched += [metrics] if size == 1 else [{k: v[i] for k, v in metrics.items()}
                                              for i in range(size)]
    self.calls = []
    self.metrics += fetched
    return fetched


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


def train_record(metrics: list[dict], elapsed: float, learning_rate: float) -> dict:
  """The log record of an interval's steps (their metrics on the host)."""
  summed = jax.tree.map(lambda *xs: float(sum(xs)), *metrics)
  tokens = max(summed["tokens"], 1.0)
  return {"loss": summed["loss"] / tokens, "nll": summed["nll"] / tokens,
          "grad_norm": summed["grad_norm"] / len(metrics), "learning_rate": learning_rate,
          "tokens_per_sec": summed["tokens"] / elapsed,
          "tokens_per_step": summed["tokens"] / len(metrics)}  # Real target tokens.


class TrainLog:
  """Every config.train.log_every_steps: the interval's train record, to the metrics and
  the progress bar."""

  def __init__(self, t: ml_collections.ConfigDict, writer: MetricsWriter, progress: Progress,
               interval: Interval):
    self.every_steps, self.num_steps = t.log_every_steps, t.num_steps
    self.schedule = learning_rate_schedule(t)
    self.writer, self.progress, self.interval = writer, progress, interval

  def due(self, done: int) -> bool:
    return _every(self.every_steps, done, self.num_steps)

  def __call__(self, done: int) -> None:
    record = train_record(self.interval.metrics, time.perf_counter() - self.interval.start,
                          float(self.schedule(done - 1)))  # The rate of the interval's last step.
    self.writer.write(done, "train", record)
    self.progress.logged(done, record)
    self.interval.restart()


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
    return _every(self.every_steps, done, self.num_steps)

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


class CompileLog:
  """What compiling cost the run, in the log and in metrics.jsonl (split "compile"): when the
  first step finished, counted from the process's start, and per program its seconds and
  whether the persistent cache held it. Waiting for programs compiled in the background is
  one line, and only where they are not ready when needed."""

  def __init__(self, trainer, writers: list[MetricsWriter], progress: Progress):
    self.trainer, self.writers, self.progress = trainer, writers, progress  # A writer per run.
    self.validation_recorded = False

  def _say(self, line: str) -> None:
    if self.writers[0].enabled:
      self.progress.write(line)

  def _write(self, done: int, record: dict) -> None:
    for writer in self.writers:
      writer.write(done, "compile", record)

  def _wait(self, done: int, groups: list[compiling.Programs], needed_by: str) -> None:
    """Waits for `groups` (saying so if they are not ready) and records them at `done`."""
    groups = [group for group in groups if len(group)]
    if not groups:
      return
    start = time.perf_counter()
    if not all(group.ready() for group in groups):
      self._say(f"step {done}: {needed_by} waits for its programs ({compiling.kinds(groups)})"
                " to finish compiling in the background.")
    records = compiling.records(groups)
    self._write(done, {"waited_seconds": time.perf_counter() - start, "programs": records})

  def first_step(self, done: int, metrics: dict) -> None:
    """After the run's first step (`done`), once its `metrics` are computed: records when,
    and starts compiling the other programs (so that they do not slow the first step)."""
    jax.block_until_ready(metrics)
    seconds = compiling.process_seconds()
    self._write(done, {"seconds_to_first_step": seconds,
                       "programs": compiling.records(self.trainer.train_programs)})
    self.trainer.compile_background()
    background = compiling.kinds(self.trainer.background_programs)
    self._say(f"step {done}: finished {seconds:.1f} s after the process started"
              + (f"; compiling {background} in the background." if background else "."))

  def before_validation(self, done: int) -> None:
    if not self.validation_recorded:
      self._wait(done, self.trainer.validation_programs, "validation")
      self.validation_recorded = True

  def at_end(self, done: int) -> None:
    """Waits for the programs compiled in the background but not for validation (the
    evaluation commands' searches): the persistent cache then holds them."""
    validation = self.trainer.validation_programs
    self._wait(done, [group for group in self.trainer.background_programs
                      if group not in validation], "the end of training")


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
    self.last_eval: dict = {}
    self.ended: dict | Exception | None = None  # What the run returns, once it has ended.

  def save_on_stop(self, state, done: int, received: str) -> None:
    """Saves step `done` (unless validation just did) and says how to resume."""
    if self.checkpoints.latest_step() != done:
      self.checkpoints.save(done, state)
    log.info("%sReceived %s: saved a checkpoint at step %d in %s; run the same command to"
             " resume.", self.label, received, done, self.workdir)


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
    for run in self.runs:
      run.interval.add(metrics, size)
    self.progress.dispatched(metrics, size)

  def due(self, done: int) -> tuple[bool, bool, bool]:
    """Whether a train record, validation and a periodic checkpoint are due after `done`
    (the same for every run trained together: they share the config's intervals)."""
    run = self.runs[0]
    return run.train_log.due(done), run.validate.due(done), run.periodic_save.due(done)

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
