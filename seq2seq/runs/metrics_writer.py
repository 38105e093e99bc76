"""A run's metrics log: `metrics.jsonl` (one JSON record per line) and TensorBoard events.

Only process 0 writes. A resumed run first drops the records written after its checkpoint,
so that every step appears once.
"""

import json
import math
from pathlib import Path

import jax

from seq2seq.data.textio import write_atomically
from seq2seq.runs import workdirs


def _truncate_jsonl(path: Path, last_step: int) -> None:
  """Keeps the records of `path` with `step <= last_step` (atomically: a kill leaves either)."""
  if not path.is_file():
    return
  def step_of(line: str) -> float:
    try:
      return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
      return math.inf  # A line torn by a kill: dropped with the steps after the checkpoint.

  lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
  kept = [line for line in lines if step_of(line) <= last_step]
  if len(kept) == len(lines):
    return
  write_atomically(path, "".join(kept))


class MetricsWriter:
  """`metrics.jsonl` and TensorBoard events; silent on all but process 0."""

  def __init__(self, workdir: Path, start_step: int = 0):
    """Appends to the run's metrics; records after `start_step` (written before a resume from
    an earlier checkpoint) are dropped first, so that every step appears once."""
    self.enabled = jax.process_index() == 0
    if self.enabled:
      _truncate_jsonl(workdir / workdirs.METRICS, start_step)
      import tensorboardX  # Only the writing process needs it.
      self.jsonl = open(workdir / workdirs.METRICS, "a", encoding="utf-8")  # noqa: SIM115
      self.tensorboard = tensorboardX.SummaryWriter(str(workdir / workdirs.TENSORBOARD))

  def write(self, step: int, split: str, metrics: dict) -> None:
    if not self.enabled:
      return
    self.jsonl.write(json.dumps({"step": step, "split": split, **metrics}) + "\n")
    self.jsonl.flush()
    for name, value in metrics.items():
      if isinstance(value, (int, float)):
        self.tensorboard.add_scalar(f"{split}/{name}", value, step)
    self.tensorboard.flush()

  def close(self) -> None:
    if self.enabled:
      self.jsonl.close()
      self.tensorboard.close()
