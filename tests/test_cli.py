"""The training command as a user runs it: overrides, the finished-run report, errors, and
being killed (SIGKILL) or stopped (SIGTERM) at a random step and resumed."""

import ast
import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from seq2seq.runs.checkpoints import Checkpoints
from tests.helpers import ENV, ROOT, console_scripts, snapshot, train_command, train_script


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_override_reaches_model_and_finished_run_is_not_retrained(tmp_path):
  workdir = tmp_path / "run"
  first = train_script(workdir, "--config.train.num_steps=4", "--config.eval.every_steps=4",
                "--config.model.emb_dim=48", "--config.model.num_heads=3")
  assert first.returncode == 0, first.stderr[-3000:]
  assert json.loads((workdir / "config.json").read_text())["model"]["emb_dim"] == 48
  checkpoints = Checkpoints(workdir, keep=2)
  assert checkpoints.all_steps() == [4]
  embedding = checkpoints.shapes(4)["params"]["src_embed"]["embedding"]["value"]
  assert embedding[1] == 48
  checkpoints.close()

  before = snapshot(workdir)
  second = train_script(workdir, "--config.train.num_steps=4", "--config.eval.every_steps=4",
                 "--config.model.emb_dim=48", "--config.model.num_heads=3")
  assert second.returncode == 0, second.stderr[-3000:]
  assert "is complete" in second.stderr
  assert snapshot(workdir) == before


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_sigterm_saves_a_checkpoint_at_the_current_step_and_exits_cleanly(tmp_path):
  workdir = tmp_path / "run"
  cmd = train_command(workdir, "--config.train.num_steps=100000",
                      "--config.train.log_every_steps=1", "--config.eval.every_steps=100000")
  process = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=ENV)
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 240
  while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
    assert process.poll() is None and time.time() < deadline, "training did not start"
    time.sleep(0.2)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-3000:]
  (step,) = Checkpoints(workdir, keep=2).all_steps()
  # The step it was in when the signal arrived: the last one trained, none after it.
  assert step == logged_steps(workdir)[-1] < 100000
  assert f"Received SIGTERM: saved a checkpoint at step {step}" in stderr


# Checkpoints every 3 steps, metrics every step: a run the tests can interrupt anywhere.
RESUMABLE = ["--config.train.num_steps=24", "--config.eval.every_steps=3",
             "--config.train.log_every_steps=1"]


def logged_steps(workdir) -> list[int]:
  metrics = Path(workdir) / "metrics.jsonl"
  if not metrics.exists():
    return []
  lines = metrics.read_text().splitlines()
  # A line being written when the process died may be cut short: only whole records count.
  return [json.loads(line)["step"] for line in lines if line.endswith("}")
          and json.loads(line)["split"] == "train"]


def saved_state(workdir, step: int) -> list[np.ndarray]:
  """Every array of the train state saved at `step` (parameters, Adam moments, step)."""
  tree = ocp.StandardCheckpointHandler().restore(Path(workdir) / "checkpoints" / str(step) /
                                                 "default")
  return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def interrupt(workdir, sig: signal.Signals, at_least: int) -> tuple[int, str]:
  """Starts training, sends `sig` once step `at_least` is logged; returns (returncode, stderr)."""
  process = subprocess.Popen(train_command(workdir, *RESUMABLE), stderr=subprocess.PIPE,
                             text=True, env=ENV)
  deadline = time.time() + 240
  while not (steps := logged_steps(workdir)) or steps[-1] < at_least:
    assert process.poll() is None and time.time() < deadline, "training did not get there"
    time.sleep(0.02)
  process.send_signal(sig)
  _, stderr = process.communicate(timeout=120)
  return process.returncode, stderr


def latest_checkpoint(workdir) -> int | None:
  checkpoints = Checkpoints(workdir, keep=2)
  latest = checkpoints.latest_step()
  checkpoints.close()
  return latest


@pytest.mark.slow  # Four training processes: about a minute.
def test_stopped_and_killed_run_resumes_to_the_bitwise_same_state(tmp_path):
  """SIGTERM at a random step saves that step; SIGKILL at a later random step loses only
  what was not checkpointed; resuming to the end gives the uninterrupted run's exact state."""
  whole = train_script(tmp_path / "whole", *RESUMABLE)
  assert whole.returncode == 0, whole.stderr[-3000:]
  rng = random.Random(7)  # Seeded: the same steps every time.
  workdir = tmp_path / "run"

  returncode, stderr = interrupt(workdir, signal.SIGTERM, rng.randint(2, 8))
  assert returncode == 0, stderr[-3000:]
  stopped = logged_steps(workdir)[-1]
  assert stopped < 24, "SIGTERM must interrupt the run, not find it finished"
  # The checkpoint is at the step it arrived in: the last trained step, none after it.
  assert latest_checkpoint(workdir) == stopped
  assert f"Received SIGTERM: saved a checkpoint at step {stopped} in" in stderr

  returncode, stderr = interrupt(workdir, signal.SIGKILL, rng.randint(stopped + 4, 20))
  assert returncode == -signal.SIGKILL
  assert f"Resumed {workdir} at step {stopped}." in stderr
  assert logged_steps(workdir)[-1] < 24, "SIGKILL must interrupt the run, not find it finished"
  killed_at = latest_checkpoint(workdir)

  resumed = train_script(workdir, *RESUMABLE)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed {workdir} at step {killed_at}." in resumed.stderr
  assert not (workdir / "damaged_checkpoints").exists()
  for a, b in zip(saved_state(tmp_path / "whole", 24), saved_state(workdir, 24), strict=True):
    assert a.dtype == b.dtype and np.array_equal(a, b)


# What start-up does when the signal comes, made to take ten minutes (its module, attribute).
SLOW_START = {"tokenizer training": ("seq2seq.data.tokenizer", "spm.SentencePieceTrainer.train"),
              "compilation": ("seq2seq.runtime.compiling", "_compile")}


# SIGINT and SIGTERM share one handler (signals.catch_interrupts): by default each start-up
# stage is interrupted by one of them, and the other two pairs run with -m slow.
@pytest.mark.parametrize("sig, during", [
    (signal.SIGINT, "tokenizer training"), (signal.SIGTERM, "compilation"),
    pytest.param(signal.SIGTERM, "tokenizer training", marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, "compilation", marks=pytest.mark.slow)],
                         ids=lambda x: x.name if isinstance(x, signal.Signals) else x)
def test_a_signal_during_start_up_ends_at_once_and_leaves_nothing(tmp_path, sig, during):
  """Tokenizer training or compilation that would take ten minutes is interrupted: exit 130,
  one line, and the new workdir is gone (the subprocess would time out if the signal waited
  for it)."""
  workdir = tmp_path / "run"
  module, attribute = SLOW_START[during]
  owner, _, name = attribute.rpartition(".")
  code = (
      "import importlib, operator, os, signal, time\n"
      "from seq2seq.commands import cli\nfrom seq2seq.training import loop\n"
      "from tests.helpers import fast_tiny_config\n"
      "def slow(*args, **kwargs):\n"
      f"  os.kill(os.getpid(), signal.{sig.name})\n"
      "  time.sleep(600)\n"
      f"module = importlib.import_module({module!r})\n"
      f"setattr(operator.attrgetter({owner!r})(module) if {owner!r} else module, {name!r},"
      " slow)\n"
      "cli.parse_flags(['train.py'])\n"
      f"cli.run_main(lambda: loop.train_and_evaluate(fast_tiny_config(), {str(workdir)!r}),"
      " interrupted=loop.INTERRUPTED)\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=ENV, timeout=120)
  assert result.returncode == 130, result.stderr
  assert result.stderr.splitlines()[-1] == (
      f"stopped by {sig.name}; nothing half-written was kept (a new run's workdir is removed"
      " until its first checkpoint): the same command starts again.")
  assert not workdir.exists()


# --- The entry points: seq2seq.commands.main and the console scripts -------------------------

SLOW_MODULES = ("jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "numpy", "sentencepiece")


def test_the_entry_points_module_imports_nothing_slow():
  """The console scripts import `seq2seq.commands.main` first: if it imported JAX, its set-up
  would come too late (a Ctrl-C during the import, malloc settings after XLA's threads start)."""
  code = ("import sys\nimport seq2seq.commands.main\n"
          f"print([m for m in {SLOW_MODULES!r} if m in sys.modules])")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=ENV, timeout=120, check=True)
  assert result.stdout.strip() == "[]"


# Runs `call` (`sys.argv` set for it) and prints, as its last line, what had been set up when
# JAX was first imported: the SIGINT handler's name and the calls of keep_freed_memory.
SET_UP_AT_JAX = """
import json, signal, sys
from seq2seq.runtime import allocator
from seq2seq.commands import main
from seq2seq.runtime import process
calls, seen = [], []
allocator.keep_freed_memory = lambda: calls.append("keep_freed_memory") or True
class Watch:
  def find_spec(self, name, path=None, target=None):
    if name == "jax" and not seen:
      seen.append([signal.getsignal(signal.SIGINT).__qualname__, list(calls)])
sys.meta_path.insert(0, Watch())
sys.argv = ARGV
try:
  CALL
except SystemExit:
  pass
print(json.dumps(seen))
"""


@pytest.mark.parametrize("call, argv", [("main.train()", ["seq2seq-train", "--help"]),
                                        ("process.start_worker()", ["worker"])])
def test_signals_and_malloc_are_set_up_before_jax_is_imported(call, argv):
  code = SET_UP_AT_JAX.replace("CALL", call).replace("ARGV", repr(argv))
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=ENV, timeout=120)
  assert json.loads(result.stdout.splitlines()[-1]) == [
      ["exit_on_signals.<locals>.leave", ["keep_freed_memory"]]], result.stderr[-3000:]


def answer_help(names) -> None:
  """`<name> --help`, for each console script of `names` (at once), prints its command's usage
  (seq2seq/commands/<command>.py's docstring) and flags, and status 0."""
  scripts = console_scripts()
  bin_dir = Path(sys.executable).parent
  missing = [name for name in names if not (bin_dir / name).exists()]
  assert not missing, f"{missing} not installed: pip install -e ."
  processes = {name: subprocess.Popen([str(bin_dir / name), "--help"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=ENV)
               for name in names}
  for name in names:
    stdout, stderr = processes[name].communicate(timeout=300)
    assert processes[name].returncode == 0, stderr[-3000:]
    command = ROOT / "seq2seq" / "commands" / f"{scripts[name].split(':')[1]}.py"
    source = command.read_text(encoding="utf-8")
    usage = ast.get_docstring(ast.parse(source))
    assert stdout.startswith(usage) and name in usage, name
    flags = set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source)) | {"verbose"}
    assert {flag for flag in flags if f"--{flag}:" not in stdout
            and f"--[no]{flag}:" not in stdout} == set(), name


def test_the_train_console_script_answers_help():
  """One command by default: tests/test_structure.py checks that every console script runs its
  command the way this one does."""
  answer_help(["seq2seq-train"])


@pytest.mark.slow  # Seven more processes importing JAX at once: about 15 s.
def test_every_other_console_script_answers_help():
  answer_help([name for name in console_scripts() if name != "seq2seq-train"])


SWALLOWED = r"""
import gc, os, signal, time
from seq2seq.commands import cli
fired = []

def callback(phase, info):  # As JAX's garbage-collection hook: its exceptions are ignored.
  if phase == "start" and not fired:
    fired.append(1)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.5)  # The handler raises here, inside the callback.

def work():
  gc.callbacks.append(callback)
  gc.collect()
  time.sleep(5)
  print("finished")

cli.run_main(work)
"""


# A hook around ours that runs on for 0.3 s after ours returns, as a busy machine may leave the
# main thread inside the hook: the signal raised again must wait until it has left.
SLOW_HOOK = r"""
  import sys
  inner = sys.unraisablehook
  def slow(unraisable):
    inner(unraisable)
    time.sleep(0.3)
  sys.unraisablehook = slow
"""


@pytest.mark.parametrize("hook", ["ours", "slow"])
def test_a_signal_that_lands_in_a_callback_still_ends_the_command(hook):
  script = SWALLOWED if hook == "ours" else SWALLOWED.replace(
      "  gc.callbacks.append", SLOW_HOOK.lstrip("\n") + "  gc.callbacks.append")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=ENV, timeout=120)
  assert result.returncode == 130, result.stderr[-3000:]
  assert "finished" not in result.stdout and "Exception ignored" not in result.stderr
  assert result.stderr.splitlines()[-1] == ("stopped by SIGTERM; nothing half-written was kept:"
                                            " the same command starts again.")


def test_verbose_shows_the_traceback_and_keeps_the_status_of_a_user_error(tmp_path):
  result = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"),
                           f"--workdir={tmp_path}", "--verbose"], capture_output=True, text=True,
                          env=ENV, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" in result.stderr
  assert result.stderr.splitlines()[-1] == (f"error: {tmp_path} is not a training run (no"
                                            " config.json); pass the --workdir that"
                                            " seq2seq-train wrote.")


# A command whose last exit handler (atexit) prints a line, not flushed, and with "signal"
# sends itself a SIGTERM: as a signal may come while the process ends.
ENDING = r"""
import atexit, os, signal, sys
from seq2seq.commands import cli
from seq2seq.errors import UserError

def last():
  print("exit handlers ran")  # Buffered: it reaches the pipe only if the end flushes after.
  if "signal" in sys.argv:
    os.kill(os.getpid(), signal.SIGTERM)

atexit.register(last)

def work():
  print("worked")
  if "error" in sys.argv:
    raise UserError("the work failed")
  return 1 if "failed" in sys.argv else None  # As the sweep's, when one of its runs failed.

cli.run_main(work)
"""

STOPPED = "stopped by SIGTERM; nothing half-written was kept: the same command starts again."


@pytest.mark.parametrize("ending, status, said", [
    ("return", 0, []), ("failed", 1, []), ("error", 2, ["error: the work failed"]),
    ("return signal", 130, [STOPPED]), ("error signal", 130, ["error: the work failed", STOPPED])])
def test_every_command_ends_through_its_exit_handlers_and_a_signal_then_is_its_line(
    ending, status, said):
  """`cli.run_main` ends every command through `process.end`: its exit handlers run and their
  output is flushed, with the status of the command's end (0, the sweep's 1, or 2 after a user
  error); a SIGTERM meanwhile is the command's line and 130. Only the sweep ended so: the
  others exited 0 or 2 as if no signal had come (or -15 and no word, once Python's shutdown
  had reset the signal handlers)."""
  result = subprocess.run([sys.executable, "-c", ENDING, *ending.split()], cwd=ROOT,
                          capture_output=True, text=True, env=ENV, timeout=120)
  assert result.returncode == status, result.stderr[-3000:]
  assert result.stdout == "worked\nexit handlers ran\n"
  assert result.stderr.splitlines() == said


@pytest.mark.parametrize("buffered, status", [(False, 141), (True, 1)])
def test_a_reader_gone_costs_no_traceback(buffered, status):
  """A reader that leaves (`| true`, as `| head` does) wants nothing more: a write then is
  status 141, as a shell reports SIGPIPE, and output still buffered at the end is dropped
  with the command's own status kept; neither is a traceback."""
  script = 'python3 -c "$ENDING" failed | true; echo "status ${PIPESTATUS[0]}" >&2'
  env = {**ENV, "ENDING": ENDING, "PATH": f"{Path(sys.executable).parent}:{ENV['PATH']}"}
  env.pop("PYTHONUNBUFFERED", None)
  result = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env=env if buffered else {**env, "PYTHONUNBUFFERED": "1"}, timeout=120)
  assert result.stderr.splitlines() == [f"status {status}"], result.stderr[-3000:]


# The evaluation command, from its entry point, on a directory that is not a run: the user
# error comes from its work or from its flags (the parser's).
@pytest.mark.parametrize("flag", ["--split=test", "--beam_size=four"])
def test_a_command_from_its_entry_point_ends_through_its_exit_handlers(tmp_path, flag):
  code = ("import atexit, os, signal, sys\n"
          "atexit.register(os.kill, os.getpid(), signal.SIGTERM)\n"
          f"sys.argv = ['seq2seq-evaluate', '--workdir={tmp_path}', {flag!r}]\n"
          "from seq2seq.commands import main\nmain.evaluate()\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=ENV, timeout=120)
  assert result.returncode == 130, result.stderr[-3000:]
  lines = result.stderr.splitlines()
  assert lines[-2].startswith("error: ") and lines[-1] == STOPPED
  assert "Traceback" not in result.stderr


FAULT = r"""
import errno, os, pathlib
from seq2seq.commands import cli
from seq2seq.data import textio

def fail(*args, **kwargs):  # As a read-only mount or a full disk answers a write.
  raise OSError(errno.ERRNO, os.strerror(errno.ERRNO), "OUT.tmp")

def work():
  os.fsync = fail  # Where a full disk shows last: the data written, not yet on the disk.
  textio.write_lines("OUT", ["Ein Hund."])

cli.run_main(work)
"""


@pytest.mark.parametrize("errno_name, line", [
    ("EROFS", "Read-only file system ({out}); make it writable, or pass a path you may write."),
    ("ENOSPC", "No space left on device ({out}); free some space and run the command again.")])
def test_a_write_the_disk_refuses_is_one_line_naming_the_file(tmp_path, errno_name, line):
  out = tmp_path / "out.de"
  code = FAULT.replace("ERRNO", errno_name).replace("OUT", str(out))
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                          timeout=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.splitlines() == ["error: " + line.format(out=out)]
  assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, flag", [
    (["evaluate.py", "--workdir=nowhere", "--gold_alignment=a.txt", "--gold_alignment=b.txt"],
     "--gold_alignment"),
    (["train.py", "--config=configs/tiny.py", "--workdir=nowhere", "--config.train.seed=1",
      "--config.train.seed=2"], "--config.train.seed")])
def test_a_flag_of_one_value_given_twice_is_refused_in_one_line(tmp_path, argv, flag):
  """The last would silently replace the first (a second gold alignment, the first's AER)."""
  result = subprocess.run([sys.executable, str(ROOT / "scripts" / argv[0]), *argv[1:]],
                          capture_output=True, text=True, env=ENV, timeout=120, cwd=ROOT)
  assert result.returncode == 2, result.stderr[-2000:]
  value = argv[-1].split("=", 1)[1]
  assert result.stderr.splitlines() == [
      f"error: {flag} was given 2 times, and only its last value would count; give it once"
      f" ({flag}={value}, if the last was meant)."]
  assert not (ROOT / "nowhere").exists()
