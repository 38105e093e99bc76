r"""Trains (or resumes) a run: parses flags and calls `train_and_evaluate`.

  seq2seq-train --config=configs/multi30k_transformer.py \
      --workdir=runs/m30k_transformer [--config.train.num_steps=200]

The logic lives in `seq2seq.training.loop`; this module is its flags.
"""

from absl import flags

from seq2seq.commands.cli import define_config_flag, run_main
from seq2seq.training.loop import INTERRUPTED, train_and_evaluate

_CONFIG = define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the run (created or resumed).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  run_main(lambda: train_and_evaluate(_CONFIG.value, _WORKDIR.value),
           interrupted=INTERRUPTED)
