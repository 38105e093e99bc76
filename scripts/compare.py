"""`seq2seq-compare` run from a checkout: compares runs.

  python scripts/compare.py runs/rnn_attention/* [--baseline=DIR] [--out=DIR]

The same flags, messages and exit statuses as `seq2seq-compare`; its usage and flags:
seq2seq/commands/compare.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.compare()
