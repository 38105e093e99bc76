"""A released model (`seq2seq-export --format=seq2seq`): a run's chosen parameters alone, in a
directory that every command that reads a run reads as one.

It holds the run's config.json and vocabulary, one checkpoint (`checkpoints/<step>/`) whose
tree is the parameters and the step, not the optimizer state (a third of the run's checkpoint:
10 MB for the published recipe's 2.6M parameters, where the run keeps 10 checkpoints of 29 MB),
`eval/selected.json` naming that checkpoint (so `--checkpoint=selected`, as an ensemble's
members take it, is the choice the run made on validation), the run's evaluation scores
(eval/*.json and *.hyp, as a record), and `released.json`: where it came from (the run, its
checkpoint spec, the steps averaged, and the run's choice on validation).

Decoding reads it as the run's own checkpoint (`selection.restore_params`): the same float32
values, so the same translations. A run may start from it (config.train.init_from), taking its
parameters and step, not an optimizer state it does not hold; it is never trained on itself
(`check_not_released`).

A released model stays as released: what a command makes of it (seq2seq-evaluate's scores,
hypotheses and pictures, seq2seq-plot-attention's picture, seq2seq-compare's cache) goes to
`outputs(model)`, beside it under the working directory's runs/released/, not into it, so a
committed model leaves `git status` clean and one on a read-only disk is read as it is;
seq2seq-translate and seq2seq-serve write nothing but their output. Choosing among its
checkpoints (it holds one, the run's choice) is refused (`check_no_choice`).
"""

import json
import shutil
from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from seq2seq.data.textio import write_atomically
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.runs import match, workdirs
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.selection import SELECTION, record_selection, restore_params, selected_checkpoint

RECORD = Path("released.json")  # In the released model's directory: what it came from.
OUTPUTS = Path("runs") / "released"  # Under the working directory: what commands make of one.


def is_released(workdir: str | Path) -> bool:
  return (Path(workdir) / RECORD).is_file()


def check_not_released(workdir: str | Path, field: str = "--workdir") -> None:
  """Raises `UserError` if `workdir` is a released model: it holds no optimizer state to train
  on (a resume would start Adam afresh mid-schedule)."""
  if is_released(workdir):
    raise UserError(f"{field}={workdir} is a released model (seq2seq-export --format=seq2seq:"
                    " its parameters, no optimizer state), not a run to train on; start a new"
                    f" run from it: --config.train.init_from={workdir} --workdir=NEW_RUN.")


def outputs(workdir: str | Path) -> Path:
  """Where a command writes what it makes of `workdir`: the run itself; for a released model,
  `runs/released/<its path>` under the working directory (<its path>: relative to the working
  directory, or, for a model outside it, its absolute path less the root), so that
  `models/m` is evaluated into `runs/released/models/m/eval/`. Run from inside the model, the
  same beside it: under its parent folder's runs/released/."""
  workdir = Path(workdir)
  if not is_released(workdir):
    return workdir
  model, here = workdir.resolve(), Path.cwd().resolve()
  if here.is_relative_to(model):
    here = model.parent
  where = model.relative_to(here if model.is_relative_to(here) else model.anchor)
  return OUTPUTS / where if here == Path.cwd().resolve() else here / OUTPUTS / where


def check_no_choice(workdir: str | Path, candidates: list[str]) -> None:
  """Raises `UserError` if `workdir` is a released model and `candidates` are several
  checkpoints to choose among: it holds one, the choice its run made, and its record of that
  choice (eval/selected.json) stays as released."""
  if is_released(workdir) and len(candidates) > 1:
    raise UserError(f"--workdir={workdir} is a released model: it holds one checkpoint, the one"
                    " its run chose (released.json), so there is nothing to choose among; score"
                    " it with --checkpoint=selected, or choose in the run it came from.")


def release(workdir: str | Path, checkpoint: str, output: str | Path) -> Path:
  """Writes the parameters that `checkpoint` of the run `workdir` names (best, latest, a step,
  avg:N, selected) as a released model directory `output`, which must not exist; returns it.
  The directory appears whole or not at all: it is written under another name, then renamed."""
  workdir, output = Path(workdir), Path(output)
  if not (workdir / workdirs.CONFIG).is_file():
    raise UserError(f"{workdir} is not a training run (no config.json); pass the --workdir"
                    " that seq2seq-train wrote.")
  if output.exists():
    raise UserError(f"--output={output} exists; pass a new directory, or remove it first.")
  if checkpoint.startswith("ensemble:"):
    raise UserError(f"--checkpoint={checkpoint} is an ensemble; a released model is one set of"
                    " parameters: release each member, or --checkpoint=avg:N (their average).")
  config = workdirs.read_run_config(workdir)
  spec = selected_checkpoint(workdir) if checkpoint == "selected" else checkpoint
  vocab = workdir / workdirs.VOCAB
  if not vocab.is_file():
    raise UserError(f"{vocab} is missing: the run's checkpoints only work with the vocabulary"
                    " they were trained with; put it back from a copy of the run.")
  like = nnx.split(nnx.eval_shape(lambda: build_model(config, match.vocab_size(vocab))),
                   nnx.Param)[1]
  steps, params = restore_params(workdir, spec, config, like)
  with workdirs.written_whole(output) as partial:
    partial.mkdir(parents=True)
    shutil.copy2(workdir / workdirs.CONFIG, partial / workdirs.CONFIG)
    workdirs.copy_vocabulary(workdir, partial)
    (partial / workdirs.EVAL).mkdir()
    for scores in sorted((workdir / workdirs.EVAL).glob("*")):
      if scores.suffix in (".json", ".hyp") and scores.name != SELECTION.name:
        shutil.copy2(scores, partial / workdirs.EVAL / scores.name)
    checkpoints = Checkpoints(partial, keep=1)
    try:
      checkpoints.save(steps[-1], {"step": jnp.asarray(steps[-1], jnp.int32), "params": params})
    finally:
      checkpoints.close()
    record = {"workdir": str(workdir), "checkpoint": checkpoint, "spec": spec,
              "steps": steps}
    if (workdir / SELECTION).is_file():
      record["selection"] = json.loads((workdir / SELECTION).read_text(encoding="utf-8"))
    record_selection(partial, {"checkpoint": "latest", "released_from": record})
    write_atomically(partial / RECORD, json.dumps(record, indent=2) + "\n")
  return output
