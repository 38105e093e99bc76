"""compare.py's table: columns from the swept fields, seed statistics, length buckets, test sets,
evaluations that are never stale, and run names. (Its refusals are in tests/test_errors.py.)"""

import csv
import errno
import json
import logging
import math
import os
import re
import shutil
import statistics
from pathlib import Path

import pytest
import scipy.stats
from sacrebleu.metrics import BLEU

from seq2seq import config as config_lib
from seq2seq.compare import comparison, evaluations, output, records, report, stats, sweep
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation import evaluate, scores
from tests.helpers import PNG, VAL, fast_tiny_config, metrics_copy, small_run, snapshot


def test_the_columns_are_the_fields_that_differ():
  a = {"model": {"num_heads": 2, "attention": "dot"}, "train": {"seed": 0, "steps": 4}}
  b = {"model": {"num_heads": 4, "attention": "dot"}, "train": {"seed": 0, "steps": 4}}
  c = {"model": {"num_heads": 4, "attention": "dot"}, "train": {"seed": 1, "steps": 4}}
  assert comparison.differing_fields([a, b, c]) == ["model.num_heads", "train.seed"]
  assert comparison.differing_fields([a, a]) == []


def test_seeds_group_runs_that_differ_only_in_the_seed():
  rows = [{"run": n, "model.num_heads": h, "train.seed": s}
          for n, h, s in [("a", 2, 0), ("b", 2, 1), ("c", 4, 0), ("d", 4, 1)]]
  groups = stats.seed_groups(rows, ["model.num_heads", "train.seed"])
  assert {k: [r["run"] for r in g] for k, g in groups.items()} == {(2,): ["a", "b"],
                                                                    (4,): ["c", "d"]}


def test_seed_statistics_and_welch_test_by_hand():
  rows = [{"run": f"r{i}", "model.num_heads": h, "train.seed": s, "val_bleu": bleu}
          for i, (h, s, bleu) in enumerate([(2, 0, 28.0), (2, 1, 28.5), (2, 2, 29.5),
                                             (4, 0, 30.0), (4, 1, 31.0), (4, 2, 32.0)])]
  seeds = stats.seed_aggregate(rows, ["model.num_heads", "train.seed"], ["val"], "r0")
  base, other = seeds
  assert base["model.num_heads"] == 2 and base["seeds"] == 3 and base["val_welch_p"] is None
  assert base["val_bleu_mean"] == pytest.approx(86.0 / 3)
  assert base["val_bleu_sd"] == pytest.approx(math.sqrt(((28 - 86 / 3) ** 2 + (28.5 - 86 / 3) ** 2
                                                         + (29.5 - 86 / 3) ** 2) / 2))
  assert other["val_bleu_mean"] == 31.0 and other["val_bleu_sd"] == pytest.approx(1.0)
  # Welch: t = (m1 - m2) / sqrt(v1/n1 + v2/n2), Welch-Satterthwaite degrees of freedom.
  v1, v2 = 1.0, statistics.variance([28.0, 28.5, 29.5])
  se2 = v1 / 3 + v2 / 3
  t = (31.0 - 86.0 / 3) / math.sqrt(se2)
  df = se2**2 / ((v1 / 3) ** 2 / 2 + (v2 / 3) ** 2 / 2)
  assert other["val_welch_p"] == pytest.approx(2 * scipy.stats.t.sf(t, df), rel=1e-9)
  assert 0.01 < other["val_welch_p"] < 0.1
  assert stats.welch_p_value([30.0], [28.0, 29.0]) is None  # One seed: no test.


def test_length_buckets_score_each_bucket_alone():
  sources = ["a " * 3, "b " * 12, "c " * 15, "d " * 40]
  refs = ["der Hund läuft", "die Katze schläft hier", "ein Mann fährt Rad", "zwei Frauen"]
  hyps = ["der Hund läuft", "die Katze schläft", "ein Mann fährt Rad", "drei Männer"]
  buckets = stats.length_buckets(sources, hyps, refs)
  assert [(b["bucket"], b["sentences"]) for b in buckets] == [("0-9", 1), ("10-19", 2),
                                                               ("20-29", 0), ("30+", 1)]
  assert buckets[1]["bleu"] == pytest.approx(
      BLEU().corpus_score(hyps[1:3], [refs[1:3]]).score)
  assert buckets[2]["bleu"] is None
  assert buckets[3]["bleu"] == pytest.approx(0.0)


@pytest.mark.slow  # Trains a tiny run in three segments: over ~10 s.
def test_training_minutes_add_up_every_resumed_segment(tmp_path, monkeypatch):
  """train_minutes sums each train record's interval (its tokens over its throughput), so a
  run resumed twice counts all three segments, not the last one's clock: a run trained 2 steps
  at a time by the same command, each segment's record timed as the loop timed it."""
  from seq2seq.training import loop, reports
  from tests.helpers import read_metrics
  intervals, train_record = [], reports.train_record

  def timed(metrics, elapsed, learning_rate):
    intervals.append(elapsed)  # The seconds of the record's steps, by the loop's clock.
    return train_record(metrics, elapsed, learning_rate)

  monkeypatch.setattr(reports, "train_record", timed)
  c = fast_tiny_config()
  c.train.log_every_steps = c.eval.every_steps = 2
  for num_steps in (2, 4, 6):  # Each call resumes the run where the last one stopped.
    c.train.num_steps = num_steps
    loop.train_and_evaluate(c, tmp_path / "run")
  train = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
  assert [r["step"] for r in train] == [2, 4, 6] and len(intervals) == 3
  assert records.train_seconds(train) == pytest.approx(sum(intervals), rel=1e-6)
  assert records.training_record(tmp_path / "run")["train_minutes"] == pytest.approx(
      sum(intervals) / 60, rel=1e-6)


@pytest.mark.slow  # A minute: trains a sweep of four runs and compares it twice.
def test_a_two_field_sweep_is_compared_with_seeds_and_a_test_set(tmp_path):
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 4, 2
  root = tmp_path / "sweep"
  status = sweep.run_sweep(c, ["model.num_heads=2,4", "train.seed=0,1"], root)
  assert set(status.values()) == {"trained"}
  src, ref = tmp_path / "extra.en", tmp_path / "extra.de"
  src.write_text("A dog runs.\nTwo men play football in a long green park.\n", encoding="utf-8")
  ref.write_text("Ein Hund rennt.\nZwei Männer spielen Fußball in einem langen Park.\n",
                 encoding="utf-8")
  runs = sorted(root.iterdir())
  out = tmp_path / "report"
  rows = comparison.compare_runs(runs, out, baseline=root / "num_heads-2_seed-0", split="val",
                              test_sets=[evaluations.parse_test_set(f"extra={src},{ref}")],
                              beam_size=1, n_samples=50)
  with open(out / "comparison.csv", encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert list(table[0]) == ["run", "model.num_heads", "train.seed", "parameters", "steps",
                            "train_minutes", "tokens_per_sec", "val_bleu", "val_bleu_lc",
                            "val_chrf", "val_bleu_ci95", "val_p_value", "extra_bleu",
                            "extra_bleu_lc", "extra_chrf", "extra_bleu_ci95", "extra_p_value"]
  assert table[0]["run"] == "num_heads-2_seed-0" and rows[0]["extra_p_value"] is None
  references = ref.read_text(encoding="utf-8").splitlines()
  for row in rows:  # Lowercase BLEU is sacreBLEU's -lc of the hypotheses the row scored.
    hyp = next((root / row["run"] / "eval" / "compare").glob("extra.*.hyp"))
    hypotheses = hyp.read_text(encoding="utf-8").splitlines()
    assert row["extra_bleu_lc"] == pytest.approx(
        BLEU(lowercase=True).corpus_score(hypotheses, [references]).score)
  assert "case:lc" in (out / "comparison.md").read_text()
  with open(out / "seeds.csv", encoding="utf-8") as f:
    seeds = list(csv.DictReader(f))
  assert [(s["model.num_heads"], s["seeds"]) for s in seeds] == [("2", "2"), ("4", "2")]
  four = [r["extra_bleu"] for r in rows if r["model.num_heads"] == 4]
  assert float(seeds[1]["extra_bleu_mean"]) == pytest.approx(statistics.mean(four))
  assert "Welch's t-test" in (out / "comparison.md").read_text()
  with open(out / "length.csv", encoding="utf-8") as f:
    assert len(list(csv.DictReader(f))) == 4 * len(stats.LENGTH_EDGES + (None,))
  assert (out / "length.png").read_bytes()[:8] == PNG

  # The same four as two comparisons, the second joining the first (--earlier): the same
  # scores and the same Welch test, from the cached evaluations.
  search = dict(split="val", test_sets=[evaluations.parse_test_set(f"extra={src},{ref}")],
                beam_size=1, n_samples=50)
  comparison.compare_runs(runs[:2], tmp_path / "two", **search)
  joined = comparison.compare_runs(runs[2:], tmp_path / "four", earlier=[tmp_path / "two"],
                                   **search)
  assert [r["run"] for r in joined] == ["num_heads-4_seed-0", "num_heads-4_seed-1",
                                        "two:num_heads-2_seed-0", "two:num_heads-2_seed-1"]
  for row in joined[2:]:
    alone = next(r for r in rows if "two:" + r["run"] == row["run"])
    assert {k: row[k] for k in table[0] if k != "run" and "p_value" not in k} == {
        k: alone[k] for k in table[0] if k != "run" and "p_value" not in k}
    assert row["extra_p_value"] is None  # Not tested against this baseline.
  with open(tmp_path / "four" / "seeds.csv", encoding="utf-8") as f:
    rejoined = list(csv.DictReader(f))
  assert [s["model.num_heads"] for s in rejoined] == ["4", "2"]
  for key in ("val_welch_p", "extra_welch_p", "extra_bleu_mean", "extra_bleu_sd"):
    assert float(rejoined[1][key] or "nan") == pytest.approx(float(
        {"val_welch_p": seeds[1], "extra_welch_p": seeds[1]}.get(key, seeds[0])[key]),
        rel=1e-9, nan_ok=True)  # Welch's test is symmetric: 2 against 4 is 4 against 2.
  assert "`two:...` are the runs of the earlier comparison two/" in (
      tmp_path / "four" / "comparison.md").read_text()
  # Welch's test against an earlier run's variant, the paired bootstrap still against the first.
  against = comparison.compare_runs(runs[2:], tmp_path / "against", earlier=[tmp_path / "two"],
                                    welch_against="two:num_heads-2_seed-0", **search)
  assert [r["val_p_value"] for r in against] == [r["val_p_value"] for r in joined]
  with open(tmp_path / "against" / "seeds.csv", encoding="utf-8") as f:
    flipped = list(csv.DictReader(f))
  assert [s["model.num_heads"] for s in flipped] == ["4", "2"]
  assert [s["val_welch_p"] for s in flipped] == [rejoined[1]["val_welch_p"], ""]
  assert "against the variant of `two:num_heads-2_seed-0`" in (
      tmp_path / "against" / "comparison.md").read_text()
  with pytest.raises(UserError, match="num_heads-2_seed-0 and two:num_heads-2_seed-0 are one"):
    comparison.compare_runs(runs[:1], tmp_path / "again", earlier=[tmp_path / "two"], **search)


def test_an_earlier_runs_config_takes_the_defaults_of_the_fields_it_predates():
  """runs.json written before config.model.positions existed: its runs trained with
  sinusoidal positions, the field's default, so they do not differ from today's in it."""
  today = comparison.flat_config(fast_tiny_config())
  before = {k: v for k, v in today.items() if k not in ("model.positions", "data.num_buckets")}
  earlier = report.Earlier(Path("old"), "old", ["train.seed"], [{"run": "old:a"}],
                           {"old:a": before}, None, None)
  joined = comparison._earlier_configs([earlier], today)["old:a"]
  assert joined["model.positions"] == "sinusoidal"
  assert joined["data.num_buckets"] == config_lib.BEFORE_FIELD[("data", "num_buckets")]
  assert comparison._differing([today, joined]) == ["data.num_buckets"]


# --- Runs compared on a corpus of a few sentences: copies of the trained `run` ----------------

def pair(directory, src_lines, ref_lines, name="extra"):
  """`directory/<name>.en` and `.de`: a --test_set's files."""
  directory.mkdir(parents=True, exist_ok=True)
  src, ref = directory / f"{name}.en", directory / f"{name}.de"
  src.write_text("".join(line + "\n" for line in src_lines), encoding="utf-8")
  ref.write_text("".join(line + "\n" for line in ref_lines), encoding="utf-8")
  return str(src), str(ref)


def row_scores(row, name):
  return row[f"{name}_bleu"], row[f"{name}_chrf"]


@pytest.mark.slow  # Nine comparisons and evaluations: about 15 s.
def test_a_cached_evaluation_is_shown_only_for_the_settings_it_was_made_with(run, tmp_path):
  workdir = small_run(run, tmp_path / "run")

  def compare_val(**search):
    return comparison.compare_runs([workdir], tmp_path / "out", split="val", beam_size=2,
                                n_samples=20, **search)[0]

  row = compare_val(alpha=0.6)
  fresh, prefix = evaluate.run_evaluation(workdir, split="val", beam_size=2, alpha=0.6)
  assert row_scores(row, "val") == (fresh["bleu"], fresh["chrf"])
  (cached,) = (workdir / "eval" / "compare").glob("val.beam2.*.json")
  key = json.loads(cached.read_text())["key"]
  assert (key["checkpoint_steps"], key["beam_size"], key["alpha"]) == ([4], 2, 0.6)
  hyp_file, json_file = scores.output_files(prefix)
  assert cached.with_suffix(".hyp").read_text() == hyp_file.read_text()

  # A score edited by hand is not that of the hypotheses: evaluated again, and rewritten.
  cached.write_text(json.dumps({**json.loads(cached.read_text()), "bleu": 42.0}))
  assert row_scores(compare_val(alpha=0.6), "val") == (fresh["bleu"], fresh["chrf"])
  assert json.loads(cached.read_text())["bleu"] == fresh["bleu"]
  # Nothing changed: the cached result is shown (marked here so that it can be told apart).
  cached.write_text(json.dumps({**json.loads(cached.read_text()), "bleu_signature": "marked"}))
  assert compare_val(alpha=0.6)["bleu_signature"] == "marked"

  # scripts/evaluate.py --alpha=0 writes eval/val.best.beam2.*: compare at --alpha=0 decodes
  # anew (and never reads those files), and at 0.6 keeps its own result.
  evaluate_py, _ = evaluate.run_evaluation(workdir, split="val", beam_size=2, alpha=0.0)
  json_file.write_text(json.dumps({**json.loads(json_file.read_text()), "bleu": 77.0}))
  assert row_scores(compare_val(alpha=0.0), "val") == (evaluate_py["bleu"], evaluate_py["chrf"])
  assert compare_val(alpha=0.6)["bleu_signature"] == "marked"
  assert len(list((workdir / "eval" / "compare").glob("val.beam2.*.json"))) == 2

  # Another checkpoint becomes "best" (the run trained further): evaluated anew.
  shutil.rmtree(workdir / "checkpoints" / "4")
  row = compare_val(alpha=0.6)
  fresh, _ = evaluate.run_evaluation(workdir, split="val", beam_size=2, alpha=0.6)
  assert fresh["checkpoint_steps"] == [2]
  assert row_scores(row, "val") == (fresh["bleu"], fresh["chrf"])
  shutil.copytree(run / "checkpoints" / "4", workdir / "checkpoints" / "4")
  assert compare_val(alpha=0.6)["bleu_signature"] == "marked"  # Step 4 again: cached.


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_test_sets_whose_files_share_a_name_get_their_own_scores(run, tmp_path):
  workdir = small_run(run, tmp_path / "run")
  sources = [s for s, _ in VAL]
  translated = [nbest[0][0] for nbest in
                Translator(workdir, "best", beam_size=2).translate(sources)]
  a = pair(tmp_path / "a", sources, ["Völlig anders.", "Nichts davon.", "Kein Wort."])
  b = pair(tmp_path / "b", sources, translated)  # The run's own output: chrF 100.
  rows = {}
  for name, (src, ref) in (("a", a), ("b", b)):  # The second with the first's cache there.
    test_set = evaluations.parse_test_set(f"{name}={src},{ref}")
    rows[name] = comparison.compare_runs([workdir], tmp_path / "out", split="val",
                                      test_sets=[test_set], beam_size=2, n_samples=20)[0]
    fresh, _ = evaluate.run_evaluation(workdir, src_file=src, ref_file=ref, beam_size=2)
    assert row_scores(rows[name], name) == (fresh["bleu"], fresh["chrf"])
  assert rows["b"]["b_chrf"] == 100.0 and rows["a"]["a_chrf"] < 50


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_runs_with_the_same_directory_name_stay_apart(run, tmp_path):
  runs = [small_run(run, tmp_path / "runs" / group / "s0") for group in ("a", "b")]
  out = tmp_path / "out"
  rows = comparison.compare_runs(runs, out, split="val", beam_size=2, n_samples=20)
  assert [r["run"] for r in rows] == ["a/s0", "b/s0"]
  assert rows[1]["val_p_value"] == 1.0  # The same model: tested against the other s0.
  with open(out / "length.csv", encoding="utf-8") as f:
    lengths = [(r["run"], r["bucket"]) for r in csv.DictReader(f)]
  buckets = ["0-9", "10-19", "20-29", "30+"]
  assert lengths == [(name, b) for name in ("a/s0", "b/s0") for b in buckets]
  with open(out / "comparison.csv", encoding="utf-8") as f:
    assert [r["run"] for r in csv.DictReader(f)] == ["a/s0", "b/s0"]


def test_run_names_are_paths_below_the_common_parent(tmp_path):
  assert comparison.run_names([tmp_path / "runs" / "a" / "s0"]) == ["s0"]
  assert comparison.run_names([tmp_path / "x" / "a" / "s0", tmp_path / "x" / "b" / "s0",
                            tmp_path / "x" / "b" / "s1"]) == ["a/s0", "b/s0", "b/s1"]
  assert comparison.run_names([tmp_path / "r", tmp_path / "r" / "more"]) == ["r", "r/more"]


def test_a_cut_off_last_metrics_line_is_skipped_with_one_warning(run, tmp_path, caplog):
  whole = records.training_record(run)
  workdir = metrics_copy(run, tmp_path, '{"step": 5, "split": "train", "loss": 3.')
  with caplog.at_level("WARNING", logger="seq2seq"):
    assert records.training_record(workdir) == whole
  assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
      (logging.WARNING, f"{workdir}/metrics.jsonl: its last line was cut off (the run was stopped"
       " while writing it?) and is skipped.")]


def earlier_files(directory: Path, names=("comparison.csv", "curves.png", "seeds.csv")) -> Path:
  """A folder holding an earlier comparison's `names` (their bytes: `old <name>`)."""
  directory.mkdir(parents=True, exist_ok=True)
  for name in names:
    (directory / name).write_bytes(f"old {name}".encode())
  return directory


def full_disk_halfway(folder: Path) -> None:
  """A comparison's writing that fills the disk halfway through curves.png."""
  (folder / "comparison.csv").write_text("new", encoding="utf-8")
  (folder / "curves.png").write_bytes(PNG[:4])
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # As a write() names no file.


@pytest.mark.parametrize("shared", [False, True])
def test_a_comparison_that_fails_to_write_leaves_the_earlier_one_as_it_was(tmp_path, shared):
  """Over an earlier comparison on a full disk, --out held new files, old ones and a cut
  curves.png, and the error named no file. (`shared`: --out also holds a run, as the runs'
  parent does by default.)"""
  out = earlier_files(tmp_path / "out")
  if shared:
    (out / "s0").mkdir()
    (out / "s0" / "config.json").write_text("{}", encoding="utf-8")
  before = snapshot(out)
  with pytest.raises(UserError) as raised:
    output.write_whole(out, full_disk_halfway, report.FILES)
  assert str(raised.value) == (f"No space left on device while writing the comparison to {out};"
                               " the earlier comparison there is kept: free some space and run"
                               " the command again.")
  assert snapshot(out) == before
  assert [p.name for p in tmp_path.iterdir()] == ["out"]  # No partial folder beside it.


def test_a_file_that_fails_to_write_is_named_where_it_belongs(tmp_path):
  def denied(folder):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder / "bleu.png"))

  with pytest.raises(UserError) as raised:
    output.write_whole(tmp_path / "new", denied, report.FILES)
  assert str(raised.value) == (f"Permission denied ({tmp_path}/new/bleu.png) while writing the"
                               f" comparison to {tmp_path}/new; nothing was written: pass another"
                               " --out, or fix the cause and run the command again.")
  assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("shared", [False, True])
def test_a_written_comparison_replaces_the_earlier_one_whole(tmp_path, shared):
  out = earlier_files(tmp_path / "out")
  if shared:  # The run and the user's notes stay; the earlier comparison's files go.
    (out / "s0").mkdir()
    (out / "notes.md").write_text("mine", encoding="utf-8")

  def write(folder):
    for name in ("comparison.csv", "curves.png"):
      (folder / name).write_text(f"new {name}", encoding="utf-8")

  output.write_whole(out, write, report.FILES)
  assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == {
      "comparison.csv": "new comparison.csv", "curves.png": "new curves.png",
      **({"notes.md": "mine"} if shared else {})}  # No seeds.csv of the earlier comparison.
  assert (out / "s0").is_dir() == shared
  assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.slow  # Decodes and bootstraps a run: about 8 s.
def test_compare_on_a_full_disk_keeps_the_earlier_comparison(run, tmp_path, monkeypatch):
  """The whole command: the disk fills while curves.png is drawn."""
  from seq2seq.evaluation import plots

  workdir = small_run(run, tmp_path / "runs" / "a")
  out = earlier_files(tmp_path / "out", ("comparison.csv", "comparison.md", "attention.png",
                                         "curves.png"))
  before = snapshot(out)

  def curves(_, path):
    Path(path).write_bytes(PNG[:4])  # Cut short.
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(plots, "training_curves", curves)
  with pytest.raises(UserError, match=f"^No space left on device while writing the comparison"
                     f" to {re.escape(str(out))}; the earlier comparison there is kept"):
    comparison.compare_runs([workdir], out, split="val", beam_size=2, n_samples=20)
  assert snapshot(out) == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "runs"]


def test_a_run_named_with_a_bar_keeps_its_table_row_whole(tmp_path):
  """comparison.md's cells escape `|` (and fold line breaks): a run named a|b is one cell."""
  from seq2seq.compare import report

  rows = [{"run": "a|b", "bleu_signature": "sig", "bleu_lc_signature": "lc",
           "test_bleu": 12.345},
          {"run": "c\nd", "bleu_signature": "sig", "test_bleu": None}]
  report.write_tables(tmp_path, rows, ["run", "test_bleu"], [], "a|b", 10, (4, 0.6),
                      {"a|b": {}, "c\nd": {}})
  table = [line for line in (tmp_path / "comparison.md").read_text().splitlines()
           if line.startswith("|")]
  assert table[2:] == ["| a\\|b | 12.35 |", "| c d | - |"]
  # Each row splits into as many cells as the header, with the escaped bar kept inside one.
  cells = [re.split(r"(?<!\\)\|", line)[1:-1] for line in table]
  assert {len(row) for row in cells} == {2}


def test_characters_the_font_lacks_are_one_line_per_picture(tmp_path, caplog):
  """Run names in CJK made matplotlib warn once per character and drawing (24 lines for one
  comparison); each picture now says it once, and no warning leaks."""
  import warnings

  from seq2seq.evaluation import plots

  with warnings.catch_warnings(record=True) as leaked, caplog.at_level(logging.WARNING):
    warnings.simplefilter("always")
    plots.bleu_chart(["日本語の実行", "run|b"], [10.0, 12.0], [1.0, 1.0], tmp_path / "b.png")
  assert leaked == []
  lines = [r.getMessage() for r in caplog.records if "matplotlib's font" in r.getMessage()]
  assert lines == [f"{tmp_path / 'b.png'}: 6 characters are not in matplotlib's font"
                   " (日本語の実行) and show as boxes."]
  assert (tmp_path / "b.png").stat().st_size > 0


@pytest.mark.parametrize("runs, grid", [(2, (1, 2)), (4, (2, 2)), (6, (2, 3)), (9, (3, 3))])
def test_attention_pictures_wrap_into_a_grid(tmp_path, runs, grid):
  """Nine runs' attention in one row made a picture 4,536 pixels wide; the panels now wrap
  into about as many rows as columns, and each panel keeps its size."""
  import matplotlib.image

  from seq2seq.evaluation import plots

  weights = [[0.25] * 4] * 3
  panels = [(f"run-{i}", weights, list("abcd"), list("xyz")) for i in range(runs)]
  height, width = matplotlib.image.imread(
      plots.attention_side_by_side(panels, tmp_path / "a.png")).shape[:2]
  assert (round(height / (4.4 * 120)), round(width / (4.2 * 120))) == grid


def test_a_model_without_attention_is_titled_so_not_drawn_as_a_dark_square():
  from seq2seq.evaluation import plots

  assert plots.panel_title("attention-none_seed-0", [[0.0, 0.0], [0.0, 0.0]]) == (
      "attention-none_seed-0 (no attention)")
  assert plots.panel_title("general", [[0.0, 1.0], [0.5, 0.5]]) == "general"
