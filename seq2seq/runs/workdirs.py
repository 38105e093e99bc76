"""A run's directory: what lives where in it, its checks, and its lock.

Layout (paths relative to the workdir; every module takes them from here):

  config.json            the run's full config
  parent.json            the run it started from (config.train.init_from), if any
  vocab/spm.model        the joint SentencePiece model
  checkpoints/<step>/    orbax checkpoints
  damaged_checkpoints/   newest checkpoints that no longer read back, moved aside
  metrics.jsonl          one JSON record per log line
  tensorboard/           the same metrics as TensorBoard events
  eval/                  hypotheses and scores of seq2seq-evaluate, selected.json
  .lock                  while a training process holds the run: its host and pid

One training process per workdir: an exclusive `flock` on `<workdir>/.lock`.
Two trainings in one workdir would interleave their metrics and overwrite each
other's checkpoints. The lock file names its holder (host and pid) for the
refusal message; the kernel drops the lock when its process dies, however it
dies, so a killed run never blocks the next one. The file is removed on release.
"""

import contextlib
import fcntl
import json
import os
import shutil
import socket
from pathlib import Path

import ml_collections

from seq2seq import config as config_lib
from seq2seq.data import tokenizer
from seq2seq.data.textio import write_bytes_atomically
from seq2seq.errors import UserError
from seq2seq.registry import import_extensions
from seq2seq.runs.full_disk import DENIED

CONFIG = Path("config.json")
PARENT = Path("parent.json")
VOCAB = Path("vocab") / "spm.model"
CHECKPOINTS = Path("checkpoints")
DAMAGED_CHECKPOINTS = Path("damaged_checkpoints")
METRICS = Path("metrics.jsonl")
TENSORBOARD = Path("tensorboard")
EVAL = Path("eval")
LOCK = Path(".lock")
# What only a run's directory holds: a directory with files but none of these is not a run.
RUN_ENTRIES = (CONFIG, VOCAB.parent, CHECKPOINTS, DAMAGED_CHECKPOINTS, METRICS, TENSORBOARD, EVAL,
               LOCK)


def check_no_tilde(workdir: str | Path) -> None:
  """Raises `UserError` if `workdir` starts with a `~` the shell left as it is (it expands
  one only at the start of a word, so not in --workdir=~/...): a folder named `~` would be
  made or looked for."""
  if str(workdir).startswith("~"):
    raise UserError(f"--workdir={workdir} starts with '~', which the shell does not expand"
                    " after '='; write the path out, e.g."
                    f" --workdir={Path(workdir).expanduser()}.")


def check_is_run_or_new(workdir: str | Path) -> None:
  """Raises `UserError` if `workdir` is empty text, starts with an unexpanded `~`, or is a
  directory that holds files but nothing of a run (a corpus folder, a home directory):
  training there would adopt it."""
  if not str(workdir).strip():
    raise UserError("--workdir is empty; pass the directory of the run, e.g."
                    " --workdir=runs/m30k_transformer.")
  check_no_tilde(workdir)
  workdir = Path(workdir)
  if workdir.is_dir() and any(workdir.iterdir()) and not any(
      (workdir / entry).exists() for entry in RUN_ENTRIES):
    example = sorted(p.name for p in workdir.iterdir())[0]
    raise UserError(f"--workdir={workdir} holds files ({example}, ...) but no run (no"
                    f" {CONFIG}, {CHECKPOINTS}/ or {VOCAB.parent}/); pass a new directory for"
                    " the run, or a run's workdir.")


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True


def partial_folder(output: Path) -> Path:
  """The hidden folder `.<name>.partial<pid>` beside `output` that this process writes a
  directory in before renaming it to `output` (a release, an export). A partial folder that a
  killed command of this host left (its process gone) is removed first, so none outlives the
  next export of the same output."""
  for stale in output.parent.glob(f".{output.name}.partial*"):
    pid = stale.name.rsplit(".partial", 1)[1]
    if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
      shutil.rmtree(stale, ignore_errors=True)
  return output.with_name(f".{output.name}.partial{os.getpid()}")


@contextlib.contextmanager
def written_whole(output: Path):
  """Yields the partial folder (`partial_folder`, emptied) in which to write the directory
  `output`, renamed to `output` once the block ends; a failure leaves no `output` and no
  partial folder, and an OSError (a full disk) names `output`, not the hidden folder."""
  partial = partial_folder(output)
  shutil.rmtree(partial, ignore_errors=True)
  try:
    yield partial
    partial.rename(output)
  except OSError as e:
    raise OSError(e.errno, e.strerror, str(output)) from e
  finally:
    shutil.rmtree(partial, ignore_errors=True)


def copy_vocabulary(source: Path, workdir: Path, field: str = "config.data.vocab_from") -> None:
  """Puts run `source`'s vocabulary in `workdir` (`field`: config.data.vocab_from, or
  config.train.init_from): the .vocab first and the .model last, each whole (written under a
  private name, then renamed)."""
  model = source / VOCAB
  if not model.is_file():
    raise UserError(f"{field}={source}: {model} does not exist; pass the workdir of a run that"
                    " has trained its vocabulary.")
  tokenizer.Tokenizer.load(model)  # Refuses one that seq2seq did not write.
  target = workdir / VOCAB
  target.parent.mkdir(parents=True, exist_ok=True)
  for ext in (".vocab", ".model"):
    if model.with_suffix(ext).is_file():
      write_bytes_atomically(target.with_suffix(ext), model.with_suffix(ext).read_bytes())


def create_workdir(workdir: str | Path) -> bool:
  """Creates `workdir` (and missing parents); True if this call made it, False if it existed.

  `mkdir` without exist_ok: of simultaneous first starts on one new workdir exactly one made
  it, and only that one may remove it again (once it also holds the lock:
  `claim.Claim.held`).
  """
  try:
    Path(workdir).mkdir(parents=True)
  except FileExistsError:
    return False
  return True


def check_writable(workdir: str | Path) -> None:
  """Raises `UserError` unless `workdir` is, or can be created as, a writable directory.

  Creates nothing: the nearest existing ancestor is checked.
  """
  workdir = Path(workdir)
  existing = workdir
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    raise UserError(f"--workdir={workdir}: {existing} is a file, not a directory; pass another"
                    " --workdir.")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UserError(f"--workdir={workdir}: {existing} is not writable (permissions or a"
                    " read-only filesystem); pass a --workdir on a writable disk.")


class WorkdirInUse(UserError):
  """The workdir's lock is held by another training (`holder`: its host and pid)."""

  def __init__(self, message: str, holder: str = ""):
    super().__init__(message)
    self.holder = holder

  def __reduce__(self):  # Pickled across a sweep's processes with both arguments.
    return type(self), (str(self), self.holder)


class WorkdirLock:
  """Context manager holding `<workdir>/.lock`; `enabled=False` makes it a no-op (the
  processes of a multi-host run other than process 0)."""

  def __init__(self, workdir: str | Path, enabled: bool = True):
    self.path = Path(workdir) / LOCK
    self.enabled = enabled
    self._file = None

  def acquire(self) -> None:
    while True:
      try:
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
      except FileNotFoundError:
        # The start that had just made the new workdir failed and removed it, or a user did.
        raise UserError(f"{self.path.parent} was removed while this training started; run the"
                        " command again.") from None
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise WorkdirInUse(f"{self.path.parent} is in use by another training ({holder},"
                           f" holding {self.path}); wait for it to finish or stop it, or pass"
                           " another --workdir.", holder) from None
      try:
        same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
      except FileNotFoundError:
        same = False
      if same:  # Not a file that a releasing holder unlinked after we opened it.
        break
      f.close()
    f.seek(0)
    f.truncate()
    f.write(f"host {socket.gethostname()}, pid {os.getpid()}\n")
    f.flush()
    self._file = f

  def release(self) -> None:
    if self._file is not None:
      try:
        self.path.unlink(missing_ok=True)  # Before unlocking: a waiter re-checks the inode.
      except OSError as e:  # A workdir made read-only: the lock is the flock, released below.
        if e.errno not in DENIED:
          raise
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self):
    if self.enabled:
      self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()


# --- What a command wrote: a run's config, and JSON records -----------------------------------


def saved_value(saved: dict, section: str, key: str, default):
  """Field `section.key` of a saved run config (a dict from its JSON). Where the saved config
  lacks the field: `config.BEFORE_FIELD`'s value for it, else `default`."""
  return saved.get(section, {}).get(key, config_lib.BEFORE_FIELD.get((section, key), default))


def read_json(path: Path, fix: str) -> dict:
  """A JSON object that a command wrote to `path`; one that does not parse (cut short, or
  edited) is a `UserError` naming the file and `fix`."""
  try:
    value = json.loads(Path(path).read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    reason = getattr(e, "msg", None) or e.reason
    raise UserError(f"{path} is not valid JSON ({reason}); {fix}.") from None
  if not isinstance(value, dict):
    raise UserError(f"{path} is not the JSON object this project writes; {fix}.")
  return value


def read_run_config(workdir: str | Path) -> ml_collections.ConfigDict:
  """A run's saved config (`<workdir>/config.json`, as `config.from_json` reads it), checked as
  a training's start checks its config (`config.validate`, `models.check_config`): a value
  edited by hand would otherwise fail deep inside a command (compile.threads="four"), or
  decode nonsense without a word (eval.max_decode_len_b=-50: each sentence one word long).
  A bad field is a `UserError` naming the file and the field."""
  check_no_tilde(workdir)
  path = Path(workdir) / CONFIG
  saved = read_json(path, RUN_CONFIG_FIX)
  try:
    config = config_lib.from_saved(saved)
  except (TypeError, ValueError, AttributeError):  # A value of another type, or not a section.
    config = None
  checked = config if config is not None else _unchecked(saved, path)
  from seq2seq import models  # What the family can build; it imports JAX, as decoding does.
  try:
    config_lib.validate(checked)
  except UserError as e:
    raise UserError(f"{path}: {str(e).rstrip('.')}; {EDITED_CONFIG_FIX}.") from None
  try:  # The run's own files (docs/extending.md), as its training imported them.
    import_extensions(checked.train.extensions)
  except UserError as e:
    raise UserError(f"{path}: {e}") from None
  try:
    models.check_config(checked)
  except UserError as e:
    raise UserError(f"{path}: {str(e).rstrip('.')}; {EDITED_CONFIG_FIX}.") from None
  if config is None:  # validate found nothing, yet from_saved could not read it.
    raise UserError(f"{path} holds values seq2seq cannot read back; {EDITED_CONFIG_FIX}.")
  return config


def _unchecked(saved: dict, path: Path) -> ml_collections.ConfigDict:
  """The base config with `saved`'s values over it, their types unchecked, for
  `config.validate` to name the field that `config.from_saved` could not take."""
  merged = config_lib.base_config().to_dict()
  for section, values in saved.items():
    if not isinstance(values, dict):
      raise UserError(f"{path}: config.{section} is {values!r}, not a section of fields;"
                      f" {EDITED_CONFIG_FIX}.")
    merged[section] = {**merged.get(section, {}), **values}
  return ml_collections.ConfigDict(merged)


RUN_CONFIG_FIX = ("seq2seq writes it whole, so it was cut or edited since; put it back from a copy"
                  " of the run")
# A saved config.json holding a value that the run's start would refuse: edited by hand.
EDITED_CONFIG_FIX = "was it edited? Put back the run's value, or the file from a copy of the run"
