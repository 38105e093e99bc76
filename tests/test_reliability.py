"""Failures from outside: a full disk while training writes, a live run's training rotating a
checkpoint away while evaluation reads it, and two first starts racing for one new workdir."""

import errno
import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from orbax.checkpoint._src.path import async_path

from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.runs import checkpoints, claim, workdirs
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.metrics_writer import MetricsWriter
from seq2seq.runs.workdirs import WorkdirLock
from seq2seq.training import loop, seeds
from tests.helpers import ENV, ROOT, full_disk_at, shared_run_config


def sha256s(directory: Path) -> dict[str, str]:
  """Every file under `directory`: its sha256."""
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def resumable_at_2(run, tmp_path) -> Path:
  """A copy of the shared run whose newest checkpoint (4) is gone: it resumes at step 2."""
  workdir = tmp_path / "run"
  shutil.copytree(run, workdir)
  shutil.rmtree(workdir / "checkpoints" / "4")
  return workdir


def saved(workdir: Path) -> dict[str, str]:
  """The files that a failed save must leave as they were: checkpoints, vocabulary, config."""
  return {name: digest for name, digest in sha256s(workdir).items()
          if name.startswith(("checkpoints/", "vocab/", "config.json"))}


# --- A full disk (issue 28, item 5) -------------------------------------------------------


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_a_full_disk_while_saving_is_one_line_and_the_same_command_resumes(
    run, tmp_path, monkeypatch, caplog, capfd):
  workdir = resumable_at_2(run, tmp_path)
  before = saved(workdir)
  expected = (f"No space left on device while saving the checkpoint of step 4 in"
              f" {workdir}/checkpoints; the last good checkpoint is step 2. Free some space and"
              " run the same command to resume.")
  monkeypatch.setattr(async_path, "write_text", full_disk_at(4))
  caplog.set_level(logging.INFO, logger="seq2seq")
  capfd.readouterr()
  for _ in range(2):  # The first run, and a rerun on a disk still full.
    with pytest.raises(UserError) as raised:
      loop.train_and_evaluate(shared_run_config(), workdir)
    assert str(raised.value) == expected
    assert saved(workdir) == before  # Checkpoint 2 untouched, no trace of 4.
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2"]
  # orbax's threads logged the traceback of each failed write: not shown.
  assert not [r for r in caplog.records if "No space left" in r.getMessage()
              or r.exc_info and "No space left" in str(r.exc_info[1])]
  assert "Traceback" not in capfd.readouterr().err

  monkeypatch.undo()  # Space is free again: the same command resumes and finishes.
  caplog.clear()
  result = loop.train_and_evaluate(shared_run_config(), workdir)
  assert result["step"] == 4
  assert f"Resumed {workdir} at step 2." in caplog.messages
  checkpoints = Checkpoints(workdir, keep=2)
  assert checkpoints.all_steps() == [2, 4]
  checkpoints.close()


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_the_command_prints_only_the_line_on_a_full_disk(run, tmp_path):
  workdir = resumable_at_2(run, tmp_path)
  code = (
      "from orbax.checkpoint._src.path import async_path\n"
      "from seq2seq.commands import cli\nfrom seq2seq.training import loop\n"
      "from tests.helpers import full_disk_at, shared_run_config\n"
      "async_path.write_text = full_disk_at(4)\n"
      "cli.parse_flags(['train.py'])\n"
      f"cli.run_main(lambda: loop.train_and_evaluate(shared_run_config(), {str(workdir)!r}))\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=ENV, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.splitlines()[-1] == (
      f"error: No space left on device while saving the checkpoint of step 4 in"
      f" {workdir}/checkpoints; the last good checkpoint is step 2. Free some space and run the"
      " same command to resume.")
  assert "Traceback" not in result.stderr and "orbax" not in result.stderr


def test_a_full_disk_at_the_first_checkpoint_leaves_no_new_workdir(tmp_path, monkeypatch):
  workdir = tmp_path / "new"
  monkeypatch.setattr(async_path, "write_text", full_disk_at(2))
  with pytest.raises(UserError) as raised:
    loop.train_and_evaluate(shared_run_config(), workdir)
  assert str(raised.value) == (
      f"No space left on device while saving the checkpoint of step 2 in {workdir}/checkpoints;"
      " no checkpoint was saved yet. Free some space and run the same command to start again.")
  assert not workdir.exists()


@pytest.mark.parametrize("split, doing", [
    ("val", "writing the val metrics of step 4 in {workdir}"),
    ("train", "writing in {workdir}"),  # Any other write of the run: where, not which step.
])
def test_a_full_disk_while_writing_metrics_keeps_the_last_checkpoint(run, tmp_path, monkeypatch,
                                                                      split, doing):
  workdir = resumable_at_2(run, tmp_path)
  before = saved(workdir)
  write = MetricsWriter.write

  def full(self, step, this_split, metrics):
    if (step, this_split) == (4, split):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    write(self, step, this_split, metrics)

  monkeypatch.setattr(MetricsWriter, "write", full)
  with pytest.raises(UserError) as raised:
    loop.train_and_evaluate(shared_run_config(), workdir)
  assert str(raised.value) == (
      f"No space left on device while {doing.format(workdir=workdir)}; the last good checkpoint"
      " is step 2. Free some space and run the same command to resume.")
  assert saved(workdir) == before


def wrapped_by_orbax() -> Exception:
  error = RuntimeError("save failed")
  error.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/params.w/0")
  return error


def from_tensorstore() -> Exception:
  """A real one's text: the errno only in the message, the ValueError chained by asyncio."""
  error = RuntimeError("Encountered error while writing array")
  error.__context__ = ValueError(
      'RESOURCE_EXHAUSTED: Error writing "params.w/0" in OCDBT database at local file "/x/":'
      " Failed to write 8 bytes to file 22: No space left on device [os_error_code='28']")
  return error


@pytest.mark.parametrize("failure, reason", [
    (wrapped_by_orbax, "No space left on device"),
    (from_tensorstore, "No space left on device"),
    (lambda: OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), "Disk quota exceeded"),
])
def test_a_full_disk_that_surfaces_when_the_save_is_waited_for(tmp_path, failure, reason):
  """orbax may write in the background: the error comes when the save is waited for."""
  checkpoints = Checkpoints(tmp_path, keep=2)
  tree = {"w": jax.numpy.arange(4.0)}
  checkpoints.save(1, tree)

  def fail():
    raise failure()

  checkpoints.manager.save = lambda *args, **kwargs: True  # Started, still writing...
  checkpoints.manager.wait_until_finished = fail  # ... and failing when waited for.
  with pytest.raises(UserError) as raised:
    checkpoints.save(2, tree)
  assert str(raised.value) == (
      f"{reason} while saving the checkpoint of step 2 in {tmp_path}/checkpoints; the last good"
      " checkpoint is step 1. Free some space and run the same command to resume.")
  checkpoints.close()  # orbax repeats it when closing: reported once, already.
  reopened = Checkpoints(tmp_path, keep=2)
  assert reopened.all_steps() == [1]
  reopened.close()


def test_other_save_errors_are_not_called_a_full_disk(tmp_path):
  checkpoints = Checkpoints(tmp_path, keep=2)

  def fail(*args, **kwargs):
    raise OSError(errno.EIO, os.strerror(errno.EIO))

  checkpoints.manager.save = fail
  with pytest.raises(OSError, match="Input/output error"):
    checkpoints.save(1, {"w": jax.numpy.zeros(2)})
  checkpoints.close()


# --- A workdir made read-only mid-run (issue 58, round 6) ---------------------------------


def refused_in(*folders: Path):
  """orbax's making of a step's temporary directory (a save's first write) in `folders`,
  refused as a read-only folder refuses it: the tests may run as root, whom chmod refuses
  nothing. Install it with `async_path.mkdir = refused_in(...)`."""
  mkdir = async_path.mkdir

  async def refused(path, *args, **kwargs):
    if Path(path).parent in folders and ".orbax-checkpoint-tmp" in Path(path).name:
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return await mkdir(path, *args, **kwargs)

  return refused


def orbax_threads_left() -> list:
  """orbax's threads of a save still alive 5 s on (a failed save's waited 300 s for a step
  directory that was never made, and held the process's exit as long)."""
  from orbax.checkpoint._src.futures import future
  threads = [t for t in threading.enumerate() if isinstance(t, future._SignalingThread)]
  for thread in threads:
    threading.Thread.join(thread, timeout=5)  # (Its own join raises at the timeout.)
  return [thread.name for thread in threads if thread.is_alive()]


def test_a_checkpoints_folder_made_read_only_ends_the_run_in_one_line_at_once(
    tmp_path, monkeypatch, caplog, capfd):
  workdir = tmp_path / "new"
  monkeypatch.setattr(async_path, "mkdir", refused_in(workdir / "checkpoints"))
  capfd.readouterr()
  with pytest.raises(UserError) as raised:
    loop.train_and_evaluate(shared_run_config(), workdir)
  assert str(raised.value) == (
      f"Permission denied while saving the checkpoint of step 2 in {workdir}/checkpoints; no"
      f" checkpoint was saved yet. Make {workdir}/checkpoints writable again and run the same"
      " command to start again.")
  assert orbax_threads_left() == []
  assert not [r for r in caplog.records if r.exc_info or "Permission denied" in r.getMessage()]
  assert "Traceback" not in capfd.readouterr().err


@pytest.mark.slow  # Compiles a seed group's step: over ~7 s.
def test_a_seed_groups_member_whose_checkpoints_are_refused_ends_alone(tmp_path, monkeypatch,
                                                                       caplog):
  """The member's save fails (it was a PermissionError of the whole group: every member
  failed with its error); the other trains on to its end."""
  workdirs_ = {seed: tmp_path / f"seed-{seed}" for seed in (0, 1)}
  monkeypatch.setattr(async_path, "mkdir", refused_in(workdirs_[1] / "checkpoints"))
  results = seeds.train_seeds(shared_run_config(), workdirs_)
  assert results[0]["step"] == 4 and Checkpoints(workdirs_[0], keep=2).all_steps() == [2, 4]
  assert str(results[1]) == (
      f"Permission denied while saving the checkpoint of step 2 in {workdirs_[1]}/checkpoints;"
      f" no checkpoint was saved yet. Make {workdirs_[1]}/checkpoints writable again and run the"
      " same command to start again.")
  assert orbax_threads_left() == []
  assert not [r for r in caplog.records if r.exc_info]


# --- Evaluating a live run (issue 28, item 6) ----------------------------------------------


@pytest.fixture(scope="module")
def four_checkpoints(tmp_path_factory):
  """A run with checkpoints at 2, 4, 6 and 8 (keep=4): a live run's past and future."""
  c = shared_run_config(num_steps=8)
  c.checkpoint.keep = 4
  workdir = tmp_path_factory.mktemp("rotated") / "run"
  loop.train_and_evaluate(c, workdir)
  return workdir


def live_run(four_checkpoints, tmp_path) -> tuple[Path, Path]:
  """A copy holding checkpoints 2 and 4, the training's next ones (6, 8) kept aside."""
  workdir, later = tmp_path / "run", tmp_path / "later"
  shutil.copytree(four_checkpoints, workdir)
  later.mkdir()
  for step in ("6", "8"):
    (workdir / "checkpoints" / step).rename(later / step)
  return workdir, later


def rotating_while_read(monkeypatch, workdir: Path, later: Path, times: int,
                        partially: bool = False):
  """Before the first read of each of the next `times` evaluations of checkpoints: the run's
  training saves its next checkpoint and removes its oldest (keep=2), as orbax does; with
  `partially`, the oldest is still being deleted file by file when the read fails."""
  read = Checkpoints.read_or_explain
  state = {"rotations": 0, "resolved": None}
  resolve = Checkpoints.resolve

  def resolving(self, spec):
    state["resolved"] = resolve(self, spec)
    return state["resolved"]

  def reading(self, step, like, read_fn):
    if state["resolved"] is not None and state["rotations"] < times:
      state["resolved"] = None
      steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
      (later / str(steps[-1] + 2)).rename(workdir / "checkpoints" / str(steps[-1] + 2))
      oldest = workdir / "checkpoints" / str(steps[0])
      if partially:  # The files go first; the directory goes while the reader waits.
        for path in sorted(oldest.rglob("*"), reverse=True):
          path.unlink() if path.is_file() else path.rmdir()
        sleep = checkpoints.time.sleep

        def deleted(seconds):
          shutil.rmtree(oldest, ignore_errors=True)
          sleep(seconds)

        monkeypatch.setattr(checkpoints.time, "sleep", deleted)
      else:
        shutil.rmtree(oldest)
      state["rotations"] += 1
    return read(self, step, like, read_fn)

  monkeypatch.setattr(Checkpoints, "resolve", resolving)
  monkeypatch.setattr(Checkpoints, "read_or_explain", reading)


@pytest.mark.parametrize("partially", [False, True], ids=["removed", "being-removed"])
def test_a_checkpoint_removed_while_read_is_read_again_from_the_new_set(
    four_checkpoints, tmp_path, monkeypatch, caplog, partially):
  workdir, later = live_run(four_checkpoints, tmp_path)
  settled = tmp_path / "settled"  # What the run holds after the rotation: 4 and 6.
  shutil.copytree(four_checkpoints, settled)
  for step in ("2", "8"):
    shutil.rmtree(settled / "checkpoints" / step)
  expected = Translator(settled, "avg:2", beam_size=1)
  if partially:
    (workdir / workdirs.LOCK).write_text("host h, pid 1\n")  # The training holds the run.
  rotating_while_read(monkeypatch, workdir, later, times=1, partially=partially)
  caplog.set_level(logging.INFO, logger="seq2seq")
  translator = Translator(workdir, "avg:2", beam_size=1)
  assert translator.steps == expected.steps == [4, 6]
  assert jax.tree.all(jax.tree.map(np.array_equal, translator.params, expected.params))
  assert ("Checkpoint 2 was removed by the run's training while it was read; choosing"
          " --checkpoint=avg:2 again.") in caplog.messages
  assert not any("cannot be restored" in m for m in caplog.messages)


def test_a_checkpoint_removed_twice_is_one_line_that_says_training_removed_it(
    four_checkpoints, tmp_path, monkeypatch):
  workdir, later = live_run(four_checkpoints, tmp_path)
  rotating_while_read(monkeypatch, workdir, later, times=2)
  with pytest.raises(UserError) as raised:
    Translator(workdir, "avg:2", beam_size=1)
  assert str(raised.value) == (
      f"Checkpoint 4 in {workdir}/checkpoints was removed by the run's training (it keeps only"
      " its latest checkpoints, config.checkpoint.keep) while this command read it; it is not"
      " damaged. Run the command again, or once the training has finished.")


# --- Two first starts on one new workdir (issue 28, item 9) --------------------------------


@pytest.mark.parametrize("made_by", ["this start", "the other start"])
def test_a_start_refused_the_lock_leaves_the_new_workdir_of_the_other(tmp_path, monkeypatch,
                                                                      made_by):
  """Two first starts on one new workdir, interleaved: whichever made the directory, the other
  start takes the lock and writes first, and the start refused the lock removes nothing."""
  workdir = tmp_path / "new"
  other = WorkdirLock(workdir)

  def other_start_takes_it():
    workdir.mkdir(exist_ok=True)
    other.acquire()
    (workdir / "vocab").mkdir()
    (workdir / "vocab" / "spm.model").write_bytes(b"the other start's vocabulary")
    (workdir / "metrics.jsonl").write_text('{"step": 1}\n')

  def then_the_other_start(fn):
    def racing(*args):
      result = fn(*args)
      other_start_takes_it()
      return result
    return racing

  if made_by == "this start":  # It saw no workdir (and made it); the other then locks it.
    monkeypatch.setattr(claim, "check_run_config", then_the_other_start(claim.check_run_config))
  else:  # The other start makes and locks it before this one looks.
    monkeypatch.setattr(workdirs, "check_writable", then_the_other_start(workdirs.check_writable))
  try:
    with pytest.raises(UserError) as raised:
      loop.train_and_evaluate(shared_run_config(), workdir)
    assert str(raised.value) == (
        f"{workdir} is in use by another training (host {socket.gethostname()}, pid"
        f" {os.getpid()}, holding {workdir / '.lock'}); wait for it to finish or stop it, or pass"
        " another --workdir.")
    assert {name: digest for name, digest in sha256s(workdir).items()
            if not name.startswith("checkpoints/")} == {
        ".lock": hashlib.sha256(f"host {socket.gethostname()}, pid {os.getpid()}\n"
                                .encode()).hexdigest(),
        "vocab/spm.model": hashlib.sha256(b"the other start's vocabulary").hexdigest(),
        "metrics.jsonl": hashlib.sha256(b'{"step": 1}\n').hexdigest()}
  finally:
    other.release()


def test_only_the_start_that_made_the_workdir_removes_it(tmp_path, monkeypatch):
  """The winner of the race fails before its first checkpoint: its own new workdir goes."""
  workdir = tmp_path / "new"

  def fail(*args):
    raise UserError("a mistake found while starting.")

  monkeypatch.setattr(loop, "Trainer", fail)
  with pytest.raises(UserError, match="a mistake found while starting"):
    loop.train_and_evaluate(shared_run_config(), workdir)
  assert not workdir.exists()
  workdir.mkdir()  # Made by another start (a run's, by its files): a failed start leaves it.
  (workdir / "metrics.jsonl").write_text("")
  (workdir / "notes.txt").write_text("kept\n")
  with pytest.raises(UserError, match="a mistake found while starting"):
    loop.train_and_evaluate(shared_run_config(), workdir)
  assert (workdir / "notes.txt").read_text() == "kept\n"
  assert not (workdir / ".lock").exists()


def test_a_workdir_removed_before_its_lock_is_taken_is_one_line(tmp_path):
  """The start that made a new workdir failed and removed it while this one was starting."""
  with pytest.raises(UserError) as raised:
    WorkdirLock(tmp_path / "gone").acquire()
  assert str(raised.value) == (f"{tmp_path / 'gone'} was removed while this training started;"
                               " run the command again.")


@pytest.mark.parametrize("in_orbax", [True, False])
def test_asyncio_logs_of_a_failed_orbax_read_are_filtered_by_where_they_were_raised(in_orbax):
  # A damaged checkpoint's read fails in tensorstore under orbax's gathering future; asyncio
  # logs "exception was never retrieved" with a message that names neither orbax nor OCDBT.
  from seq2seq.runs import orbax_logs
  where = orbax_logs._ORBAX + "read.py" if in_orbax else __file__
  try:
    try:
      exec(compile("raise ValueError('OUT_OF_RANGE')", where, "exec"))
    except ValueError as e:
      raise Exception("Encountered error while reading array index") from e
  except Exception:
    record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1,
                               "_GatheringFuture exception was never retrieved", (),
                               sys.exc_info())
  assert orbax_logs._library_log_shown(record) is not in_orbax


def test_a_workdir_made_read_only_still_releases_its_lock(tmp_path, monkeypatch):
  """Its lock file cannot be removed: the lock (the flock) is released all the same, and the
  run's line stays its save's (it was "Permission denied (.../.lock)", or a seed group's error
  once its members had trained)."""
  lock, unlink = WorkdirLock(tmp_path), Path.unlink

  def refused(path, *args, **kwargs):
    if path == tmp_path / workdirs.LOCK:
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return unlink(path, *args, **kwargs)

  lock.acquire()
  monkeypatch.setattr(Path, "unlink", refused)
  lock.release()
  again = WorkdirLock(tmp_path)
  again.acquire()  # Not "in use by another training".
  again.release()


# --- A signal as a sweep ends (issue 58, round 6) ------------------------------------------


def test_a_sigterm_as_a_sweep_ends_stops_it_as_one_during_it(run, tmp_path):
  """A SIGTERM once the summary is printed, while the process ends (here from its last exit
  handler): the sweep's line and status 130, as during its work. It was status -15 and no word
  (Python's shutdown resets the signal handlers), or a traceback from the exit handler."""
  root = tmp_path / "sweep"
  shutil.copytree(run, root / "seed-0")  # Complete: the sweep skips it, and ends.
  code = ("import atexit, os, signal, sys\n"
          "atexit.register(os.kill, os.getpid(), signal.SIGTERM)  # Run last, as it ends.\n"
          f"sys.argv = ['seq2seq-sweep', '--config={ROOT}/configs/tiny.py', '--root={root}',"
          " '--sweep=train.seed=0', '--config.train.num_steps=4']\n"
          "from seq2seq.commands import main\nmain.sweep()\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=ENV, timeout=300)
  assert result.stdout == "seed-0  skipped\n"
  assert (result.returncode, result.stderr.splitlines()[-1]) == (
      130, "stopped by SIGTERM; nothing half-written was kept: the same command starts again.")
  assert "Traceback" not in result.stderr
