"""The attention of 2023-2025, each against its paper's formula written here in numpy, apart from
the implementation: QK-norm (Henry et al. 2020), the gated output (Qiu et al. 2025),
differential attention (Ye et al. 2025), sigmoid attention (Ramapuram et al. 2025) and a
decoder without positions (Kazemnejad et al. 2023); and what each refuses, in one line.
Stepping against teacher forcing, padding and packing: tests/test_models.py's cases."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq import config as config_lib
from seq2seq.errors import UserError
from seq2seq.models import attention, build_model, check_config, masks
from seq2seq.models.normalizers import NORMALIZERS

SRC = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]])  # EOS=3, PAD=0
X = jax.random.normal(jax.random.key(2), (2, 5, 16))
MEMORY = jax.random.normal(jax.random.key(3), (2, 6, 16))


def _np(x):
  return np.asarray(x, np.float64)


def _heads(x, w, heads):
  """`x [b, n, dim] @ w`, as `[b, heads, n, d]`."""
  y = _np(x) @ _np(w)
  b, n, _ = y.shape
  return y.reshape(b, n, heads, -1).transpose(0, 2, 1, 3)


def _softmax(scores, allowed):
  scores = np.where(allowed, scores, -np.inf)
  top = np.max(scores, axis=-1, keepdims=True)
  e = np.where(allowed, np.exp(scores - top), 0.0)
  return e / e.sum(-1, keepdims=True)


def _merge(context):
  b, h, n, d = context.shape
  return context.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def _parts(mha, heads=2):
  q = _heads(X, mha.query.kernel[...], heads)
  k = _heads(MEMORY, mha.key.kernel[...], heads)
  v = _heads(MEMORY, mha.value.kernel[...], heads)
  allowed = np.asarray(masks.padding_mask(SRC).dense(5))  # [b, 1, 1, k]
  return q, k, v, allowed


def test_qk_norm_is_the_cosine_times_a_learned_scale_from_log2_of_l2_minus_l():
  mha = attention.MultiHeadAttention(16, 2, attention="scaled_dot", dropout_rate=0.0,
                                     rngs=nnx.Rngs(0), max_keys=10, qk_norm=True)
  assert float(mha.qk_scale[...]) == pytest.approx(math.log2(10**2 - 10))
  mha.qk_scale[...] = jnp.asarray(3.5)  # Any learned value: it replaces 1/sqrt(d).
  ours = mha(X, *mha.project_kv(MEMORY), masks.padding_mask(SRC))
  q, k, v, allowed = _parts(mha)
  q = q / np.linalg.norm(q, axis=-1, keepdims=True)
  k = k / np.linalg.norm(k, axis=-1, keepdims=True)
  weights = _softmax(3.5 * np.einsum("bhqd,bhkd->bhqk", q, k), allowed)
  expected = _merge(weights @ v) @ _np(mha.out.kernel[...])
  np.testing.assert_allclose(ours, expected, atol=2e-5)


def test_qk_norm_replaces_the_divisor_of_each_dot_product():
  """`dot` divides by nothing and `scaled_dot` by sqrt(d): with QK-norm both score g q.k for
  unit q and k, so the two give the same output from the same weights."""
  build = lambda name: attention.MultiHeadAttention(  # noqa: E731
      16, 2, attention=name, dropout_rate=0.0, rngs=nnx.Rngs(0), max_keys=10, qk_norm=True)
  dot, scaled = build("dot"), build("scaled_dot")
  mask = masks.padding_mask(SRC)
  np.testing.assert_allclose(dot(X, *dot.project_kv(MEMORY), mask),
                             scaled(X, *scaled.project_kv(MEMORY), mask), atol=1e-5)


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_gate_multiplies_each_heads_output_by_a_sigmoid_of_the_input(gate):
  mha = attention.MultiHeadAttention(16, 2, attention="scaled_dot", dropout_rate=0.0,
                                     rngs=nnx.Rngs(0), gate=gate)
  assert mha.gate.kernel.shape == (16, 2 if gate == "headwise" else 16)
  ours = mha(X, *mha.project_kv(MEMORY), masks.padding_mask(SRC))
  q, k, v, allowed = _parts(mha)
  context = _softmax(np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(8), allowed) @ v
  g = 1 / (1 + np.exp(-(_np(X) @ _np(mha.gate.kernel[...]))))  # [b, q, 2 or 16]
  g = g.reshape(2, 5, 2, -1).transpose(0, 2, 1, 3)  # [b, h, q, 1 or 8]
  expected = _merge(context * g) @ _np(mha.out.kernel[...])
  np.testing.assert_allclose(ours, expected, atol=2e-5)


@pytest.mark.parametrize("layer", [0, 2])
def test_differential_attention_matches_ye_et_al(layer):
  mha = attention.MultiHeadAttention(16, 2, attention="differential", dropout_rate=0.0,
                                     rngs=nnx.Rngs(0), layer=layer)
  p = mha.score_params
  ours, weights = mha(X, *mha.project_kv(MEMORY), masks.padding_mask(SRC), return_weights=True)
  q, k, v, allowed = _parts(mha)
  d = 8
  # Each map holds whole pairs (i, i + d/2) of rotary positions: the even i of each half, or
  # the odd.
  maps = [[i for i in range(d) if (i % (d // 2)) % 2 == which] for which in (0, 1)]
  a1, a2 = (_softmax(np.einsum("bhqd,bhkd->bhqk", q[..., m], k[..., m]) / math.sqrt(d / 2),
                     allowed) for m in maps)
  lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)  # Layer l = layer + 1.
  lam = (math.exp(_np(p.lambda_q1[...]) @ _np(p.lambda_k1[...]))
         - math.exp(_np(p.lambda_q2[...]) @ _np(p.lambda_k2[...])) + lambda_init)
  w = a1 - lam * a2
  np.testing.assert_allclose(weights, w, atol=1e-5)
  heads = w @ v
  heads = heads / np.sqrt(np.mean(heads**2, axis=-1, keepdims=True) + 1e-5) * _np(p.gain[...])
  expected = _merge((1 - lambda_init) * heads) @ _np(mha.out.kernel[...])
  np.testing.assert_allclose(ours, expected, atol=2e-5)


def test_sigmoid_weights_are_sigmoid_of_score_minus_log_n_per_row():
  scores = jax.random.normal(jax.random.key(4), (2, 1, 3, 6)) * 3
  mask = jnp.asarray([[[[1, 1, 1, 1, 0, 0]]], [[[1, 0, 0, 0, 0, 0]]]], bool)
  mask = jnp.broadcast_to(mask, (2, 1, 3, 6)).at[1, 0, 2].set(False)  # A row with no keys.
  ours = np.asarray(NORMALIZERS["sigmoid"].normalize(scores, mask))
  n = np.asarray(mask).sum(-1, keepdims=True)
  expected = np.where(np.asarray(mask), 1 / (1 + np.exp(-(_np(scores) - np.log(np.maximum(n, 1))))),
                      0.0)
  np.testing.assert_allclose(ours, expected, rtol=1e-6)
  assert np.all(ours[1, 0, 2] == 0.0)
  assert not np.allclose(ours[0].sum(-1), 1.0)  # The weights need not sum to one.
  assert not NORMALIZERS["sigmoid"].sums_to_one


def _config(**model):
  c = config_lib.base_config()
  c.model.update(emb_dim=16, num_heads=2, mlp_dim=32, num_encoder_layers=1,
                 num_decoder_layers=1, max_len=16)
  c.model.update(model)
  return c


def test_a_decoder_without_positions_adds_none_and_the_encoder_keeps_its_own():
  model = build_model(_config(decoder_positions="none"), 40)
  same = build_model(_config(), 40)  # Sinusoidal on both sides, the same parameters.
  ids, positions = jnp.array([[4, 5, 6]]), jnp.arange(3)
  np.testing.assert_allclose(model._embed(ids, positions, None, target=True),
                             model.tgt_embed(ids) * math.sqrt(16), rtol=1e-6)
  np.testing.assert_array_equal(model.encode(SRC).encoded, same.encode(SRC).encoded)
  assert not np.allclose(model._embed(ids, positions, None, target=True),
                         same._embed(ids, positions, None, target=True))


def test_no_positions_at_all_make_the_encoder_a_bag_of_words():
  """Without positions, permuting a sentence's words permutes its encodings."""
  model = build_model(_config(positions="none"), 40)
  words, order = jnp.array([[5, 6, 7, 8, 3]]), np.array([3, 0, 2, 1, 4])
  np.testing.assert_allclose(model.encode(words[:, order]).encoded,
                             model.encode(words).encoded[:, order], atol=1e-5)


@pytest.mark.parametrize("model, says", [
    ({"qk_norm": True, "attention": "general"}, "qk_norm=True normalizes the queries and keys"),
    ({"attention": "differential", "emb_dim": 12, "num_heads": 2}, "a multiple of 4"),
    ({"attention": "differential", "attention_normalizer": "entmax15"}, "takes no normalizer"),
    ({"attention": "differential", "positions": "relative"}, "works inside"),
    ({"decoder_positions": "nowhere"}, "config.model.decoder_positions='nowhere' is not a way"),
    ({"decoder_positions": "relative", "attention": "local"}, "config.model.decoder_positions"),
    ({"family": "rnn", "attention": "general", "qk_norm": True}, "is the Transformer's"),
    ({"family": "rnn", "attention": "general", "attention_gate": "headwise"},
     "is the Transformer's"),
])
def test_what_cannot_compose_is_refused_in_one_line(model, says):
  with pytest.raises(UserError, match=says) as error:
    check_config(_config(**model))
  assert "\n" not in str(error.value)


def test_an_unknown_gate_or_scale_is_refused_in_one_line():
  with pytest.raises(UserError, match="attention_gate='everywhere' is not a gate; use one of:"
                                      " none, headwise, elementwise."):
    check_config(_config(attention_gate="everywhere"))
  with pytest.raises(UserError, match="qk_norm_scale=nan must be 0"):
    check_config(_config(qk_norm=True, qk_norm_scale=float("nan")))


@pytest.mark.parametrize("model, says", [
    ({"attention": "local", "attention_window": 15},
     "attention_window=15 reaches every one of config.model.max_len=16 positions, which is full"
     " attention, not 'local'; use attention=scaled_dot, or attention_window below 15."),
    ({"attention": "local_global", "attention_globals": 16},
     "attention_globals=16 reaches every one of config.model.max_len=16 positions"),
    ({"family": "rnn", "attention": "local_m", "attention_window": 20},
     "a window of 2D + 1 words around p_t reaches every one of config.model.max_len=16 source"
     " words, which is global attention"),
])
def test_a_window_as_wide_as_the_sentence_is_refused_as_full_attention(model, says):
  with pytest.raises(UserError, match=re.escape(says)):
    check_config(_config(**model))
  check_config(_config(**{**model, "attention_window": 4, "attention_globals": 2}))
