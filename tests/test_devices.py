"""Data parallelism and FSDP: training on several devices equals one device with the same
global batch."""

import re
import subprocess
import sys

import numpy as np
import pytest

from seq2seq.evaluation.evaluate import run_evaluation
from seq2seq.evaluation.scores import output_files
from tests.helpers import ROOT, device_env, train_losses, train_on


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


@pytest.mark.slow  # two training processes, four batch shapes each
def test_four_devices_see_the_batches_of_one_on_the_tiny_config_as_shipped(tmp_path):
  """configs/tiny.py as shipped: its batches of 21 rows (length 24) do not split over 4
  devices. Filler rows pad them for the devices, so the batches per epoch, the examples of
  every step and the losses are one device's (to float32 rounding: the sums split four ways)."""
  args = ["--config.train.num_steps=12", "--config.train.log_every_steps=1",
          "--config.eval.every_steps=12", "--config.eval.max_sentences=8"]
  losses, epochs = {}, {}
  for devices in (1, 4):
    workdir = tmp_path / str(devices)
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"),
                             f"--config={ROOT / 'configs' / 'tiny.py'}", f"--workdir={workdir}",
                             *args], capture_output=True, text=True, env=device_env(devices),
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    epochs[devices] = re.search(r"(\d+) batches per epoch", result.stderr)[1]
    losses[devices] = train_losses(workdir)
  assert epochs[4] == epochs[1] and len(losses[1]) == 12
  np.testing.assert_allclose(losses[4], losses[1], rtol=2e-5)
