"""Each model released in models/ still translates its test set as it did when released: the
committed `eval/test.selected.beam<k>.hyp`, the evaluation that gave its score in the README,
line for line. A change to the model code, the search or the default configs that would change
what a released model (or a run trained before it) outputs fails here."""

import json
from pathlib import Path

import pytest

from seq2seq.evaluation.evaluate import run_evaluation
from tests.helpers import ROOT

RELEASED = sorted(path.parent for path in (ROOT / "models").glob("*/*/released.json"))


def test_models_holds_released_models():
  assert RELEASED, "models/ should hold the released models this test decodes"


@pytest.mark.slow
@pytest.mark.parametrize("model", RELEASED, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_released_model_translates_its_test_set_as_released(model: Path, tmp_path):
  scores = sorted((model / "eval").glob("test.selected.beam*.json"))
  assert len(scores) == 1, f"{model} should hold one recorded test evaluation"
  recorded = json.loads(scores[0].read_text(encoding="utf-8"))
  result, prefix = run_evaluation(model, split="test", checkpoint="selected",
                                  beam_size=recorded["beam_size"], alpha=recorded["alpha"],
                                  out=tmp_path)
  ours = Path(f"{prefix}.hyp").read_text(encoding="utf-8").splitlines()
  theirs = Path(str(scores[0])[:-len(".json")] + ".hyp").read_text(encoding="utf-8").splitlines()
  assert len(ours) == len(theirs) == recorded["sentences"]
  assert [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b] == []
  assert result["bleu"] == pytest.approx(recorded["bleu"], abs=1e-9)
