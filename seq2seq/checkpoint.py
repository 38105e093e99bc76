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

BEST_METRIC = "bleu"


class Checkpoints:
  """Save, list and restore a run's train states."""

  def __init__(self, workdir: str | Path, keep: int):
    self.directory = Path(workdir).resolve() / "checkpoints"
    preservation = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        policies.BestN(get_metric_fn=lambda metrics: metrics[BEST_METRIC], n=1),
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

  def close(self) -> None:
    self.manager.close()
