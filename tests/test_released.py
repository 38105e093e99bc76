"""seq2seq-export --format=seq2seq: a released model decodes what its run decodes (the same
parameters, bit for bit), alone and as an ensemble's member, holds no optimizer state, starts a
new run as its run would, and is never trained on itself (seq2seq/runs/released.py)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.runs import released
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.training import loop
from tests.helpers import ENV, ROOT, shared_run_config, snapshot

TEXTS = ["A man is riding a bike.", "Two dogs play in the snow near a tree.", "", "A girl."]


@pytest.fixture(scope="module")
def averaged(run, tmp_path_factory):
  """The session's run (checkpoints 2 and 4) released at avg:2, through the command."""
  output = tmp_path_factory.mktemp("released") / "avg2"
  done = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), "--format=seq2seq",
                         f"--workdir={run}", "--checkpoint=avg:2", f"--output={output}"],
                        capture_output=True, text=True, env=ENV, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == f"wrote {output}"
  return output


def _equal(a, b) -> bool:
  return jax.tree.all(jax.tree.map(np.array_equal, a, b))


def test_a_released_model_decodes_its_runs_parameters_bit_for_bit(run, averaged):
  ours = Translator(averaged, "selected", beam_size=3)
  theirs = Translator(run, "avg:2", beam_size=3)
  assert _equal(ours.params, theirs.params)
  assert ours.translate(TEXTS) == theirs.translate(TEXTS)
  assert ours.steps == [4] and theirs.steps == [2, 4]
  record = json.loads((averaged / released.RECORD).read_text())
  assert record["spec"] == "avg:2" and record["steps"] == [2, 4]
  assert record["workdir"] == str(run)  # As given: a release outlives the run's path.


def test_it_holds_the_parameters_and_the_step_not_the_optimizer_state(run, averaged):
  checkpoints = Checkpoints(averaged, keep=1)
  try:
    assert checkpoints.all_steps() == [4]
    assert set(checkpoints.shapes(4)) == {"step", "params"}
    assert checkpoints.shapes(4)["params"] == Checkpoints(run, 10).shapes(4)["params"]
  finally:
    checkpoints.close()
  size = lambda d: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())  # noqa: E731
  assert size(averaged / "checkpoints") < size(run / "checkpoints" / "4") / 2


def test_as_an_ensembles_member_it_is_its_runs_checkpoint(run, averaged, tmp_path):
  alone = released.release(run, "latest", tmp_path / "latest")
  ours = Translator(alone, "latest", beam_size=3, ensemble=[averaged])
  with_run = Translator(run, "4", beam_size=3)
  with_run.load_checkpoint("avg:2")
  both = [Translator(run, "latest", beam_size=1).params, with_run.params]
  assert _equal(ours.params[0], jax.tree.map(lambda *x: np.stack(x), *both))
  assert Translator(averaged, "latest", beam_size=3, ensemble=[alone]).translate(TEXTS) == \
      ours.translate(TEXTS)


def test_a_new_run_starts_from_it_as_from_its_run(run, averaged, tmp_path):
  """At learning rate 0 a child of the released model holds its parent's parameters, as a
  child of the run at avg:2 does."""
  children = []
  for parent, spec in ((averaged, "selected"), (run, "avg:2")):
    c = shared_run_config(2)
    c.train.init_from, c.train.init_checkpoint, c.train.learning_rate = str(parent), spec, 0.0
    children.append(tmp_path / f"child-{len(children)}")
    loop.train_and_evaluate(c, children[-1])
  first, second = (Translator(child, "latest", beam_size=1).params for child in children)
  assert _equal(first, second)


def test_it_is_never_trained_on_and_keeps_no_optimizer_for_a_child(averaged, tmp_path):
  before = snapshot(averaged)
  with pytest.raises(UserError) as raised:
    loop.train_and_evaluate(shared_run_config(8), averaged)
  assert str(raised.value) == (
      f"--workdir={averaged} is a released model (seq2seq-export --format=seq2seq: its"
      " parameters, no optimizer state), not a run to train on; start a new run from it:"
      f" --config.train.init_from={averaged} --workdir=NEW_RUN.")
  c = shared_run_config(8)
  c.train.init_from, c.train.init_keep = str(averaged), "optimizer"
  with pytest.raises(UserError, match="is a released model, which holds no optimizer state;"
                                      " drop optimizer from config.train.init_keep=optimizer"):
    loop.train_and_evaluate(c, tmp_path / "child")
  assert snapshot(averaged) == before


@pytest.mark.parametrize("case", ["exists", "ensemble", "not a run"])
def test_each_refusal_is_one_line_and_writes_nothing(run, tmp_path, case):
  output, workdir, spec = tmp_path / "out", run, "latest"
  if case == "exists":
    output.mkdir()
  elif case == "ensemble":
    spec = "ensemble:2"
  else:
    workdir = tmp_path / "nothing"
    workdir.mkdir()
  message = {"exists": f"--output={output} exists; pass a new directory, or remove it first.",
             "ensemble": "--checkpoint=ensemble:2 is an ensemble; a released model is one set of"
                         " parameters: release each member, or --checkpoint=avg:N (their"
                         " average).",
             "not a run": f"{workdir} is not a training run (no config.json); pass the --workdir"
                          " that seq2seq-train wrote."}[case]
  before = sorted(tmp_path.rglob("*"))
  with pytest.raises(UserError) as raised:
    released.release(workdir, spec, output)
  assert str(raised.value) == message
  assert sorted(tmp_path.rglob("*")) == before


def test_a_killed_exports_partial_folder_goes_with_the_next_export(run, tmp_path):
  """A release killed midway leaves `.<name>.partial<pid>`; the next release of that output
  removes it (its process is gone) and writes the model; another live process's stays."""
  output = tmp_path / "model"
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  (tmp_path / f".model.partial{dead}" / "checkpoints").mkdir(parents=True)
  alive = tmp_path / f".model.partial{os.getppid()}"  # pytest's parent: alive.
  alive.mkdir()
  released.release(run, "latest", output)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model", alive.name])


def test_a_full_disk_during_a_release_names_the_output_and_leaves_nothing(run, tmp_path,
                                                                         monkeypatch):
  import errno

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "somewhere/hidden")
  monkeypatch.setattr(released, "write_atomically", full)
  output = tmp_path / "model"
  with pytest.raises(OSError) as raised:
    released.release(run, "latest", output)
  assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(output)
  assert list(tmp_path.iterdir()) == []


def test_a_child_keeping_its_step_goes_on_as_a_child_of_its_run_does(run, averaged, tmp_path):
  """init_keep=step from a released model (which holds no optimizer state) starts at the
  release's step with the schedule there, as a child of the run at avg:2 keeping its step:
  after two steps of training both hold the same parameters and the same step."""
  children = []
  for parent, spec in ((averaged, "selected"), (run, "avg:2")):
    c = shared_run_config(6)
    c.train.init_from, c.train.init_checkpoint, c.train.init_keep = str(parent), spec, "step"
    children.append(tmp_path / f"child-{len(children)}")
    loop.train_and_evaluate(c, children[-1])
  assert [Checkpoints(child, 2).all_steps()[-1] for child in children] == [6, 6]
  first, second = (Translator(child, "latest", beam_size=1).params for child in children)
  assert jax.tree.all(jax.tree.map(np.allclose, first, second))
