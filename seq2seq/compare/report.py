"""The files of a comparison of runs: its tables and its pictures.

comparison.csv and comparison.md hold one row per run (seeds.csv and a second Markdown
table, per variant across seeds, when some variant has several); length.csv and length.png
the BLEU of each source-length bucket; bleu.png, curves.png and attention.png the runs'
scores with their 95% intervals, their validation curves and their attention on one
sentence. The rows come from `compare.compare_runs`; nothing here evaluates.
"""

import csv
from pathlib import Path

from seq2seq.compare.stats import length_buckets
from seq2seq.decoding.alignment import alignment
from seq2seq.decoding.translator import Translator
from seq2seq.evaluation import plots


def write_tables(out_dir: Path, rows: list[dict], columns: list[str], seeds: list[dict],
                 baseline: str, n_samples: int) -> None:
  """comparison.csv, comparison.md and, with `seeds`, seeds.csv."""
  _write_csv(out_dir / "comparison.csv", rows, columns)
  lines = [f"Baseline: `{baseline}`. Per set: BLEU, lowercase BLEU (`bleu_lc`), chrF, the 95%"
           f" bootstrap interval of BLEU and the paired bootstrap p-value against the baseline"
           f" (sacreBLEU, {n_samples} resamples). {rows[0]['bleu_signature']}; lowercase"
           f" {rows[0]['bleu_lc_signature']}", "", *_markdown(rows, columns)]
  if seeds:
    seed_columns = list(seeds[0])
    _write_csv(out_dir / "seeds.csv", seeds, seed_columns)
    lines += ["", "Across seeds: mean and sample standard deviation of per-seed BLEU, and the"
              " two-sided p-value of Welch's t-test (unequal variances) of the per-seed BLEU"
              " against the baseline's variant, which accounts for seed variance.", "",
              *_markdown(seeds, seed_columns)]
  (out_dir / "comparison.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_lengths(out_dir: Path, rows: list[dict], text: tuple[list[str], list[str]],
                  hyps: dict[str, list[str]], ylabel: str) -> None:
  """length.csv and length.png: each run's BLEU per source-length bucket of `text` (sources,
  references), from its hypotheses `hyps[run]`."""
  sources, references = text
  lengths = [{"run": r["run"], **bucket} for r in rows
             for bucket in length_buckets(sources, hyps[r["run"]], references)]
  _write_csv(out_dir / "length.csv", lengths, ["run", "bucket", "sentences", "bleu"])
  plots.length_chart({r["run"]: [(b["bucket"], b["bleu"]) for b in lengths if b["run"] == r["run"]]
                      for r in rows}, out_dir / "length.png", ylabel=ylabel)


def write_charts(out_dir: Path, rows: list[dict], split: str, beam_size: int,
                 curves: dict[str, list]) -> None:
  """bleu.png (each run's BLEU on `split` with its 95% interval) and curves.png (`curves`,
  each run's validation curve)."""
  plots.bleu_chart([r["run"] for r in rows], [r[f"{split}_bleu"] for r in rows],
                   [r[f"{split}_bleu_ci95"] for r in rows], out_dir / "bleu.png",
                   ylabel=f"{split} BLEU (beam {beam_size}), 95% CI")
  plots.training_curves(curves, out_dir / "curves.png")


def write_attention(out_dir: Path, translators: dict[str, Translator], text: str) -> None:
  """attention.png: each run's attention on `text` (its last layer, averaged over heads)."""
  panels = []
  for name, translator in translators.items():
    weights, src, tgt = alignment(translator, text)
    panels.append((name, weights[-1].mean(axis=0), src, tgt))  # last layer, head mean
  plots.attention_side_by_side(panels, out_dir / "attention.png")


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


def _fmt(value, digits=2) -> str:
  if value is None:
    return "-"
  return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _cell(text: str) -> str:
  """`text` as one markdown table cell: a `|` (a run named a|b) would start another cell, a
  line break end the row."""
  return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _markdown(rows: list[dict], columns: list[str]) -> list[str]:
  lines = ["| " + " | ".join(map(_cell, columns)) + " |", "|" + "---|" * len(columns)]
  for row in rows:
    lines.append("| " + " | ".join(
        _cell(_fmt(row[c], 3 if c.endswith("_p") or c.endswith("p_value") else 2))
        for c in columns) + " |")
  return lines
