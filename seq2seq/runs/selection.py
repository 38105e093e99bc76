"""Which parameters of a run decode: a checkpoint, the average of several (`avg:N`), or the
one chosen on validation data (`selected`, recorded by `select_checkpoint`)."""

import functools
import json
import logging
from pathlib import Path

import jax
import jax.numpy as jnp

from seq2seq.data.textio import write_atomically
from seq2seq.errors import UserError
from seq2seq.runs import workdirs
from seq2seq.runs.checkpoints import Checkpoints, read_again_if_removed
from seq2seq.runs.train_state import make_optimizer, new_train_state

log = logging.getLogger("seq2seq")


SELECTION = workdirs.EVAL / "selected.json"  # Relative to the workdir.
# The fix for a selection that does not read as one.
_CHOOSE_AGAIN = ("choose again on validation data: seq2seq-evaluate --split=val"
                 " --checkpoint=best,avg:5,avg:10")


def selected_checkpoint(workdir: Path, field: str = "--checkpoint") -> str:
  """The checkpoint spec that `select_checkpoint` chose on validation data (`field`: the flag
  or config field that asked for `selected`, for the refusal)."""
  path = Path(workdir) / SELECTION
  if not path.is_file():
    raise UserError(f"{field}=selected needs {path}, which does not exist; choose on"
                    f" validation data first: seq2seq-evaluate --workdir={workdir} --split=val"
                    " --checkpoint=best,avg:5,avg:10.")
  choice = workdirs.read_json(path, _CHOOSE_AGAIN).get("checkpoint")
  if not isinstance(choice, str):
    raise UserError(f"{path} names no checkpoint; {_CHOOSE_AGAIN}.")
  return choice


def selected_search(workdir: Path) -> tuple[int, float] | None:
  """The beam size and alpha that `select_checkpoint` chose with the checkpoint, where it chose
  among several searches (a released model: its run's choice, where it was released with
  --checkpoint=selected); None where it was given one search, or where nothing was chosen."""
  path = Path(workdir) / SELECTION
  if not path.is_file():
    return None
  record = selection_record(workdir)
  if "searches" not in record:
    return None
  return int(record["beam_size"]), float(record["alpha"])


def selection_record(workdir: Path) -> dict:
  """The choice `select_checkpoint` recorded in `<workdir>/eval/selected.json`, which must
  exist: the checkpoint, the search it was chosen at ("beam_size", "alpha"), every candidate's
  BLEU. A released model's is its run's, where it was released with --checkpoint=selected."""
  record = workdirs.read_json(Path(workdir) / SELECTION, _CHOOSE_AGAIN)
  source = record.get("released_from", {})
  if source.get("checkpoint") == "selected":
    record = source.get("selection", {})
  return record


def chosen_search(record: dict) -> tuple[int, float] | None:
  """The beam size and alpha a selection (`selection_record`) was made at: its one search, or
  the winner's of several; None where it does not say (a model released with another spec)."""
  if "beam_size" not in record or "alpha" not in record:
    return None
  return int(record["beam_size"]), float(record["alpha"])


def candidate_specs(record: dict) -> list[str]:
  """The checkpoint specs a selection (`selection_record`) scored, in order: its labels, each a
  spec or, among several searches, `<spec> beam<k> alpha<a>` (`evaluate.search_label`)."""
  return list(dict.fromkeys(label.split(" ")[0] for label in record.get("bleu", {})))


def record_selection(workdir: Path, result: dict) -> None:
  """Writes the choice that `selected_checkpoint` reads (`evaluate.select_checkpoint`)."""
  write_atomically(Path(workdir) / SELECTION, json.dumps(result, indent=2) + "\n")


def restore_params(workdir: Path, spec: str, config, params_like):
  """The parameters of the checkpoint(s) `spec` names, averaged when several.

  The checkpoints are those that exist when the read starts. A live run's training may remove
  one meanwhile (it keeps only its latest): then `spec` is resolved again and read once more;
  a second removal is `CheckpointRemoved`, a one-line UserError that says so.
  """
  return read_again_if_removed(lambda: _read_params(workdir, spec, config, params_like),
                               f"--checkpoint={spec}")


def _read_params(workdir: Path, spec: str, config, params_like):
  """`restore_params`, one try."""
  checkpoints = Checkpoints(workdir, config.checkpoint.keep)
  try:
    steps = checkpoints.resolve(spec)
    # Shapes only: no optimizer state is built (orbax still reads each step's).
    state_like = jax.eval_shape(lambda: new_train_state(params_like,
                                                        make_optimizer(config.train)))
    # On one device, whatever mesh saved it: evaluation needs no mesh, and orbax refuses a
    # target without shardings for a checkpoint saved on another topology.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    state_like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                              state_like)
    for step in steps:
      checkpoints.read_or_explain(step, state_like,
                                  functools.partial(checkpoints.check_params, step, params_like))
    total = None  # A running sum: avg:N holds two parameter copies, not N.
    def read(step: int):
      if "opt_state" in checkpoints.shapes(step):
        return checkpoints.restore(step, state_like).params
      # A released model's checkpoint: its parameters and step alone (`released`).
      like = {"step": state_like.step, "params": state_like.params}
      return checkpoints.restore(step, like)["params"]

    for step in steps:
      params = checkpoints.read_or_explain(step, state_like, functools.partial(read, step))
      total = params if total is None else jax.tree.map(jnp.add, total, params)
    params = jax.tree.map(lambda x: x / len(steps), total)
  finally:
    checkpoints.close()
  return steps, params
