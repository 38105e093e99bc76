r"""`seq2seq-train` run from a checkout: trains (or resumes) a run.

  python scripts/train.py --config=configs/multi30k_transformer.py \
      --workdir=runs/m30k_transformer [--config.train.num_steps=200]

The same flags, messages and exit statuses as `seq2seq-train`; its usage and flags:
seq2seq/commands/train.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.train()
