"""The training command as a user runs it: overrides, the finished-run report, errors."""

import json
import os
import signal
import subprocess
import sys
import time

from seq2seq.checkpoint import Checkpoints
from tests.conftest import ROOT

FAST = ["--config.data.max_train_examples=300", "--config.data.max_len=16",
        "--config.data.bucket_step=16", "--config.eval.max_sentences=8",
        "--config.eval.batch_size=8", "--config.eval.max_decode_len_a=1.0",
        "--config.eval.max_decode_len_b=0"]


def train(workdir, *overrides):
  cmd = [sys.executable, str(ROOT / "scripts" / "train.py"),
         f"--config={ROOT / 'configs' / 'tiny.py'}", f"--workdir={workdir}", *FAST, *overrides]
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def snapshot(workdir):
  return {str(p.relative_to(workdir)): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(workdir.rglob("*")) if p.is_file()}


def test_override_reaches_model_and_finished_run_is_not_retrained(tmp_path):
  workdir = tmp_path / "run"
  first = train(workdir, "--config.train.num_steps=4", "--config.eval.every_steps=4",
                "--config.model.emb_dim=48", "--config.model.num_heads=3")
  assert first.returncode == 0, first.stderr[-3000:]
  assert json.loads((workdir / "config.json").read_text())["model"]["emb_dim"] == 48
  checkpoints = Checkpoints(workdir, keep=2)
  assert checkpoints.all_steps() == [4]
  embedding = checkpoints.shapes(4)["params"]["src_embed"]["embedding"]["value"]
  assert embedding[1] == 48
  checkpoints.close()

  before = snapshot(workdir)
  second = train(workdir, "--config.train.num_steps=4", "--config.eval.every_steps=4",
                 "--config.model.emb_dim=48", "--config.model.num_heads=3")
  assert second.returncode == 0, second.stderr[-3000:]
  assert "is complete" in second.stderr
  assert snapshot(workdir) == before


def test_bad_value_is_one_line_error(tmp_path):
  result = train(tmp_path / "run", "--config.model.num_heads=5")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "error: config.model.emb_dim=32 is not divisible by config.model.num_heads=5;"
      " choose sizes where it is."]
  assert not (tmp_path / "run").exists()


def test_sigterm_saves_a_checkpoint_at_the_current_step_and_exits_cleanly(tmp_path):
  workdir = tmp_path / "run"
  cmd = [sys.executable, str(ROOT / "scripts" / "train.py"),
         f"--config={ROOT / 'configs' / 'tiny.py'}", f"--workdir={workdir}", *FAST,
         "--config.train.num_steps=100000", "--config.train.log_every_steps=1",
         "--config.eval.every_steps=100000"]
  process = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 240
  while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
    assert process.poll() is None and time.time() < deadline, "training did not start"
    time.sleep(0.2)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-3000:]
  logged = len(metrics.read_text().splitlines())
  (step,) = Checkpoints(workdir, keep=2).all_steps()
  assert logged <= step < 100000  # the step it was at when the signal arrived
  assert f"Received SIGTERM: saved a checkpoint at step {step}" in stderr
