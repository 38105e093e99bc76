"""`seq2seq-serve` run from a checkout: serves runs over HTTP, with the attention explorer.

  python scripts/serve.py --workdir=runs/m30k_transformer --checkpoint=selected

The same flags, messages and exit statuses as `seq2seq-serve`; its usage and flags:
seq2seq/commands/serve.py, or --help.
"""

from seq2seq.commands import main

if __name__ == "__main__":
  main.serve()
