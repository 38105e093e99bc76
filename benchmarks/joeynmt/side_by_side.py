"""This project against JoeyNMT 2.3.0, run from a checkout (JoeyNMT's harness is no part of the
installed package):

  python benchmarks/joeynmt/side_by_side.py --joeynmt_python=.anchors/joeynmt/bin/python
  python benchmarks/joeynmt/side_by_side.py --full_budget --config=configs/multi30k_rnn.py \\
      --joeynmt_python=.anchors/joeynmt/bin/python --workdir=runs/joeynmt/rnn

Its usage and flags: benchmarks/joeynmt/command.py, or --help; what it reproduces:
benchmarks/joeynmt/README.md. It runs as the package's commands do (`seq2seq.commands.main`):
the same messages and exit statuses.
"""

import sys
from pathlib import Path

# The checkout's root, not this folder, first on sys.path: `benchmarks.joeynmt` imports as a
# package, and none of this folder's modules shadows one of the same name.
sys.path[0] = str(Path(__file__).resolve().parents[2])

from seq2seq.commands import main  # noqa: E402 (after the sys.path above)

if __name__ == "__main__":
  main.run_module("benchmarks.joeynmt.command")
