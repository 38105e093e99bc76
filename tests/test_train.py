"""The training loop: one step end to end, overfitting, exact resume."""

import copy
import functools
import io
import json
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from seq2seq import config as config_lib
from seq2seq.data import batching, corpus, tokenizer
from seq2seq.data.special_ids import PAD_ID
from seq2seq.decoding import search
from seq2seq.errors import UserError
from seq2seq.models import ATTENTION_BY_FAMILY, build_model, check_config
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.train_state import learning_rate_schedule, make_optimizer, new_train_state
from seq2seq.runs.workdirs import WorkdirLock
from seq2seq.training import actions, loop, reports, steps
from seq2seq.training.reports import due_every
from seq2seq.training.steps import cross_entropy, train_step
from seq2seq.training.trainer import Trainer
from tests.helpers import ENV, ROOT, damage_checkpoint, fast_tiny_config, load_config, read_metrics


def test_one_training_step_end_to_end(tmp_path, tiny_config):
  tiny_config.train.num_steps = 1
  result = loop.train_and_evaluate(tiny_config, tmp_path)
  assert result["step"] == 1 and "nrefs:1|case:mixed" in result["bleu_signature"]
  records = read_metrics(tmp_path)
  # The first step's compiling, its training record, validation's compiling, validation.
  assert [(r["step"], r["split"]) for r in records] == [(1, "compile"), (1, "train"),
                                                        (1, "compile"), (1, "val")]
  assert records[3]["bleu"] == result["bleu"]  # What is returned is what was logged.
  assert np.isfinite(records[1]["loss"]) and records[1]["tokens_per_sec"] > 0
  assert Checkpoints(tmp_path, keep=2).all_steps() == [1]
  assert (tmp_path / "vocab" / "spm.model").exists()
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  assert json.loads((tmp_path / "config.json").read_text())["train"]["num_steps"] == 1


def test_loss_falls_when_overfitting_a_few_pairs(tiny_config):
  """A handful of fixed pairs is memorized: the NLL drops far below its start."""
  tiny_config.model.dropout_rate = 0.0
  tiny_config.train.warmup_steps = 5
  vocab = 30
  model = build_model(tiny_config, vocab)
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = make_optimizer(tiny_config.train)
  rng = np.random.default_rng(0)
  tgt = rng.integers(4, vocab, size=(4, 6))
  batch = {"src": jnp.asarray(np.concatenate([rng.integers(4, vocab, (4, 5)),
                                              np.full((4, 1), 3)], 1), jnp.int32),
           "tgt_in": jnp.asarray(np.concatenate([np.full((4, 1), 2), tgt[:, :-1]], 1), jnp.int32),
           "tgt_out": jnp.asarray(tgt, jnp.int32)}
  step = jax.jit(lambda s, b, k: train_step(s, b, k, graphdef=graphdef,
                                                  optimizer=optimizer, train=_settings(0.0)))
  state = new_train_state(params, optimizer)
  nll = []
  for _ in range(60):
    state, metrics = step(state, batch, jax.random.key(0))
    nll.append(float(metrics["nll"] / metrics["tokens"]))
  assert nll[0] > 2.5  # about log(30) at initialization
  assert nll[-1] < 0.2 * nll[0]


def _schedule(name: str):
  from ml_collections import ConfigDict
  return learning_rate_schedule(ConfigDict(
      {"learning_rate": 1.0, "warmup_steps": 100, "num_steps": 500, "schedule": name}))


def test_inverse_sqrt_schedule():
  schedule = _schedule("inverse_sqrt")
  np.testing.assert_allclose(schedule(50), 0.5)
  np.testing.assert_allclose(schedule(100), 1.0)
  np.testing.assert_allclose(schedule(400), (100 / 400) ** 0.5, rtol=1e-6)


def test_decays_to_zero_at_the_last_step():
  linear, cosine = _schedule("linear"), _schedule("cosine")
  for schedule in (linear, cosine):
    np.testing.assert_allclose(schedule(50), 0.5)  # the same warmup
    np.testing.assert_allclose(schedule(100), 1.0)
    np.testing.assert_allclose(schedule(300), 0.5, rtol=1e-6)  # half-way through the decay
    np.testing.assert_allclose([schedule(500), schedule(600)], [0.0, 0.0], atol=1e-7)
  np.testing.assert_allclose(linear(200), 0.75, rtol=1e-6)
  np.testing.assert_allclose(cosine(200), 0.5 * (1 + np.cos(np.pi / 4)), rtol=1e-6)


def test_label_smoothed_loss_matches_formula():
  logits = jax.random.normal(jax.random.key(0), (1, 2, 5))
  targets = jnp.array([[3, 0]])  # the second position is PAD: no weight
  sums = cross_entropy(logits, targets, 0.1)
  logp = jax.nn.log_softmax(logits[0, 0])
  expected = -(0.9 * logp[3] + 0.1 * jnp.mean(logp))
  np.testing.assert_allclose(sums["loss"], expected, rtol=1e-5)
  np.testing.assert_allclose(sums["nll"], -logp[3], rtol=1e-5)
  assert float(sums["tokens"]) == 1.0


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_loss_equals_one_hot_softmax_cross_entropy(smoothing):
  """One log-normalizer gives optax's smoothed one-hot cross-entropy: values and gradients."""
  logits = 3.0 * jax.random.normal(jax.random.key(1), (3, 7, 50))
  targets = jax.random.randint(jax.random.key(2), (3, 7), 0, 50).at[:, -2:].set(0)  # PAD tail

  def reference(z):
    weights = (targets != 0).astype(jnp.float32)
    soft = optax.smooth_labels(jax.nn.one_hot(targets, 50), smoothing)
    return jnp.sum(optax.softmax_cross_entropy(z, soft) * weights)

  ours = lambda z: cross_entropy(z, targets, smoothing)["loss"]  # noqa: E731
  np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-5)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(reference)(logits), atol=1e-6)


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_resume_continues_with_the_same_batches(tmp_path, tiny_config, monkeypatch):
  """Stopping after 3 steps and resuming to 6 gives the uninterrupted run's parameters; the
  resume restores into the state's shapes and initializes no state."""
  tiny_config.train.num_steps = 6
  tiny_config.eval.every_steps = 3
  tiny_config.train.log_every_steps = 1
  whole = tmp_path / "whole"
  loop.train_and_evaluate(tiny_config, whole)

  split = tmp_path / "split"
  tiny_config.train.num_steps = 3
  loop.train_and_evaluate(tiny_config, split)
  tiny_config.train.num_steps = 6
  inits, new_state = [], Trainer.new_state
  monkeypatch.setattr(Trainer, "new_state", lambda self: inits.append(1) or new_state(self))
  loop.train_and_evaluate(tiny_config, split)
  assert not inits

  losses = lambda w: [(r["step"], r["loss"]) for r in read_metrics(w) if r["split"] == "train"]  # noqa: E731
  assert losses(split) == losses(whole)  # step 4 onwards: the same batches and dropout
  restored = []
  for workdir in (whole, split):
    checkpoints = Checkpoints(workdir, keep=2)
    assert checkpoints.all_steps() == [3, 6]
    trainer_like = Trainer(tiny_config, workdir).new_state()
    restored.append(checkpoints.restore(6, trainer_like))
  for a, b in zip(jax.tree.leaves(restored[0]), jax.tree.leaves(restored[1]), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_several_steps_per_call_train_as_one_step_per_call(tmp_path, tiny_config, monkeypatch):
  """config.train.steps_per_call=4: calls of 4 steps (lax.scan), single steps before each
  action a call would pass (validation and records at 5 and 10: calls 1-4, 6-9). The losses
  of one step per call, and its parameters, to float32 rounding: XLA compiles the
  scan's body as a program of its own, whose sums may round in another order (on this CPU,
  at most a few units in the last place after 10 steps). A run stopped at 5 and resumed
  equals the uninterrupted one bit for bit."""
  tiny_config.train.num_steps, tiny_config.eval.every_steps = 10, 5
  tiny_config.train.log_every_steps = 5
  calls, dispatch = [], Trainer.train

  def counted(self, state, step, size):
    calls.append((step, size))
    return dispatch(self, state, step, size)

  monkeypatch.setattr(Trainer, "train", counted)
  runs = {}
  for k in (1, 4):
    tiny_config.train.steps_per_call = k
    runs[k] = tmp_path / f"k{k}"
    calls.clear()
    loop.train_and_evaluate(tiny_config, runs[k])
  assert calls == [(0, 4), (4, 1), (5, 4), (9, 1)]
  # Stopped at 5 and resumed (calls of 4 from step 5: 5-8, then 9 alone).
  runs["resumed"] = tmp_path / "resumed"
  for num_steps in (5, 10):
    tiny_config.train.num_steps = num_steps
    loop.train_and_evaluate(tiny_config, runs["resumed"])
  records = {k: [(r["step"], r["split"], r.get("loss")) for r in read_metrics(w)
                 if r["split"] != "compile"] for k, w in runs.items()}
  assert records[4] == records["resumed"] and len(records[1]) == 4
  assert [r[:2] for r in records[4]] == [r[:2] for r in records[1]]
  np.testing.assert_allclose([r[2] for r in records[4]], [r[2] for r in records[1]], rtol=1e-6)
  compiled = [(p["program"], p["shape"]) for r in read_metrics(runs[4]) if r["split"] == "compile"
              for p in r["programs"]]
  assert compiled[0] == ("4-step train call", "(4, 16, 16)")  # Before step 1.
  assert ("train step", "(16, 16)") in compiled  # In the background.
  restored = []
  for workdir in runs.values():
    checkpoints = Checkpoints(workdir, keep=2)
    assert checkpoints.all_steps() == [5, 10]
    restored.append(checkpoints.restore(10, Trainer(tiny_config, workdir).new_state()))
  for one, four, resumed in zip(*map(jax.tree.leaves, restored), strict=True):
    np.testing.assert_array_equal(np.asarray(resumed), np.asarray(four))
    np.testing.assert_allclose(np.asarray(four), np.asarray(one), rtol=1e-5, atol=1e-6)


VARIANTS = [(family, name) for family, names in ATTENTION_BY_FAMILY.items()
            for name in names]


@pytest.fixture(scope="module")
def tiny_batches(tmp_path_factory):
  """A few real Multi30k batches of configs/tiny.py, with its own tokenizer."""
  c = load_config("tiny")
  c.data.max_train_examples, c.data.vocab_size = 400, 300
  text = corpus.read_split(c.data, "train")
  tok = tokenizer.train_tokenizer(text.src + text.tgt, tmp_path_factory.mktemp("spm") / "spm",
                                  c.data.vocab_size)
  src, tgt = batching.encode_pairs(tok, text)
  batches = batching.TrainBatches(src, tgt, tokens_per_batch=512, max_len=16, bucket_step=16,
                                  seed=0)
  return c, tok.vocab_size, [batches(i) for i in range(3)]


# One variant of each family in the default run; every other with -m slow (~5 s each).
DEFAULT_RUN_VARIANTS = {("transformer", "dot"), ("rnn", "general")}


@pytest.mark.parametrize("family,name", [
    pytest.param(f, n, marks=() if (f, n) in DEFAULT_RUN_VARIANTS else pytest.mark.slow)
    for f, n in VARIANTS], ids=[f"{f}-{n}" for f, n in VARIANTS])
def test_every_variant_trains_on_tiny(tiny_batches, family, name):
  """A few dozen steps on three real batches: the loss falls for every variant."""
  c, vocab, batches = tiny_batches
  c = copy.deepcopy(c)
  c.model.family, c.model.attention = family, name
  c.model.attention_window = 2
  model = build_model(c, vocab)
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = make_optimizer(c.train)
  step = jax.jit(lambda s, b, k: train_step(s, b, k, graphdef=graphdef,
                                                  optimizer=optimizer, train=_settings(0.0)))
  state = new_train_state(params, optimizer)
  nll = []
  for i in range(30):
    state, metrics = step(state, batches[i % 3], jax.random.key(0))
    nll.append(float(metrics["nll"] / metrics["tokens"]))
  assert np.isfinite(nll).all()
  assert np.mean(nll[-3:]) < 0.8 * np.mean(nll[:3]), nll


# The attention of 2025 and directional ALiBi, each a switch of config.model; the first in the
# default run, the rest with -m slow (`differential`, a variant, is in VARIANTS above too).
SWITCHES = {"qk_norm": {"qk_norm": True}, "headwise": {"attention_gate": "headwise"},
            "elementwise": {"attention_gate": "elementwise"},
            "differential": {"attention": "differential", "positions": "rope"},
            "sigmoid": {"attention_normalizer": "sigmoid"},
            "decoder_nope": {"decoder_positions": "none"},
            "alibi_directional": {"positions": "alibi_directional"}}


@pytest.mark.parametrize("switch", [
    pytest.param(name, marks=() if name == "qk_norm" else pytest.mark.slow)
    for name in SWITCHES])
def test_each_switch_of_2025_trains_and_translates_greedily_and_with_beams(tiny_batches,
                                                                          switch):
  c, vocab, batches = tiny_batches
  c = copy.deepcopy(c)
  c.model.update(SWITCHES[switch])
  check_config(c)
  model = build_model(c, vocab)
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = make_optimizer(c.train)
  step = jax.jit(lambda s, b, k: train_step(s, b, k, graphdef=graphdef, optimizer=optimizer,
                                            train=_settings(0.0)))
  state = new_train_state(params, optimizer)
  nll = []
  for i in range(30):
    state, metrics = step(state, batches[i % 3], jax.random.key(0))
    nll.append(float(metrics["nll"] / metrics["tokens"]))
  assert np.mean(nll[-3:]) < 0.8 * np.mean(nll[:3]), nll
  nnx.update(model, state.params)
  src = jnp.asarray(batches[0]["src"][:3])
  greedy, _ = search.generate(model, src, search.Greedy(), max_len=12)
  beam_ids, scores = search.generate(model, src, search.Beam(3, 0.6, 2), max_len=12)
  assert greedy.shape[0] == beam_ids.shape[0] == 3 and np.isfinite(np.asarray(scores)).all()


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_gradient_accumulation_equals_one_large_batch(tiny_batches):
  """k micro-batches summed into one update give the k-times-larger batch's update."""
  c, vocab, batches = tiny_batches
  c = copy.deepcopy(c)
  c.model.dropout_rate = 0.0  # dropout masks differ per micro-batch by design
  graphdef, params = nnx.split(build_model(c, vocab), nnx.Param)
  optimizer = make_optimizer(c.train)
  results = []
  for k in (1, 4):
    step = jax.jit(lambda s, b, key, k=k: train_step(
        s, b, key, graphdef=graphdef, optimizer=optimizer, train=_settings(0.1, k)))
    state = new_train_state(params, optimizer)
    for i in range(2):
      state, metrics = step(state, batches[i], jax.random.key(0))
    results.append((state.params, metrics))
  (params_1, metrics_1), (params_4, metrics_4) = results
  for key in ("loss", "nll", "tokens"):
    np.testing.assert_allclose(metrics_4[key], metrics_1[key], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(params_1), jax.tree.leaves(params_4), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.slow  # bfloat16 is emulated, so slow, on CPU
@pytest.mark.parametrize("family,name", [("transformer", "scaled_dot"), ("rnn", "concat")])
def test_bfloat16_compute_keeps_float32_parameters(tiny_batches, family, name):
  """Mixed precision: bf16 activations, fp32 parameters and optimizer state, close losses."""
  c, vocab, batches = tiny_batches
  losses = {}
  for dtype in ("float32", "bfloat16"):
    cd = copy.deepcopy(c)
    cd.model.family, cd.model.attention, cd.train.dtype = family, name, dtype
    model = build_model(cd, vocab)
    graphdef, params = nnx.split(model, nnx.Param)
    optimizer = make_optimizer(cd.train)
    step = jax.jit(functools.partial(train_step, graphdef=graphdef, optimizer=optimizer,
                                     train=_settings(0.1)))
    state, metrics = step(new_train_state(params, optimizer), batches[0], jax.random.key(0))
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
    assert {x.dtype for x in jax.tree.leaves(state.opt_state) if x.ndim} == {jnp.dtype("float32")}
    if dtype == "bfloat16":
      memory = model.encode(jnp.asarray(batches[0]["src"]))
      assert memory.encoded.dtype == jnp.bfloat16
    losses[dtype] = float(metrics["loss"] / metrics["tokens"])
  np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=2e-2)


@pytest.mark.parametrize("damage", ["truncated", pytest.param("missing", marks=pytest.mark.slow)])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, tiny_config, caplog,
                                                              damage):
  tiny_config.train.num_steps, tiny_config.eval.every_steps = 4, 2
  tiny_config.train.log_every_steps = 1
  loop.train_and_evaluate(tiny_config, tmp_path)
  damage_checkpoint(tmp_path, 4, damage)
  (tmp_path / "checkpoints" / "4" / "_CHECKPOINT_METADATA").write_text("")  # Read as it lists.

  tiny_config.train.num_steps = 6
  with caplog.at_level("WARNING", logger="seq2seq"):
    result = loop.train_and_evaluate(tiny_config, tmp_path)
  warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  # Orbax (the "absl" logger) logs nothing of the failed reads: the one warning says it all.
  assert [r.name for r in caplog.records if r.levelno >= logging.WARNING] == ["seq2seq"]
  assert len(warning) == 1 and warning[0].startswith("Checkpoint 4 in ")
  assert "resumed from step 2 instead" in warning[0]
  assert (tmp_path / "damaged_checkpoints" / "4" / "default").is_dir()
  steps = [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"]
  # Steps 3-4 were trained again from step 2: their first records are dropped, not repeated.
  assert steps == [1, 2, 3, 4, 5, 6]
  assert [r["step"] for r in read_metrics(tmp_path) if r["split"] == "val"] == [2, 4, 6]
  assert result["step"] == 6 and Checkpoints(tmp_path, keep=2).all_steps()[-1] == 6


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
  """A run of 2 steps, evaluated and checkpointed at each: (its config, its workdir)."""
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 2, 1
  workdir = tmp_path_factory.mktemp("two-steps") / "run"
  loop.train_and_evaluate(c, workdir)
  return c, workdir


@pytest.mark.parametrize("every,checkpoints,message", [
    # Every step evaluated: the parameters after the first update give a non-finite validation
    # loss (the step's own training loss, computed before the update, is still finite).
    ({"eval.every_steps": 1}, [1, 2], "The val loss is {nan} at step 3"),
    # Every step checkpointed (the last 2 kept), none evaluated: step 4's training loss is the
    # first to overflow.
    ({"eval.every_steps": 100, "checkpoint.every_steps": 1}, [2, 3],
     "The training loss is {nan} (gradient norm {nan}) at step 4"),
])
def test_non_finite_loss_stops_before_a_diverged_state_is_saved(two_steps, tmp_path, every,
                                                                checkpoints, message):
  c, run = two_steps
  shutil.copytree(run, tmp_path, dirs_exist_ok=True)
  # Resumed with an absurd learning rate, the first update (step 3) blows the parameters up. No
  # loss is logged before step 8: checked only when logged, the loss would let the diverged
  # states of the steps before it be saved.
  diverging = copy.deepcopy(c)
  diverging.train.num_steps, diverging.train.learning_rate = 8, 1e30
  for field, value in every.items():
    section, name = field.split(".")
    diverging[section][name] = value
  with pytest.raises(UserError) as raised:
    loop.train_and_evaluate(diverging, tmp_path)
  expected = (re.escape(message).replace(r"\{nan\}", "(nan|inf)")
              + re.escape(f"; the last good checkpoint is step {checkpoints[-1]}. Lower"
                          " config.train.learning_rate or raise config.train.warmup_steps."))
  assert re.fullmatch(expected, str(raised.value)), str(raised.value)
  assert Checkpoints(tmp_path, keep=10).all_steps() == checkpoints


def _scripted_bleu(monkeypatch, scores):
  """Validation returns the given BLEU scores in turn (what patience reads)."""
  calls = iter(scores)

  def evaluate(self, params):
    del self, params
    return {"loss": 1.0, "perplexity": math.e, "bleu": next(calls), "bleu_signature": "s",
            "example": ""}
  monkeypatch.setattr(Trainer, "evaluate", evaluate)


@pytest.mark.parametrize("patience, stop", [pytest.param(1, 6, marks=pytest.mark.slow), (2, 8),
                                            pytest.param(3, 12, marks=pytest.mark.slow)])
def test_patience_stops_after_evaluations_without_a_better_bleu(tmp_path, tiny_config,
                                                                monkeypatch, caplog, patience,
                                                                stop):
  # Evaluations at steps 2, 4, ..., 12: the best BLEU (7) is at step 4, then 6, 6, 7.5, 2.
  _scripted_bleu(monkeypatch, [5.0, 7.0, 6.0, 6.0, 7.5, 2.0])
  tiny_config.train.num_steps, tiny_config.eval.every_steps = 12, 2
  tiny_config.train.patience = patience
  caplog.set_level(logging.INFO, logger="seq2seq")
  result = loop.train_and_evaluate(tiny_config, tmp_path)
  assert result["step"] == stop and result.get("early_stopped", False) == (stop < 12)
  checkpoints = Checkpoints(tmp_path, tiny_config.checkpoint.keep)
  assert checkpoints.latest_step() == stop
  checkpoints.close()
  if stop < 12:
    assert (f"Stopped early at step {stop}: validation BLEU has not improved for {patience}"
            f" evaluations (config.train.patience); the best is 7.00 at step 4.") in caplog.text
    again = loop.train_and_evaluate(tiny_config, tmp_path)  # Resuming stops at once.
    assert again == {"step": stop, "complete": True, "early_stopped": True}


def test_a_second_training_in_the_same_workdir_is_refused(tmp_path, tiny_config):
  holder = WorkdirLock(tmp_path)
  holder.acquire()
  with pytest.raises(UserError) as e:
    loop.train_and_evaluate(tiny_config, tmp_path)
  assert str(e.value) == (
      f"{tmp_path} is in use by another training (host {socket.gethostname()}, pid"
      f" {os.getpid()}, holding {tmp_path / '.lock'}); wait for it to finish or stop it, or pass"
      " another --workdir.")
  holder.release()
  assert not (tmp_path / ".lock").exists()
  tiny_config.train.num_steps = tiny_config.eval.every_steps = 2
  assert loop.train_and_evaluate(tiny_config, tmp_path)["step"] == 2
  assert not (tmp_path / ".lock").exists()


def test_a_killed_holder_does_not_block_the_workdir(tmp_path):
  code = ("import sys, time; from seq2seq.runs.workdirs import WorkdirLock;"
          f" lock = WorkdirLock({str(tmp_path)!r}); lock.acquire(); print('held', flush=True);"
          " time.sleep(120)")
  holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            env=ENV)
  assert holder.stdout.readline() == b"held\n"
  with pytest.raises(UserError, match=f"pid {holder.pid}, holding"):
    WorkdirLock(tmp_path).acquire()
  holder.kill()
  holder.wait()
  assert (tmp_path / ".lock").exists()  # Left behind by the kill, but no longer locked.
  with WorkdirLock(tmp_path):
    assert f"pid {os.getpid()}" in (tmp_path / ".lock").read_text()


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_resuming_from_an_earlier_checkpoint_logs_each_step_once(tmp_path, tiny_config):
  tiny_config.train.num_steps, tiny_config.eval.every_steps = 6, 3
  tiny_config.train.log_every_steps = 1
  loop.train_and_evaluate(tiny_config, tmp_path)
  shutil.rmtree(tmp_path / "checkpoints" / "6")  # The newest checkpoint is lost: resume at 3.
  with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
    f.write('{"step": 6, "spl')  # A record torn by the kill.
  loop.train_and_evaluate(tiny_config, tmp_path)
  records = [(r["step"], r["split"]) for r in read_metrics(tmp_path)]
  assert [record for record in records if record[1] != "compile"] == [
      (1, "train"), (2, "train"), (3, "train"), (3, "val"), (4, "train"), (5, "train"),
      (6, "train"), (6, "val")]
  # Each start's compiling: its first step and first validation (1 and 3, then 4 and 6).
  assert [step for step, split in records if split == "compile"] == [1, 3, 4, 6]


def test_a_checkpoint_written_in_the_background_holds_the_state_it_was_given(tmp_path,
                                                                            tiny_config):
  """`save(wait=False)` (periodic checkpoints) returns before the write ends, and the train
  step then donates the state it saved: the checkpoint still holds the state as given."""
  trainer = Trainer(tiny_config, tmp_path / "run")
  trainer.compile()
  state, _ = trainer.train(trainer.new_state(), 0, 1)
  saved = [np.array(x) for x in jax.tree.leaves(state)]  # Host copies, before the save.
  checkpoints = Checkpoints(tmp_path / "run", keep=2)
  checkpoints.save(1, state, wait=False)
  for step in range(1, 4):  # Each call donates (overwrites) the buffers of the state before.
    state, _ = trainer.train(state, step, 1)
  jax.block_until_ready(state)
  assert checkpoints.latest_step() == 1  # Waits for the write.
  restored = checkpoints.restore(1, trainer.new_state())
  for a, b in zip(jax.tree.leaves(restored), saved, strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)
  checkpoints.close()


@pytest.mark.slow  # Trains a vocabulary and a run: about 12 s.
def test_a_vocabulary_left_by_a_stopped_first_start_is_trained_again(run, tmp_path, tiny_config):
  """A first start killed after writing vocab/ but before config.json left a vocabulary of
  another config (here 500 pieces): the next start trains its own (300), not the leftover."""
  workdir = tmp_path / "run"
  shutil.copytree(run / "vocab", workdir / "vocab")
  tiny_config.data.vocab_size, tiny_config.train.num_steps = 300, 1
  tiny_config.eval.every_steps = 1
  loop.train_and_evaluate(tiny_config, workdir)
  assert tokenizer.Tokenizer.load(workdir / "vocab" / "spm.model").vocab_size == 300


def _settings(label_smoothing: float, grad_accum_steps: int = 1,
              loss_terms: str = "") -> ml_collections.ConfigDict:
  """The config.train fields `train_step` reads."""
  return ml_collections.ConfigDict({"label_smoothing": label_smoothing,
                                    "grad_accum_steps": grad_accum_steps,
                                    "loss_terms": loss_terms})


def test_z_loss_is_the_squared_log_normalizer_summed_over_the_targets():
  """PaLM's z-loss by hand: logits of 2.0 over 8 words have log Z = 2 + log 8 at each of the
  3 real targets (PAD counts nothing); random logits, numpy's float64 log-sum-exp."""
  targets = jnp.array([[5, 6, PAD_ID], [7, PAD_ID, PAD_ID]])
  weights = (targets != PAD_ID).astype(jnp.float32)
  z = steps.z_loss(jnp.full((2, 3, 8), 2.0), targets, weights, None)
  np.testing.assert_allclose(z, 3 * (2 + np.log(8)) ** 2, rtol=1e-6)
  logits = 4.0 * jax.random.normal(jax.random.key(0), (2, 3, 8))
  log_z = np.log(np.sum(np.exp(np.asarray(logits, np.float64)), axis=-1))
  np.testing.assert_allclose(steps.z_loss(logits, targets, weights, None),
                             np.sum(log_z ** 2 * np.asarray(weights)), rtol=1e-6)


def test_a_registry_takes_each_name_once_and_a_registration_can_be_undone():
  with pytest.raises(ValueError, match="'z_loss' is already registered"):
    steps.register_loss_term("z_loss")
  with pytest.raises(ValueError, match="reserved"):  # It would hide the train record's own.
    steps.register_loss_term("nll")
  with actions.ACTIONS.registered("noop", object):
    assert actions.ACTIONS.chosen(" noop ") == {"noop": None}
  assert "noop" not in actions.ACTIONS
  assert steps.LOSS_TERMS.chosen("z_loss:1e-4") == {"z_loss": 1e-4}
  assert steps.LOSS_TERMS.chosen("") == actions.ACTIONS.chosen("") == {}  # The defaults.


def per_target_token(logits, targets, weights, params):
  """A loss term of 1 per target token: a known value, and no gradient."""
  del logits, targets, params
  return jnp.sum(weights)


def test_a_registered_loss_term_adds_its_weighted_value_and_the_default_is_unchanged(
    tiny_batches):
  """A term registered for the test (`LOSS_TERMS.registered`; in steps.py,
  `@register_loss_term`) and chosen by config.train.loss_terms: the train step returns it
  times its weight, exactly, and the train record logs it per token; the cross-entropy's sums
  stay bit for bit the default's (no term), and so do the gradient and the update, since this
  term has none. z_loss is its known value on the step's logits, and changes the gradient; it
  leaves the cross-entropy's sums as they are to float32's rounding, not bit for bit: a term
  that reads the logits makes another program, whose fused sums XLA may round otherwise in the
  last bit (the same forward fusions here, on this suite's fast-compile flags: 1001.76111 against
  1001.76117 on an AVX2 host; equal on the default flags)."""
  c, vocab, batches = tiny_batches
  c = copy.deepcopy(c)
  c.model.dropout_rate, c.train.warmup_steps = 0.0, 0  # Step 1 updates the parameters.
  graphdef, params = nnx.split(build_model(c, vocab), nnx.Param)
  optimizer, batch = make_optimizer(c.train), batches[0]

  def one_step(loss_terms: str):
    step = jax.jit(lambda s, b, k: train_step(s, b, k, graphdef=graphdef, optimizer=optimizer,
                                              train=_settings(0.1, loss_terms=loss_terms)))
    return step(new_train_state(params, optimizer), batch, jax.random.key(0))

  with steps.LOSS_TERMS.registered("per_token", per_target_token):
    (plain_state, plain), (same_state, same), (_, z) = [
        one_step(terms) for terms in ("", "per_token:0.5", "z_loss:1e-4")]
  assert "per_token" not in steps.LOSS_TERMS and "z_loss" not in plain
  assert {k: float(same[k]) for k in ("loss", "nll", "tokens")} == {
      k: float(plain[k]) for k in ("loss", "nll", "tokens")}
  assert float(z["tokens"]) == float(plain["tokens"])
  for k in ("loss", "nll"):  # One float32 ulp of 1,000 is 6e-5: rtol 2e-7 allows about 3.
    np.testing.assert_allclose(float(z[k]), float(plain[k]), rtol=2e-7, atol=0)
  assert float(same["grad_norm"]) == float(plain["grad_norm"]) != float(z["grad_norm"])
  assert float(same["per_token"]) == 0.5 * float(plain["tokens"])
  assert reports.train_record([jax.device_get(same)], 1.0, 0.0)["per_token"] == 0.5
  for a, b in zip(jax.tree.leaves(plain_state.params), jax.tree.leaves(same_state.params),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  model = nnx.merge(graphdef, params)
  log_z = jax.nn.logsumexp(model.decode(model.encode(batch["src"]), batch["tgt_in"]), axis=-1)
  known = 1e-4 * np.sum(np.square(log_z) * (batch["tgt_out"] != PAD_ID))
  np.testing.assert_allclose(z["z_loss"], known, rtol=1e-5)


def test_param_norm_writes_the_global_norm_with_each_train_record():
  written = []
  writer = types.SimpleNamespace(write=lambda *record: written.append(record))
  config = config_lib.base_config()
  config.train.num_steps, config.train.log_every_steps = 7, 3
  action = actions.ACTIONS["param_norm"](types.SimpleNamespace(writer=writer), config)
  assert [done for done in range(1, 8) if action.due(done)] == [3, 6, 7]
  action(types.SimpleNamespace(params={"a": jnp.array([3.0]), "b": jnp.array([[0.0, 4.0]])}), 3)
  assert written == [(3, "param_norm", {"norm": 5.0})]


class MaxAbsParam:
  """docs/extending.md's loop action: the largest absolute parameter, every 3 steps and after
  the last."""

  def __init__(self, run, config):  # run: the run's RunActions (its writer, workdir, ...).
    self.writer, self.num_steps = run.writer, config.train.num_steps

  def due(self, done):
    return due_every(3, done, self.num_steps)

  def __call__(self, state, done):  # The run's own state: a seed group's member's.
    biggest = max(float(abs(p).max()) for p in jax.tree.leaves(state.params))
    self.writer.write(done, "max_abs_param", {"value": biggest})


@pytest.mark.slow  # Two tiny runs: over ~7 s.
def test_a_registered_loop_action_runs_when_due_with_any_steps_per_call(tmp_path, tiny_config,
                                                                        monkeypatch):
  """docs/extending.md, "A loop action": a class registered for the test
  (`ACTIONS.registered`; in actions.py, `@register_action`) and chosen by
  config.train.actions, with the shipped `param_norm`, runs every 3 steps and after the last;
  calls of several steps stop where it is due, so it falls on the same steps with the same
  state as with one step per call. With 3 steps per call, calls of 3 run up to each action
  (with 4, every call was one step before the next action: the 4-step program never ran)."""
  tiny_config.train.num_steps = tiny_config.eval.every_steps = 7
  tiny_config.train.log_every_steps = 7
  tiny_config.train.actions = "max_abs_param,param_norm"
  records, calls, train = {}, {1: [], 3: []}, Trainer.train

  def counted(self, state, step, size):
    calls[self.config.train.steps_per_call].append(size)
    return train(self, state, step, size)

  monkeypatch.setattr(Trainer, "train", counted)
  with actions.ACTIONS.registered("max_abs_param", MaxAbsParam):
    for k in (1, 3):
      tiny_config.train.steps_per_call = k
      loop.train_and_evaluate(tiny_config, tmp_path / f"k{k}")
      records[k] = [(r["step"], r["split"], r.get("value", r.get("norm")))
                    for r in read_metrics(tmp_path / f"k{k}")
                    if r["split"] in ("max_abs_param", "param_norm")]
  assert calls == {1: [1] * 7, 3: [3, 3, 1]}  # Steps 1-3 and 4-6 in calls of 3, then step 7.
  assert [(step, split) for step, split, _ in records[1]] == [
      (3, "max_abs_param"), (6, "max_abs_param"), (7, "max_abs_param"), (7, "param_norm")]
  assert [r[:2] for r in records[3]] == [r[:2] for r in records[1]]
  np.testing.assert_allclose([r[2] for r in records[3]], [r[2] for r in records[1]], rtol=1e-6)


# The commit before training/seeds.py (issue 45): the code that issue 43's sweeps started under.
BEFORE = "bf25fff"


@pytest.mark.slow  # Trains 4 steps under the code before, then resumes: about 40 s.
def test_a_checkpoint_of_the_code_before_resumes_to_the_same_parameters(tmp_path):
  """A run trained by the code of commit BEFORE, its last checkpoint removed, resumes under
  this code to the parameters the code before saved there, bit for bit: runs started before
  the training code was rewritten go on with the same numerics."""
  before = tmp_path / "before"
  before.mkdir()
  try:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "seq2seq"],
                             capture_output=True)
  except FileNotFoundError:
    pytest.skip("git is not installed: the code before cannot be read")
  if archive.returncode:
    pytest.skip(f"this clone lacks commit {BEFORE}: {archive.stderr.decode().strip()}")
  with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
    tar.extractall(before, filter="data")
  (before / "data").symlink_to(ROOT / "data")  # The bundled Multi30k, where the code looks.
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 4, 2  # Checkpoints at 2 and 4.
  workdir = tmp_path / "run"
  # The fields newer than BEFORE, at their defaults (which train as the code before did), are
  # left out for the code before, which refuses fields it does not know.
  script = ("import json, sys, seq2seq; from seq2seq import config; from seq2seq.training"
            " import loop; base, saved = config.base_config(), json.loads(sys.argv[1]);"
            " known = {s: {k: v for k, v in f.items() if k in base[s]} for s, f in saved.items()};"
            " loop.train_and_evaluate(config.from_saved(known), sys.argv[2]);"
            " print(seq2seq.__file__)")
  done = subprocess.run([sys.executable, "-c", script, config_lib.to_json(c), str(workdir)],
                        env=dict(ENV, PYTHONPATH=str(before)), cwd=tmp_path,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.splitlines()[-1] == str(before / "seq2seq" / "__init__.py")  # It ran.
  template = Trainer(c, workdir).new_state()
  saved = jax.tree.leaves(Checkpoints(workdir, keep=3).restore(4, template).params)
  shutil.rmtree(workdir / "checkpoints" / "4")
  assert loop.train_and_evaluate(c, workdir)["step"] == 4
  resumed = jax.tree.leaves(Checkpoints(workdir, keep=3).restore(4, template).params)
  for a, b in zip(saved, resumed, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
