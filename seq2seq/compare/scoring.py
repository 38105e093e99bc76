"""The scores of the compared runs: each workdir decoded by its translator at the checkpoint
compared (`translators`; its evaluations cached, `evaluations`), each run's record read
(`recorded`); their rows, with the 95% interval and the paired-bootstrap p-value against the
baseline (`score`), and the alignment error rate of their attention (`gold`,
`add_alignment_error`)."""

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from seq2seq.compare.evaluations import TestSet, evaluation
from seq2seq.compare.records import Run
from seq2seq.compare.stats import paired_bootstrap
from seq2seq.decoding import alignment
from seq2seq.decoding.translator import Translator
from seq2seq.evaluation.alignment_error import Gold, alignment_scores, read_gold


def translators(runs: Sequence[Run], checkpoint: str, search: tuple[int, float],
                gold: Gold | None, layer: int) -> dict[str, Translator]:
  """Each workdir's translator (of `checkpoint`: best, or selected; `search`: its beam size and
  alpha), by name; a record has none.
  With `gold`, each is checked to have `layer` before any decodes (it failed once every run had
  been scored)."""
  made = {run.name: Translator(run.workdir, checkpoint, beam_size=search[0], alpha=search[1])
          for run in runs if not run.recorded}
  for translator in made.values() if gold is not None else []:
    alignment.alignment_layer(translator, layer)
  return made


def score(runs: Sequence[Run], translators: dict[str, Translator], recorded: dict,
          configs: dict[str, dict], fields: list[str], sets: Sequence[TestSet], texts: dict,
          search: tuple[int, float], n_samples: int) -> tuple[list[dict], dict]:
  """Each run's row (its differing config `fields`, size, training record, and per set its
  scores and their significance, `_add_significance`) and its hypotheses per set
  (`hyps[set][run]`): decoded by its translator in `translators` (`search`: beam, alpha), or a
  record's, `recorded[run][set]` (`recorded.read_records`), whose size is not counted."""
  rows, hyps = [], defaultdict(dict)
  for run in runs:
    translator = translators.get(run.name)
    record = {key: value for key, value in run.record.items() if key != "curve"}
    row = {"run": run.name, **{f: configs[run.name].get(f) for f in fields},
           "parameters": None if translator is None else _num_params(translator), **record}
    for ts in sets:
      scores, hyps[ts.name][run.name] = (
          recorded[run.name][ts.name] if run.recorded
          else evaluation(run.workdir, ts, *search, translator, texts[ts.name]))
      row[f"{ts.name}_bleu"], row[f"{ts.name}_chrf"] = scores["bleu"], scores["chrf"]
      row[f"{ts.name}_bleu_lc"] = scores["bleu_lowercase"]
      row["bleu_signature"] = scores["bleu_signature"]
      row["bleu_lc_signature"] = scores["bleu_lowercase_signature"]
    rows.append(row)
  _add_significance(rows, sets, hyps, texts, n_samples)
  return rows, hyps


def gold(flags: dict | None, text: tuple[list[str], list[str]]) -> tuple[Gold | None, int]:
  """The gold alignment of `text` that `flags` name, read once for every run (`read_gold`;
  None without one), and the layer to score (`compare_runs`' `gold_alignment`)."""
  flags = {"alignment_layer": -2, "gold_one_based": False, **(flags or {})}
  found = (read_gold(flags["gold_alignment"], *text, flags["gold_one_based"])
           if flags.get("gold_alignment") else None)
  return found, flags["alignment_layer"]


def add_alignment_error(rows: list[dict], translators: dict[str, Translator], split: str,
                        text: tuple[list[str], list[str]], gold: Gold | None,
                        layer: int) -> None:
  """Adds to each row `<split>_aer`, its attention's alignment error rate (layer `layer`) on
  the references of `text` against `gold` (nothing without one)."""
  for row in rows if gold is not None else []:
    row[f"{split}_aer"] = alignment_scores(translators[row["run"]], *text, gold,
                                           layer=layer)["aer"]


def _num_params(translator: Translator) -> int:
  import jax

  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(translator.params)))


def _add_significance(rows: list[dict], sets: Sequence[TestSet], hyps: dict, texts: dict,
                      n_samples: int) -> None:
  """Adds to each row, per set, the 95% interval of its BLEU and the paired-bootstrap p-value
  against the baseline (the first row; None for it). A run without the set's hypotheses (a
  record that holds none) has neither, and where the baseline has none, no run has."""
  base = rows[0]["run"]
  for ts in sets:
    named = hyps[ts.name]
    significance = {} if named[base] is None else paired_bootstrap(
        named[base], {r["run"]: named[r["run"]] for r in rows[1:] if named[r["run"]] is not None},
        texts[ts.name][1], n_samples)
    for row in rows:
      row[f"{ts.name}_bleu_ci95"], row[f"{ts.name}_p_value"] = significance.get(
          "baseline" if row["run"] == base else row["run"], (None, None))
