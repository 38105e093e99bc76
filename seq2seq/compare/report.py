"""The files of a comparison of runs: its tables and its pictures.

comparison.csv and comparison.md hold one row per run (seeds.csv and a second Markdown
table, per variant across seeds, when some variant has several); length.csv and length.png
the BLEU of each source-length bucket; bleu.png, curves.png and attention.png the runs'
scores with their 95% intervals, their validation curves and their attention on one
sentence; zeros.csv each sparse run's share of exactly-zero attention weights per layer. The rows
come from `compare.compare_runs`; nothing here evaluates.
`read_earlier` reads an earlier comparison's rows back, so that later runs join its table.
"""

import csv
import json
import re
from pathlib import Path
from typing import NamedTuple

from seq2seq.compare.stats import length_buckets
from seq2seq.decoding.alignment import alignment, zero_shares
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation import plots
from seq2seq.models.normalizers import NORMALIZERS


def write_tables(out_dir: Path, rows: list[dict], columns: list[str], seeds: list[dict],
                 baseline: str, n_samples: int, search: tuple[int, float],
                 configs: dict[str, dict], earlier: list[str] = (),
                 welch_against: str = "", chosen: tuple[str, list[str]] = ("best", [])) -> None:
  """comparison.csv, comparison.md, runs.json (`configs`: each row's flat config, for a later
  comparison to join this one) and, with `seeds`, seeds.csv. `search`: the evaluations'
  (beam size, alpha); `earlier`: the earlier comparisons whose rows `rows` include;
  `welch_against`: the row whose variant Welch's test is against (default: `baseline`);
  `chosen`: the checkpoint scored (best, or selected) and the rows that are runs' records."""
  _write_csv(out_dir / "comparison.csv", rows, columns)
  (out_dir / RUNS).write_text(json.dumps({r["run"]: configs[r["run"]] for r in rows}, indent=1,
                                         sort_keys=True) + "\n", encoding="utf-8")
  joined = "".join(f" Rows named `{name}:...` are the runs of the earlier comparison {name}/,"
                   " as it scored them (no p-value against this baseline)." for name in earlier)
  lines = [f"Baseline: `{baseline}`. {CHECKPOINTS[chosen[0]]}, beam {search[0]}, alpha"
           f" {search[1]}. Per set: BLEU, lowercase BLEU (`bleu_lc`), chrF, the 95%"
           f" bootstrap interval of BLEU and the paired bootstrap p-value against the baseline"
           f" (sacreBLEU, {n_samples} resamples). {rows[0]['bleu_signature']}; lowercase"
           f" {rows[0]['bleu_lc_signature']}.{joined}{_records_note(chosen[1], rows)}", "",
           *_markdown(rows, columns)]
  if seeds:
    seed_columns = list(seeds[0])
    _write_csv(out_dir / "seeds.csv", seeds, seed_columns)
    lines += ["", "Across seeds: mean and sample standard deviation of per-seed BLEU, and the"
              " two-sided p-value of Welch's t-test (unequal variances) of the per-seed BLEU"
              f" against the variant of `{welch_against or baseline}`, which accounts for seed"
              " variance.", "",
              *_markdown(seeds, seed_columns)]
  (out_dir / "comparison.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


# What comparison.md says of the checkpoint scored (`read_earlier` reads it back).
CHECKPOINTS = {"best": "Best checkpoints",
               "selected": "The checkpoints chosen on validation (seq2seq-evaluate --split=val)"}


def _records_note(names: list[str], rows: list[dict]) -> str:
  """What comparison.md says of the rows that are runs' records (none: nothing)."""
  if not names:
    return ""
  which = ("Every run is a run's record" if len(names) == len(rows) else
           f"{', '.join(f'`{name}`' for name in names)} are runs' records")
  return (f" {which}: each one's scores are read from its evaluations (checked against its"
          " hypotheses where it holds them), not decoded; its parameters are not counted,"
          " attention.png and zeros.csv leave it out, and a set whose hypotheses it does not"
          " hold has no interval or p-value.")


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
  if not translators:  # Runs' records alone: no model to draw.
    return
  panels = []
  for name, translator in translators.items():
    weights, src, tgt = alignment(translator, text)
    panels.append((name, weights[-1].mean(axis=0), src, tgt))  # last layer, head mean
  plots.attention_side_by_side(panels, out_dir / "attention.png")


def write_zeros(out_dir: Path, translators: dict[str, Translator], texts: tuple) -> None:
  """zeros.csv, when a run's normalizer can give exact zeros (`Normalizer.sparse`): each such
  run's share of exactly-zero attention weights per layer and kind, on `texts` (sources,
  references) teacher-forced (`alignment.zero_shares`). Softmax gives none by construction."""
  sparse = {name: t for name, t in translators.items()
            if NORMALIZERS[t.config.model.attention_normalizer].sparse}
  if not sparse:
    return
  rows = []
  for name, translator in sparse.items():
    shares = zero_shares(translator, *texts)
    rows.append({"run": name, **{f"{kind}_{layer + 1}": round(share, 4)
                                 for kind, per_layer in shares.items()
                                 for layer, share in enumerate(per_layer)}})
  columns = list(dict.fromkeys(key for row in rows for key in row))
  with open(out_dir / "zeros.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)


RUNS = "runs.json"
# Every file a comparison writes (`write_tables`, `write_lengths`, `write_charts`,
# `write_attention`, `write_zeros`): a folder holding these alone is a comparison's own.
FILES = ("comparison.csv", "comparison.md", RUNS, "seeds.csv", "length.csv", "length.png",
         "bleu.png", "curves.png", "attention.png", "zeros.csv")


class Earlier(NamedTuple):
  """An earlier comparison, read back (`read_earlier`)."""
  directory: Path
  name: str  # Its directory's name: its rows are named `<name>:<run>`.
  fields: list[str]  # The config fields its table names.
  rows: list[dict]  # Its runs' rows, without p-values.
  configs: dict[str, dict] | None  # Row name -> flat config (runs.json; older ones lack it).
  search: tuple[int, float] | None  # (beam size, alpha), where its comparison.md says them.
  signature: str | None  # Its sacreBLEU signature.
  checkpoint: str | None = None  # "best" or "selected", where its comparison.md says which.


_SCORES = ("bleu", "bleu_lc", "chrf", "bleu_ci95")


def read_earlier(directory: Path, sets: list[str], fixed: list[str]) -> Earlier:
  """The rows of an earlier comparison's comparison.csv, to join a new table: its config
  fields (the columns between `run` and the `fixed` ones) parsed back to values, and its
  scores on each of `sets`, which it must have. A `UserError` when it is not one."""
  table, notes = directory / "comparison.csv", directory / "comparison.md"
  if not (table.is_file() and notes.is_file()):
    raise UserError(f"--earlier={directory} holds no comparison.csv and comparison.md; pass a"
                    " directory that seq2seq-compare wrote (its --out).")
  with open(table, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f)
    columns, rows = reader.fieldnames or [], list(reader)
  wanted = [*fixed, *(f"{s}_{c}" for s in sets for c in _SCORES)]
  missing = [c for c in ["run", *wanted] if c not in columns]
  if missing or not rows:
    raise UserError(f"--earlier={directory}: its comparison.csv has no "
                    f"{', '.join(missing) or 'rows'}; compare on the sets it was scored on"
                    " (--split, --test_set).")
  fields = columns[1:columns.index(fixed[0])]
  name = directory.resolve().name
  out = [{"run": f"{name}:{row['run']}", **{f: _value(row[f]) for f in fields},
          **{c: _number(row[c]) for c in wanted}, **{f"{s}_p_value": None for s in sets}}
         for row in rows]
  configs = None
  if (directory / RUNS).is_file():
    configs = {f"{name}:{run}": config for run, config in
               json.loads((directory / RUNS).read_text(encoding="utf-8")).items()}
  text = notes.read_text(encoding="utf-8")
  search = re.search(r"beam (\d+), alpha ([0-9.]+)\.", text)
  signature = re.search(r"nrefs:\S+?\|version:[0-9.]+", text)
  checkpoint = next((key for key, said in CHECKPOINTS.items() if f"`. {said}, beam" in text), None)
  return Earlier(directory, name, fields, out, configs,
                 search and (int(search[1]), float(search[2])), signature and signature[0],
                 checkpoint)


def _value(text: str):
  """A config value as csv.DictWriter wrote it, back: 3, 0.5, True, None ("") or a string."""
  if text in ("True", "False", ""):
    return {"True": True, "False": False}.get(text)
  try:
    return json.loads(text)
  except ValueError:
    return text


def _number(text: str) -> float | None:
  return json.loads(text) if text else None  # 3400 stays an int, 149.45 a float.


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
        _cell(_fmt(row.get(c), 3 if c.endswith("_p") or c.endswith("p_value") else 2))
        for c in columns) + " |")
  return lines
