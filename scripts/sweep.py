r"""`seq2seq-sweep` run from a checkout: trains a cross product of configs.

  python scripts/sweep.py --config=configs/multi30k_rnn.py \
      --sweep=model.attention=none,dot,general --root=runs/rnn_attention

The same flags, messages and exit statuses as `seq2seq-sweep`; its usage and flags:
seq2seq/commands/sweep.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.sweep()
