"""Multi-host training: two processes on localhost equal one process with the same global batch."""

import contextlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from absl import flags

from seq2seq.commands import cli
from seq2seq.runs import workdirs
from seq2seq.runtime import signals
from seq2seq.training import loop
from tests.helpers import (
  DEVICE_RUN,
  device_env,
  fast_tiny_config,
  train_command,
  train_losses,
  train_on,
)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def two_processes(workdir, *overrides: str):
  """scripts/train.py as processes 0 and 1 of one run on localhost, one CPU device each;
  both are killed on the way out, whatever the test did."""
  address = f"localhost:{free_port()}"
  processes = [subprocess.Popen(
      train_command(workdir, *DEVICE_RUN, f"--config.distributed.coordinator_address={address}",
                    "--config.distributed.num_processes=2",
                    f"--config.distributed.process_id={i}", *overrides),
      env=device_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  try:
    yield processes
  finally:
    for p in processes:
      p.kill()


def both_succeed(processes, timeout: float) -> list[tuple[str, str]]:
  """Each process' (stdout, stderr), once both have exited with status 0."""
  outputs = [p.communicate(timeout=timeout) for p in processes]
  for p, (_, stderr) in zip(processes, outputs, strict=True):
    assert p.returncode == 0, stderr[-3000:]
  return outputs


@pytest.mark.slow  # three training processes
def test_two_processes_give_the_losses_of_one(tmp_path):
  one = train_on(1, tmp_path / "one")
  workdir = tmp_path / "two"
  # One CPU device each: the global batch is split over two processes and jax.distributed
  # (gloo collectives on CPU) all-reduces the gradients.
  with two_processes(workdir) as processes:
    outputs = both_succeed(processes, timeout=300)
  assert "devices: 2." in outputs[0][1] and "BLEU" in outputs[0][0]
  assert "devices:" not in outputs[1][1] and "BLEU" not in outputs[1][0]  # Only process 0 logs ...
  two = train_losses(workdir)  # ... and writes metrics (once, not twice).
  assert len(one) == 4
  np.testing.assert_allclose(two, one, rtol=2e-5)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == ["4"]


# Joins, in a fresh process, a "cluster" of one process: the default config first (no
# coordinator: nothing to join), then an address from the config with the process count and
# id left empty, which jax.distributed must read from the environment (a one-task Slurm job).
JOIN = """
import jax
from seq2seq.runtime import distributed
from seq2seq.config import base_config
d = base_config().distributed
distributed.initialize_distributed(d)
print(jax.distributed.is_initialized())
d.coordinator_address, d.num_processes, d.process_id = ADDRESS, 0, -1
distributed.initialize_distributed(d)
distributed.initialize_distributed(d)  # Joined already: nothing to do.
print(jax.distributed.is_initialized(), jax.process_count(), jax.process_index())
"""


def test_initialize_joins_only_when_asked_and_reads_what_is_left_empty_from_the_environment():
  slurm = {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "1",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
  result = subprocess.run(
      [sys.executable, "-c", JOIN.replace("ADDRESS", repr(f"localhost:{free_port()}"))],
      capture_output=True, text=True, env=dict(device_env(1), **slurm), timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines() == ["False", "True 1 0"]


@pytest.mark.slow  # two training processes
def test_a_signal_to_one_process_stops_both_at_the_same_step(tmp_path):
  """SIGTERM reaches process 1 only: both agree on the step, save it together, exit 0."""
  workdir = tmp_path / "two"
  with two_processes(workdir, "--config.train.num_steps=400", "--config.eval.every_steps=400",
                     "--config.train.log_every_steps=1") as processes:
    metrics = workdir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
      assert time.monotonic() < deadline and processes[0].poll() is None
      time.sleep(0.5)
    processes[1].send_signal(signal.SIGTERM)
    outputs = both_succeed(processes, timeout=120)
  steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
  assert len(steps) == 1 and 3 <= steps[0] < 400
  assert (f"Received a signal on another process: saved a checkpoint at step {steps[0]}"
          in outputs[0][1])


@pytest.mark.slow  # two training processes
def test_a_signal_to_one_process_during_start_up_stops_both_before_the_first_step(tmp_path):
  """SIGTERM reaches process 1 while the run starts (process 0 has just trained the
  vocabulary): neither leaves the other waiting in a collective; both end with status 130
  at the first agreement, and the new workdir is removed."""
  workdir = tmp_path / "two"
  with two_processes(workdir) as processes:
    deadline = time.monotonic() + 240
    while not (workdir / workdirs.VOCAB).exists():
      assert time.monotonic() < deadline and processes[0].poll() is None
      time.sleep(0.1)
    processes[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=120) for p in processes]
  assert [p.returncode for p in processes] == [130, 130], outputs
  assert "stopped by a signal on another process;" in outputs[0][1]
  assert "stopped by SIGTERM;" in outputs[1][1]
  assert not workdir.exists()


def test_a_deferred_start_up_signal_ends_the_run_before_its_first_step(tmp_path, monkeypatch):
  """What each process of a multi-process run does with a start-up signal: it is recorded,
  start-up goes on, and the loop's first agreement ends the run before any step."""
  monkeypatch.setattr(signals, "RECEIVED", [])
  handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
  cli.parse_flags(["train.py"], flags.FlagValues())  # The scripts' start-up handlers.
  try:
    with signals.defer_interrupts():
      signal.raise_signal(signal.SIGTERM)
      assert signals.RECEIVED == ["SIGTERM"]  # Recorded, not raised.
      with pytest.raises(signals.Interrupted, match="SIGTERM"):
        loop.train_and_evaluate(fast_tiny_config(), tmp_path / "run")
  finally:
    for sig, handler in handlers.items():
      signal.signal(sig, handler)
  assert not (tmp_path / "run").exists()
  with pytest.raises(signals.Interrupted, match="SIGTERM"):
    signals.raise_if_interrupted()  # Outside, the record ends a command as before.
