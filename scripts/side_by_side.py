"""`seq2seq-side-by-side` run from a checkout: this project's speed against flax examples/wmt.

  python scripts/side_by_side.py [--rounds=7]

The same flags, messages and exit statuses as `seq2seq-side-by-side`; its usage and flags:
seq2seq/commands/side_by_side.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.side_by_side()
