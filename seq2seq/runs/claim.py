"""A workdir taken for training (`Claim`): checked, created if new, locked, with its
checkpoints open, and whether the run in it has steps left: complete, or out of patience
(`EarlyStopping`, read from the checkpoints alone). Several runs' workdirs taken together
(`claim_each`), and a seed group's members resumed together, from one step
(`restore_together`, `shared_step`)."""

import contextlib
import logging
import shutil
from collections.abc import Hashable, Mapping
from pathlib import Path

import jax
import ml_collections

from seq2seq.errors import UserError
from seq2seq.runs import released, workdirs
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.match import check_run_config

log = logging.getLogger("seq2seq")


def evaluations_without_improvement(checkpoints: Checkpoints, step: int,
                                    every_steps: int) -> int:
  """Evaluations in (best step, `step`]: evaluations happen at multiples of `every_steps`,
  so this is a function of the checkpoints alone and a resumed run counts as it would have."""
  best = checkpoints.best_step()
  return 0 if best is None else step // every_steps - best // every_steps


class EarlyStopping:
  """Patience (config.train.patience, 0: none): the run stops once validation BLEU has not
  improved for that many evaluations. Read from the checkpoints' metrics alone, so a resumed
  run stops where the uninterrupted one would have."""

  def __init__(self, config: ml_collections.ConfigDict, checkpoints: Checkpoints):
    self.patience, self.every_steps = config.train.patience, config.eval.every_steps
    self.checkpoints = checkpoints

  def exhausted(self, step: int) -> bool:
    """Whether the evaluations up to `step` end the run."""
    return bool(self.patience) and evaluations_without_improvement(
        self.checkpoints, step, self.every_steps) >= self.patience

  def message(self, step: int) -> str:
    best = self.checkpoints.best_step()
    bleu = self.checkpoints.manager.metrics(best)["bleu"]
    return (f"Stopped early at step {step}: validation BLEU has not improved for"
            f" {self.patience} evaluations (config.train.patience); the best is {bleu:.2f} at"
            f" step {best}.")


class Claim:
  """A workdir taken for training: checked, created if new, with its checkpoints open."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | Path):
    workdirs.check_is_run_or_new(workdir)  # The text as given: an empty one is not ".".
    released.check_not_released(workdir)
    workdir = Path(workdir)
    self.config, self.workdir, self.checkpoints = config, workdir, None
    workdirs.check_writable(workdir)
    self.created = jax.process_index() == 0 and workdirs.create_workdir(workdir)
    check_run_config(workdir, config)
    self.checkpoints = Checkpoints(workdir, config.checkpoint.keep)

  def latest_step(self) -> int | None:
    return self.checkpoints and self.checkpoints.latest_step()

  def finished(self) -> dict | None:
    """What the run returns if it has nothing left to train (complete, or out of patience);
    raises `UserError` if its vocabulary is gone while checkpoints need it."""
    latest, num_steps = self.latest_step(), self.config.train.num_steps
    if latest is not None and latest >= num_steps:
      log.info(f"The run in {self.workdir} is complete: its checkpoint is at step {latest} and"
               f" config.train.num_steps={num_steps}. Nothing to do; pass a larger"
               " --config.train.num_steps to train further.")
      return {"step": latest, "complete": True,
              **(self.checkpoints.manager.metrics(latest) or {})}
    early_stopping = EarlyStopping(self.config, self.checkpoints)
    if latest is not None and early_stopping.exhausted(latest):
      log.info("The run in %s is complete. %s", self.workdir, early_stopping.message(latest))
      return {"step": latest, "complete": True, "early_stopped": True}
    if latest is not None and not (self.workdir / workdirs.VOCAB).is_file():
      # Retraining it would give the checkpoints a vocabulary of chance.
      raise UserError(f"{self.workdir / workdirs.VOCAB} is missing but {self.workdir} holds"
                      " checkpoints trained with it; put it back from a copy of the run, or"
                      " train in a new --workdir.")
    return None

  @contextlib.contextmanager
  def held(self):
    """Within: the run's lock. A new workdir is removed again when its start fails before the
    first checkpoint, but only by the start whose `mkdir` made it, and while it holds the
    lock: of two simultaneous first starts, the one refused the lock removes nothing."""
    with workdirs.WorkdirLock(self.workdir, enabled=jax.process_index() == 0):
      finished = False
      try:
        self._remove_leftover_vocabulary()
        yield
        finished = True
      finally:
        if self.created and not finished:  # This start made the workdir and holds its lock.
          saved = self.checkpoints.latest_step() is not None
          self.checkpoints.close()  # Waits for orbax's threads, which may create directories.
          if not saved:
            # A start that failed (or was interrupted) before its first checkpoint leaves
            # nothing; removed before the lock is released, so no other start trains in it.
            shutil.rmtree(self.workdir, ignore_errors=True)

  def _remove_leftover_vocabulary(self) -> None:
    """A vocabulary beside no config.json and no checkpoint was left by a first start killed
    before it saved its config: of a config unknown, so trained (or copied) again. Only with
    the lock held: a start in progress keeps the vocabulary it is training with."""
    vocab = self.workdir / workdirs.VOCAB.parent
    if (jax.process_index() == 0 and vocab.is_dir() and self.latest_step() is None
        and not (self.workdir / workdirs.CONFIG).exists()):
      log.info("%s holds a vocabulary but no config.json: left by a start that was stopped;"
               " training it again for this config.", self.workdir)
      shutil.rmtree(vocab)

  def close(self) -> None:
    if self.checkpoints is not None:
      self.checkpoints.close()


def claim_each(runs: Mapping[Hashable, tuple[ml_collections.ConfigDict, str | Path]],
               stack: contextlib.ExitStack, results: dict) -> dict[Hashable, Claim]:
  """The workdirs of `runs` (key -> its config and workdir) taken, each held within `stack`,
  of those with steps left. A run that does not fit its workdir, is complete, or is in
  another training's hands ends alone, the others train: its result (what `Claim.finished`
  returns, or the `UserError`) is in `results`, under its key."""
  claims = {}
  for key, (config, workdir) in runs.items():
    try:
      claim = Claim(config, workdir)
      stack.callback(claim.close)
      if (done := claim.finished()) is not None:
        results[key] = done
      else:
        claims[key] = claim
    except UserError as e:
      results[key] = e
  for key, claim in list(claims.items()):
    try:
      stack.enter_context(claim.held())
    except workdirs.WorkdirInUse as e:
      results[key] = e
      del claims[key]
  return claims


def shared_step(workdirs: list[Path], steps: list[list[int]]) -> int:
  """The latest step that every member of a seed group has a checkpoint of (`steps`: each
  member's, in `workdirs`), where they are at different steps: a stop during the group's save
  (members save one after another) leaves some a save ahead of the others.

  Raises:
    UserError: they share no step (one is new, say): they cannot resume as one program.
  """
  shared = set.intersection(*map(set, steps))
  if not shared:
    held = [f"checkpoints {', '.join(map(str, s))}" if s else "no checkpoint" for s in steps]
    raise UserError("The runs " + ", ".join(f"{workdir} ({what})" for workdir, what in
                                            zip(workdirs, held, strict=True))
                    + " share no checkpoint step and cannot resume as one program; train them"
                    " one by one (seq2seq-sweep --one_by_one).")
  return max(shared)


def restore_together(claims: Mapping[int, Claim], like) -> tuple[int | None, list]:
  """The latest good checkpoint of each member of a seed group (`claims`: seed -> its claim),
  all at one step: members at different steps go back to the latest step they all have
  (`shared_step`), one line says so, and the checkpoints after it are removed, so that the
  group trains on as the uninterrupted group did, bit for bit. Returns that step (None: they
  are new) and each member's state (`like` where new)."""
  seeds, claims = list(claims), list(claims.values())
  restored = [claim.checkpoints.restore_latest_good(like) for claim in claims]
  while len(set(steps := [step for step, _ in restored])) > 1:
    back = shared_step([claim.workdir for claim in claims],
                       [claim.checkpoints.all_steps() for claim in claims])
    ahead = [i for i, step in enumerate(steps) if step > back]
    log.info("Seeds %s are at steps %s (a stop during the group's save leaves them so): they"
             " resume as one program from step %d, the last step they all have (the later"
             " checkpoints of seed %s are removed, to be trained again).",
             ", ".join(map(str, seeds)), ", ".join(map(str, steps)), back,
             ", ".join(str(seeds[i]) for i in ahead))
    for i in ahead:
      claims[i].checkpoints.remove_after(back)
      restored[i] = claims[i].checkpoints.restore_latest_good(like)
  return steps[0], [state for _, state in restored]


def writing_in(workdir: str | Path):
  """What a full disk interrupted, for `write_fault_is_user_error`: the file its error names (the
  run's config, vocabulary or metrics), else the workdir."""
  return lambda error: f"writing {error.filename or f'in {workdir}'}"
