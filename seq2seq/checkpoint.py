"""Checkpoints through orbax's CheckpointManager.

A run's workdir holds `checkpoints/<step>/` (the train state, written
atomically by orbax: a killed save leaves no half-written step), the run's
`config.json` and its SentencePiece vocabulary in `vocab/`. The latest
`keep` checkpoints are kept, and so is the one with the best validation BLEU.
"""

import logging
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from seq2seq.errors import UserError

BEST_METRIC = "bleu"
log = logging.getLogger("seq2seq")


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

  def restore_latest_good(self, like) -> tuple[int | None, object]:
    """Restores the newest checkpoint that reads back, moving damaged newer ones aside.

    A checkpoint that fails to restore (a truncated or missing file) is moved to
    `<workdir>/damaged_checkpoints/<step>` for inspection, never deleted, and a
    warning names it and the step used instead.

    Returns:
      (step, state), or (None, `like`) when there is no checkpoint.
    """
    damaged = []
    for step in reversed(self.all_steps()):
      try:
        state = self.restore(step, like)
      except Exception as e:  # noqa: BLE001 (orbax/tensorstore raise many kinds)
        damaged.append((step, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
        self._move_aside(step)
        continue
      for bad, error in damaged:
        log.warning("Checkpoint %d in %s cannot be restored (%s); moved it to %s and resumed"
                    " from step %d instead.", bad, self.directory, error,
                    self.directory.parent / "damaged_checkpoints", step)
      return step, state
    if damaged:
      raise UserError(f"No checkpoint in {self.directory} can be restored (steps"
                      f" {', '.join(str(s) for s, _ in damaged)} are damaged and were moved to"
                      f" {self.directory.parent / 'damaged_checkpoints'}); start a new --workdir.")
    return None, like

  def _move_aside(self, step: int) -> None:
    target = self.directory.parent / "damaged_checkpoints" / str(step)
    target.parent.mkdir(parents=True, exist_ok=True)
    (self.directory / str(step)).rename(target)
    self.manager.reload()  # Forget the step it had listed.

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
