"""`seq2seq-translate` run from a checkout: translates text.

  echo "A dog runs on the beach." | python scripts/translate.py --workdir=runs/m30k_transformer

The same flags, messages and exit statuses as `seq2seq-translate`; its usage and flags:
seq2seq/commands/translate.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.translate()
