"""The members of an ensemble, from the command line: the runs of `--workdir` and `--ensemble`,
each once, or the last N checkpoints of one run (`--checkpoint=ensemble:N`), each with the
checkpoint it decodes at; checked before any checkpoint is read."""

from collections.abc import Sequence
from pathlib import Path

from seq2seq.errors import UserError
from seq2seq.runs import workdirs
from seq2seq.runs.checkpoints import Checkpoints


def distinct_runs(workdir: Path, others: Sequence[str | Path]) -> list[Path]:
  """`workdir` and the --ensemble runs `others`, each once: an empty entry (a stray comma) or
  a run named twice (by any path) is a `UserError`, before anything is read."""
  if any(not str(other).strip() for other in others):
    raise UserError(f"--ensemble={','.join(map(str, others))} has an empty entry (a stray"
                    " comma); list the other runs' workdirs, e.g. --ensemble=runs/b,runs/c.")
  runs, seen = [workdir, *map(Path, others)], {}
  for run in runs:
    key = run.resolve()
    if key in seen:
      raise UserError(f"--ensemble: {run} is a run already listed (as {seen[key]}, by"
                      " --workdir or --ensemble); name each run once: an ensemble counts each"
                      " member once.")
    seen[key] = run
  return runs


def ensemble_members(workdir: Path, checkpoint: str, others: Sequence[str | Path],
                      keep: int) -> list[tuple[Path, str]] | None:
  """(workdir, checkpoint spec) of each member of an ensemble; None for one model.

  `--checkpoint=ensemble:N` makes the last N checkpoints of `workdir` the members; otherwise
  `workdir` and `others` are, each at the checkpoint `checkpoint` names for it.
  """
  if not checkpoint.startswith("ensemble:"):
    return [(w, checkpoint) for w in distinct_runs(workdir, others)] if others else None
  if others:
    raise UserError(f"--checkpoint={checkpoint} ensembles checkpoints of --workdir alone; drop"
                    " --ensemble, or pass --checkpoint=best (or another) with it.")
  n = checkpoint[len("ensemble:"):]
  checkpoints = Checkpoints(workdir, keep)
  try:
    steps = checkpoints.all_steps()
    if not steps:
      checkpoints.resolve("latest")  # Says that there is none.
  finally:
    checkpoints.close()
  if not n.isdigit() or not 1 <= int(n) <= len(steps):
    raise UserError(f"--checkpoint={checkpoint}: N of ensemble:N must be 1 to {len(steps)}, the"
                    f" checkpoints {workdir / workdirs.CHECKPOINTS} holds (steps"
                    f" {', '.join(map(str, steps))}).")
  return [(workdir, str(step)) for step in steps[-int(n):]]
