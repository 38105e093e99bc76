r"""Scores a run's checkpoint on a split (or any test set) with sacreBLEU.

  seq2seq-evaluate --workdir=runs/m30k_transformer --split=test \
      [--checkpoint=best|latest|STEP|avg:N|selected] [--beam_size=4 --alpha=0.6] \
      [--plot_attention=K] [--matmul_dtype=bfloat16]
  seq2seq-evaluate --workdir=runs/m30k_transformer --split=val --checkpoint=best,avg:5
  seq2seq-evaluate --workdir=DIR --split=val --checkpoint=best,avg:10 --beam_size=4,5 \
      --alpha=0.6,1.0
  seq2seq-evaluate --workdir=DIR --src_file=test.en --ref_file=test.de
  seq2seq-evaluate --workdir=runs/a --ensemble=runs/b,runs/c --checkpoint=selected
  seq2seq-evaluate --workdir=runs/a --checkpoint=ensemble:5

Writes <workdir>/eval/<split>.<checkpoint>.beam<k>.hyp (detokenized, one line
per sentence) and .json (BLEU, case-insensitive BLEU, chrF, TER, signatures);
--matmul_dtype=bfloat16 writes <...>.beam<k>.matmul-bfloat16.*, beside float32's;
with --plot_attention=K, also .attention<i>.png heatmaps of the first K sentences.
A released model (seq2seq-export --format=seq2seq, as models/ holds) stays as released:
its scores go beside it, to runs/released/<its path>/eval/ under the working directory
(models/wu2021_cpu/seed-0: runs/released/models/wu2021_cpu/seed-0/eval/), and choosing
among its checkpoints is refused (it holds one, its run's choice). --out=DIR writes
them to DIR instead, for a run or a released model.
With --src_file, <split> is its file name, and the .json records --ref_file (its path and
sha256); scores of that source against another reference go to
<...>.beam<k>.ref-<8 hex of its sha256>.*, beside the first reference's, not over them.
With --gold_alignment=FILE (one line per sentence: `i-j` sure and `i?j` or `ipj`
possible links, 0-based source word i and target word j; --gold_one_based for
files counting from 1), also the alignment error rate (AER) of the attention of
--alignment_layer (default -2, the penultimate) on the references, teacher-forced.
Several comma-separated checkpoints (validation split only) are each scored, and
the best is recorded in <workdir>/eval/selected.json for --checkpoint=selected.
So are several beam sizes and alphas (--beam_size=4,5,6 --alpha=0.6,1.0: every pair,
with every checkpoint); then --checkpoint=selected decodes with the chosen search, and
the files of an alpha other than 0.6 say it (<...>.beam5.alpha1.hyp).
"""

import json

from absl import flags

from seq2seq.commands import cli
from seq2seq.errors import UserError
from seq2seq.evaluation.evaluate import run_evaluation, select_checkpoint

_RUN = cli.define_run_flags(ensemble=True, choices=True)
_SPLIT = flags.DEFINE_enum("split", "test", ["train", "val", "test"], "Split of the run's corpus.")
_BATCH = flags.DEFINE_integer("batch_size", None, "Sentences per batch (default: the run's"
                               " config.eval.batch_size, whose programs the run compiled).")
_SRC = flags.DEFINE_string("src_file", "", "External source file (with --ref_file).")
_REF = flags.DEFINE_string("ref_file", "", "External reference file (with --src_file).")
_PLOT = flags.DEFINE_integer("plot_attention", 0, "Draw the attention of the first K sentences.")
_OUT = flags.DEFINE_string("out", "", "Directory for the .hyp, .json and pictures (default:"
                           " <workdir>/eval; a released model's: runs/released/<its path>/eval"
                           " under the working directory, not the model's own folder).")
_ALIGNMENT = cli.define_alignment_flags()
_MATMUL = cli.define_matmul_flag()
_GOLD = _ALIGNMENT["gold_alignment"]


def main(argv):
  del argv

  def evaluate():
    candidates = _RUN["checkpoint"].value.split(",")
    beams, alphas = cli.search_values(_RUN)
    several = len(candidates) * len(beams) * len(alphas) > 1
    what = "several checkpoints or searches"
    if several and _RUN["ensemble"].value:
      raise UserError(f"--ensemble scores one choice, not {what}; choose each run's checkpoint"
                      " on validation alone first, then ensemble with --checkpoint=selected.")
    cli.check_alignment_flags(_ALIGNMENT)
    if several and _GOLD.value:
      raise UserError(f"--gold_alignment scores one choice, not {what}; choose on validation"
                      " first, then score it with --checkpoint=selected.")
    if several and _MATMUL.value != "float32":
      raise UserError(f"--matmul_dtype={_MATMUL.value} scores one choice, not {what}; choose on"
                      " validation in float32 first, then score it with --checkpoint=selected.")
    if several:
      result = select_checkpoint(_RUN["workdir"].value, candidates, split=_SPLIT.value,
                                 beam_size=beams, alpha=alphas, batch_size=_BATCH.value,
                                 out=_OUT.value)
      print(json.dumps(result, indent=2))
      print(f"chose --checkpoint={result['checkpoint']} --beam_size={result['beam_size']}"
            f" --alpha={result['alpha']:g} on {_SPLIT.value}; score it on test with"
            " --checkpoint=selected" + (" (which decodes with that search)"
                                         if "searches" in result else ""))
      return
    beam_size, alpha = cli.selected_search(_RUN, beams[0], alphas[0])
    result, prefix = run_evaluation(
        _RUN["workdir"].value, split=_SPLIT.value, checkpoint=_RUN["checkpoint"].value,
        beam_size=beam_size, alpha=alpha, batch_size=_BATCH.value,
        src_file=_SRC.value, ref_file=_REF.value, plot_attention=_PLOT.value,
        ensemble=_RUN["ensemble"].value, gold_alignment=_GOLD.value,
        alignment_layer=_ALIGNMENT["alignment_layer"].value,
        gold_one_based=_ALIGNMENT["gold_one_based"].value, out=_OUT.value,
        matmul_dtype=_MATMUL.value)
    print(json.dumps(result, indent=2))
    print(f"wrote {prefix}.hyp and {prefix}.json")

  cli.run_main(evaluate)
