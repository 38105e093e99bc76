"""The statistics of a comparison of runs: are the differences in BLEU real?

One output against another on one test set: sacreBLEU's paired bootstrap resampling
(`paired_bootstrap`). Runs that differ only in `train.seed` form one variant, and variants
are compared on their per-seed BLEU with Welch's t-test (`seed_aggregate`), which accounts
for the seed's variance that a test of single outputs cannot see. `length_buckets` scores
the sentences of each source length apart, to show where a model gains or loses.
"""

import statistics
from collections import defaultdict
from collections.abc import Sequence

import scipy.stats
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

SEED = "train.seed"
LENGTH_EDGES = (10, 20, 30)  # Source-length buckets in words: 0-9, 10-19, 20-29, 30+.


def paired_bootstrap(baseline: list[str], systems: dict[str, list[str]], references: list[str],
                     n_samples: int) -> dict[str, tuple[float, float | None]]:
  """name -> (95% CI half-width of BLEU, p-value against the baseline; None for it).

  sacreBLEU's p-value follows multeval's convention, which gives two identical
  outputs p = 1 / (n + 1); a run whose output is the baseline's is reported
  with p = 1 (no difference at all).
  """
  named = [("baseline", baseline)] + list(systems.items())
  test = PairedTest(named, {"BLEU": BLEU(references=[references])}, None, test_type="bs",
                    n_samples=n_samples)
  _, results = test()
  out = {}
  for (name, hyps), result in zip(named[1:], results["BLEU"][1:], strict=True):
    p = 1.0 if list(hyps) == list(baseline) else result.p_value
    out[name] = (result.ci, p)
  out["baseline"] = (results["BLEU"][0].ci, None)
  return out


def welch_p_value(scores: Sequence[float], baseline: Sequence[float]) -> float | None:
  """Two-sided Welch's t-test of per-seed BLEU (None without two seeds on each side)."""
  if len(scores) < 2 or len(baseline) < 2:
    return None
  if statistics.pvariance(scores) == statistics.pvariance(baseline) == 0:
    return 1.0 if statistics.mean(scores) == statistics.mean(baseline) else 0.0
  return float(scipy.stats.ttest_ind(scores, baseline, equal_var=False).pvalue)


def seed_groups(rows: list[dict], fields: Sequence[str]) -> dict[tuple, list[dict]]:
  """Rows grouped by every differing field except `train.seed`: a group is one variant."""
  keys = [f for f in fields if f != SEED]
  groups = defaultdict(list)
  for row in rows:
    groups[tuple(row[k] for k in keys)].append(row)
  return dict(groups)


def seed_aggregate(rows: list[dict], fields: Sequence[str], sets: Sequence[str],
                   baseline: str) -> list[dict]:
  """Per variant (runs that differ only in `train.seed`): seeds, and for each set the mean and
  sample standard deviation of BLEU and Welch's p-value against the baseline's variant.
  Empty unless some variant has several seeds."""
  if SEED not in fields:
    return []
  groups = seed_groups(rows, fields)
  if all(len(g) < 2 for g in groups.values()):
    return []
  base = next(g for g in groups.values() if any(r["run"] == baseline for r in g))
  out = []
  for key, group in groups.items():
    entry = dict(zip([f for f in fields if f != SEED], key, strict=True))
    entry["seeds"] = len(group)
    for name in sets:
      scores = [r[f"{name}_bleu"] for r in group]
      entry[f"{name}_bleu_mean"] = statistics.mean(scores)
      entry[f"{name}_bleu_sd"] = statistics.stdev(scores) if len(scores) > 1 else 0.0
      entry[f"{name}_welch_p"] = (None if group is base else
                                  welch_p_value(scores, [r[f"{name}_bleu"] for r in base]))
    out.append(entry)
  return out


def length_buckets(sources: Sequence[str], hypotheses: Sequence[str],
                   references: Sequence[str], edges: Sequence[int] = LENGTH_EDGES) -> list[dict]:
  """BLEU of the sentences in each source-length bucket (words): [{bucket, sentences, bleu}]."""
  bounds = [0, *edges, None]
  out = []
  for low, high in zip(bounds[:-1], bounds[1:], strict=True):
    index = [i for i, src in enumerate(sources)
             if len(src.split()) >= low and (high is None or len(src.split()) < high)]
    name = f"{low}-{high - 1}" if high is not None else f"{low}+"
    bleu = (BLEU().corpus_score([hypotheses[i] for i in index],
                                [[references[i] for i in index]]).score if index else None)
    out.append({"bucket": name, "sentences": len(index), "bleu": bleu})
  return out
