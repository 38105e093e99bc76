"""Data parallelism and FSDP: training on several devices equals one device with the same
global batch."""

import numpy as np
import pytest

from seq2seq.evaluate import run_evaluation
from seq2seq.metrics import output_files
from tests.helpers import train_on


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
