"""What the training loop tells the user as it goes: the progress bar (`Progress`), each
train record (`TrainLog`) and what it compiled, and when (`CompileLog`)."""

import collections
import logging
import time

import jax
import ml_collections
import tqdm

from seq2seq.runs.metrics_writer import MetricsWriter
from seq2seq.runs.train_state import learning_rate_schedule
from seq2seq.runtime import compiling

log = logging.getLogger("seq2seq")

MAX_STEPS_AHEAD = 2  # Train calls dispatched but not finished, at most.


def due_every(steps: int, done: int, num_steps: int) -> bool:
  """Whether an action every `steps` steps (and after the last) runs after step `done`."""
  return done % steps == 0 or done == num_steps


class Interval:
  """The steps since the last train record: their metrics, and when their training began.
  `view` picks the run's own metrics out of what a train call returns (`RunActions`)."""

  def __init__(self, view):
    self.view = view
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
    for metrics, size in jax.device_get(self.calls):  # One transfer for them all.
      metrics = self.view(metrics)
      fetched += [metrics] if size == 1 else [{k: v[i] for k, v in metrics.items()}
                                              for i in range(size)]
    self.calls = []
    self.metrics += fetched
    return fetched


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


def train_record(metrics: list[dict], elapsed: float, learning_rate: float) -> dict:
  """The log record of an interval's steps (their metrics on the host): every metric the
  train step sums over target tokens (`loss`, `nll`, and any `steps.loss_terms`) per token,
  the mean gradient norm, the rate and the throughput."""
  summed = jax.tree.map(lambda *xs: float(sum(xs)), *metrics)
  tokens = max(summed["tokens"], 1.0)
  per_token = {name: total / tokens for name, total in summed.items()
               if name not in ("tokens", "grad_norm")}
  return {**per_token, "grad_norm": summed["grad_norm"] / len(metrics),
          "learning_rate": learning_rate, "tokens_per_sec": summed["tokens"] / elapsed,
          "tokens_per_step": summed["tokens"] / len(metrics)}  # Real target tokens.


class TrainLog:
  """Every config.train.log_every_steps: the interval's train record, to the metrics and
  the progress bar."""

  def __init__(self, t: ml_collections.ConfigDict, writer: MetricsWriter, progress: Progress,
               interval: Interval):
    self.schedule = learning_rate_schedule(t)
    self.writer, self.progress, self.interval = writer, progress, interval

  def __call__(self, done: int) -> None:
    record = train_record(self.interval.metrics, time.perf_counter() - self.interval.start,
                          float(self.schedule(done - 1)))  # The rate of the interval's last step.
    self.writer.write(done, "train", record)
    self.progress.logged(done, record)
    self.interval.restart()


class CompileLog:
  """What compiling cost the run, in the log and in metrics.jsonl (split "compile"): when the
  first step finished, counted from the process's start, and per program its seconds and
  whether the persistent cache held it. Waiting for programs compiled in the background is
  one line, and only where they are not ready when needed."""

  def __init__(self, trainer, progress: Progress):
    self.trainer, self.progress = trainer, progress
    self.writers: list[MetricsWriter] = []  # A writer per run: each `RunActions` adds its own.
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
