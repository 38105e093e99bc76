r"""This project's speed against flax `examples/wmt` at equal shapes, one JSON line.

  seq2seq-side-by-side [--rounds=7] [--beam=4]

A train step (64 x 32 random tokens, 3+3 layers, d=256) and beam search (32 sentences, 40
tokens out) of both, interleaved in one process; `train_ratio` and `decode_ratio` are the
anchor's median time over ours (above 1: faster than the anchor). The anchor's two files come
from $FLAX_WMT_DIR, or from flax's source distribution, downloaded at run time
(seq2seq/performance/side_by_side.py).

The comparison against JoeyNMT is a reproduction in a checkout, not part of the package:
`python benchmarks/joeynmt/side_by_side.py` (benchmarks/joeynmt/README.md).
"""

import dataclasses
import json

from absl import flags

from seq2seq.commands import cli
from seq2seq.errors import UserError

JOEYNMT = ("JoeyNMT's comparison is a reproduction outside the package: from a checkout, run"
           " `python benchmarks/joeynmt/side_by_side.py --joeynmt_python=...`"
           " (benchmarks/joeynmt/README.md).")


class _AnchorParser(flags.EnumParser):
  """flax_wmt; `joeynmt`, the anchor this command once had, is refused naming where it went
  (before any other flag's error: absl reports unknown flags last)."""

  def parse(self, argument):
    if argument == "joeynmt":
      raise ValueError(JOEYNMT)
    return super().parse(argument)


flags.DEFINE(_AnchorParser(["flax_wmt"]), "anchor", "flax_wmt", "What to time ours against:"
             " flax's examples/wmt at equal shapes (JoeyNMT: python"
             " benchmarks/joeynmt/side_by_side.py, from a checkout).")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Timed rounds, each two train steps and one search.")
_BEAM = flags.DEFINE_integer("beam", 4, "Beam size of both searches.")


def main(argv):
  del argv

  def measure():
    if _ROUNDS.value < 1 or _BEAM.value < 1:
      raise UserError(f"--rounds={_ROUNDS.value} and --beam={_BEAM.value} must be at least 1.")
    from seq2seq.performance import side_by_side

    shapes = dataclasses.replace(side_by_side.Shapes(), beam=_BEAM.value)
    print(json.dumps(side_by_side.compare(_ROUNDS.value, shapes)), flush=True)

  cli.run_main(measure)
