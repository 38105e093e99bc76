r"""`seq2seq-plot-attention` run from a checkout: draws a run's attention.

  python scripts/plot_attention.py --workdir=runs/m30k_transformer \
      --text="A little girl climbs into a wooden playhouse."

The same flags, messages and exit statuses as `seq2seq-plot-attention`; its usage and flags:
seq2seq/commands/plot_attention.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.plot_attention()
