"""seq2seq-compare --checkpoint=selected: each run at the checkpoint chosen on validation, and a
run's record (seq2seq-export --format=record) compared as the run it came from, its
evaluations read instead of decoded; the study's records in docs/recipe_study among them."""

import csv
import json
import subprocess
import sys

import pytest

from seq2seq.compare import comparison, evaluations, report
from seq2seq.errors import UserError
from seq2seq.evaluation import evaluate, record, scores
from seq2seq.runs import selection
from tests.helpers import ENV, ROOT, VAL, small_run

STUDY = ROOT / "docs" / "recipe_study"


def test_a_records_files_are_named_as_seq2seq_evaluate_names_them(tmp_path):
  assert record.candidate_files(tmp_path, "avg:3", (4, 0.6)) == (
      tmp_path / "eval" / "val.avg3.beam4.hyp", tmp_path / "eval" / "val.avg3.beam4.json")
  assert record.selected_files(tmp_path, "test", (5, 1.0)) == (
      tmp_path / "eval" / "test.selected.beam5.alpha1.hyp",
      tmp_path / "eval" / "test.selected.beam5.alpha1.json")
  assert evaluate.output_prefix(tmp_path, "test", "ensemble:5", "beam4") == (
      tmp_path / "test.ensemble5.beam4")


def test_a_selection_names_its_candidates_and_the_search_it_was_made_at():
  one = {"checkpoint": "avg:3", "beam_size": 4, "alpha": 0.6,
         "bleu": {"best": 39.7, "avg:3": 39.9, "avg:5": 39.4}}
  assert selection.candidate_specs(one) == ["best", "avg:3", "avg:5"]
  assert selection.chosen_search(one) == (4, 0.6)
  several = {"checkpoint": "best", "beam_size": 5, "alpha": 1.0,
             "bleu": {evaluate.search_label(spec, k, a): 1.0 for spec in ("best", "avg:5")
                      for k in (4, 5) for a in (0.6, 1.0)}}
  assert selection.candidate_specs(several) == ["best", "avg:5"]
  assert selection.chosen_search(several) == (5, 1.0)
  assert selection.chosen_search({"checkpoint": "latest"}) is None


def test_the_study_compares_from_its_records_as_recorded(tmp_path):
  """docs/recipe_study's records: each row's val BLEU is its choice's in selected.json, its
  test scores those of its test.selected.beam4.json, recomputed from its hypotheses."""
  runs = sorted(STUDY.iterdir())
  rows = comparison.compare_runs(runs, tmp_path / "out", checkpoint="selected", n_samples=20)
  assert len(rows) == len(runs) >= 8
  for row in rows:
    chosen = json.loads((STUDY / row["run"] / "eval" / "selected.json").read_text())
    test = json.loads((STUDY / row["run"] / "eval" / "test.selected.beam4.json").read_text())
    assert row["val_bleu"] == chosen["bleu"][chosen["checkpoint"]]
    assert (row["test_bleu"], row["test_bleu_lc"], row["test_chrf"]) == (
        test["bleu"], test["bleu_lowercase"], test["chrf"])
    assert row["parameters"] is None and row["val_bleu_ci95"] is None  # No val hypotheses.
    assert row["test_bleu_ci95"] is not None
  assert rows[0]["test_bleu"] == pytest.approx(39.42, abs=0.005)  # docs/recipe.md's seed 0.
  assert "Every run is a run's record" in (tmp_path / "out" / "comparison.md").read_text()
  assert not (tmp_path / "out" / "attention.png").exists()


def test_an_earlier_comparison_says_which_checkpoint_it_scored(tmp_path):
  row = {"run": "a", "bleu_signature": "s", "bleu_lc_signature": "l", "val_bleu": 1.0}
  for checkpoint in ("best", "selected"):
    folder = tmp_path / checkpoint
    folder.mkdir()
    report.write_tables(folder, [row], ["run", "parameters", "val_bleu"], [], "a", 10, (4, 0.6),
                        {"a": {}}, chosen=(checkpoint, []))
    assert report.read_earlier(folder, [], ["parameters"]).checkpoint == checkpoint


# --- A tiny run: chosen on validation, scored on test, exported, compared ----------------------

SEARCH = dict(beam_size=2, alpha=0.6)


def chosen_and_scored(run, workdir):
  """A small copy of the run, chosen on validation among two checkpoints and its choice scored
  on test, at beam 2, as seq2seq-evaluate does."""
  small_run(run, workdir)
  evaluate.select_checkpoint(workdir, ["best", "avg:2"], **SEARCH)
  evaluate.run_evaluation(workdir, split="test", checkpoint="selected", **SEARCH)
  return workdir


def command(script: str, *args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)],
                        capture_output=True, text=True, env=ENV, timeout=300)


@pytest.mark.slow  # Decodes a tiny run's candidates, three commands, four comparisons: ~25 s.
def test_a_record_compares_as_the_workdir_it_came_from(run, tmp_path):
  workdir = chosen_and_scored(run, tmp_path / "runs" / "tiny")
  exported = tmp_path / "records" / "tiny"
  export = ["export.py", "--format=record", f"--workdir={workdir}", f"--output={exported}"]
  refused = command(*export, "--checkpoint=best")
  assert (refused.returncode, refused.stderr.splitlines()) == (2, [
      "error: --checkpoint does not apply to --format=record, which holds the checkpoint chosen"
      " on validation (eval/selected.json); drop it."])
  written = command(*export)
  assert (written.returncode, written.stdout) == (0, f"wrote {exported}\n"), written.stderr
  chosen = json.loads((workdir / "eval" / "selected.json").read_text())
  files = sorted(p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file())
  spec = chosen["checkpoint"].replace(":", "")
  assert files == sorted(["config.json", "metrics.jsonl", "eval/selected.json",
                          "eval/val.best.beam2.json", "eval/val.avg2.beam2.json",
                          f"eval/val.{spec}.beam2.hyp", "eval/test.selected.beam2.hyp",
                          "eval/test.selected.beam2.json"])
  assert record.is_record(exported) and not record.is_record(workdir)

  alone = {}
  for name, path in (("workdir", workdir), ("record", exported)):
    alone[name] = comparison.compare_runs([path], tmp_path / name, checkpoint="selected",
                                          n_samples=20, **SEARCH)[0]
  differ = {"run", "parameters"}
  assert {k: v for k, v in alone["record"].items() if k not in differ} == {
      k: v for k, v in alone["workdir"].items() if k not in differ}
  assert alone["record"]["parameters"] is None and alone["workdir"]["parameters"] > 0
  for name in ("length.csv", "comparison.csv"):
    with open(tmp_path / "workdir" / name) as a, open(tmp_path / "record" / name) as b:
      assert [dict(r, run=None, parameters=None) for r in csv.DictReader(a)] == [
          dict(r, run=None, parameters=None) for r in csv.DictReader(b)]

  # The bootstrap's inputs: compare decoded (and cached) the hypotheses the record holds.
  cached = json.loads(next((workdir / "eval" / "compare").glob("test.*.json")).read_text())
  assert (cached["key"]["checkpoint"], cached["key"]["beam_size"]) == (chosen["checkpoint"], 2)
  for split, kept in (("test", "test.selected.beam2.hyp"), ("val", f"val.{spec}.beam2.hyp")):
    hyp = next((workdir / "eval" / "compare").glob(f"{split}.*.hyp"))
    assert hyp.read_text() == (exported / "eval" / kept).read_text()
  both = comparison.compare_runs([workdir, exported], tmp_path / "both", checkpoint="selected",
                                 n_samples=20, **SEARCH)
  assert [r["run"] for r in both] == ["runs/tiny", "records/tiny"]
  assert both[1]["test_p_value"] == both[1]["val_p_value"] == 1.0  # The same hypotheses.
  compared = command("compare.py", "--checkpoint=selected", "--beam_size=2",
                     f"--out={tmp_path / 'command'}", exported)
  assert compared.returncode == 0, compared.stderr[-3000:]
  with open(tmp_path / "record" / "comparison.csv") as a, open(
      tmp_path / "command" / "comparison.csv") as b:
    assert list(csv.DictReader(a)) == list(csv.DictReader(b))


def test_a_record_or_a_choice_that_does_not_fit_is_refused_in_one_line(run, tmp_path):
  workdir = chosen_and_scored(run, tmp_path / "runs" / "tiny")
  chosen = json.loads((workdir / "eval" / "selected.json").read_text())["checkpoint"]
  exported = record.write_record(workdir, tmp_path / "records" / "tiny")
  out = tmp_path / "out"

  def refused(runs, **flags):
    with pytest.raises(UserError) as raised:
      comparison.compare_runs(runs, out, **{"checkpoint": "selected", **SEARCH, **flags})
    assert not out.exists()
    return str(raised.value)

  choose = (f"seq2seq-evaluate --workdir={workdir} --split=val --checkpoint=best,avg:2"
            " --beam_size=4 --alpha=0.6")
  assert refused([workdir], beam_size=4) == (
      f"{workdir}/eval/selected.json chose {chosen} at beam 2, alpha 0.6, not at --beam_size=4"
      f" --alpha=0.6; choose at this search: {choose}, or compare at its search.")
  assert refused([exported], checkpoint="best") == (
      f"{exported} is a run's record (its evaluations, no checkpoints): it holds the scores of"
      " the checkpoint chosen on validation alone; compare with --checkpoint=selected.")
  src = tmp_path / "extra.en"
  src.write_text("A dog.\n")
  assert refused([exported], test_sets=[evaluations.TestSet("extra", str(src), str(src))]) == (
      f"{exported} is a run's record (its evaluations, no checkpoints): nothing decodes"
      " --test_set's files with it; drop --test_set, or compare the runs' workdirs.")
  assert refused([exported], gold_alignment={"gold_alignment": str(src)}).endswith(
      "it has no model whose attention --gold_alignment scores; drop --gold_alignment, or"
      " compare the runs' workdirs.")

  test_json = exported / "eval" / "test.selected.beam2.json"
  edited = json.loads(test_json.read_text())
  test_json.write_text(json.dumps({**edited, "bleu": edited["bleu"] + 1.0}))
  assert refused([exported]) == (
      f"{test_json}: its bleu, {edited['bleu'] + 1.0}, is not that of its hypotheses"
      " (test.selected.beam2.hyp, against the run's test references); put back the files"
      " seq2seq-evaluate wrote, or score the choice in the run's workdir (seq2seq-evaluate"
      " --workdir=WORKDIR --split=test --checkpoint=selected --beam_size=2 --alpha=0.6), then"
      " export its record again (seq2seq-export --format=record).")
  test_json.unlink()
  assert refused([exported]).startswith(
      f"{test_json} is missing from the record {exported}; score the choice in the run's workdir")

  (workdir / "eval" / "selected.json").unlink()
  assert refused([workdir]) == (
      f"{workdir}/eval/selected.json is missing: --checkpoint=selected scores the checkpoint"
      " chosen on validation; choose at this search: seq2seq-evaluate"
      f" --workdir={workdir} --split=val --checkpoint=best,avg:5,avg:10 --beam_size=2"
      " --alpha=0.6.")


def test_export_refuses_a_run_without_its_choice_or_its_test_scores(run, tmp_path):
  workdir = small_run(run, tmp_path / "tiny")
  with pytest.raises(UserError) as raised:
    record.write_record(workdir, tmp_path / "record")
  assert str(raised.value) == (
      f"{workdir}/eval/selected.json is missing: a record holds the checkpoint chosen on"
      " validation; choose it first: seq2seq-evaluate"
      f" --workdir={workdir} --split=val --checkpoint=best,avg:5,avg:10 --beam_size=4"
      " --alpha=0.6.")
  # A choice made (its candidates' scores written as seq2seq-evaluate writes them), no test.
  references = [t for _, t in VAL]
  for spec in ("best", "avg:2"):
    hyp, scored = record.candidate_files(workdir, spec, (2, 0.6))
    scored.parent.mkdir(exist_ok=True)
    scored.write_text(json.dumps({**scores.scores(references, references), "checkpoint": spec,
                                  "beam_size": 2, "alpha": 0.6, "sentences": 3}))
  selection.record_selection(workdir, {"checkpoint": "avg:2", "split": "val", "beam_size": 2,
                                       "alpha": 0.6, "bleu": {"best": 90.0, "avg:2": 100.0}})
  with pytest.raises(UserError) as raised:
    record.write_record(workdir, tmp_path / "record")
  assert str(raised.value) == (
      f"{workdir}/eval/test.selected.beam2.hyp and .json are missing: a record holds the"
      " choice's test scores; score the choice: seq2seq-evaluate"
      f" --workdir={workdir} --split=test --checkpoint=selected --beam_size=2 --alpha=0.6.")
  assert not (tmp_path / "record").exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny", "tiny-corpus"]
