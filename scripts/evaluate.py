"""Scores a run's checkpoint on a split (or any test set) with sacreBLEU.

  python scripts/evaluate.py --workdir=runs/m30k_transformer --split=test \
      [--checkpoint=best|latest|STEP|avg:N] [--beam_size=4 --alpha=0.6]
  python scripts/evaluate.py --workdir=DIR --src_file=test.en --ref_file=test.de

Writes <workdir>/eval/<split>.<checkpoint>.beam<k>.hyp (detokenized, one line
per sentence) and .json (BLEU, case-insensitive BLEU, chrF, TER, signatures).
"""

import json

from absl import app, flags

from seq2seq.cli import run_main
from seq2seq.evaluate import run_evaluation

_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of a training run.")
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "val", "test"], "Split of the run's corpus.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "best, latest, a step, or avg:N.")
_BEAM = flags.DEFINE_integer("beam_size", 4, "Beam size (1: greedy).")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Sentences per batch.")
_SRC = flags.DEFINE_string("src_file", "", "External source file (with --ref_file).")
_REF = flags.DEFINE_string("ref_file", "", "External reference file (with --src_file).")
flags.mark_flag_as_required("workdir")


def main(argv):
  del argv

  def evaluate():
    result, prefix = run_evaluation(
        _WORKDIR.value, split=_SPLIT.value, checkpoint=_CHECKPOINT.value,
        beam_size=_BEAM.value, alpha=_ALPHA.value, batch_size=_BATCH.value,
        src_file=_SRC.value, ref_file=_REF.value)
    print(json.dumps(result, indent=2))
    print(f"wrote {prefix}.hyp and {prefix}.json")

  run_main(evaluate)


if __name__ == "__main__":
  app.run(main)
