"""Checkpoints through orbax's CheckpointManager.

A run's workdir holds `checkpoints/<step>/` (the train state, written
atomically by orbax: a killed save leaves no half-written step), the run's
`config.json` and its SentencePiece vocabulary in `vocab/`. The latest
`keep` checkpoints are kept, and so is the one with the best validation BLEU.

A full disk while saving is a `UserError` naming the step and the last good
checkpoint (`full_disk_error`); a checkpoint that the run's training rotates
away while evaluation reads it is `CheckpointRemoved`, never called damaged.
"""

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import ml_collections
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

from seq2seq import config as config_lib
from seq2seq import layout
from seq2seq.data import tokenizer
from seq2seq.errors import UserError, describe

BEST_METRIC = "bleu"
VOCAB_FINGERPRINT = "vocab_sha256"  # Key of the vocabulary's hash in each step's metadata.
log = logging.getLogger("seq2seq")
# errno values of a full disk; tensorstore reports them inside its message as os_error_code='28'.
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
# A training that holds the run (its .lock) may be deleting a rotated checkpoint file by file:
# how long a reader waits for the directory to go before calling it damaged.
REMOVAL_WAIT_SECONDS = 5.0
_ORBAX = os.path.dirname(ocp.__file__) + os.sep  # Where orbax's code (and its coroutines) live.


def full_disk(error: BaseException | None) -> OSError | None:
  """The full-disk error (ENOSPC, EDQUOT) in `error` or its chain (`__cause__`, `__context__`,
  an exception group's members), as an OSError; None if there is none.

  orbax wraps an OSError, and tensorstore's writes raise a ValueError that carries the code
  only in its text ("... No space left on device [os_error_code='28']").
  """
  seen, todo = set(), [error]
  while todo:
    e = todo.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in FULL_DISK:
      return e
    if not isinstance(e, UserError) and (code := _full_disk_code(str(e))):
      return OSError(code, os.strerror(code))
    todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
  return None


def _full_disk_code(text: str) -> int | None:
  """The full-disk errno that a library's message reports, if it reports one."""
  match = _OS_ERROR_CODE.search(text)
  code = int(match[1]) if match else errno.ENOSPC if os.strerror(errno.ENOSPC) in text else None
  return code if code in FULL_DISK else None


def full_disk_error(error: BaseException, doing: str, last_step: int | None) -> UserError | None:
  """The one line for a full disk found in `error` (None if it is something else): what was
  being written (`doing`), the last good checkpoint, and that the same command resumes."""
  found = full_disk(error)
  if found is None:
    return None
  last = (f"the last good checkpoint is step {last_step}" if last_step is not None
          else "no checkpoint was saved yet")
  again = "resume" if last_step is not None else "start again"
  return UserError(f"{found.strerror or os.strerror(found.errno)} while {doing}; {last}. Free"
                   f" some space and run the same command to {again}.")


@contextlib.contextmanager
def full_disk_is_user_error(workdir: Path, last_step: Callable[[], int | None]):
  """Within: a full disk at any write in `workdir` (its config, vocabulary, metrics) is one
  `UserError` line naming the file where known and the last good checkpoint (`last_step()`)."""
  try:
    yield
  except UserError:
    raise
  except Exception as e:
    found = full_disk(e)
    if found is None:
      raise
    where = found.filename or f"in {workdir}"
    raise full_disk_error(e, f"writing {where}", last_step()) from e


def _library_log_shown(record: logging.LogRecord) -> bool:
  """False for the log lines of orbax (absl) and asyncio that our one-line messages replace."""
  # A step saved between evaluations has no BLEU by design (LatestN keeps it, BestN ignores it).
  if "did not provide metrics" in record.getMessage():
    return False
  # orbax's work that a failed save or read left behind: asyncio logs the error of each of its
  # tasks and tensorstore futures ("... exception was never retrieved"), which the one-line
  # message has reported.
  if record.name == "asyncio" and (_ORBAX in record.getMessage()
                                   or "OCDBT database" in record.getMessage()):
    return False
  # A full disk: each of orbax's threads logs its traceback; `Checkpoints.save` says it once.
  if record.levelno >= logging.ERROR and _full_disk_code(record.getMessage()):
    return False
  return full_disk(record.exc_info[1] if record.exc_info else None) is None


for _name in ("absl", "asyncio"):
  logging.getLogger(_name).addFilter(_library_log_shown)


def _abandoned_orbax_work(unraisable) -> bool:
  """Whether an unraisable exception is orbax's work left behind by a failed save or read:
  tensorstore completing it into orbax's closed event loop, or its coroutine collected."""
  exc, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
  return ((isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed")
          or (code is not None and code.co_filename.startswith(_ORBAX)))


def _ignore_abandoned_orbax_work() -> None:
  """From now on, orbax's work that a failed save or read left running reports to no one: the
  failure is reported once, in one line, and these print pages (until the process exits)."""
  if getattr(sys.unraisablehook, "ignores_abandoned_orbax_work", False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    if not _abandoned_orbax_work(unraisable):
      previous(unraisable)

  hook.ignores_abandoned_orbax_work = True
  sys.unraisablehook = hook


class CheckpointRemoved(UserError):
  """A checkpoint that the run's training removed (its rotation) while it was being read."""

  def __init__(self, step: int, directory: Path):
    super().__init__(f"Checkpoint {step} in {directory} was removed by the run's training (it"
                     " keeps only its latest checkpoints, config.checkpoint.keep) while this"
                     " command read it; it is not damaged. Run the command again, or once the"
                     " training has finished.")
    self.step = step


class Checkpoints:
  """Save, list and restore a run's train states."""

  def __init__(self, workdir: str | Path, keep: int):
    self.directory = Path(workdir).resolve() / layout.CHECKPOINTS
    preservation = policies.AnyPreservationPolicy([
        policies.LatestN(n=keep),
        # Checkpoints saved on a signal have no BLEU: only LatestN keeps them.
        policies.BestN(get_metric_fn=lambda metrics: metrics[BEST_METRIC], n=1,
                       keep_checkpoints_without_metrics=False),
    ])
    # best_fn only makes orbax write each step's metrics to disk (the preservation policy
    # decides what is kept): without it, a restarted process sees no BLEU, and "best"
    # would quietly mean "latest".
    options = ocp.CheckpointManagerOptions(
        create=True, preservation_policy=preservation, enable_async_checkpointing=False,
        best_fn=lambda metrics: metrics[BEST_METRIC], best_mode="max")
    # Listing the steps reads each one's metadata; orbax logs a damaged step's there, and
    # restoring that step reports it again, in our one line.
    with self.quiet():
      self.manager = ocp.CheckpointManager(self.directory, options=options)
    _ignore_abandoned_orbax_work()
    self._unfinished: int | None = None  # The step of a save not known to be on disk yet.
    self._partial: list[int] = []  # Steps whose save failed: their temporary directories.
    self._closed = False

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
    # The handler, not StandardCheckpointer: that one warns about a missing step-level file.
    metadata = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / "default")
    return jax.tree.map(lambda leaf: tuple(leaf.shape), dict(metadata))

  def check_vocab(self, step: int) -> None:
    """Raises `UserError` if the run's vocabulary is missing or is not the one the
    checkpoint at `step` was trained with (by its recorded sha256)."""
    with self.quiet():  # Reading step metadata alone makes orbax warn about its items.
      metadata = self.manager.metadata(step)
    recorded = (metadata.custom_metadata or {}).get(VOCAB_FINGERPRINT)
    if recorded is None:
      return  # Saved before fingerprints were recorded.
    path = self.directory.parent / layout.VOCAB
    found = vocab_fingerprint(path)
    if found is None:
      raise UserError(f"{path} is missing: the checkpoint at step {step} only works with the"
                      " vocabulary it was trained with; put it back from a copy of the run.")
    if recorded not in (found, _bytes_sha256(path)):  # Checkpoints saved before content ones.
      raise UserError(f"{path} is not the vocabulary the checkpoint at step {step} was trained"
                      f" with (sha256 {found[:12]}..., recorded {recorded[:12]}...); put back the"
                      " run's vocab/ or train in a new --workdir.")

  def check_params(self, step: int, params_like) -> None:
    """Raises `UserError` if the parameters saved at `step` do not fit `params_like`.

    Names the first differing parameter, and says whether the run's vocabulary
    or its config no longer matches the checkpoint, so a mismatch is never
    mistaken for a damaged checkpoint (or restored into a wrong model).
    """
    saved = _flat_shapes(self.shapes(step)["params"])
    model = _flat_shapes(params_like)
    names = sorted(saved.keys() | model.keys())
    differ = [(n, saved.get(n), model.get(n)) for n in names if saved.get(n) != model.get(n)]
    if not differ:
      self.check_vocab(step)  # Same shapes: is it the same vocabulary, too?
      return
    workdir = self.directory.parent
    vocab = _vocab_size(workdir / layout.VOCAB)
    # Only the vocabulary-sized axis of embedding/output tables differs: a foreign vocabulary.
    rows = [_vocab_axis(s, m, vocab) for _, s, m in differ]
    if vocab is not None and None not in rows and len(set(rows)) == 1:
      raise UserError(f"{workdir / layout.VOCAB} has {vocab} subwords but the checkpoint at"
                      f" step {step} was trained with {rows[0]} ({differ[0][0]}): the vocabulary"
                      " is not this run's; put back the run's vocab/ or train in a new --workdir.")
    name, in_checkpoint, in_model = differ[0]
    more = f", and {len(differ) - 1} more parameters differ" if len(differ) > 1 else ""
    raise UserError(
        f"The checkpoint at step {step} in {workdir} does not fit the model of its config.json"
        f" ({name} is {_describe(in_checkpoint)} in the checkpoint but {_describe(in_model)} in"
        f" the model{more}); was config.json edited? Put back the run's config.json or train in"
        " a new --workdir.")

  def save(self, step: int, state, metrics: dict | None = None) -> None:
    """Saves `state` at `step`, recording the fingerprint of the run's vocabulary.

    Raises:
      UserError: the disk is full (the step, this directory and the last good checkpoint
        named); the earlier checkpoints are untouched, and the same command resumes.
    """
    self._finish()  # A save still writing fails here, under its own step.
    fingerprint = vocab_fingerprint(self.directory.parent / layout.VOCAB)
    self._unfinished = step
    with self._full_disk_is_user_error():
      self.manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics, force=True,
                        custom_metadata={VOCAB_FINGERPRINT: fingerprint} if fingerprint else None)
    self._finish()

  def _finish(self) -> None:
    """Waits for the save in progress (orbax may write in the background)."""
    if self._unfinished is not None:
      with self._full_disk_is_user_error():
        self.manager.wait_until_finished()
      self._unfinished = None

  @contextlib.contextmanager
  def _full_disk_is_user_error(self):
    """A full disk during the save of `self._unfinished` becomes one `UserError` line; the
    half-written step is removed (it holds space, and no reader lists it)."""
    try:
      yield
    except UserError:
      raise
    except Exception as e:
      step, self._unfinished = self._unfinished, None
      if full_disk(e) is None:
        raise
      if step is None:
        return  # No save in progress: orbax repeats the failure that `save` reported.
      self._partial.append(step)
      self._remove_partial()
      with contextlib.suppress(Exception), self.quiet():
        self.manager.reload()  # The steps on disk: the failed one is not among them.
      raise full_disk_error(e, f"saving the checkpoint of step {step} in {self.directory}",
                            self.latest_step()) from e

  @contextlib.contextmanager
  def quiet(self):
    """Silences orbax's (absl) log while a read that may fail runs: a damaged checkpoint
    makes its threads log hundreds of lines before the one exception the caller explains."""
    absl_log = logging.getLogger("absl")
    previous, absl_log.disabled = absl_log.disabled, True
    try:
      yield
    finally:
      absl_log.disabled = previous

  def restore(self, step: int, like):
    """Restores `step` into the structure, shapes and shardings of the pytree `like`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def read_or_explain(self, step: int, like, read):
    """`read()` of checkpoint `step` (a restore into `like`, or a check of it), but one that
    does not read back (a truncated or missing file) is a `UserError` naming it and the
    steps that do restore into `like`. Nothing is moved: that is for resuming alone."""
    try:
      with self.quiet():
        return read()
    except (UserError, AttributeError, NameError):
      raise  # The user's mismatch, or a bug of ours: not the checkpoint's damage.
    except Exception as e:  # noqa: BLE001 (orbax/tensorstore raise many kinds)
      if self._removed(step):
        raise CheckpointRemoved(step, self.directory) from e
      error = describe(e)
    good = []
    for other in self.all_steps():
      if other != step:
        try:
          with self.quiet():
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
    training = (self.directory.parent / layout.LOCK).exists()
    deadline = time.monotonic() + (REMOVAL_WAIT_SECONDS if training else 0.0)
    while path.exists():
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.05)
    return True

  def restore_latest_good(self, like) -> tuple[int | None, object]:
    """Restores the newest checkpoint that reads back, moving damaged newer ones aside.

    A checkpoint that fails to restore (a truncated or missing file) is moved to
    `<workdir>/damaged_checkpoints/<step>` for inspection, never deleted, and a
    warning names it and the step used instead. One whose parameters do not fit
    `like.params` (another config or vocabulary) stays where it is: `UserError`.

    Returns:
      (step, state), or (None, `like`) when there is no checkpoint.
    """
    damaged = []
    for step in reversed(self.all_steps()):
      try:
        with self.quiet():  # A damaged one is reported below, in one warning.
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
                    self.directory.parent / layout.DAMAGED_CHECKPOINTS, step)
      return step, state
    if damaged:
      raise UserError(f"No checkpoint in {self.directory} can be restored (steps"
                      f" {', '.join(str(s) for s, _ in damaged)} are damaged and were moved to"
                      f" {self.directory.parent / layout.DAMAGED_CHECKPOINTS}); start a new"
                      " --workdir.")
    return None, like

  def _move_aside(self, step: int) -> None:
    target = self.directory.parent / layout.DAMAGED_CHECKPOINTS / str(step)
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
      with self._full_disk_is_user_error():
        self.manager.close()
    finally:
      self._remove_partial()  # Again: writes that the failure left running may have added to it.

  def _remove_partial(self) -> None:
    """Removes what failed saves wrote (orbax's `<step>.orbax-checkpoint-tmp`): it holds space,
    no reader lists it, and the next save of that step would log its removal."""
    for step in self._partial:
      for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
        shutil.rmtree(partial, ignore_errors=True)


def check_run_config(workdir: Path, config: ml_collections.ConfigDict) -> None:
  """Refuses to resume a run whose model or data config differ from `config`.

  Raises:
    UserError: naming every differing field, its value in the run and in `config`.
  """
  path = Path(workdir) / layout.CONFIG
  if not path.exists():
    return
  saved = json.loads(path.read_text(encoding="utf-8"))
  differ, flags = [], []
  for section in ("model", "data"):
    for key, value in config[section].to_dict().items():
      was = config_lib.saved_value(saved, section, key, value)
      if was != value:
        differ.append(f"config.{section}.{key}={was!r} (not {value!r})")
        flags.append(f"--config.{section}.{key}={was}")
  if differ:
    raise UserError(f"{workdir} holds a run trained with {', '.join(differ)}; resume it with"
                    f" the run's values ({' '.join(flags)}), or pass a new --workdir.")


def save_run_config(workdir: Path, config: ml_collections.ConfigDict) -> None:
  """Writes `<workdir>/config.json` atomically, and only if it changes (a failed start of
  a finished or mismatched run leaves the file untouched)."""
  path, text = Path(workdir) / layout.CONFIG, config_lib.to_json(config)
  if path.exists() and path.read_text(encoding="utf-8") == text:
    return
  layout.write_atomically(path, text)


def _flat_shapes(tree) -> dict[str, tuple]:
  """{"decoder_layers.0.mlp.kernel": shape} of a parameter tree, saved or live."""
  def name(path):
    parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return ".".join(parts[:-1] if parts and parts[-1] == "value" else parts)
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x))[0]
  return {name(path): tuple(leaf) if isinstance(leaf, tuple) else tuple(leaf.shape)
          for path, leaf in leaves}


def _vocab_axis(saved: tuple | None, model: tuple | None, vocab: int | None) -> int | None:
  """The saved size of the one axis where the shapes differ, if the model has `vocab` there."""
  if saved is None or model is None or len(saved) != len(model):
    return None
  axes = [i for i, (a, b) in enumerate(zip(saved, model, strict=True)) if a != b]
  return saved[axes[0]] if len(axes) == 1 and model[axes[0]] == vocab else None


def _describe(shape: tuple | None) -> str:
  return "missing" if shape is None else f"of shape {shape}"


def _vocab_size(path: Path) -> int | None:
  """Pieces in the run's SentencePiece model (None if there is none)."""
  if not path.is_file():
    return None
  import sentencepiece as spm
  return spm.SentencePieceProcessor(model_file=str(path)).vocab_size()


def vocab_fingerprint(path: Path) -> str | None:
  """The fingerprint of a SentencePiece model's content (`tokenizer.fingerprint`; None if
  there is none): a vocabulary trained again from the same text and seed has the same one."""
  return tokenizer.fingerprint(path)


def _bytes_sha256(path: Path) -> str:
  """sha256 of a file's bytes: what checkpoints recorded as the vocabulary's fingerprint
  before it was taken over the content."""
  return hashlib.sha256(path.read_bytes()).hexdigest()
