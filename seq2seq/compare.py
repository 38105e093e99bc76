"""Compare runs: a table of scores with paired-bootstrap significance, and pictures.

`compare_runs(workdirs, out_dir)` evaluates each run's best checkpoint on
validation and the chosen split (reusing evaluation files already written),
tests every run against the baseline with sacreBLEU's paired bootstrap
resampling, aggregates seeds, and writes comparison.md, comparison.csv,
bleu.png, curves.png and attention.png.
"""

import csv
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.stats
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from seq2seq import config as config_lib
from seq2seq import layout, plots
from seq2seq.errors import UserError
from seq2seq.evaluate import (
  Translator,
  alignment,
  check_search,
  output_files,
  read_lines,
  run_evaluation,
)

SEED = "train.seed"

FIXED_COLUMNS = ["parameters", "steps", "train_minutes", "tokens_per_sec"]
LENGTH_EDGES = (10, 20, 30)  # Source-length buckets in words: 0-9, 10-19, 20-29, 30+.


class TestSet(NamedTuple):
  """A set every run is scored on: a split of the runs' corpus, or a pair of files."""
  name: str
  src_file: str = ""
  ref_file: str = ""


def parse_test_set(spec: str) -> TestSet:
  """"NAME=SRC,REF" (the `--test_set` flag) -> TestSet."""
  name, sep, files = spec.partition("=")
  src, comma, ref = files.partition(",")
  if not (sep and comma and name and src and ref) or "," in ref:
    raise UserError(f"--test_set={spec} is not NAME=SRC,REF; e.g."
                    " --test_set=test2017=data/test_2017.en,data/test_2017.de.")
  if name in ("val", "test", "train"):
    raise UserError(f"--test_set={spec}: {name!r} is a split of the runs' corpus; give the files"
                    " another name.")
  for path in (src, ref):
    if not Path(path).is_file():
      raise UserError(f"--test_set={spec}: {path} is not a file; pass an existing text file.")
  return TestSet(name, src, ref)


def flat_config(config) -> dict[str, object]:
  """{"model.num_heads": 4, ...} of a run's config (sections of plain fields)."""
  config = config.to_dict() if hasattr(config, "to_dict") else config
  return {f"{section}.{key}": value for section, fields in config.items()
          for key, value in fields.items()}


def differing_fields(configs: Sequence) -> list[str]:
  """The dotted config fields whose values are not the same in every run, in config order."""
  flat = [flat_config(c) for c in configs]
  names = list(dict.fromkeys(name for f in flat for name in f))
  return [n for n in names if len({json.dumps(f.get(n), sort_keys=True) for f in flat}) > 1]


def seed_groups(rows: list[dict], fields: Sequence[str]) -> dict[tuple, list[dict]]:
  """Rows grouped by every differing field except `train.seed`: a group is one variant."""
  keys = [f for f in fields if f != SEED]
  groups = defaultdict(list)
  for row in rows:
    groups[tuple(row[k] for k in keys)].append(row)
  return dict(groups)


def welch_p_value(scores: Sequence[float], baseline: Sequence[float]) -> float | None:
  """Two-sided Welch's t-test of per-seed BLEU (None without two seeds on each side)."""
  if len(scores) < 2 or len(baseline) < 2:
    return None
  if statistics.pvariance(scores) == statistics.pvariance(baseline) == 0:
    return 1.0 if statistics.mean(scores) == statistics.mean(baseline) else 0.0
  return float(scipy.stats.ttest_ind(scores, baseline, equal_var=False).pvalue)


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


def _evaluation(workdir: Path, test_set: TestSet, beam_size: int,
                alpha: float) -> tuple[dict, list]:
  """The run's scores on `test_set` (best checkpoint) and its hypotheses, computed once."""
  name = Path(test_set.src_file).name if test_set.src_file else test_set.name
  hyp_path, json_path = output_files(workdir / layout.EVAL / f"{name}.best.beam{beam_size}")
  if not (json_path.exists() and hyp_path.exists()):
    run_evaluation(workdir, split=test_set.name if not test_set.src_file else "test",
                   src_file=test_set.src_file, ref_file=test_set.ref_file, checkpoint="best",
                   beam_size=beam_size, alpha=alpha)
  return json.loads(json_path.read_text(encoding="utf-8")), read_lines(hyp_path)


def _training_record(workdir: Path) -> dict:
  records = [json.loads(line) for line in
             (workdir / layout.METRICS).read_text(encoding="utf-8").splitlines()]
  train = [r for r in records if r["split"] == "train"]
  val = [r for r in records if r["split"] != "train" and "bleu" in r]
  if not val:
    raise UserError(f"{workdir} has no validation result yet; train it first.")
  return {"steps": val[-1]["step"], "train_minutes": val[-1]["train_wall_seconds"] / 60,
          "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in train),
          "curve": [(r["step"], r["bleu"], r["loss"]) for r in val]}


def _significance(baseline: list[str], systems: dict[str, list[str]], references: list[str],
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


def compare_runs(workdirs: list[str | Path], out_dir: str | Path, *, baseline: str | Path = "",
                 split: str = "test", test_sets: Sequence[TestSet] = (), beam_size: int = 4,
                 alpha: float = 0.6, n_samples: int = 1000,
                 attention_text: str = "A man in an orange hat starring at something.") -> list:
  """Writes the comparison of `workdirs` to `out_dir`; returns the table's rows.

  Every run is scored (best checkpoint, beam search) on `val`, on `split` and on
  each extra test set; the table's columns are the config fields that differ
  between the runs, and per set its BLEU, chrF, 95% bootstrap interval and
  paired-bootstrap p-value against the baseline.
  """
  workdirs = [Path(w) for w in workdirs if (Path(w) / layout.CONFIG).exists()]
  if not workdirs:
    raise UserError("No training runs among the given directories; pass run workdirs.")
  if baseline and not (Path(baseline) / layout.CONFIG).exists():
    raise UserError(f"--baseline={baseline} is not a training run (no config.json); pass one of"
                    " the compared workdirs.")
  check_search(beam_size, alpha)  # Before --out is created.
  baseline = Path(baseline) if baseline else workdirs[0]
  workdirs = [baseline] + [w for w in workdirs if w != baseline]  # The baseline's row first.
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  configs = {w: config_lib.from_json((w / layout.CONFIG).read_text(encoding="utf-8"))
             for w in workdirs}
  fields = differing_fields([configs[w] for w in workdirs])
  sets = list(dict.fromkeys([TestSet("val"), TestSet(split), *test_sets]))
  texts = {ts.name: _text(configs[baseline], ts) for ts in sets}

  rows, hyps, curves, translators = [], defaultdict(dict), {}, {}
  for workdir in workdirs:
    record = _training_record(workdir)
    curves[workdir.name] = record.pop("curve")
    translator = translators[workdir] = Translator(workdir, "best", beam_size=beam_size,
                                                   alpha=alpha)
    flat = flat_config(configs[workdir])
    row = {"run": workdir.name, **{f: flat.get(f) for f in fields},
           "parameters": _num_params(translator), **record}
    for ts in sets:
      scores, hyps[ts.name][workdir.name] = _evaluation(workdir, ts, beam_size, alpha)
      row[f"{ts.name}_bleu"], row[f"{ts.name}_chrf"] = scores["bleu"], scores["chrf"]
      row["bleu_signature"] = scores["bleu_signature"]
    rows.append(row)
  for ts in sets:
    significance = _significance(hyps[ts.name][baseline.name],
                                 {r["run"]: hyps[ts.name][r["run"]] for r in rows[1:]},
                                 texts[ts.name][1], n_samples)
    for row in rows:
      row[f"{ts.name}_bleu_ci95"], row[f"{ts.name}_p_value"] = significance[
          "baseline" if row["run"] == baseline.name else row["run"]]
  columns = ["run", *fields, *FIXED_COLUMNS] + [
      f"{ts.name}_{c}" for ts in sets for c in ("bleu", "chrf", "bleu_ci95", "p_value")]
  seeds = seed_aggregate(rows, fields, [ts.name for ts in sets], baseline.name)
  _write_tables(rows, columns, seeds, out_dir, baseline.name, n_samples)
  lengths = [{"run": r["run"], **bucket} for r in rows
             for bucket in length_buckets(texts[split][0], hyps[split][r["run"]],
                                          texts[split][1])]
  _write_csv(out_dir / "length.csv", lengths, ["run", "bucket", "sentences", "bleu"])
  plots.length_chart({r["run"]: [(b["bucket"], b["bleu"]) for b in lengths if b["run"] == r["run"]]
                      for r in rows}, out_dir / "length.png",
                     ylabel=f"{split} BLEU (beam {beam_size})")
  plots.bleu_chart([r["run"] for r in rows], [r[f"{split}_bleu"] for r in rows],
                   [r[f"{split}_bleu_ci95"] for r in rows], out_dir / "bleu.png",
                   ylabel=f"{split} BLEU (beam {beam_size}), 95% CI")
  plots.training_curves(curves, out_dir / "curves.png")
  panels = []
  for workdir in workdirs:
    weights, src, tgt = alignment(translators[workdir], attention_text)
    panels.append((workdir.name, weights[-1].mean(axis=0), src, tgt))  # last layer, head mean
  plots.attention_side_by_side(panels, out_dir / "attention.png")
  return rows


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


def _text(config, test_set: TestSet) -> tuple[list[str], list[str]]:
  """(sources, references) of a test set."""
  if test_set.src_file:
    return read_lines(test_set.src_file), read_lines(test_set.ref_file)
  from seq2seq.data import corpus

  text = corpus.read_split(config.data, test_set.name)
  return text.src, text.tgt


def _num_params(translator: Translator) -> int:
  import jax

  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(translator.params)))


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


def _fmt(value, digits=2) -> str:
  if value is None:
    return "-"
  return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _markdown(rows: list[dict], columns: list[str]) -> list[str]:
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for row in rows:
    lines.append("| " + " | ".join(_fmt(row[c], 3 if c.endswith("_p") or c.endswith("p_value")
                                         else 2) for c in columns) + " |")
  return lines


def _write_tables(rows: list[dict], columns: list[str], seeds: list[dict], out_dir: Path,
                  baseline: str, n_samples: int) -> None:
  _write_csv(out_dir / "comparison.csv", rows, columns)
  lines = [f"Baseline: `{baseline}`. Per set: BLEU, chrF, the 95% bootstrap interval of BLEU and"
           f" the paired bootstrap p-value against the baseline (sacreBLEU, {n_samples}"
           f" resamples). {rows[0]['bleu_signature']}", "", *_markdown(rows, columns)]
  if seeds:
    seed_columns = list(seeds[0])
    _write_csv(out_dir / "seeds.csv", seeds, seed_columns)
    lines += ["", "Across seeds: mean and sample standard deviation of per-seed BLEU, and the"
              " two-sided p-value of Welch's t-test (unequal variances) of the per-seed BLEU"
              " against the baseline's variant, which accounts for seed variance.", "",
              *_markdown(seeds, seed_columns)]
  (out_dir / "comparison.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
