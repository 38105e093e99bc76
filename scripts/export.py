r"""`seq2seq-export` run from a checkout: converts a run's checkpoint for CTranslate2.

  python scripts/export.py --workdir=runs/m30k_transformer --output=m30k_ct2

The same flags, messages and exit statuses as `seq2seq-export`; its usage and flags:
seq2seq/commands/export.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.export()
