"""`seq2seq-evaluate` run from a checkout: scores a run's checkpoint.

  python scripts/evaluate.py --workdir=runs/m30k_transformer --split=test [--checkpoint=best]

The same flags, messages and exit statuses as `seq2seq-evaluate`; its usage and flags:
seq2seq/commands/evaluate.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.evaluate()
