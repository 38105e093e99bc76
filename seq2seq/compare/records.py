"""The compared runs (`Run`): each checked to be a run, named once (`check_runs`), and its
training record: what its metrics.jsonl says of its training (steps, minutes, throughput) and
its validation curve, for the table's columns and curves.png (`training_record`)."""

import json
import logging
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import ml_collections

from seq2seq.errors import UserError
from seq2seq.runs import workdirs

log = logging.getLogger("seq2seq")


class Run(NamedTuple):
  """A compared run: its workdir (or record), its name in the table, its config and training
  record, and whether it is a run's record (`evaluation.record`: scores read, not decoded)."""
  workdir: Path
  name: str
  config: ml_collections.ConfigDict
  record: dict  # `training_record`
  recorded: bool = False


def training_record(workdir: Path) -> dict:
  """A run's steps, training minutes and median throughput, and its validation curve
  [(step, BLEU, loss)], from its metrics.jsonl."""
  path = workdir / workdirs.METRICS
  if not path.is_file() and any((workdir / workdirs.CHECKPOINTS).glob("[0-9]*")):
    raise UserError(f"{path} is missing, though {workdir} holds checkpoints (the run trained);"
                    " put metrics.jsonl back from a copy of the run: the comparison reads its"
                    " steps, training time and validation curve from it.")
  if not path.is_file():
    raise UserError(f"{workdir} has no validation result yet ({path} does not exist); train it"
                    " first.")
  lines = path.read_text(encoding="utf-8").splitlines()
  records = []
  for number, line in enumerate(lines, start=1):
    try:
      records.append(json.loads(line))
    except ValueError as e:
      if number < len(lines):
        raise UserError(f"{path} line {number} is not a JSON record ({e.msg}); repair or delete"
                        " that line.") from None
      log.warning("%s: its last line was cut off (the run was stopped while writing it?) and is"
                  " skipped.", path)
  train = [r for r in records if r["split"] == "train"]
  val = [r for r in records if r["split"] != "train" and "bleu" in r]
  if not val:
    raise UserError(f"{workdir} has no validation result yet; train it first.")
  return {"steps": val[-1]["step"], "train_minutes": train_seconds(train) / 60,
          "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in train),
          "curve": [(r["step"], r["bleu"], r["loss"]) for r in val]}


def train_seconds(train: list[dict]) -> float:
  """The seconds the train steps took, summed over the run's train records (each interval's
  tokens over its throughput, validation left out): across every resume, where the
  validation records' `train_wall_seconds` count from the last one."""
  before = [0] + [r["step"] for r in train[:-1]]
  return sum(r["tokens_per_step"] * (r["step"] - last) / r["tokens_per_sec"]
             for r, last in zip(train, before, strict=True) if r["tokens_per_sec"])


def check_runs(run_dirs: Sequence[str | Path]) -> list[Path]:
  """The given run workdirs, each once; a path that is not a run is a `UserError` naming it."""
  if not run_dirs:
    raise UserError("No training runs among the given directories; pass run workdirs.")
  bad = [f"{w} ({not_a_run(Path(w))})" for w in run_dirs
         if not (Path(w) / workdirs.CONFIG).is_file()]
  if bad:
    what = "Not a training run" if len(bad) == 1 else "Not training runs"
    raise UserError(f"{what}: {', '.join(bad)}; pass only the workdirs that seq2seq-train"
                    " wrote (each holds config.json), e.g. runs/rnn_attention/*.")
  seen = {}
  for w in map(Path, run_dirs):
    first = seen.setdefault(w.resolve(), w)
    if first is not w:  # By another path or a link: one row, silently, of two named.
      raise UserError(f"The runs to compare list one run twice ({first} and {w}); name each run"
                      " once: the table and its tests count each run once.")
  return list(seen.values())


def not_a_run(path: Path) -> str:
  """Why `path` is not a run: it does not exist, holds no config.json or is a file."""
  if not path.exists():
    return "does not exist"
  return "no config.json" if path.is_dir() else "not a directory"
