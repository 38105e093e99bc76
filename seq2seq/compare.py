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
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from seq2seq import config as config_lib
from seq2seq import plots
from seq2seq.errors import UserError
from seq2seq.evaluate import Translator, alignment, output_files, read_lines, run_evaluation

COLUMNS = ["run", "family", "attention", "seed", "parameters", "steps", "train_minutes",
           "tokens_per_sec", "val_bleu", "val_chrf", "test_bleu", "test_chrf", "test_bleu_ci95",
           "p_value"]


def _evaluation(workdir: Path, split: str, beam_size: int, alpha: float) -> tuple[dict, list]:
  """The run's scores on `split` (best checkpoint) and its hypotheses, computed once."""
  hyp_path, json_path = output_files(workdir / "eval" / f"{split}.best.beam{beam_size}")
  if not (json_path.exists() and hyp_path.exists()):
    run_evaluation(workdir, split=split, checkpoint="best", beam_size=beam_size, alpha=alpha)
  return json.loads(json_path.read_text(encoding="utf-8")), read_lines(hyp_path)


def _training_record(workdir: Path) -> dict:
  records = [json.loads(line) for line in
             (workdir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
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
                 split: str = "test", beam_size: int = 4, alpha: float = 0.6,
                 n_samples: int = 1000,
                 attention_text: str = "A man in an orange hat starring at something.") -> list:
  """Writes the comparison of `workdirs` to `out_dir`; returns the table's rows."""
  workdirs = [Path(w) for w in workdirs if (Path(w) / "config.json").exists()]
  if not workdirs:
    raise UserError("No training runs among the given directories; pass run workdirs.")
  if baseline and not (Path(baseline) / "config.json").exists():
    raise UserError(f"--baseline={baseline} is not a training run (no config.json); pass one of"
                    " the compared workdirs.")
  baseline = Path(baseline) if baseline else workdirs[0]
  if baseline not in workdirs:
    workdirs.append(baseline)
  workdirs = [baseline] + [w for w in workdirs if w != baseline]  # The baseline's row first.
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)

  rows, hyps, curves, references, translators = [], {}, {}, None, {}
  for workdir in workdirs:
    config = config_lib.from_json((workdir / "config.json").read_text(encoding="utf-8"))
    val, _ = _evaluation(workdir, "val", beam_size, alpha)
    test, hyps[workdir.name] = _evaluation(workdir, split, beam_size, alpha)
    record = _training_record(workdir)
    curves[workdir.name] = record.pop("curve")
    translator = translators[workdir] = Translator(workdir, "best", beam_size=beam_size,
                                                   alpha=alpha)
    references = references or _references(config, split)
    rows.append({
        "run": workdir.name, "family": config.model.family, "attention": config.model.attention,
        "seed": config.train.seed, "parameters": _num_params(translator), **record,
        "val_bleu": val["bleu"], "val_chrf": val["chrf"], "test_bleu": test["bleu"],
        "test_chrf": test["chrf"], "bleu_signature": test["bleu_signature"]})
  significance = _significance(hyps[baseline.name],
                               {r["run"]: hyps[r["run"]] for r in rows[1:]}, references,
                               n_samples)
  for row in rows:
    ci, p = significance["baseline" if row["run"] == baseline.name else row["run"]]
    row["test_bleu_ci95"], row["p_value"] = ci, p
  _write_tables(rows, out_dir, baseline.name, split)
  plots.bleu_chart([r["run"] for r in rows], [r["test_bleu"] for r in rows],
                   [r["test_bleu_ci95"] for r in rows], out_dir / "bleu.png",
                   ylabel=f"{split} BLEU (beam {beam_size}), 95% CI")
  plots.training_curves(curves, out_dir / "curves.png")
  panels = []
  for workdir in workdirs:
    weights, src, tgt = alignment(translators[workdir], attention_text)
    panels.append((workdir.name, weights[-1].mean(axis=0), src, tgt))  # last layer, head mean
  plots.attention_side_by_side(panels, out_dir / "attention.png")
  return rows


def _references(config, split: str) -> list[str]:
  from seq2seq.data import corpus

  return corpus.read_split(config.data, split).tgt


def _num_params(translator: Translator) -> int:
  import jax

  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(translator.params)))


def _write_tables(rows: list[dict], out_dir: Path, baseline: str, split: str) -> None:
  with open(out_dir / "comparison.csv", "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)

  def fmt(value, digits=2):
    if value is None:
      return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

  lines = [f"Baseline: `{baseline}`; {split} BLEU with a 95% bootstrap interval and the paired"
           f" bootstrap p-value against the baseline. {rows[0]['bleu_signature']}", "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
  for row in rows:
    lines.append("| " + " | ".join(fmt(row[c], 3 if c == "p_value" else 2) for c in COLUMNS)
                 + " |")
  groups = defaultdict(list)
  for row in rows:
    groups[(row["family"], row["attention"])].append(row["test_bleu"])
  if any(len(scores) > 1 for scores in groups.values()):
    lines += ["", f"Across seeds ({split} BLEU, mean ± standard deviation):", "",
              "| family | attention | seeds | BLEU |", "|---|---|---|---|"]
    for (family, attention), scores in sorted(groups.items()):
      spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
      lines.append(f"| {family} | {attention} | {len(scores)} |"
                   f" {statistics.mean(scores):.2f} ± {spread:.2f} |")
  (out_dir / "comparison.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
