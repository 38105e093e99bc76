"""Trains (or resumes) a run: parses flags and calls `train_and_evaluate`.

  python scripts/train.py --config=configs/multi30k_transformer.py \
      --workdir=runs/m30k_transformer [--config.train.num_steps=200]

Kept short on purpose: the logic lives in `seq2seq.train`, importable and tested.
"""

from seq2seq import allocator, signals

signals.exit_on_signals()  # Before the slow imports: Ctrl-C during them ends the command.
allocator.keep_freed_memory()  # Before XLA starts its threads (seq2seq/allocator.py).

from absl import app, flags

from seq2seq.cli import define_config_flag, parse_flags, run_main
from seq2seq.train import INTERRUPTED, train_and_evaluate

_CONFIG = define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the run (created or resumed).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  run_main(lambda: train_and_evaluate(_CONFIG.value, _WORKDIR.value),
           interrupted=INTERRUPTED)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
