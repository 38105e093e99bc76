"""Data parallelism and FSDP: training on several devices equals one device with the same
global batch."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from seq2seq.evaluate import run_evaluation
from seq2seq.metrics import output_files
from tests.conftest import ROOT

# 256 tokens at padded length 16 are 16 rows: a multiple of 1 and of 4 devices,
# so both runs see exactly the same global batches.
OVERRIDES = ["--config.data.max_train_examples=300", "--config.data.max_len=16",
             "--config.data.bucket_step=16", "--config.data.tokens_per_batch=256",
             "--config.eval.max_sentences=8", "--config.eval.batch_size=8",
             "--config.eval.max_decode_len_a=1.0", "--config.eval.max_decode_len_b=0",
             "--config.train.num_steps=4", "--config.eval.every_steps=4",
             "--config.train.log_every_steps=1"]


def train_command(workdir, *overrides: str) -> list[str]:
  """scripts/train.py on configs/tiny.py with OVERRIDES, then `overrides`."""
  return [sys.executable, str(ROOT / "scripts" / "train.py"),
          f"--config={ROOT / 'configs' / 'tiny.py'}", f"--workdir={workdir}", *OVERRIDES,
          *overrides]


def device_env(devices: int) -> dict:
  """The environment of a process with `devices` (forced) CPU devices."""
  return dict(os.environ, PYTHONPATH=str(ROOT),
              XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


def train_losses(workdir) -> list[float]:
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r["loss"] for r in records if r["split"] == "train"]


def train_on(devices: int, workdir, *overrides: str, expect: str = ""):
  """Trains in a subprocess; returns the logged training losses. `expect`: a log excerpt."""
  result = subprocess.run(train_command(workdir, *overrides), capture_output=True, text=True,
                          env=device_env(devices), timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"devices: {devices}." in result.stderr and expect in result.stderr
  return train_losses(workdir)


@pytest.mark.slow  # two training processes
def test_four_devices_give_the_losses_of_one(tmp_path):
  one = train_on(1, tmp_path / "one")
  four = train_on(4, tmp_path / "four")
  assert len(one) == 4
  np.testing.assert_allclose(four, one, rtol=2e-5)


@pytest.mark.slow  # two training processes
def test_fsdp_sharded_parameters_give_the_losses_of_replicated_ones(tmp_path):
  """4 devices as a 2 (data) x 2 (fsdp) mesh: matrices and their Adam moments are split in
  two, yet training is the replicated one-device run."""
  one = train_on(1, tmp_path / "one")
  sharded = train_on(4, tmp_path / "fsdp", "--config.train.fsdp=2", expect="split over 2")
  assert len(one) == 4
  np.testing.assert_allclose(sharded, one, rtol=2e-5)
  # The sharded checkpoint restores on one device (evaluation needs no mesh) and
  # translates like the replicated run's.
  prefixes = [run_evaluation(tmp_path / name, split="val", checkpoint="latest", beam_size=1,
                            batch_size=8)[1] for name in ("one", "fsdp")]
  hypotheses = [output_files(prefix)[0].read_text(encoding="utf-8") for prefix in prefixes]
  assert hypotheses[0] == hypotheses[1] and hypotheses[0].strip()
