"""Luong et al.'s (2015, 3.2) local attention of the RNN, local_m and local_p: known answers by
hand, agreement with dense `general` attention under the window's mask, the decoding
invariants, and the configs that take or refuse them. (tests/test_rnn.py runs them through
every test that loops over the RNN's attention names.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.decoding import search
from seq2seq.errors import UserError
from seq2seq.models import ATTENTION_BY_FAMILY, attention, build_model, check_config, masks
from seq2seq.models.local_rnn import LOCAL, SCORE
from tests.helpers import assert_stepping_matches_decode

VOCAB = 40
SRC = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]])  # EOS=3, PAD=0
TGT = jnp.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]])  # BOS=2
# Five real keys and a padded one, and three real keys: S = 5 and S = 3.
KEY_IDS = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]])


def rnn_config(tiny_config, **model):
  c = tiny_config
  c.model.family = "rnn"
  c.model.emb_dim, c.model.rnn_hidden_dim = 16, 24
  c.model.num_encoder_layers = c.model.num_decoder_layers = 2
  c.model.attention_window = 1
  c.model.update(model)
  return c


def hand_params(w_a, w_p=None, v_p=None):
  arrays = {"w": jnp.asarray(w_a, jnp.float32)[None]}
  if w_p is not None:
    arrays.update(w_p=jnp.asarray(w_p, jnp.float32)[None], v_p=jnp.asarray(v_p, jnp.float32)[None])
  return attention.ScoreParams(**arrays)


def local(name, query, keys, values, *, first=0, window=1, params, reverse=False):
  """`LOCAL[name]` on one head: `query [batch, q, d]`, `keys`/`values [batch, k, d]`."""
  mask = masks.padding_mask(KEY_IDS).replace(query_offset=jnp.asarray(first, jnp.int32))
  kind = LOCAL[name]
  context, weights = kind.attend(query[:, None], kind.prepare(keys[:, None], params),
                                 values[:, None], mask, params, window=window, reverse=reverse)
  return np.asarray(context[:, 0]), np.asarray(weights[:, 0])


# Keys k_s = (s, 1): with W_a = I, query (1, 0) scores key s with s.
KEYS = jnp.broadcast_to(jnp.stack([jnp.arange(6.0), jnp.ones(6)], -1), (2, 6, 2))


def test_local_m_known_windows():
  """D = 1: step t sees source words t - 1 .. t (softmax of the scores s), and past the
  source's end its last words; padding and the words outside get exactly zero."""
  query = jnp.broadcast_to(jnp.array([1.0, 0.0]), (2, 7, 2))
  _, weights = local("local_m", query, KEYS, KEYS, params=hand_params(np.eye(2)))
  softmax = lambda s: np.exp(s) / np.exp(s).sum()  # noqa: E731
  expected = np.zeros((2, 7, 6))
  for t in range(7):
    for row, length in enumerate((5, 3)):
      p = min(t, length - 1)
      window = [s for s in (p - 1, p, p + 1) if 0 <= s < length]
      expected[row, t, window] = softmax(np.array(window, float))
  np.testing.assert_allclose(weights, expected, rtol=1e-6, atol=1e-7)
  assert np.all(weights[expected == 0] == 0.0)
  # From target step 3 on (a decoding step's offset): the windows of steps 3 and 4.
  _, later = local("local_m", query[:, :2], KEYS, KEYS, first=3, params=hand_params(np.eye(2)))
  np.testing.assert_allclose(later, expected[:, 3:5], rtol=1e-6, atol=1e-7)


def test_local_m_with_a_reversed_source_places_its_window_on_the_same_words():
  """The memory holds word s at S - 1 - s: step 0's window (words 0, 1) is at positions 4, 3."""
  query = jnp.zeros((2, 2, 2))  # Equal scores: uniform over the window.
  _, weights = local("local_m", query, KEYS, KEYS, params=hand_params(np.eye(2)), reverse=True)
  np.testing.assert_allclose(weights[0, 0], [0, 0, 0, 0.5, 0.5, 0], atol=1e-7)
  np.testing.assert_allclose(weights[0, 1], [0, 0, 1 / 3, 1 / 3, 1 / 3, 0], atol=1e-7)
  np.testing.assert_allclose(weights[1, 0], [0, 0.5, 0.5, 0, 0, 0], atol=1e-7)


def test_local_p_known_positions_and_gaussian():
  """W_p = I, v_p = (3, 0), W_a = 0 (a uniform softmax in the window), D = 1 (sigma = 1/2):
  h = (x, 0) gives p = S sigmoid(3 tanh x). x = 0: p = S/2; sigmoid = 0.72: p = 3.6 for S = 5,
  window {3, 4}; sigmoid = 0.9: p = 4.5, window {4, 5}, whose 5 is padding."""
  x = [0.0, np.arctanh(np.log(0.72 / 0.28) / 3), np.arctanh(np.log(9.0) / 3)]
  query = jnp.broadcast_to(jnp.stack([jnp.array(x), jnp.zeros(3)], -1), (2, 3, 2))
  params = hand_params(np.zeros((2, 2)), np.eye(2), [3.0, 0.0])
  positions = LOCAL["local_p"].positions(query[:, None], masks.padding_mask(KEY_IDS), params,
                                         False)
  np.testing.assert_allclose(positions[:, 0], [[2.5, 3.6, 4.5], [1.5, 2.16, 2.7]], rtol=1e-5)
  _, weights = local("local_p", query, KEYS, KEYS, params=params)
  gauss = lambda d: np.exp(-d**2 / (2 * 0.5**2))  # noqa: E731
  expected = np.zeros((2, 3, 6))
  expected[0, 0, [2, 3]] = 0.5 * gauss(0.5)  # p = 2.5: words 2 and 3 (1.5 and 3.5 are not).
  expected[0, 1, [3, 4]] = 0.5 * gauss(np.array([0.6, 0.4]))
  expected[0, 2, 4] = gauss(0.5)  # Word 5 is padding: the softmax has word 4 alone.
  expected[1, 0, [1, 2]] = 0.5 * gauss(0.5)  # S = 3: p = 1.5.
  expected[1, 1, [2]] = gauss(0.16)  # p = 2.16: words 2 and 3, 3 is padding.
  expected[1, 2, [2]] = gauss(0.7)  # p = 2.7: the same.
  np.testing.assert_allclose(weights, expected, rtol=1e-4, atol=1e-7)
  assert np.all(weights[expected == 0] == 0.0)


def dense_reference(name, query, keys, values, params, first, window):
  """General attention over every source word under the window's mask (and the Gaussian),
  with p_t computed here from the paper's formulas."""
  length = np.asarray(KEY_IDS != 0).sum(1)[:, None]  # [b, 1]
  t = first + np.arange(query.shape[1])[None]
  if name == "local_p":
    z = np.tanh(np.einsum("bqd,de->bqe", query, params.w_p[0])) @ np.asarray(params.v_p[0])
    p = length / (1 + np.exp(-z))
  else:
    p = np.minimum(t, length - 1).astype(float)
  s = np.arange(keys.shape[1])
  inside = np.abs(s[None, None] - p[..., None]) <= window
  mask = inside & np.asarray(KEY_IDS != 0)[:, None]
  _, weights = attention.attend(SCORE, query[:, None], SCORE.prepare(keys[:, None], params),
                                values[:, None], jnp.asarray(mask)[:, None], params)
  weights = np.asarray(weights[:, 0])
  if name == "local_p":
    weights = weights * np.exp(-(s - p[..., None]) ** 2 / (2 * (window / 2) ** 2))
  return np.einsum("bqk,bkd->bqd", weights, values), weights


@pytest.mark.parametrize("name", LOCAL)
@pytest.mark.parametrize("window,first", [(1, 0), (2, 3), (3, 0)])
def test_local_attention_equals_dense_general_attention_under_the_window(name, window, first):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(window + first), 4)
  query = jax.random.normal(k1, (2, 7, 4))
  keys, values = jax.random.normal(k2, (2, 6, 4)), jax.random.normal(k3, (2, 6, 4))
  params = LOCAL[name].init(1, 4, 0, nnx.Rngs(params=k4))
  context, weights = local(name, query, keys, values, first=first, window=window, params=params)
  expected_context, expected_weights = dense_reference(name, np.asarray(query), np.asarray(keys),
                                                       np.asarray(values), params, first, window)
  np.testing.assert_allclose(weights, expected_weights, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(context, expected_context, rtol=1e-5, atol=1e-5)
  assert np.all(weights[expected_weights == 0] == 0.0)


@pytest.mark.slow  # Over ~7 s (or a second case of a fast one): -m slow runs it.
def test_local_m_with_a_window_over_the_whole_source_is_general(tiny_config):
  """Same parameters (local_m's are general's, drawn alike), and a window wider than every
  source: the same model."""
  general = build_model(rnn_config(tiny_config, attention="general"), VOCAB)
  wide = build_model(rnn_config(tiny_config, attention="local_m", attention_window=6), VOCAB)
  np.testing.assert_allclose(wide.decode(wide.encode(SRC), TGT),
                             general.decode(general.encode(SRC), TGT), atol=1e-5)
  narrow = build_model(rnn_config(tiny_config, attention="local_m"), VOCAB)
  assert not np.allclose(narrow.decode(narrow.encode(SRC), TGT),
                         general.decode(general.encode(SRC), TGT), atol=1e-3)


@pytest.mark.parametrize("name", LOCAL)
def test_source_padding_changes_nothing(tiny_config, name):
  model = build_model(rnn_config(tiny_config, attention=name), VOCAB)
  wider = jnp.pad(SRC, ((0, 0), (0, 4)))
  np.testing.assert_allclose(model.decode(model.encode(wider), TGT),
                             model.decode(model.encode(SRC), TGT), atol=1e-5)
  weights = np.asarray(model.attention_weights(wider, TGT)["cross"])
  np.testing.assert_allclose(weights[..., :6], model.attention_weights(SRC, TGT)["cross"],
                             atol=1e-6)
  assert np.all(weights[..., 6:] == 0.0)


@pytest.mark.slow  # Over ~7 s (or a second case of a fast one): -m slow runs it.
@pytest.mark.parametrize("name", LOCAL)
def test_reverse_source_steps_as_it_decodes_and_aligns_words_monotonically(tiny_config, name):
  config = rnn_config(tiny_config, attention=name, reverse_source=True)
  check_config(config)  # Taken: local_m places its window on the reversed memory.
  model = build_model(config, VOCAB)
  assert_stepping_matches_decode(model, SRC, TGT, all_positions=True)
  if name == "local_m":
    # The weights on the words in order (put back): step t's window is around min(t, S - 1).
    words = np.asarray(model.attention_weights(SRC, TGT)["cross"])[0, :, 0]  # [b, t, src]
    lengths = np.asarray((SRC != 0).sum(1))
    p = np.minimum(np.arange(5)[None, :], lengths[:, None] - 1)
    expected = (np.abs(np.arange(6)[None, None] - p[..., None]) <= 1) & (
        np.arange(6) < lengths[:, None, None])
    np.testing.assert_array_equal(words > 0, expected)


@pytest.mark.slow  # Over ~7 s (or a second case of a fast one): -m slow runs it.
@pytest.mark.parametrize("name", LOCAL)
def test_beam_search_decodes_each_sentence_as_it_does_alone(tiny_config, name):
  """Beam 1 is greedy; beam 3 (the memory copied per beam) on two sentences of different
  lengths gives the shorter what it gives alone, so each row's window uses its own sentence."""
  model = build_model(rnn_config(tiny_config, attention=name), VOCAB)
  greedy, _ = search.generate(model, SRC, search.Greedy(), max_len=8)
  memory = model.encode(SRC)
  ids, _ = search.beam_search(functools.partial(model.decode_step, memory),
                              model.init_cache(memory, 8), 2, 8, beam_size=1, alpha=0.0)
  np.testing.assert_array_equal(ids[:, 0], greedy[:, 0])
  both, scores = search.generate(model, SRC, search.Beam(3, 0.6, 2), max_len=8)
  alone, alone_scores = search.generate(model, SRC[1:], search.Beam(3, 0.6, 2), max_len=8)
  np.testing.assert_array_equal(both[1], alone[0])
  np.testing.assert_allclose(scores[1], alone_scores[0], rtol=1e-5)


@pytest.mark.slow  # Over ~7 s (or a second case of a fast one): -m slow runs it.
def test_local_p_learns_its_position_through_the_gaussian(tiny_config):
  """W_p and v_p get gradients (only the Gaussian depends on p_t smoothly)."""
  config = rnn_config(tiny_config, attention="local_p", num_encoder_layers=1,
                      num_decoder_layers=1)
  graphdef, params = nnx.split(build_model(config, VOCAB), nnx.Param)

  def loss(params):
    m = nnx.merge(graphdef, params)
    return m.decode(m.encode(SRC), TGT).sum()

  grads = jax.grad(loss)(params)
  for name in ("w_p", "v_p"):
    assert np.abs(np.asarray(grads["score_params"][name][...])).max() > 0, name


@pytest.mark.parametrize("name", LOCAL)
def test_only_the_rnn_takes_local_m_and_local_p(tiny_config, name):
  assert name in ATTENTION_BY_FAMILY["rnn"] and name not in attention.VARIANTS
  check_config(rnn_config(tiny_config, attention=name))
  tiny_config.model.family, tiny_config.model.attention = "transformer", name
  with pytest.raises(UserError) as error:
    check_config(tiny_config)
  message = str(error.value)
  assert "\n" not in message
  assert message == (f"config.model.attention={name!r} is not available for the transformer;"
                     f" use one of: {', '.join(ATTENTION_BY_FAMILY['transformer'])}.")


@pytest.mark.slow  # Over ~7 s (~25 s on 2 shared cores): the default run stays under 8 minutes.
def test_a_tiny_local_p_run_trains_end_to_end(tiny_config, tmp_path):
  from seq2seq.decoding.translator import Translator
  from seq2seq.training import loop
  c = rnn_config(tiny_config, attention="local_p", attention_window=2)
  c.train.num_steps, c.eval.every_steps = 4, 4
  metrics = loop.train_and_evaluate(c, tmp_path / "run")
  assert metrics["step"] == 4 and np.isfinite(metrics["loss"])
  # What it trained is local_p: its own W_p and v_p moved from their start, and the run's
  # checkpoint attends within 2D + 1 = 5 source words of p_t, nothing outside.
  translator = Translator(tmp_path / "run", "latest", beam_size=1)
  model = nnx.merge(translator.graphdef, translator.params)
  start = build_model(c, translator.tokenizer.vocab_size)
  for name in ("w_p", "v_p"):
    assert not np.allclose(getattr(model.score_params, name)[...],
                           getattr(start.score_params, name)[...]), name
  weights = np.asarray(model.attention_weights(SRC, TGT)["cross"])
  assert ((weights > 0).sum(-1) <= 5).all() and ((weights > 0).sum(-1) >= 1).any()
