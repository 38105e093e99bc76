"""A two-variant sweep on the tiny config, compared end to end."""

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seq2seq.compare import comparison, evaluations, stats, sweep
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.workdirs import WorkdirLock
from seq2seq.runtime import process
from seq2seq.training.trainer import Trainer
from tests.helpers import ENV, FAST, PNG, ROOT, fast_tiny_config, load_config


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 4, 2
  root = tmp_path_factory.mktemp("sweep")
  status = sweep.run_sweep(c, ["model.attention=scaled_dot,dot"], root)
  return c, root, status


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_sweep_trains_each_combination_in_a_readable_workdir(swept):
  _, root, status = swept
  assert status == {"attention-scaled_dot": "trained", "attention-dot": "trained"}
  assert sorted(p.name for p in root.iterdir()) == ["attention-dot", "attention-scaled_dot"]


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_rerunning_the_sweep_trains_nothing(swept):
  c, root, _ = swept
  before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
  status = sweep.run_sweep(c, ["model.attention=scaled_dot,dot"], root)
  assert set(status.values()) == {"skipped"}
  assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_a_failing_run_is_reported_and_the_others_still_train(swept, tmp_path):
  c, _, _ = swept
  c = sweep.expand(c, [])[0][1]
  c.data.max_len = 1  # Every pair is too long: this run fails at startup ...
  status = sweep.run_sweep(c, ["data.max_len=1,16"], tmp_path)
  assert status["max_len-1"].startswith("failed: UserError: The training corpus is empty")
  assert status["max_len-16"] == "trained"  # ... and the sweep goes on.


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_a_run_another_sweep_trains_is_left_to_it_and_not_a_failure(swept, tmp_path):
  c, _, _ = swept
  busy = tmp_path / "seed-0"
  busy.mkdir()
  (busy / "notes.txt").write_text("the other sweep's run")
  with WorkdirLock(busy):  # As the other sweep's training holds it.
    status = sweep.run_sweep(c, ["train.seed=0,1"], tmp_path)
  holder = f"host {socket.gethostname()}, pid {os.getpid()}"
  assert status == {"seed-0": f"in use by another training ({holder}); not trained here: run the"
                              " sweep again once it ends",
                    "seed-1": "trained"}
  assert sorted(p.name for p in busy.rglob("*") if p.is_file()) == ["notes.txt"]


def test_sweep_values_take_the_field_type():
  c = load_config("tiny")
  assert sweep.parse_sweep("train.seed=0,1", c) == ("train.seed", [0, 1])
  assert sweep.parse_sweep("model.pre_ln=true,false", c) == ("model.pre_ln", [True, False])


@pytest.mark.parametrize("specs,message", [
    (["train.seed=0,1", "train.seed=2"], "--sweep=train.seed=0,1 and --sweep=train.seed=2 both"
     " sweep train.seed; give its values in one --sweep, e.g. --sweep=train.seed=0,1,2."),
    (["train.seed=0,0"], "--sweep=train.seed=0,0 lists 0 twice (as a value of"
     " config.train.seed); list each value once: each is a run of its own."),
    (["model.pre_ln=true,1"], "--sweep=model.pre_ln=true,1 lists True twice (as a value of"
     " config.model.pre_ln); list each value once: each is a run of its own."),
])
def test_a_grid_of_one_field_twice_or_one_value_twice_is_refused(tmp_path, specs, message):
  """Such a grid named two runs alike: one trained, with the last value, and the other was
  listed as not started (or counted, and trained once)."""
  with pytest.raises(sweep.UserError) as raised:
    sweep.run_sweep(load_config("tiny"), specs, tmp_path / "root")
  assert str(raised.value) == message
  assert not (tmp_path / "root").exists()


@pytest.mark.slow  # Decodes, bootstraps and draws both runs: about 15 s.
def test_compare_writes_table_and_pictures(swept):
  _, root, _ = swept
  runs = [root / "attention-scaled_dot", root / "attention-dot"]
  rows = comparison.compare_runs(runs, root / "report", split="val", beam_size=2, n_samples=100)
  with open(root / "report" / "comparison.csv", encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert list(table[0]) == ["run", "model.attention", "parameters", "steps", "train_minutes",
                            "tokens_per_sec", "val_bleu", "val_bleu_lc", "val_chrf",
                            "val_bleu_ci95", "val_p_value"]
  assert [r["run"] for r in table] == ["attention-scaled_dot", "attention-dot"]
  assert [r["model.attention"] for r in table] == ["scaled_dot", "dot"]
  assert rows[0]["val_p_value"] is None  # the baseline itself
  for name in ("bleu.png", "curves.png", "attention.png", "length.png"):
    assert (root / "report" / name).read_bytes()[:8] == PNG
  assert "paired bootstrap" in (root / "report" / "comparison.md").read_text()


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_a_run_against_itself_is_not_significant(swept):
  _, root, _ = swept
  run = root / "attention-dot"
  hyps = evaluations.evaluation(run, evaluations.TestSet("val"), 2, 0.6)[1]
  references = evaluations.read_test_set(load_config("tiny"), evaluations.TestSet("val"))[1]
  perfect = list(references)
  result = stats.paired_bootstrap(hyps, {"itself": list(hyps), "other": perfect},
                                          references, 100)
  assert result["itself"][1] == 1.0
  assert result["other"][1] < 0.05  # the same test does detect a real difference


@pytest.mark.slow  # trains and interrupts a sweep of runs
def test_a_signal_stops_the_sweep_and_the_same_command_resumes(tmp_path, monkeypatch):
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 4, 2
  to_device = Trainer.to_device

  def sigterm_once(self, *args):  # A SIGTERM arrives during the first run's first step.
    monkeypatch.setattr(Trainer, "to_device", to_device)
    os.kill(os.getpid(), signal.SIGTERM)
    return to_device(self, *args)

  monkeypatch.setattr(Trainer, "to_device", sigterm_once)
  status = sweep.run_sweep(c, ["model.attention=dot,general"], tmp_path)
  assert status["attention-dot"].startswith("stopped by SIGTERM at step ")
  assert status["attention-general"] == "not started"
  assert not (tmp_path / "attention-general").exists()
  status = sweep.run_sweep(c, ["model.attention=dot,general"], tmp_path)
  assert status == {"attention-dot": "trained", "attention-general": "trained"}


def test_parallel_trainers_take_a_share_of_device_memory_each(monkeypatch):
  """seq2seq-sweep --parallel=N: each of the N processes takes 0.9/N of a device's memory
  (XLA's default, 0.75 each, would not fit two), unless the user chose."""
  for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE"):
    monkeypatch.delenv(name, raising=False)
  process.share_device_memory(1)
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ
  process.share_device_memory(3)
  assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.300"
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  process.share_device_memory(2)
  assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"


@pytest.mark.slow  # Two trainers in processes of their own: about a minute on 2 cores.
def test_a_parallel_sweep_trains_each_point_in_a_process_of_its_own(tmp_path):
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 2, 2
  status = sweep.run_sweep(c, ["model.attention=dot,general"], tmp_path, parallel=2)
  assert status == {"attention-dot": "trained", "attention-general": "trained"}


def _processes_with(variable: str) -> list[str]:
  """The command lines of the processes whose environment holds `variable` (NAME=value)."""
  found = []
  for environ in Path("/proc").glob("[0-9]*/environ"):
    try:
      if variable.encode() in environ.read_bytes().split(b"\0"):
        command = (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ")
        found.append(f"{environ.parent.name}: {command.decode(errors='replace')}")
    except OSError:  # Ended meanwhile.
      continue
  return found


@pytest.mark.slow  # Two trainers in processes of their own, stopped: about a minute.
def test_a_sigterm_to_a_parallel_sweep_stops_and_saves_its_trainers(tmp_path):
  """`kill PID` of a `--parallel=2` sweep: both trainers save their step and stop, the sweep
  says so and exits 130."""
  command = [sys.executable, str(ROOT / "scripts" / "sweep.py"),
             f"--config={ROOT / 'configs' / 'tiny.py'}", *FAST, f"--root={tmp_path}",
             "--sweep=model.attention=dot,general", "--parallel=2",
             "--config.train.num_steps=100000", "--config.eval.every_steps=100000"]
  log = tmp_path / "sweep.log"  # A file, not a pipe: the trainers' progress bars fill one.
  with open(log, "w") as stderr:
    sweep_process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                                     env=dict(ENV, SEQ2SEQ_TEST_SWEEP=str(tmp_path)))
  runs = [tmp_path / "attention-dot", tmp_path / "attention-general"]
  deadline = time.monotonic() + 240
  while not all((run / "metrics.jsonl").exists() for run in runs):  # Both have run step 1.
    assert time.monotonic() < deadline and sweep_process.poll() is None
    time.sleep(0.5)
  sweep_process.send_signal(signal.SIGTERM)
  sweep_process.wait(timeout=240)
  stderr = log.read_text()
  assert sweep_process.returncode == 130, stderr[-3000:]
  assert "leaked" not in stderr
  # No trainer outlives it (multiprocessing's resource tracker may take a moment to end).
  deadline = time.monotonic() + 30
  while (left := _processes_with(f"SEQ2SEQ_TEST_SWEEP={tmp_path}")) and time.monotonic() < deadline:
    time.sleep(0.5)
  assert left == []
  for run in runs:
    steps = Checkpoints(run, keep=2).all_steps()
    assert len(steps) == 1 and 0 < steps[0] < 100000
    assert f"{run.name}: stopped by SIGTERM at step {steps[0]}" in stderr
