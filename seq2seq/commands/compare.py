r"""Compares runs: scores, paired-bootstrap significance, seed statistics and plots.

  seq2seq-compare runs/rnn_attention/* [--baseline=DIR] [--split=test] [--out=DIR] \
      [--checkpoint=best|selected] [--beam_size=4] [--alpha=0.6] \
      [--test_set=NAME=SRC,REF ...] [--earlier=DIR ...] [--welch_against=RUN] \
      [--gold_alignment=FILE [--gold_one_based] [--alignment_layer=-2]]
  seq2seq-compare --checkpoint=selected --beam_size=4 --out=runs/study_report docs/recipe_study/*

Evaluates each run's best checkpoint on val, --split and every --test_set with
beam search (--beam_size, and --alpha, the GNMT length-penalty exponent, as
seq2seq-evaluate takes them) and writes comparison.md, comparison.csv
(columns: the config fields that differ between the runs, then per set BLEU,
lowercase BLEU, chrF, a 95% interval and the paired bootstrap p-value), seeds.csv (when runs
differ in train.seed: mean, sd and Welch's t-test per variant), length.csv,
length.png, bleu.png, curves.png, attention.png and runs.json (each row's config) to
--out (default: the first run's parent directory). With --gold_alignment (a gold word
alignment of --split's sentences, as seq2seq-evaluate takes it), the table also has each
run's alignment error rate, <split>_aer: its best checkpoint's attention on the references.
Runs are named by their path below the runs' common parent (runs/a/s0 and runs/b/s0: a/s0
and b/s0), each once.
The comparison is written beside --out and swapped in once complete: a failure (a full
disk) leaves an earlier comparison there as it was.

--checkpoint=selected scores each run at the checkpoint seq2seq-evaluate --split=val chose
for it (its eval/selected.json), which must have been chosen at --beam_size and --alpha: a
run without that choice is refused, naming the seq2seq-evaluate command that makes it.
With it, a run's record is compared as a run: a directory of config.json, metrics.jsonl and
eval/ without checkpoints, as seq2seq-export --format=record writes one (docs/recipe_study/
holds such records). Nothing of it decodes: its val columns are the chosen candidate's
eval/val.<checkpoint>.beam<k>.json, its --split columns eval/<split>.selected.beam<k>.json
(.alpha<a> after beam<k> where --alpha is not 0.6), whose BLEU, lowercase BLEU and chrF must
be those of the .hyp beside it against the corpus's references (else it is refused, naming
the file); the bootstrap and length.csv take that .hyp, curves.png its metrics.jsonl. A
record has no model, so its parameters are not counted, it is left out of attention.png and
zeros.csv, and it is refused with --checkpoint=best, --test_set or --gold_alignment; a set
whose hypotheses it does not hold (validation's, in an older record) has no interval or
p-value.

--earlier=DIR adds the runs of an earlier comparison (its --out) as it scored them, named
<DIR's name>:<run>: to both tables, to Welch's test across seeds and to bleu.png, but not
to the paired bootstrap, the lengths, the curves or the attention, which need their
workdirs. New runs join a published comparison without it being evaluated again, or after
its workdirs are gone. It must have been scored on the same sets, with the same
--checkpoint, --beam_size, --alpha and sacreBLEU version (checked where its comparison.md
says them).
Welch's test is against the baseline's variant, or that of --welch_against, a row's name as
the table shows it: an earlier comparison's baseline (tf_full:attention-scaled_dot_seed-0)
is the reference of every new variant, while the paired bootstrap stays against --baseline.

Evaluations are cached in <run>/eval/compare/ under everything that decides
them (the checkpoint compared, the steps it names now and their weights, --beam_size,
--alpha, the decoding lengths, the run's config and vocabulary, the sentences):
a run trained further, chosen again, another --alpha or another file is evaluated again, and
the numbers are those seq2seq-evaluate --checkpoint=best (or selected) would give with the
same settings. A workdir's seq2seq-evaluate outputs (<run>/eval/<name>.best.beam<k>.*) are
not read.
"""

import time
from pathlib import Path

from absl import flags

from seq2seq.commands.cli import check_alignment_flags, define_alignment_flags, run_main
from seq2seq.compare.comparison import compare_runs
from seq2seq.compare.evaluations import parse_test_set
from seq2seq.errors import UserError

POSITIONAL = "RUN_DIR ..."  # The runs to compare.
_BASELINE = flags.DEFINE_string("baseline", "", "Run the others are tested against"
                                " (default: the first).")
_SPLIT = flags.DEFINE_enum("split", "test", ["val", "test"], "Split of the table's test columns.")
_OUT = flags.DEFINE_string("out", "", "Output directory.")
_BEAM = flags.DEFINE_integer("beam_size", 4, "Beam size of every evaluation.")
_CHECKPOINT = flags.DEFINE_enum("checkpoint", "best", ["best", "selected"], "The checkpoint of"
                                " each run scored: best, or selected (chosen on validation by"
                                " seq2seq-evaluate --split=val --checkpoint=best,avg:N).")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent of every evaluation.")
_SAMPLES = flags.DEFINE_integer("bootstrap_samples", 1000, "Paired bootstrap resamples.")
_EARLIER = flags.DEFINE_multi_string("earlier", [], "An earlier comparison's --out directory whose"
                                     " runs join the tables (repeatable).")
_TEST_SETS = flags.DEFINE_multi_string("test_set", [], "NAME=SRC,REF: score every run on these"
                                       " files too (repeatable).")
_WELCH = flags.DEFINE_string("welch_against", "", "The run (its name in the table, an --earlier"
                             " one too) whose variant Welch's test is against (default: the"
                             " baseline).")
_ALIGNMENT = define_alignment_flags()


def main(argv):
  runs = argv[1:]

  def compare():
    if not runs:
      raise UserError("Pass the run directories to compare, e.g. runs/rnn_attention/*.")
    check_alignment_flags(_ALIGNMENT)
    out = _OUT.value or str(Path(runs[0]).parent)
    test_sets = [parse_test_set(spec) for spec in _TEST_SETS.value]
    start = time.time()
    rows = compare_runs(runs, out, baseline=_BASELINE.value, split=_SPLIT.value,
                        test_sets=test_sets, beam_size=_BEAM.value, alpha=_ALPHA.value,
                        n_samples=_SAMPLES.value, earlier=_EARLIER.value,
                        gold_alignment={k: f.value for k, f in _ALIGNMENT.items()},
                        welch_against=_WELCH.value, checkpoint=_CHECKPOINT.value)
    print((Path(out) / "comparison.md").read_text(encoding="utf-8"))
    written = sorted(p.name for p in Path(out).iterdir()
                     if p.is_file() and p.stat().st_mtime >= start)
    print(f"{len(rows)} runs; wrote {', '.join(written)} to {out}")

  run_main(compare)
