"""Checkpoints through orbax's CheckpointManager.

A run's workdir holds `checkpoints/<step>/` (the train state, written
atomically by orbax: a killed save leaves no half-written step), the run's
`config.json` and its SentencePiece vocabulary in `vocab/`. The latest
`keep` checkpoints of the run's schedule (periodic and validation) are kept, and so is the
one with the best validation BLEU. A checkpoint saved on a signal, between the schedule's, is
kept while it is the newest (it is what the run resumes from), and goes once a later one is
on disk: a paused and resumed run keeps the checkpoints an uninterrupted one keeps, so
`avg:N` averages the same steps (`LatestOfSchedule`).

A full disk (or a checkpoints folder made read-only) while saving is a `UserError` naming
the step and the last good checkpoint (`full_disk.write_fault_is_user_error`), and the failed
save's threads end with it; a checkpoint that the run's training
rotates away while evaluation reads it is `CheckpointRemoved`, never called
damaged. Whether a checkpoint fits the run's model and vocabulary is decided in
match.py; orbax_logs.py keeps orbax's own reports of a failure out of sight.
"""

import contextlib
import functools
import logging
import shutil
import time
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from seq2seq.data import tokenizer
from seq2seq.errors import UserError, describe
from seq2seq.runs import match, workdirs
from seq2seq.runs.full_disk import write_fault_is_user_error
from seq2seq.runs.orbax_logs import (
  current_operation,
  ignore_abandoned_orbax_work,
  quiet,
  release_failed_save,
)

BEST_METRIC = "bleu"
VOCAB_FINGERPRINT = "vocab_sha256"  # Key of the vocabulary's hash in each step's metadata.
ON_STOP = "saved_on_stop"  # In a step's metadata: saved on a signal, outside the schedule.
log = logging.getLogger("seq2seq")
# A training that holds the run (its .lock) may be deleting a rotated checkpoint file by file:
# how long a reader waits for the directory to go before calling it damaged.
REMOVAL_WAIT_SECONDS = 5.0


class CheckpointRemoved(UserError):
  """A checkpoint that the run's training removed (its rotation) while it was being read."""

  def __init__(self, step: int, directory: Path):
    super().__init__(f"Checkpoint {step} in {directory} was removed by the run's training (it"
                     " keeps only its latest checkpoints, config.checkpoint.keep) while this"
                     " command read it; it is not damaged. Run the command again, or once the"
                     " training has finished.")
    self.step = step


def read_again_if_removed(read, what: str):
  """`read()`, which resolves and reads checkpoints of a run, and once more where the run's
  training removed one of them meanwhile (`CheckpointRemoved`): the second try chooses again
  among the checkpoints then on disk. A second removal is the one-line `CheckpointRemoved`.
  `what` names the checkpoints in the log ("--checkpoint=avg:5")."""
  try:
    return read()
  except CheckpointRemoved as removed:
    log.info("Checkpoint %d was removed by the run's training while it was read; choosing %s"
             " again.", removed.step, what)
  return read()


class LatestOfSchedule:
  """orbax's preservation policy: the latest `n` checkpoints among those not saved on a signal
  (`stopped`, their steps), and the newest checkpoint of all, whichever it is."""

  def __init__(self, n: int, stopped: set[int]):
    self.n, self.stopped = n, stopped

  def should_preserve(self, checkpoints, *, context) -> list[bool]:
    del context
    scheduled = sorted(c.step for c in checkpoints if c.step not in self.stopped)[-self.n:]
    newest = max((c.step for c in checkpoints), default=None)
    return [c.step in scheduled or c.step == newest for c in checkpoints]


class Checkpoints:
  """Save, list and restore a run's train states."""

  def __init__(self, workdir: str | Path, keep: int):
    self.directory = Path(workdir).resolve() / workdirs.CHECKPOINTS
    # The steps saved on a signal: read from their metadata before the first save.
    self._stopped: set[int] = set()
    self._stopped_read = False
    preservation = policies.AnyPreservationPolicy([
        LatestOfSchedule(keep, self._stopped),
        # Checkpoints saved on a signal have no BLEU: only LatestOfSchedule keeps them.
        policies.BestN(get_metric_fn=lambda metrics: metrics[BEST_METRIC], n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    # best_fn only makes orbax write each step's metrics to disk (the preservation policy
    # decides what is kept): without it, a restarted process sees no BLEU, and "best"
    # would quietly mean "latest".
    options = ocp.CheckpointManagerOptions(
        create=True, preservation_policy=preservation, enable_async_checkpointing=True,
        best_fn=lambda metrics: metrics[BEST_METRIC], best_mode="max")
    # Listing the steps reads each one's metadata; orbax logs a damaged step's there, and
    # restoring that step reports it again, in our one line.
    with quiet():
      self.manager = ocp.CheckpointManager(self.directory, options=options)
    ignore_abandoned_orbax_work()
    self._unfinished: int | None = None  # The step of a save not known to be on disk yet.
    self._operation: str | None = None  # orbax's id of that save (`release_failed_save`).
    self._partial: list[int] = []  # Steps whose save failed: their temporary directories.
    self._closed = False

  def latest_step(self) -> int | None:
    self._finish()  # A save still writing (`save(wait=False)`) counts once it is on disk.
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    self._finish()
    return sorted(self.manager.all_steps())

  def best_step(self) -> int | None:
    """The kept step with the highest validation BLEU (None if none has one)."""
    scored = [(metrics[BEST_METRIC], step) for step in self.all_steps()
              if (metrics := self.manager.metrics(step)) and BEST_METRIC in metrics]
    return max(scored)[1] if scored else None

  def shapes(self, step: int) -> dict:
    """The saved tree of `step` as nested dicts of array shapes, read without restoring."""
    # The handler, not StandardCheckpointer: that one warns about a missing step-level file.
    metadata = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "default")
    return jax.tree.map(lambda leaf: tuple(leaf.shape), dict(metadata))

  def check_vocab(self, step: int) -> None:
    """Raises `UserError` if the run's vocabulary is missing or is not the one the
    checkpoint at `step` was trained with (by its recorded fingerprint)."""
    recorded = self._custom_metadata(step).get(VOCAB_FINGERPRINT)
    match.check_vocab(self.directory.parent / workdirs.VOCAB, step, recorded)

  def _custom_metadata(self, step: int) -> dict:
    """What `save` recorded beside the state of `step` (the vocabulary's fingerprint, ON_STOP)."""
    with quiet():  # Reading step metadata alone makes orbax warn about its items.
      return self.manager.metadata(step).custom_metadata or {}

  def check_params(self, step: int, params_like) -> None:
    """Raises `UserError` if the parameters saved at `step` do not fit `params_like`, or
    its vocabulary is not the run's (`match.check_shapes`, `match.check_vocab`):
    a mismatch is never mistaken for a damaged checkpoint, nor restored into a wrong model.
    """
    match.check_shapes(self.directory.parent, step, self.shapes(step)["params"],
                           params_like)
    self.check_vocab(step)  # Same shapes: is it the same vocabulary, too?

  def save(self, step: int, state, metrics: dict | None = None, wait: bool = True,
           on_stop: bool = False) -> None:
    """Saves `state` at `step`, recording the fingerprint of the run's vocabulary. With
    `wait=False` it returns once the state is copied off the device (so the caller may
    donate it), and writes in the background: the next save, read of the steps or `close`
    waits for it (and reports its failure). `on_stop`: saved on a signal, outside the run's
    schedule of checkpoints, and so kept only while it is the newest (`LatestOfSchedule`).

    Raises:
      UserError: the disk is full, or this directory may not be written (the step, this
        directory and the last good checkpoint named); the earlier checkpoints are untouched,
        and the same command resumes.
    """
    self._finish()  # A save still writing fails here, under its own step.
    self._read_stopped()
    fingerprint = tokenizer.fingerprint(self.directory.parent / workdirs.VOCAB)
    custom = {VOCAB_FINGERPRINT: fingerprint} if fingerprint else {}
    if on_stop:
      custom[ON_STOP] = True
      self._stopped.add(step)
    else:
      self._stopped.discard(step)  # (A step saved again, as a seed group's member may.)
    self._unfinished, self._operation = step, None
    with self._write_fault_is_user_error():
      self.manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics, force=True,
                        custom_metadata=custom or None)
      self._operation = current_operation()  # Its threads' id, while they may still write.
    if wait:
      self._finish()

  def _read_stopped(self) -> None:
    """Reads which kept steps an earlier process saved on a signal (once: later saves add
    their own)."""
    if self._stopped_read:
      return
    self._stopped_read = True
    for step in self.manager.all_steps():
      with contextlib.suppress(Exception):  # A damaged step's metadata: not stopped.
        if self._custom_metadata(step).get(ON_STOP):
          self._stopped.add(step)

  def _finish(self) -> None:
    """Waits for the save in progress (orbax may write in the background)."""
    if self._unfinished is not None:
      with self._write_fault_is_user_error():
        self.manager.wait_until_finished()
      self._unfinished = None

  @contextlib.contextmanager
  def _write_fault_is_user_error(self):
    """`write_fault_is_user_error` for the save of `self._unfinished`: the half-written step is
    removed first (it holds space, and no reader lists it), and orbax repeating a failure
    already reported (when the save is waited for or closed, with no save in progress) is
    dropped, not reported twice. Whatever fails, the save is no longer in progress, and its
    threads are ended (`release_failed_save`): none waits on, nor holds the exit."""
    step = self._unfinished
    try:
      with write_fault_is_user_error(f"saving the checkpoint of step {step} in {self.directory}",
                                     self.latest_step, functools.partial(self._failed_save, step)):
        yield
    except Exception:
      if step is not None:  # (Raised by orbax at once, the save's id is the latest.)
        release_failed_save(self._operation or current_operation())
      self._unfinished = None
      raise

  def _failed_save(self, step: int | None) -> bool:
    """Cleans up after the save of `step` failed; False when no save was in progress."""
    self._unfinished = None
    if step is None:
      return False
    self._partial.append(step)
    self._remove_partial()
    with contextlib.suppress(Exception), quiet():
      self.manager.reload()  # The steps on disk: the failed one is not among them.
    return True

  def restore(self, step: int, like):
    """Restores `step` into the structure, shapes and shardings of the pytree `like`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def guarded(self, step: int, read):
    """`read()` of checkpoint `step` (its metadata, shapes or arrays), the one guarded read of
    every command and of a run starting from a parent: where it fails because the step's
    directory is gone (the run's training rotated it away meanwhile), `CheckpointRemoved`,
    which `read_again_if_removed` answers by choosing again; any other failure as it is."""
    try:
      with quiet():
        return read()
    except (UserError, AttributeError, NameError):
      raise  # The user's mismatch, or a bug of ours: not the checkpoint's damage.
    except Exception as e:  # noqa: BLE001 (orbax/tensorstore raise many kinds)
      if self._removed(step):
        raise CheckpointRemoved(step, self.directory) from e
      raise

  def read_or_explain(self, step: int, like, read):
    """`read()` of checkpoint `step` (a restore into `like`, or a check of it), guarded
    (`guarded`), but one that does not read back (a truncated or missing file) is a
    `UserError` naming it and the steps that do restore into `like`. Nothing is moved: that is
    for resuming alone."""
    try:
      return self.guarded(step, read)
    except (UserError, AttributeError, NameError):
      raise  # CheckpointRemoved, the user's mismatch, or a bug of ours.
    except Exception as e:  # noqa: BLE001 (orbax/tensorstore raise many kinds)
      error = describe(e)
    good = []
    for other in self.all_steps():
      if other != step:
        try:
          with quiet():
            self.restore(other, like)
          good.append(str(other))
        except Exception:  # noqa: BLE001, S112
          continue
    use = (f"use --checkpoint= one of the steps that do: {', '.join(good)}" if good
           else "no other checkpoint restores either; train the run again")
    raise UserError(f"Checkpoint {step} in {self.directory} cannot be restored ({error});"
                    f" {use}.")

  def _removed(self, step: int) -> bool:
    """Whether `step`'s directory is gone: the run's training rotated it away. While a
    training holds the run (its lock file exists), one it is still deleting file by file is
    given REMOVAL_WAIT_SECONDS to go."""
    path = self.directory / str(step)
    training = (self.directory.parent / workdirs.LOCK).exists()
    deadline = time.monotonic() + (REMOVAL_WAIT_SECONDS if training else 0.0)
    while path.exists():
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.05)
    return True

  def restore_latest_good(self, like, new=None) -> tuple[int | None, object]:
    """Restores the newest checkpoint that reads back, moving damaged newer ones aside.

    A checkpoint that fails to restore (a truncated or missing file) is moved to
    `<workdir>/damaged_checkpoints/<step>` for inspection, never deleted, and a
    warning names it and the step used instead. One whose parameters do not fit
    `like.params` (another config or vocabulary) stays where it is: `UserError`.

    `like` may be abstract (`jax.ShapeDtypeStruct`s with shardings): nothing is computed to
    restore into.

    Returns:
      (step, state), or with no checkpoint (None, `new()`; `like` itself without `new`).
    """
    damaged = []
    for step in reversed(self.all_steps()):
      try:
        with quiet():  # A damaged one is reported below, in one warning.
          self.check_params(step, like.params)
          state = self.restore(step, like)
      except UserError:
        raise  # It does not fit this config or vocabulary: the user's to fix, not damage.
      except Exception as e:  # noqa: BLE001 (orbax/tensorstore raise many kinds)
        damaged.append((step, describe(e)))
        self._move_aside(step)
        continue
      for bad, error in damaged:
        log.warning("Checkpoint %d in %s cannot be restored (%s); moved it to %s and resumed"
                    " from step %d instead.", bad, self.directory, error,
                    self.directory.parent / workdirs.DAMAGED_CHECKPOINTS, step)
      return step, state
    if damaged:
      raise UserError(f"No checkpoint in {self.directory} can be restored (steps"
                      f" {', '.join(str(s) for s, _ in damaged)} are damaged and were moved to"
                      f" {self.directory.parent / workdirs.DAMAGED_CHECKPOINTS}); start a new"
                      " --workdir.")
    return None, like if new is None else new()

  def remove_after(self, step: int) -> None:
    """Removes the checkpoints after `step`: a seed group's member a save ahead of the others
    goes back to their step (`claim.shared_step`), to train those steps again."""
    for later in self.all_steps():
      if later > step:
        self.manager.delete(later)

  def _move_aside(self, step: int) -> None:
    target = self.directory.parent / workdirs.DAMAGED_CHECKPOINTS / str(step)
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
    if spec.startswith("avg:") and spec[4:].isdigit():
      if int(spec[4:]) == 0:
        raise UserError(f"--checkpoint={spec} averages no checkpoint; N of avg:N must be 1 to"
                        f" {len(steps)}, the checkpoints {self.directory} holds.")
      if int(spec[4:]) > len(steps):
        raise UserError(f"--checkpoint={spec} averages {spec[4:]} checkpoints but {self.directory}"
                        f" holds {len(steps)} (steps {', '.join(map(str, steps))}); use"
                        f" --checkpoint=avg:{len(steps)} or fewer.")
      return steps[-int(spec[4:]):]
    if spec.isdigit() and int(spec) in steps:
      return [int(spec)]
    raise UserError(f"--checkpoint={spec} names no checkpoint of {self.directory}; use latest,"
                    f" best, avg:N or one of the steps {', '.join(map(str, steps))}.")

  def close(self) -> None:
    """Waits for a save in progress (a full disk: `UserError`, as in `save`), then closes.
    Closing twice does nothing."""
    if self._closed:
      return
    self._closed = True
    try:
      with self._write_fault_is_user_error():
        self.manager.close()
    finally:
      self._remove_partial()  # Again: writes that the failure left running may have added to it.

  def _remove_partial(self) -> None:
    """Removes what failed saves wrote (orbax's `<step>.orbax-checkpoint-tmp`): it holds space,
    no reader lists it, and the next save of that step would log its removal."""
    for step in self._partial:
      for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
        shutil.rmtree(partial, ignore_errors=True)

