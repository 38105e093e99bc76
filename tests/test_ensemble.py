"""Ensembles: several runs or checkpoints decoding as one model, and runs sharing a vocabulary."""

import functools
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq import config as config_lib
from seq2seq import decoding, evaluate, train
from seq2seq.data import tokenizer
from seq2seq.ensemble import Ensemble, stack
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.translator import Translator, search_fn
from tests.conftest import ROOT, fast_tiny_config
from tests.test_cli import snapshot

TEXTS = ["A man is riding a bike.", "Two dogs play in the snow near a tree.", "", "A girl."]


@pytest.fixture(scope="module")
def seed_1(run, tmp_path_factory):
  """The session's run trained again with train.seed=1."""
  c = config_lib.from_json((run / "config.json").read_text())
  c.train.seed = 1
  workdir = tmp_path_factory.mktemp("seed") / "seed-1"
  train.train_and_evaluate(c, workdir)
  return workdir


def _nbest(translator, texts=TEXTS):
  return translator.translate(texts)


@pytest.mark.parametrize("beam_size,nbest", [(1, 1), (3, 2)])
def test_a_run_ensembled_with_itself_translates_like_the_run(run, beam_size, nbest):
  alone = _nbest(Translator(run, "latest", beam_size=beam_size, nbest=nbest))
  twice = _nbest(Translator(run, "latest", beam_size=beam_size, nbest=nbest,
                                     ensemble=[run]))
  assert [[text for text, _ in n] for n in twice] == [[text for text, _ in n] for n in alone]
  np.testing.assert_allclose([s for n in twice for _, s in n], [s for n in alone for _, s in n],
                             rtol=1e-5, atol=1e-5)


def test_the_translate_command_with_its_own_run_as_ensemble_writes_the_same_bytes(run,
                                                                                  tmp_path):
  source = tmp_path / "in.en"
  source.write_text("\n".join(TEXTS) + "\n")

  def translate(*args):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "translate.py"),
                             f"--workdir={run}", f"--input={source}", *args],
                            capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            timeout=300)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    return result.stdout

  assert translate(f"--ensemble={run}") == translate()


def _models(run, steps):
  """The run's model at each of `steps`: (graphdef, params) per step."""
  translator = Translator(run, str(steps[0]), beam_size=1)
  out = []
  for step in steps:
    translator.load_checkpoint(str(step))
    out.append((translator.graphdef, translator.params))
  return out


def test_k_copies_of_one_model_give_its_scores(run):
  (graphdef, params), = _models(run, [4])
  src = jnp.asarray(np.array([[5, 9, 13, 3], [7, 3, 0, 0]], np.int32))
  search = functools.partial(search_fn, src=src, strategy=decoding.Beam(3, 0.6, nbest=2),
                             max_len_a=1.0, max_len_b=4, max_len_limit=64)
  ids, scores = search(params, graphdef=graphdef)
  ensemble_ids, ensemble_scores = search((stack([params] * 3),), graphdef=(graphdef,))
  np.testing.assert_array_equal(ensemble_ids, ids)
  np.testing.assert_allclose(ensemble_scores, scores, rtol=1e-5)


def test_one_step_is_the_mean_of_the_members_log_probabilities(run):
  """Two checkpoints of the Transformer (one vmapped group) and an RNN of the same vocabulary
  (a second group): the ensemble's step equals the members' steps averaged."""
  transformers = _models(run, [2, 4])
  rnn_config = fast_tiny_config()
  rnn_config.model.family, rnn_config.model.attention = "rnn", "general"
  vocab_size = transformers[0][1]["src_embed"]["embedding"].shape[0]
  rnn_graphdef, rnn_params = nnx.split(build_model(rnn_config, vocab_size, seed=3),
                                       nnx.Param)
  members = [*transformers, (rnn_graphdef, rnn_params)]
  ensemble = Ensemble([transformers[0][0], rnn_graphdef],
                      [stack([p for _, p in transformers]), stack([rnn_params])])
  src = jnp.asarray(np.array([[5, 9, 13, 3], [7, 3, 0, 0]], np.int32))
  tokens = [jnp.array([2, 2]), jnp.array([17, 40]), jnp.array([8, 3])]
  memory = ensemble.encode(src)
  cache = ensemble.init_cache(memory, 8)
  singles = [nnx.merge(g, p) for g, p in members]
  single_memories = [m.encode(src) for m in singles]
  single_caches = [m.init_cache(mem, 8) for m, mem in zip(singles, single_memories, strict=True)]
  for token_ids in tokens:
    mean, cache = ensemble.decode_step(memory, cache, token_ids)
    log_probs = []
    for i, model in enumerate(singles):
      logits, single_caches[i] = model.decode_step(single_memories[i], single_caches[i],
                                                   token_ids)
      log_probs.append(jax.nn.log_softmax(logits, axis=-1))
    np.testing.assert_allclose(mean, np.mean(log_probs, axis=0), rtol=1e-5, atol=1e-5)


def test_ensemble_n_takes_the_last_n_checkpoints_as_members(run):
  translator = Translator(run, "ensemble:2", beam_size=2)
  assert [member["steps"] for member in translator.steps] == [[2], [4]]
  assert len(translator.translate(TEXTS)) == len(TEXTS)
  with pytest.raises(UserError) as e:
    Translator(run, "ensemble:3")
  assert str(e.value) == (f"--checkpoint=ensemble:3: N of ensemble:N must be 1 to 2, the"
                          f" checkpoints {run}/checkpoints holds (steps 2, 4).")


def test_seeds_share_a_vocabulary_and_their_ensemble_is_neither(run, seed_1):
  vocab = "vocab/spm.model"
  assert tokenizer.fingerprint(seed_1 / vocab) == tokenizer.fingerprint(run / vocab)
  texts = TEXTS[:2]
  both = _nbest(Translator(run, "latest", beam_size=2, ensemble=[seed_1]), texts)
  for member in (run, seed_1):
    alone = _nbest(Translator(member, "latest", beam_size=2), texts)
    assert [s for n in both for _, s in n] != pytest.approx([s for n in alone for _, s in n])


def test_a_member_of_another_vocabulary_is_refused_before_anything_is_written(run, tmp_path):
  other = tmp_path / "other"
  c = fast_tiny_config()
  c.data.vocab_size, c.train.num_steps, c.eval.every_steps = 300, 2, 2
  train.train_and_evaluate(c, other)
  before = snapshot(run)
  with pytest.raises(UserError) as e:
    evaluate.run_evaluation(run, split="val", ensemble=[str(other)])
  assert str(e.value) == (
      f"--ensemble: {other}/vocab/spm.model is not the vocabulary of {run} (an ensemble averages"
      " the members' probabilities of the same tokens); ensemble runs of one vocabulary, such as"
      " runs that differ only in config.train.seed.")
  assert snapshot(run) == before


def test_vocab_from_takes_another_runs_vocabulary(run, tmp_path):
  c = config_lib.from_json((run / "config.json").read_text())
  c.data.vocab_from, c.data.vocab_size = str(run), 300  # The size of the copied one counts.
  c.train.num_steps, c.eval.every_steps = 2, 2
  train.train_and_evaluate(c, tmp_path / "reuse")
  for name in ("spm.model", "spm.vocab"):
    assert (tmp_path / "reuse" / "vocab" / name).read_bytes() == (run / "vocab" / name).read_bytes()
  c.data.vocab_from = str(tmp_path / "missing")
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(c, tmp_path / "new")
  assert str(e.value) == (f"config.data.vocab_from={tmp_path}/missing: {tmp_path}/missing/vocab/"
                          "spm.model does not exist; pass the workdir of a run that has trained"
                          " its vocabulary.")
  assert not (tmp_path / "new").exists()
  shutil.rmtree(tmp_path / "reuse")
