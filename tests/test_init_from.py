"""Starting a run from a parent run (config.train.init_from): what comes from the parent, what
starts fresh, resuming, and the refusals (seq2seq/runs/parents.py). The parent is the
session's shared `run` (tests/conftest.py: checkpoints at steps 2 and 4), which no test here
may change."""

import json
import os
import shutil
import signal
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from seq2seq.compare import comparison
from seq2seq.data import tokenizer
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.runs import match, parents
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.training import loop, seeds
from seq2seq.training.trainer import Trainer
from tests.helpers import read_metrics, rescore_one_piece, shared_run_config, small_run, snapshot

ADAM_COUNT, SCHEDULE_COUNT = "opt_state.1.0.count", "opt_state.1.2.count"  # chain(clip, adamw)


def _saved(workdir, step: int) -> dict[str, np.ndarray]:
  """Every leaf of checkpoint `step` of `workdir`, by name (`match.leaf_name`)."""
  path = Path(workdir) / "checkpoints" / str(step) / "default"
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  handler = ocp.StandardCheckpointHandler()
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        dict(handler.metadata(path)))
  return _leaves_of(handler.restore(path, args=ocp.args.StandardRestore(target)))


def _params(leaves: dict) -> dict:
  return {name: value for name, value in leaves.items() if name.startswith("params.")}


def _child(parent, num_steps: int = 2, **train):
  """shared_run_config's run of `num_steps` started from `parent`, with `train` fields set."""
  c = shared_run_config(num_steps)
  c.train.init_from = str(parent)
  for key, value in train.items():
    c.train[key] = value
  return c


def test_a_child_at_learning_rate_0_keeps_the_parents_chosen_checkpoint(run, tmp_path):
  """At learning rate 0 the child's parameters are those of the checkpoint it names, exactly;
  it takes the parent's vocabulary, and parent.json records where it started."""
  before = snapshot(run)
  child = tmp_path / "child"
  loop.train_and_evaluate(_child(run, learning_rate=0.0, init_checkpoint="2"), child)
  ours, theirs = _params(_saved(child, 2)), _params(_saved(run, 2))
  assert ours.keys() == theirs.keys()
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  assert any(not np.array_equal(ours[n], v) for n, v in _params(_saved(run, 4)).items())
  vocab = Path("vocab") / "spm.model"
  assert tokenizer.fingerprint(child / vocab) == tokenizer.fingerprint(run / vocab)
  record = json.loads((child / "parent.json").read_text())
  assert record == {"workdir": str(run.resolve()), "checkpoint": "2", "step": 2, "steps": [2],
                    "keep": [], "fresh": ""}
  assert snapshot(run) == before


@pytest.mark.parametrize("keep, steps, counts", [
    ("", [1, 2], (2, 2, 2)),  # (step, Adam's count, the schedule's count)
    pytest.param("optimizer", [1, 2], (2, 6, 2), marks=pytest.mark.slow),
    pytest.param("step", [5, 6], (6, 2, 6), marks=pytest.mark.slow),
    ("optimizer,step", [5, 6], (6, 6, 6))])
def test_the_step_optimizer_and_schedule_start_fresh_unless_kept(run, tmp_path, keep, steps,
                                                                 counts):
  """By default the child trains steps 1.. with a fresh optimizer and schedule; "optimizer"
  carries Adam's state (its count goes on from the parent's 4), "step" the step and the
  schedule (the child trains on from step 4 to num_steps)."""
  c = _child(run, num_steps=2 if "step" not in keep else 6, init_keep=keep)
  c.train.log_every_steps = 1
  loop.train_and_evaluate(c, tmp_path / "child")
  records = [r for r in read_metrics(tmp_path / "child") if r["split"] == "train"]
  assert [r["step"] for r in records] == steps
  saved = _saved(tmp_path / "child", steps[-1])
  assert (int(saved["step"]), int(saved[ADAM_COUNT]), int(saved[SCHEDULE_COUNT])) == counts


@pytest.mark.slow  # Trains a child three times: about 20 s.
def test_a_child_stopped_by_sigterm_resumes_to_the_uninterrupted_child(run, tmp_path,
                                                                      monkeypatch):
  """A SIGTERM at the first step saves step 1; the same command resumes from the child's own
  checkpoint (the parent is no longer read: it is moved away) to the uninterrupted child's
  state bit for bit."""
  c = _child(run, num_steps=4)
  loop.train_and_evaluate(c, tmp_path / "whole")
  to_device = Trainer.to_device

  def sigterm_once(self, *args):
    monkeypatch.setattr(Trainer, "to_device", to_device)
    os.kill(os.getpid(), signal.SIGTERM)
    return to_device(self, *args)

  parent = tmp_path / "parent"
  shutil.copytree(run, parent)
  c = _child(parent, num_steps=4)
  c.checkpoint.keep = 3  # Room for the signal's step 1 beside 2 and 4, were it kept.
  monkeypatch.setattr(Trainer, "to_device", sigterm_once)
  stopped = loop.train_and_evaluate(c, tmp_path / "split")
  assert stopped["interrupted"] == "SIGTERM"
  parent.rename(tmp_path / "moved")  # A resumed child never reads its parent again.
  assert loop.train_and_evaluate(c, tmp_path / "split")["step"] == 4
  # The signal's step 1 went once step 2 was saved: the uninterrupted child's checkpoints.
  assert Checkpoints(tmp_path / "split", keep=10).all_steps() == Checkpoints(
      tmp_path / "whole", keep=10).all_steps()
  whole, split = _saved(tmp_path / "whole", 4), _saved(tmp_path / "split", 4)
  assert whole.keys() == split.keys()
  for name, value in whole.items():
    np.testing.assert_array_equal(split[name], value, err_msg=name)


def _other_vocabulary(run, tmp_path):
  """A run (its config and vocabulary alone) whose vocabulary is not `run`'s."""
  other = tmp_path / "other"
  (other / "vocab").mkdir(parents=True)
  (other / "config.json").write_bytes((run / "config.json").read_bytes())
  for name in ("spm.model", "spm.vocab"):
    (other / "vocab" / name).write_bytes((run / "vocab" / name).read_bytes())
  rescore_one_piece(other / "vocab" / "spm.model")
  return other


REFUSALS = [
    ("parent missing", lambda r, t: _child(t / "missing"),
     "config.train.init_from={tmp}/missing does not exist; pass the workdir of a trained run."),
    ("not a run", lambda r, t: _child(t / "corpus"),
     "config.train.init_from={tmp}/corpus is not a trained run (no config.json and"
     " checkpoints/); pass the workdir of one."),
    ("another vocabulary size", lambda r, t: _vocab_size(_child(r), 300),
     "config.train.init_from={run} holds a vocabulary of config.data.vocab_size=500, not this"
     " run's 300; pass --config.data.vocab_size=500, or start a new run without init_from to"
     " train one of 300."),
    ("a vocabulary of other languages", lambda r, t: _vocab_languages(_child(r), "de,en,cs"),
     "config.train.init_from={run} holds a vocabulary of de, en, and this run's is of cs, de,"
     " en; pass --config.data.vocab_languages=de,en to take it as it is, or start a new run"
     " without init_from to train one of cs, de, en."),
    ("a pair of another language", lambda r, t: _languages(_child(r), "en", "fr"),
     "config.train.init_from={run} holds a vocabulary of de, en, and this run's is of en, fr;"
     " pass --config.data.vocab_languages=de,en to take it as it is, or start a new run without"
     " init_from to train one of en, fr."),
    ("vocab_from another vocabulary", lambda r, t: _vocab_from(_child(r), _other_vocabulary(r, t)),
     "config.data.vocab_from={tmp}/other is another vocabulary than the parent's"
     " (config.train.init_from={run}), and a run started from a parent takes the parent's; drop"
     " vocab_from, or pass a new --workdir."),
    ("a shape mismatch", lambda r, t: _model(_child(r), mlp_dim=128),
     "config.train.init_from={run}: the checkpoint at step 4 does not fit this run's model (6"
     " parameters differ: decoder_layers.0.mlp.wi.bias is (64,) in the parent but (128,) here;"
     " decoder_layers.0.mlp.wi.kernel is (32, 64) in the parent but (32, 128) here;"
     " decoder_layers.0.mlp.wo.kernel is (64, 32) in the parent but (128, 32) here; and 3 more);"
     " give this run the parent's config.model, or leave those parameters freshly initialized"
     " with --config.train.init_fresh=REGEX (a regex on their names)."),
    ("a parameter on one side only", lambda r, t: _model(_child(r), share_embeddings=False),
     "config.train.init_from={run}: the checkpoint at step 4 does not fit this run's model (3"
     " parameters differ: logits_dense.bias is only in this run; logits_dense.kernel is only in"
     " this run; tgt_embed.embedding is only in this run); give this run the parent's"
     " config.model, or leave those parameters freshly initialized with"
     " --config.train.init_fresh=REGEX (a regex on their names)."),
    ("an optimizer state that does not fit", lambda r, t: _clip(_child(r, init_keep="optimizer")),
     "config.train.init_from={run}: the checkpoint at step 4 holds an optimizer state that does"
     " not fit this run's (71 leaves differ: opt_state.0.count is only in this run;"
     " opt_state.0.mu.decoder_layers.0.cross_attention.key.kernel is only in this run;"
     " opt_state.0.mu.decoder_layers.0.cross_attention.out.kernel is only in this run; and 68"
     " more); give this run the parent's optimizer fields (config.train.clip_norm), or drop"
     " optimizer from config.train.init_keep=optimizer."),
    ("a checkpoint the parent lacks", lambda r, t: _child(r, init_checkpoint="3"),
     "config.train.init_checkpoint=3 names no checkpoint of {run}/checkpoints; use latest,"
     " best, avg:N or one of the steps 2, 4."),
    ("a kept step past num_steps", lambda r, t: _child(r, num_steps=4, init_keep="step"),
     "config.train.init_keep=step: the parent's checkpoint is at step 4, and"
     " config.train.num_steps=4 leaves nothing to train; pass a larger"
     " --config.train.num_steps (the run trains on from step 4 to it)."),
    ("its own workdir", lambda r, t: _child(t / "child"),
     "config.train.init_from={tmp}/child is this run's own workdir; pass another run's, or drop"
     " init_from to resume this one."),
    ("a bad init_keep", lambda r, t: _child(r, init_keep="moments"),
     "config.train.init_keep='moments': 'moments' is not something a run keeps from its parent;"
     " use optimizer, step or optimizer,step."),
    ("a bad init_fresh", lambda r, t: _child(r, init_fresh="logits_dense("),
     "config.train.init_fresh='logits_dense(' is not a regular expression (missing ), unterminated"
     " subpattern at position 12); e.g. logits_dense|decoder_layers.3"),
    ("a bad init_checkpoint", lambda r, t: _child(r, init_checkpoint="avg:0"),
     "config.train.init_checkpoint='avg:0' names no checkpoint; use best, latest, selected,"
     " avg:N or a step number."),
    ("a fresh pattern matching nothing", lambda r, t: _child(r, init_fresh="logits_dense"),
     "config.train.init_fresh='logits_dense' matches none of this run's parameters, so it would"
     " leave none fresh; give a regex on their names (such as decoder_layers.0, decoder_norm,"
     " encoder_layers.0, encoder_norm, src_embed), or drop it."),
    ("a step after a colon", lambda r, t: _child(f"{r}:4"),
     "config.train.init_from={run}:4 does not exist, and {run} does: a checkpoint of the parent"
     " is chosen apart, --config.train.init_from={run} --config.train.init_checkpoint=4."),
    ("selected, never chosen", lambda r, t: _child(_unevaluated(r, t), init_checkpoint="selected"),
     "config.train.init_from={tmp}/parent: its config.train.init_checkpoint=selected needs"
     " {tmp}/parent/eval/selected.json, which does not exist; choose on validation data first:"
     " seq2seq-evaluate --workdir={tmp}/parent --split=val --checkpoint=best,avg:5,avg:10."),
    ("init_keep without init_from", lambda r, t: _child("", init_keep="optimizer"),
     "config.train.init_keep='optimizer' is for a run started from another, and"
     " config.train.init_from is empty; pass --config.train.init_from=PARENT_WORKDIR, or drop"
     " init_keep."),
]


def _unevaluated(run, tmp):
  """A copy of `run` without its evaluations (other tests may have chosen a checkpoint)."""
  shutil.copytree(run, tmp / "parent", ignore=shutil.ignore_patterns("eval"))
  return tmp / "parent"


def _clip(c):
  c.train.clip_norm = 0.0  # No clipping: another optimizer state.
  return c


def _vocab_size(c, size):
  c.data.vocab_size = size
  return c


def _languages(c, src, tgt):
  c.data.src_lang, c.data.tgt_lang = src, tgt
  return c


def _vocab_languages(c, languages):
  c.data.vocab_languages = languages
  return c


def _vocab_from(c, other):
  c.data.vocab_from = str(other)
  return c


def _model(c, **fields):
  for key, value in fields.items():
    c.model[key] = value
  return c


@pytest.mark.parametrize("case, make, message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_is_one_line_and_changes_no_file(run, tmp_path, case, make, message):
  """Refused before anything compiles: one line, the parent as it was, no child workdir."""
  (tmp_path / "corpus").mkdir()
  (tmp_path / "corpus" / "train.en").write_text("A dog.\n")
  config = make(run, tmp_path)
  before = snapshot(run)
  compiled = []
  original = Trainer.compile
  Trainer.compile = lambda self: compiled.append(1) or original(self)
  try:
    with pytest.raises(UserError) as refused:
      loop.train_and_evaluate(config, tmp_path / "child")
  finally:
    Trainer.compile = original
  assert str(refused.value) == message.format(run=run, tmp=tmp_path)
  assert "\n" not in str(refused.value) and not compiled
  assert not (tmp_path / "child").exists()
  assert snapshot(run) == before


@pytest.mark.slow  # Compiles another model's programs: about 16 s.
def test_the_fresh_pattern_leaves_a_mismatched_output_layer_fresh(run, tmp_path):
  """config.train.init_fresh: the parameters it matches (here the output layer and target
  embedding the parent shares with its source embedding) are initialized as a new run's and
  the rest come from the parent."""
  c = _model(_child(run, learning_rate=0.0, init_fresh="logits_dense|tgt_embed"),
             share_embeddings=False)
  loop.train_and_evaluate(c, tmp_path / "child")
  ours, theirs = _params(_saved(tmp_path / "child", 2)), _params(_saved(run, 4))
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  assert {name for name in ours if name not in theirs} == {
      "params.logits_dense.bias", "params.logits_dense.kernel", "params.tgt_embed.embedding"}
  c.train.init_from = ""  # A new run of this config: its initial output layer.
  model = build_model(c, match.vocab_size(run / "vocab" / "spm.model"), seed=c.train.seed)
  new = _params(_leaves_of({"params": nnx.split(model, nnx.Param)[1]}))
  for name in ("params.logits_dense.kernel", "params.tgt_embed.embedding"):
    # Initialized inside jit there, eagerly here: to float32 rounding.
    np.testing.assert_allclose(ours[name], new[name], rtol=1e-6, atol=1e-7, err_msg=name)


def _leaves_of(tree) -> dict[str, np.ndarray]:
  return {match.leaf_name(p): np.asarray(x)
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.slow  # Trains an RNN parent and its child: about 15 s.
def test_an_rnn_child_keeps_its_rnn_parents_parameters(tmp_path):
  c = shared_run_config(2)
  c.model.family, c.model.attention = "rnn", "general"
  loop.train_and_evaluate(c, tmp_path / "parent")
  c.train.init_from, c.train.learning_rate = str(tmp_path / "parent"), 0.0
  loop.train_and_evaluate(c, tmp_path / "child")
  ours, theirs = _params(_saved(tmp_path / "child", 2)), _params(_saved(tmp_path / "parent", 2))
  assert ours.keys() == theirs.keys() and any("decoder_cells" in name for name in ours)
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)


@pytest.mark.slow  # Trains a seed group of two children: about 15 s.
def test_a_seed_group_of_children_starts_each_from_the_parent(run, tmp_path):
  """Children of seeds 0 and 1 trained as one program: each takes the parent's parameters
  (exactly, at learning rate 0), its vocabulary and records it."""
  runs = {seed: tmp_path / f"seed-{seed}" for seed in (0, 1)}
  results = seeds.train_seeds(_child(run, learning_rate=0.0), runs)
  assert [r["step"] for r in results.values()] == [2, 2]
  theirs = _params(_saved(run, 4))
  for workdir in runs.values():
    ours = _params(_saved(workdir, 2))
    for name, value in theirs.items():
      np.testing.assert_array_equal(ours[name], value, err_msg=name)
    assert json.loads((workdir / "parent.json").read_text())["step"] == 4


def test_the_parents_names_match_a_new_state(run):
  """The names `parents` loads by are the checkpoint's own: a new run's state has every leaf
  the parent saved, and its schedule count is where the tests look for it."""
  c = shared_run_config()
  c.train.init_from = str(run)
  parent = parents.of(c, run.parent / "new-child", None)
  assert parent.steps == [4] and ADAM_COUNT not in parent.loads
  assert set(parent.loads) == {name for name in _saved(run, 4) if name.startswith("params.")}


@pytest.mark.slow  # Decodes two runs: about 10 s.
def test_the_comparison_shows_a_runs_parent(run, tmp_path):
  """seq2seq-compare's table gains a parent column once a compared run has a parent: the
  parent's name among the runs, its checkpoint and step."""
  base = small_run(run, tmp_path / "runs" / "base")
  child = small_run(run, tmp_path / "runs" / "child")
  record = {"workdir": str(base.resolve()), "checkpoint": "best", "step": 4, "steps": [4]}
  (child / "parent.json").write_text(json.dumps(record))
  out = tmp_path / "out"
  rows = comparison.compare_runs([base, child], out, split="val", beam_size=2, n_samples=20)
  assert [row["parent"] for row in rows] == [None, "base (best, step 4)"]
  table = (out / "comparison.md").read_text()
  assert "| tokens_per_sec | parent |" in table and "| base (best, step 4) |" in table


@pytest.mark.parametrize("removed_while", ["checking its shapes", "reading its parameters"])
def test_a_checkpoint_the_parents_training_removes_is_chosen_again(run, tmp_path, monkeypatch,
                                                                   removed_while):
  """A parent still training keeps only its latest checkpoints: the one a child chose (latest,
  step 4) goes while the child reads it, when `parents.of` checks its shapes or when `start`
  reads its parameters. The child chooses again (step 2, now the latest) and trains from it,
  at learning rate 0 keeping exactly its parameters, and parent.json says so."""
  parent = tmp_path / "parent"
  shutil.copytree(run, parent)
  (parent / ".lock").write_text("host h, pid 1\n")  # As a training parent holds it.
  gone = parent / "checkpoints" / "4"
  if removed_while == "checking its shapes":
    target, name = Checkpoints, "shapes"
  else:
    target, name = ocp.StandardCheckpointHandler, "metadata"
  real = getattr(target, name)

  def rotated(self, where, *args, **kwargs):
    if gone.exists() and (str(where) == "4" or str(gone) in str(where)):
      shutil.rmtree(gone)  # The parent's training rotates it away: the read finds nothing.
    return real(self, where, *args, **kwargs)
  monkeypatch.setattr(target, name, rotated)
  child = tmp_path / "child"
  loop.train_and_evaluate(_child(parent, learning_rate=0.0, init_checkpoint="latest"), child)
  assert not gone.exists()
  record = json.loads((child / "parent.json").read_text())
  assert record["steps"] == [2] and record["step"] == 2
  for leaf, value in _params(_saved(parent, 2)).items():
    np.testing.assert_array_equal(_params(_saved(child, 2))[leaf], value, err_msg=leaf)


def test_a_child_naming_the_parents_own_languages_takes_its_vocabulary(run):
  """The languages are compared as languages: "en,de" and "de, en" are the parent's pair."""
  from seq2seq.runs import vocabulary
  for listed in ("en,de", "de, en", ""):
    c = _child(run)
    c.data.vocab_languages = listed
    vocabulary.check_source(run, c.data, "config.train.init_from")
  assert vocabulary.languages(c.data) == ("de", "en")


def test_a_resumed_child_keeps_one_record_of_its_parent(run, tmp_path):
  """Resumed, a child never reads a parent again: another init_from (or none) now is refused
  in one line, where config.json would have named it beside parent.json's; the same parent
  by another path resumes."""
  child = tmp_path / "child"
  loop.train_and_evaluate(_child(run, num_steps=2), child)
  before = (child / "config.json").read_text()
  other = tmp_path / "other"
  other.symlink_to(run.resolve())
  loop.train_and_evaluate(_child(other, num_steps=4), child)  # The same parent: resumes.
  assert Checkpoints(child, 2).all_steps()[-1] == 4
  for changed in (_child(tmp_path / "elsewhere", num_steps=6), _child("", num_steps=6)):
    with pytest.raises(UserError) as refused:
      loop.train_and_evaluate(changed, child)
    assert str(refused.value).startswith(
        f"{child} holds a run trained with config.train.init_from={str(run)!r} (not")
    assert "\n" not in str(refused.value)
  assert json.loads((child / "config.json").read_text())["train"]["init_from"] == str(run)
  assert json.loads(before)["train"]["init_from"] == str(run)
