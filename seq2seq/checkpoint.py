"""Checkpoints through orbax's CheckpointManager.

A run's workdir holds `checkpoints/<step>/` (the train state, written
atomically by orbax: a killed save leaves no half-written step), the run's
`config.json` and its SentencePiece vocabulary in `vocab/`. The latest
`keep` checkpoints are kept, and so is the one with the best validation BLEU.
"""

from pathlib import Path

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from seq2seq.errors import UserError

BEST_METRIC = "bleu"


class Checkpoints:
  """Save, list and restore a run's train states."""

  def __init__(self, workdir: str | Path, keep: int):
    self.directory = Path(workdir).resolve() / "checkpoints"
    preservation = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        # Checkpoints saved on a signal have no BLEU: only LatestN keeps them.
        policies.BestN(get_metric_fn=lambda metrics: metrics[BEST_METRIC], n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    options = ocp.CheckpointManagerOptions(
        create=True, preservation_policy=preservation, enable_async_checkpointing=False)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def best_step(self) -> int | None:
    """The kept step with the highest validation BLEU (None if none has one)."""
    scored = [(metrics[BEST_METRIC], step) for step in self.all_steps()
              if (metrics := self.manager.metrics(step)) and BEST_METRIC in metrics]
    return max(scored)[1] if scored else None

  def shapes(self, step: int) -> dict:
    """The saved tree of `step` as nested dicts of array shapes, read without restoring."""
    metadata = ocp.StandardCheckpointer().metadata(self.directory / str(step) / "default")
    return jax.tree.map(lambda leaf: tuple(leaf.shape), dict(metadata.item_metadata))

  def save(self, step: int, state, metrics: dict | None = None) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics, force=True)
    self.manager.wait_until_finished()

  def restore(self, step: int, like):
    """Restores `step` into the structure, shapes and shardings of the pytree `like`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def resolve(self, spec: str) -> list[int]:
    """The steps that `spec` names: "latest", "best", a step number, or "avg:N" (last N).

    Raises:
      UserError: naming the steps that exist, if `spec` names none of them.
    """
    steps = self.all_steps()
    if not steps:
      raise UserError(f"{self.directory} holds no checkpoint; train the run first.")
    if spec == "latest":
      return [steps[-1]]
    if spec == "best":
      best = self.best_step()
      return [best if best is not None else steps[-1]]
    if spec.startswith("avg:") and spec[4:].isdigit() and int(spec[4:]) > 0:
      return steps[-int(spec[4:]):]
    if spec.isdigit() and int(spec) in steps:
      return [int(spec)]
    raise UserError(f"--checkpoint={spec} names no checkpoint of {self.directory}; use latest,"
                    f" best, avg:N or one of the steps {', '.join(map(str, steps))}.")

  def close(self) -> None:
    self.manager.close()


def average(trees: list):
  """Element-wise mean of parameter pytrees of one structure (checkpoint averaging)."""
  return jax.tree.map(lambda *leaves: sum(leaves) / len(leaves), *trees)
