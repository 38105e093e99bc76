"""`seq2seq-benchmark` run from a checkout: training and decoding speed.

  python scripts/benchmark.py [--mode=train,decode] [--dtype=float32|bfloat16]

The same flags, messages and exit statuses as `seq2seq-benchmark`; its usage and flags:
seq2seq/commands/benchmark.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.benchmark()
