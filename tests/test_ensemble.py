"""Ensembles: several runs or checkpoints decoding as one model, and runs sharing a vocabulary."""

import functools
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq import config as config_lib
from seq2seq.data import tokenizer
from seq2seq.decoding import search
from seq2seq.decoding.ensemble import Ensemble, stack
from seq2seq.decoding.translator import Translator, search_fn
from seq2seq.models import build_model
from seq2seq.training import loop
from tests.helpers import ENV, ROOT, fast_tiny_config

TEXTS = ["A man is riding a bike.", "Two dogs play in the snow near a tree.", "", "A girl."]


@pytest.fixture(scope="module")
def seed_1(run, tmp_path_factory):
  """The session's run trained again with train.seed=1."""
  c = config_lib.from_json((run / "config.json").read_text())
  c.train.seed = 1
  workdir = tmp_path_factory.mktemp("seed") / "seed-1"
  loop.train_and_evaluate(c, workdir)
  return workdir


@pytest.fixture(scope="module")
def twin(run, tmp_path_factory):
  """A copy of the session's run: the same model as another run (a run is a member once)."""
  copy = tmp_path_factory.mktemp("twin") / "run"
  shutil.copytree(run, copy)
  return copy


def _nbest(translator, texts=TEXTS):
  return translator.translate(texts)


@pytest.mark.parametrize("beam_size,nbest", [(1, 1), (3, 2)])
def test_a_run_ensembled_with_its_twin_translates_like_the_run(run, twin, beam_size, nbest):
  alone = _nbest(Translator(run, "latest", beam_size=beam_size, nbest=nbest))
  twice = _nbest(Translator(run, "latest", beam_size=beam_size, nbest=nbest,
                                     ensemble=[twin]))
  assert [[text for text, _ in n] for n in twice] == [[text for text, _ in n] for n in alone]
  np.testing.assert_allclose([s for n in twice for _, s in n], [s for n in alone for _, s in n],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_the_translate_command_with_its_twin_as_ensemble_writes_the_same_bytes(run, twin,
                                                                               tmp_path):
  source = tmp_path / "in.en"
  source.write_text("\n".join(TEXTS) + "\n")

  def translate(*args):  # Both commands run at once: each spends most of its time starting.
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "translate.py"),
                             f"--workdir={run}", f"--input={source}", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)

  outputs = []
  for process in [translate(f"--ensemble={twin}"), translate()]:
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr.decode()[-2000:]
    outputs.append(stdout)
  assert outputs[0] == outputs[1] and outputs[0].strip()


def _models(run, steps):
  """The run's model at each of `steps`: (graphdef, params) per step."""
  translator = Translator(run, str(steps[0]), beam_size=1)
  out = []
  for step in steps:
    translator.load_checkpoint(str(step))
    out.append((translator.graphdef, translator.params))
  return out


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_k_copies_of_one_model_give_its_scores(run):
  (graphdef, params), = _models(run, [4])
  src = jnp.asarray(np.array([[5, 9, 13, 3], [7, 3, 0, 0]], np.int32))
  decode = functools.partial(search_fn, src=src, strategy=search.Beam(3, 0.6, nbest=2),
                             max_len_a=1.0, max_len_b=4, max_len_limit=64)
  ids, scores = decode(params, graphdef=graphdef)
  ensemble_ids, ensemble_scores = decode((stack([params] * 3),), graphdef=(graphdef,))
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
  # Compiled, as the search runs them (op by op, they take longer to dispatch than to compile).
  memory = jax.jit(ensemble.encode)(src)
  cache = ensemble.init_cache(memory, 8)
  ensemble_step = jax.jit(ensemble.decode_step)
  singles = [nnx.merge(g, p) for g, p in members]
  single_memories = [jax.jit(m.encode)(src) for m in singles]
  single_caches = [m.init_cache(mem, 8) for m, mem in zip(singles, single_memories, strict=True)]
  single_steps = [jax.jit(m.decode_step) for m in singles]
  for token_ids in tokens:
    mean, cache = ensemble_step(memory, cache, token_ids)
    log_probs = []
    for i, step in enumerate(single_steps):
      logits, single_caches[i] = step(single_memories[i], single_caches[i], token_ids)
      log_probs.append(jax.nn.log_softmax(logits, axis=-1))
    np.testing.assert_allclose(mean, np.mean(log_probs, axis=0), rtol=1e-5, atol=1e-5)


def test_ensemble_n_takes_the_last_n_checkpoints_as_members(run):
  translator = Translator(run, "ensemble:2", beam_size=2)
  assert [member["steps"] for member in translator.steps] == [[2], [4]]
  assert len(translator.translate(TEXTS)) == len(TEXTS)


def test_seeds_share_a_vocabulary_and_their_ensemble_is_neither(run, seed_1):
  vocab = "vocab/spm.model"
  assert tokenizer.fingerprint(seed_1 / vocab) == tokenizer.fingerprint(run / vocab)
  texts = TEXTS[:2]
  both = _nbest(Translator(run, "latest", beam_size=2, ensemble=[seed_1]), texts)
  for member in (run, seed_1):
    alone = _nbest(Translator(member, "latest", beam_size=2), texts)
    assert [s for n in both for _, s in n] != pytest.approx([s for n in alone for _, s in n])


def test_vocab_from_takes_another_runs_vocabulary(run, tmp_path):
  c = config_lib.from_json((run / "config.json").read_text())
  c.data.vocab_from = str(run)  # At its size (another is refused: tests/test_errors.py).
  c.train.num_steps, c.eval.every_steps = 2, 2
  loop.train_and_evaluate(c, tmp_path / "reuse")
  for name in ("spm.model", "spm.vocab"):
    assert (tmp_path / "reuse" / "vocab" / name).read_bytes() == (run / "vocab" / name).read_bytes()
