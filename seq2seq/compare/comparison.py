"""Compare runs: a table of scores with paired-bootstrap significance, and pictures.

`compare_runs(run_dirs, out_dir)` evaluates each run's best checkpoint, or the one chosen for
it on validation, on validation and the chosen split (scoring.py; evaluations.py caches the
evaluations, recorded.py reads a run's record instead), tests every run against the baseline
with sacreBLEU's paired bootstrap resampling and aggregates seeds (stats.py), and writes
comparison.md, comparison.csv, seeds.csv (when runs differ in seed), length.csv, length.png,
bleu.png, curves.png, attention.png, zeros.csv and runs.json (report.py); an earlier
comparison's rows join the tables with `earlier`.
Every run is checked, its training record and its test sets read, before
anything is evaluated or written: a mistake costs no decoding and leaves no file.
"""

import json
import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import ml_collections

from seq2seq import config as config_lib
from seq2seq.compare import output, recorded, records, report, scoring
from seq2seq.compare.evaluations import TestSet, read_test_set
from seq2seq.compare.records import Run
from seq2seq.compare.stats import seed_aggregate
from seq2seq.decoding.translator import check_search
from seq2seq.errors import UserError
from seq2seq.evaluation.record import is_record
from seq2seq.runs import workdirs

log = logging.getLogger("seq2seq")

FIXED_COLUMNS = ["parameters", "steps", "train_minutes", "tokens_per_sec"]


def flat_config(config) -> dict[str, object]:
  """{"model.num_heads": 4, ...} of a run's config (sections of plain fields)."""
  config = config.to_dict() if hasattr(config, "to_dict") else config
  return {f"{section}.{key}": value for section, fields in config.items()
          for key, value in fields.items()}


def differing_fields(configs: Sequence) -> list[str]:
  """The dotted config fields whose values are not the same in every run, in config order."""
  return _differing([flat_config(c) for c in configs])


def _as_saved(flat: dict[str, object]) -> dict[str, object]:
  """A flat config as a run that saved it would read it back (`config.from_saved`): the fields
  it predates take the values their runs trained with (their defaults, or `BEFORE_FIELD`)."""
  nested = defaultdict(dict)
  for name, value in flat.items():
    section, _, key = name.partition(".")
    nested[section][key] = value
  return flat_config(config_lib.from_saved(dict(nested)))


def _differing(flat: Sequence[dict]) -> list[str]:
  names = list(dict.fromkeys(name for f in flat for name in f))
  return [n for n in names if len({json.dumps(f.get(n), sort_keys=True) for f in flat}) > 1]


def run_names(run_dirs: Sequence[str | Path]) -> list[str]:
  """Each run's name in the table: its path relative to the runs' common parent (`a/s0` and
  `b/s0` stay apart); one run alone is named by its directory."""
  resolved = [Path(w).resolve() for w in run_dirs]
  if len(resolved) == 1:
    return [resolved[0].name]
  common = Path(os.path.commonpath(resolved))
  if common in resolved:  # One run inside another: name both below the outer one's parent.
    common = common.parent
  return [p.relative_to(common).as_posix() for p in resolved]


def compare_runs(run_dirs: list[str | Path], out_dir: str | Path, *, baseline: str | Path = "",
                 split: str = "test", test_sets: Sequence[TestSet] = (), beam_size: int = 4,
                 alpha: float = 0.6, n_samples: int = 1000, earlier: Sequence[str | Path] = (),
                 attention_text: str = "A man in an orange hat starring at something.",
                 gold_alignment: dict | None = None, welch_against: str = "",
                 checkpoint: str = "best") -> list:
  """Writes the comparison of `run_dirs` to `out_dir` (its files and columns: seq2seq-compare
  --help); returns the table's rows.

  Every run is scored at its `checkpoint` (best, or selected: the one chosen on validation at
  this beam size and alpha; a run's record, `evaluation.record`, is read, not decoded) on
  `val`, `split` and each of `test_sets`, and tested against the `baseline` (paired
  bootstrap). Runs are named by their path below their common parent (`run_names`); each
  `earlier` comparison's runs join the tables as it scored them. `gold_alignment` (FILE,
  "gold_one_based", "alignment_layer") adds `<split>_aer`; Welch's test is against the row
  `welch_against`'s variant (default: the baseline's)."""
  output.check_out(Path(out_dir))
  search = (beam_size, alpha)
  runs = _runs(run_dirs, baseline, beam_size, alpha)
  sets, named = _sets(split, test_sets)
  choices = recorded.checked_choices(runs, checkpoint, search, test_sets, gold_alignment)
  parents = _parents(runs)
  before = [_earlier(Path(d), named, search, checkpoint) for d in earlier]
  configs, fields, earlier_rows = _configs(runs, before, named)
  against = _welch_reference(welch_against, runs, earlier_rows)
  texts = _texts(runs, sets)
  gold, layer = scoring.gold(gold_alignment, texts[split])  # A wrong file fails before decoding.
  read = recorded.read_records(runs, choices, sets, split, search, texts)
  translators = scoring.translators(runs, checkpoint, search, gold, layer)
  rows, hyps = scoring.score(runs, translators, read, configs, fields, sets, texts, search,
                             n_samples)
  scoring.add_alignment_error(rows, translators, split, texts[split], gold, layer)
  _check_signatures(before, rows[0])
  joined = _each_once(rows, earlier_rows, fields, named)
  columns = _columns(fields, _add_parents(rows, parents), named, gold and f"{split}_aer")
  seeds = seed_aggregate(joined, fields, named, against)

  def write(folder: Path) -> None:
    report.write_tables(folder, joined, columns, seeds, runs[0].name, n_samples, search,
                        configs, [e.name for e in before], against,
                        (checkpoint, [run.name for run in runs if run.recorded]))
    report.write_lengths(folder, rows, texts[split], hyps[split],
                         ylabel=f"{split} BLEU (beam {beam_size})")
    report.write_charts(folder, joined, split, beam_size,
                        {run.name: run.record["curve"] for run in runs})
    report.write_attention(folder, translators, attention_text)  # Records have no model.
    report.write_zeros(folder, translators, texts["val"])

  output.write_whole(Path(out_dir), write, report.FILES)  # Whole, or the earlier one kept.
  return joined


def _sets(split: str, test_sets: Sequence[TestSet]) -> tuple[list[TestSet], list[str]]:
  """The sets every run is scored on: `val`, `split` and the extra test sets, each once; and
  their names."""
  sets = list(dict.fromkeys([TestSet("val"), TestSet(split), *test_sets]))
  names = [ts.name for ts in sets]
  twice = _repeated(names)
  if twice is not None:  # Its columns would hold one set's scores, its p-values the other's.
    raise UserError(f"--test_set names {twice!r} twice, for different files; give each set its"
                    " own NAME.")
  return sets, names


def _configs(runs: list[Run], before: list[report.Earlier],
             sets: list[str]) -> tuple[dict[str, dict], list[str], list[dict]]:
  """The flat config of every run in the tables by name (the `before` comparisons' too), the
  fields that differ between them, and the earlier rows with those fields; checked, before
  anything is decoded, to hold no run twice (`_each_once`)."""
  configs = {run.name: flat_config(run.config) for run in runs}
  configs.update(_earlier_configs(before, configs[runs[0].name]))
  fields = _differing(list(configs.values()))
  earlier_rows = [{**row, **{f: configs[row["run"]].get(f) for f in fields}}
                  for e in before for row in e.rows]
  _each_once([], earlier_rows, fields, sets)
  return configs, fields, earlier_rows


def _columns(fields: list[str], parent: bool, sets: list[str], aer: str | None) -> list[str]:
  """The table's columns: the run, the `fields` that differ, the fixed ones, the parent
  (where a run has one), each set's scores, and the alignment error rate `aer` (if any)."""
  return ["run", *fields, *FIXED_COLUMNS, *(["parent"] if parent else [])] + [
      f"{name}_{c}" for name in sets for c in ("bleu", "bleu_lc", "chrf", "bleu_ci95",
                                               "p_value")] + ([aer] if aer else [])


def _runs(run_dirs: Sequence[str | Path], baseline: str | Path, beam_size: int,
          alpha: float) -> list[Run]:
  """The runs to compare, the baseline first (`baseline`, or the first of `run_dirs`), each
  checked and its config and training record read before anything is written."""
  run_dirs = records.check_runs(run_dirs)
  if baseline and not (Path(baseline) / workdirs.CONFIG).exists():
    raise UserError(f"--baseline={baseline} is not a training run (no config.json); pass one of"
                    " the compared workdirs.")
  check_search(beam_size, alpha)  # Before --out is created.
  baseline = Path(baseline) if baseline else run_dirs[0]
  run_dirs = [baseline] + [w for w in run_dirs if w.resolve() != baseline.resolve()]
  names = run_names(run_dirs)
  configs = [workdirs.read_run_config(w) for w in run_dirs]
  for w, config in zip(run_dirs[1:], configs[1:], strict=True):
    if _direction(config) != _direction(configs[0]):  # Else "other sentences", of one corpus.
      raise UserError(f"{w} translates {_direction(config)} but the baseline {run_dirs[0]}"
                      f" translates {_direction(configs[0])}; compare runs of one direction.")
  trained = [records.training_record(w) for w in run_dirs]
  kinds = [is_record(w) for w in run_dirs]
  return [Run(*run) for run in zip(run_dirs, names, configs, trained, kinds, strict=True)]


def _direction(config: ml_collections.ConfigDict) -> str:
  return f"{config.data.src_lang}->{config.data.tgt_lang}"


def _parents(runs: list[Run]) -> dict[str, str]:
  """Each started run's parent (its parent.json, config.train.init_from) as the table shows it:
  the parent's name among the compared runs, else its directory's, with the checkpoint and
  its step; {} when no run has one (the table then has no parent column)."""
  names = {run.workdir.resolve(): run.name for run in runs}
  shown = {}
  for run in runs:
    if (run.workdir / workdirs.PARENT).is_file():
      record = workdirs.read_json(run.workdir / workdirs.PARENT, workdirs.RUN_CONFIG_FIX)
      parent = Path(str(record.get("workdir", "")))
      shown[run.name] = (f"{names.get(parent, parent.name)} ({record.get('checkpoint')}, step"
                         f" {record.get('step')})")
  return shown


def _add_parents(rows: list[dict], parents: dict[str, str]) -> bool:
  """Adds each row's `parent` (`_parents`) where some run has one; returns whether one has."""
  for row in rows if parents else []:
    row["parent"] = parents.get(row["run"])
  return bool(parents)


def _earlier(directory: Path, sets: list[str], search: tuple[int, float],
             checkpoint: str) -> report.Earlier:
  """An earlier comparison (`--earlier`), checked before anything is decoded: scored on these
  sets, with this beam size and alpha where its comparison.md names them, at `checkpoint`."""
  earlier = report.read_earlier(directory, sets, FIXED_COLUMNS)
  if earlier.search is None:
    log.warning("--earlier=%s does not name its beam size and alpha (an older comparison.md);"
                " its rows are taken to be scored with beam %d, alpha %s like these.",
                directory, *search)
  elif earlier.search != search:
    raise UserError(f"--earlier={directory} was scored with beam {earlier.search[0]}, alpha"
                    f" {earlier.search[1]}, these runs with beam {search[0]}, alpha {search[1]};"
                    " pass its --beam_size and --alpha.")
  if earlier.checkpoint not in (None, checkpoint):
    raise UserError(f"--earlier={directory} scored each run's {earlier.checkpoint} checkpoint,"
                    f" these runs' {checkpoint}; pass its --checkpoint={earlier.checkpoint}.")
  return earlier


def _earlier_configs(earlier: list[report.Earlier], baseline: dict) -> dict[str, dict]:
  """Each earlier run's flat config: from its comparison's runs.json, or, where an older one
  has none, the fields its table names over the `baseline`'s others."""
  twice = _repeated([e.name for e in earlier])
  if twice is not None:  # Their rows would have one name.
    raise UserError(f"--earlier names two comparisons in directories called {twice}; rename"
                    " one, since its name prefixes its rows.")
  configs = {}
  for e in earlier:
    if e.configs is None:
      log.warning("--earlier=%s has no runs.json (an older comparison) and its table names"
                  " only %s: its runs are taken to share every other config field with the"
                  " baseline.", e.directory, ", ".join(e.fields) or "no config field")
    for row in e.rows:
      if e.configs is None:
        configs[row["run"]] = {**baseline, **{f: row[f] for f in e.fields}}
      elif row["run"] in e.configs:
        configs[row["run"]] = _as_saved(e.configs[row["run"]])
      else:
        raise UserError(f"--earlier={e.directory}: its {report.RUNS} has no config for the run"
                        f" {row['run'].partition(':')[2]} of its table; pass the directory as"
                        " seq2seq-compare wrote it.")
  return configs


def _each_once(rows: list[dict], earlier_rows: list[dict], fields: list[str],
               sets: list[str]) -> list[dict]:
  """`rows + earlier_rows`, once no earlier row is another row's run: the same config fields
  and scores on every set, as when a run is joined twice (its own workdir and an earlier
  comparison that holds it, or two comparisons that both hold it), which would count its
  seed twice in Welch's test."""
  def key(row):
    return json.dumps([row[f] for f in fields] + [row.get(f"{s}_{c}") for s in sets
                                                  for c in ("bleu", "bleu_lc", "chrf")])

  seen = {key(row): row["run"] for row in rows}
  for row in earlier_rows:
    other = seen.setdefault(key(row), row["run"])
    if other != row["run"]:
      raise UserError(f"{other} and {row['run']} are one run (the same config and scores);"
                      " pass each run, and each --earlier comparison holding it, once.")
  return rows + earlier_rows


def _welch_reference(name: str, runs: list[Run], earlier_rows: list[dict]) -> str:
  """The row whose variant Welch's test is against: `name` (one of the `runs` or of the
  `earlier_rows`), or the baseline (the first run)."""
  names = [run.name for run in runs] + [row["run"] for row in earlier_rows]
  if name and name not in names:
    raise UserError(f"--welch_against={name} names no compared run; pass a row's name as the"
                    f" table shows it, one of: {', '.join(names)}.")
  return name or names[0]


def _repeated(names: Sequence[str]) -> str | None:
  """The first name that `names` holds more than once, or None."""
  return next((name for name in names if names.count(name) > 1), None)


def _check_signatures(before: list[report.Earlier], baseline: dict) -> None:
  """A `UserError` unless each earlier comparison's sacreBLEU signature is the baseline's."""
  for earlier in before:
    if earlier.signature not in (None, baseline["bleu_signature"]):
      raise UserError(f"--earlier={earlier.directory} was scored as {earlier.signature}, these"
                      f" runs as {baseline['bleu_signature']}; join comparisons of one"
                      " sacreBLEU version.")


def _texts(runs: list[Run], sets: list[TestSet]) -> dict[str, tuple[list[str], list[str]]]:
  """Each set's (sources, references), read once per corpus config. Each run is evaluated on
  its own corpus: one that gives other sentences than the baseline's is a `UserError`."""
  read = {}

  def text(run: Run, ts: TestSet) -> tuple[list[str], list[str]]:
    corpus = "" if ts.src_file else json.dumps(run.config.data.to_dict(), sort_keys=True)
    if (corpus, ts) not in read:
      read[corpus, ts] = read_test_set(run.config, ts)
    return read[corpus, ts]

  texts = {ts.name: text(runs[0], ts) for ts in sets}
  for run in runs:
    for ts in sets:
      if text(run, ts) != texts[ts.name]:
        raise UserError(f"{run.workdir} has other {ts.name} sentences than the baseline"
                        f" {runs[0].workdir} (their config.data differs); compare runs of one"
                        " corpus.")
  return texts
