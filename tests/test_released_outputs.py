"""A released model stays as released (seq2seq/runs/released.py, `outputs`): evaluating,
translating, serving, comparing or choosing with it writes nothing into its folder, even where
the folder is read-only on disk; what a command makes of it goes beside it, to
runs/released/<its path>/ under the working directory, or where --out says."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.compare import evaluations
from seq2seq.errors import UserError
from seq2seq.evaluation.evaluate import run_evaluation, select_checkpoint
from seq2seq.evaluation.scores import output_files
from seq2seq.runs import released
from seq2seq.serve.runs import load_runs
from tests.helpers import ENV, ROOT, snapshot

SOURCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A girl."]
REFERENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Mädchen."]


def _set_writable(directory: Path, writable: bool) -> None:
  for path in [directory, *directory.rglob("*")]:
    mode = path.stat().st_mode
    path.chmod(mode | 0o200 if writable else mode & ~0o222)


@pytest.fixture(scope="module")
def model(run, tmp_path_factory):
  """The session's run released (its latest checkpoint) as <root>/models/m, read-only on disk.
  (As root a chmod stops no write: the listings before and after do.)"""
  root = tmp_path_factory.mktemp("released_outputs")
  (root / "models").mkdir()
  (root / "src.en").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
  (root / "ref.de").write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
  output = released.release(run, "latest", root / "models" / "m")
  _set_writable(output, False)
  yield output
  _set_writable(output, True)  # For the clean-up of the temporary folder.


def _state(model: Path) -> tuple:
  """Every path under the model (folders too) and every file's bytes and time."""
  return sorted(str(p.relative_to(model)) for p in model.rglob("*")), snapshot(model)


def test_outputs_of_a_run_are_its_own_and_a_released_models_lie_beside_it(tmp_path,
                                                                           monkeypatch):
  run, model = tmp_path / "runs" / "r", tmp_path / "models" / "m"
  run.mkdir(parents=True)
  model.mkdir(parents=True)
  (model / released.RECORD).write_text("{}\n", encoding="utf-8")
  monkeypatch.chdir(tmp_path)
  assert released.outputs("runs/r") == Path("runs/r")
  assert released.outputs("models/m") == Path("runs/released/models/m")
  assert released.outputs(tmp_path / "models" / "m") == Path("runs/released/models/m")
  monkeypatch.chdir(run)  # The model outside the working directory: its whole path.
  assert released.outputs(model) == Path("runs/released") / model.relative_to(model.anchor)
  monkeypatch.chdir(model)  # Inside the model: beside it, never in it.
  assert released.outputs(".") == tmp_path / "models" / "runs" / "released" / "m"


def test_evaluating_it_writes_beside_it_with_its_pictures_and_where_out_says(model, run,
                                                                             monkeypatch):
  root, before = model.parents[1], _state(model)
  monkeypatch.chdir(root)
  files = {"src_file": str(root / "src.en"), "ref_file": str(root / "ref.de")}
  result, prefix = run_evaluation("models/m", checkpoint="selected", beam_size=2,
                                  plot_attention=1, **files)
  assert prefix == Path("runs/released/models/m/eval/src.en.selected.beam2")
  names = sorted(p.name for p in prefix.parent.iterdir())
  assert names == [f"{prefix.name}.{ext}" for ext in ("attention1.png", "hyp", "json")]
  assert json.loads(output_files(prefix)[1].read_text())["bleu"] == result["bleu"]
  _, ensembled = run_evaluation("models/m", checkpoint="latest", beam_size=2,
                                ensemble=[str(run)], **files)
  assert ensembled.parent == prefix.parent and ".ensemble2-" in ensembled.name
  _, elsewhere = run_evaluation("models/m", checkpoint="selected", beam_size=2, out="scores",
                                **files)
  assert elsewhere == Path("scores/src.en.selected.beam2")
  assert output_files(elsewhere)[0].is_file()
  assert _state(model) == before


def test_choosing_among_its_checkpoints_is_refused_and_writes_nothing(model, tmp_path,
                                                                      monkeypatch):
  before = _state(model)
  monkeypatch.chdir(tmp_path)
  with pytest.raises(UserError) as raised:
    select_checkpoint(model, ["best", "latest"], split="val")
  assert str(raised.value) == (
      f"--workdir={model} is a released model: it holds one checkpoint, the one its run chose"
      " (released.json), so there is nothing to choose among; score it with"
      " --checkpoint=selected, or choose in the run it came from.")
  assert _state(model) == before and list(tmp_path.iterdir()) == []


def test_comparing_and_serving_it_write_nothing_into_it(model, tmp_path, monkeypatch):
  root, before = model.parents[1], _state(model)
  monkeypatch.chdir(tmp_path)
  test_set = evaluations.TestSet("few", str(root / "src.en"), str(root / "ref.de"))
  result, hypotheses = evaluations.evaluation(model, test_set, beam_size=1, alpha=0.6)
  cache = released.outputs(model) / "eval" / "compare"
  assert len(hypotheses) == len(SOURCES) and len(list(cache.glob("few.beam1.*.json"))) == 1
  again, _ = evaluations.evaluation(model, test_set, beam_size=1, alpha=0.6)  # From the cache.
  assert again == result
  served = load_runs([str(model)], "selected", beams=[1], alpha=0.6, batch_size=8)
  assert served[0].released["steps"] == [4]
  assert _state(model) == before


def test_the_commands_leave_it_as_released(model):
  """seq2seq-evaluate and seq2seq-translate as a user runs them, from the folder above
  models/: the scores appear in runs/released/models/m/eval/, the model's listing is the same."""
  root, before = model.parents[1], _state(model)
  done = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate.py"),
                         "--workdir=models/m", "--checkpoint=selected", "--beam_size=1",
                         "--src_file=src.en", "--ref_file=ref.de"],
                        capture_output=True, text=True, env=ENV, cwd=root, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  prefix = "runs/released/models/m/eval/src.en.selected.beam1"
  assert done.stdout.splitlines()[-1] == f"wrote {prefix}.hyp and {prefix}.json"
  assert (root / f"{prefix}.hyp").read_text(encoding="utf-8").count("\n") == len(SOURCES)
  done = subprocess.run([sys.executable, str(ROOT / "scripts" / "translate.py"),
                         "--workdir=models/m", "--checkpoint=selected", "--alignment"],
                        input="\n".join(SOURCES) + "\n", capture_output=True, text=True,
                        env=ENV, cwd=root, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert len(done.stdout.splitlines()) == len(SOURCES)
  assert _state(model) == before
  assert os.access(model, os.W_OK) == (os.geteuid() == 0)  # Read-only, as far as chmod goes.
