"""Every attention variant: weights, masks, and agreement with independent implementations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq import config as config_lib
from seq2seq import models
from seq2seq.models import attention, build_model, masks

KEY_IDS = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]])  # PAD = 0
B, H, D = 2, 2, 8


def qkv(q_len, k_len, seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(k1, (B, H, q_len, D)), jax.random.normal(k2, (B, H, k_len, D)),
          jax.random.normal(k3, (B, H, k_len, D)))


def test_cross_attention_of_local_is_full_scaled_dot():
  c = config_lib.base_config()
  c.model.attention = "local"
  model = build_model(c, 50)
  layer = model.decoder_layers[0]
  assert layer.self_attention.attention == "local"
  assert layer.cross_attention.attention == "scaled_dot"


@pytest.mark.parametrize("name", attention.VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["padding", "causal"])
def test_weights_sum_to_one_and_are_zero_where_masked(name, causal):
  """Through MultiHeadAttention, as the models use it: every registered variant, so a new
  score in `SCORES` is checked as attention whichever family declares it."""
  model = config_lib.base_config().model
  model.attention_window = 2
  mha = attention.MultiHeadAttention(H * D, H, attention=name, dropout_rate=0.0,
                                     rngs=nnx.Rngs(0), max_keys=16,
                                     **attention.hyperparameters(model, name))
  x = jax.random.normal(jax.random.key(1), (B, 6, H * D))
  mask = masks.decoder_self_mask(KEY_IDS) if causal else masks.padding_mask(KEY_IDS)
  _, weights = mha(x, *mha.project_kv(x), mask, return_weights=True)
  weights = np.asarray(weights)
  allowed = np.broadcast_to(np.asarray(mask.dense(6)), weights.shape)
  assert np.all(weights[~allowed] == 0.0)
  real_query = np.asarray(KEY_IDS != 0)[:, None, :]  # padding queries may see nothing
  # Differential attention's rows are two maps of one each, the second times lambda.
  total = (1.0 - float(mha.score_params.strength())
           if isinstance(mha.score_params, attention.DifferentialParams) else 1.0)
  np.testing.assert_allclose(weights.sum(-1)[np.broadcast_to(real_query, weights.shape[:3])],
                             total, rtol=1e-5)
  if causal:
    assert np.all(np.triu(weights[:, :, :, :], k=1) == 0.0)


@pytest.mark.parametrize("causal,chunk", [(False, 64), (True, 64), (True, 4), (True, 1)])
def test_linear_attention_equals_its_quadratic_formula(causal, chunk):
  q, k, v = qkv(6, 6)
  mask = masks.decoder_self_mask(KEY_IDS) if causal else masks.padding_mask(KEY_IDS)
  context, _ = attention.linear_attention(q, k, v, mask, chunk=chunk)  # 4: a ragged last chunk
  phi = lambda x: jax.nn.elu(x) + 1  # noqa: E731
  sim = jnp.einsum("bhqd,bhkd->bhqk", phi(q), phi(k)) * mask.dense(6)
  naive = jnp.einsum("bhqk,bhkd->bhqd", sim / (sim.sum(-1, keepdims=True) + 1e-6), v)
  np.testing.assert_allclose(context, naive, atol=1e-5)


def _band_mask(num_queries: int, num_keys: int, window: int) -> jnp.ndarray:
  """`[1, 1, q, k]`: query i sees keys i - window .. i + window (local attention's reference)."""
  offset = jnp.arange(num_keys)[None, :] - jnp.arange(num_queries)[:, None]
  return (jnp.abs(offset) <= window)[None, None]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 3])
def test_local_attention_equals_full_attention_with_band_mask(causal, window):
  q, k, v = qkv(6, 6)
  mask = masks.decoder_self_mask(KEY_IDS) if causal else masks.padding_mask(KEY_IDS)
  context, weights = attention.local_attention(q, k, v, mask, window)
  band = mask.dense(6) & _band_mask(6, 6, window)
  full, full_weights = attention.attend(attention.SCORES["scaled_dot"], q, k, v, band)
  np.testing.assert_allclose(context, full, atol=1e-5)
  np.testing.assert_allclose(weights, full_weights, atol=1e-6)


def _local_global_mask(num_queries, num_keys, window, num_global):
  """`[1, 1, q, k]`: the band, plus every query on the first `num_global` keys and the first
  `num_global` queries on every key (Beltagy et al. 2020, figure 2d)."""
  i, j = jnp.arange(num_queries)[:, None], jnp.arange(num_keys)[None, :]
  return ((jnp.abs(j - i) <= window) | (j < num_global) | (i < num_global))[None, None]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,num_global", [(1, 1), (1, 2), (2, 3), (0, 1)])
def test_local_global_attention_equals_full_attention_under_its_mask(causal, window, num_global):
  q, k, v = qkv(6, 6)
  mask = masks.decoder_self_mask(KEY_IDS) if causal else masks.padding_mask(KEY_IDS)
  context, weights = attention.local_global_attention(q, k, v, mask, window, num_global)
  allowed = mask.dense(6) & _local_global_mask(6, 6, window, num_global)
  full, full_weights = attention.attend(attention.SCORES["scaled_dot"], q, k, v, allowed)
  np.testing.assert_allclose(context, full, atol=1e-5)
  np.testing.assert_allclose(weights, full_weights, atol=1e-6)


@pytest.mark.parametrize("index", [1, 6])
def test_local_global_attention_steps_at_cache_positions(index):
  """A decoding step at position i sees slots i - window .. i and the global ones; a step
  at a global position, every slot up to it."""
  q, k, v = qkv(1, 8)
  context, weights = attention.local_global_attention(q, k, v, masks.cache_mask(index, 8), 1, 2)
  seen = jnp.zeros(8, bool).at[:2].set(True).at[index - 1:index + 1].set(True)
  expected, expected_weights = attention.attend(attention.SCORES["scaled_dot"], q, k, v,
                                                seen[None, None, None, :])
  np.testing.assert_allclose(context, expected, atol=1e-5)
  np.testing.assert_allclose(weights, expected_weights, atol=1e-6)


def test_local_attention_steps_at_cache_positions():
  """A decoding step at position i sees cache slots i - window .. i only."""
  q, k, v = qkv(1, 8)
  index = 5
  context, weights = attention.local_attention(q, k, v, masks.cache_mask(index, 8), 2)
  assert np.all(np.asarray(weights)[..., [0, 1, 2, 6, 7]] == 0.0)
  band = jnp.zeros(8, bool).at[3:6].set(True)[None, None, None, :]
  expected, _ = attention.attend(attention.SCORES["scaled_dot"], q, k, v, band)
  np.testing.assert_allclose(context, expected, atol=1e-5)


def _keras():
  keras = pytest.importorskip("keras", reason="Keras comes with the [tfds] extra's TensorFlow:"
                              " pip install -e '.[tfds]'")
  import tensorflow as tf  # noqa: F401  (Keras' TensorFlow backend)
  return keras


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_luong_dot_matches_keras_attention():
  keras = _keras()
  q, k, v = qkv(4, 6, seed=3)
  mask = masks.padding_mask(KEY_IDS)
  ours, _ = attention.attend(attention.SCORES["dot"], q, k, v, mask.dense(4))
  layer = keras.layers.Attention(use_scale=False)
  theirs = layer([np.asarray(q[:, 0]), np.asarray(v[:, 0]), np.asarray(k[:, 0])],
                 mask=[None, np.asarray(KEY_IDS != 0)])
  np.testing.assert_allclose(ours[:, 0], np.asarray(theirs), atol=1e-5)


def test_bahdanau_additive_matches_keras_additive_attention():
  """With identity W_q, W_k, ours is Keras' v^T tanh(q + k) (its `scale` is our v)."""
  keras = _keras()
  q, k, v = qkv(4, 6, seed=4)
  eye = jnp.broadcast_to(jnp.eye(D), (1, D, D))
  scale = jax.random.normal(jax.random.key(5), (D,))
  params = attention.ScoreParams(w_query=eye, w_key=eye, v=scale[None])
  score = attention.SCORES["concat"]
  q1, k1, v1 = q[:, :1], k[:, :1], v[:, :1]
  ours, _ = attention.attend(score, q1, score.prepare(k1, params), v1,
                             masks.padding_mask(KEY_IDS).dense(4), params)
  layer = keras.layers.AdditiveAttention(use_scale=True)
  layer.build([(B, 4, D), (B, 6, D), (B, 6, D)])
  layer.scale.assign(np.asarray(scale))
  theirs = layer([np.asarray(q1[:, 0]), np.asarray(v1[:, 0]), np.asarray(k1[:, 0])],
                 mask=[None, np.asarray(KEY_IDS != 0)])
  np.testing.assert_allclose(ours[:, 0], np.asarray(theirs), atol=1e-5)


def test_general_and_location_scores_match_their_formulas():
  q, k, _ = qkv(3, 6, seed=6)
  general = attention.SCORES["general"]
  params = general.init(H, D, 10, nnx.Rngs(0))
  w = params.w[...]
  expected = jnp.einsum("bhqd,hde,bhke->bhqk", q, w, k)  # h_t^T W_a h_s
  np.testing.assert_allclose(general.score(q, general.prepare(k, params), params), expected,
                             rtol=1e-4, atol=1e-4)
  location = attention.SCORES["location"]
  params = location.init(H, D, 10, nnx.Rngs(1))
  expected = jnp.einsum("bhqd,hdl->bhql", q, params.w[...])[..., :6]  # W_a h_t
  np.testing.assert_allclose(location.score(q, k, params), expected, rtol=1e-5)


def test_attention_dropout_composes_with_grouped_beams():
  """Cross-attention groups each sentence's beams over its one copy of the keys and values;
  with dropout on the weights, the grouped rows drop what the same rows ungrouped (keys and
  values repeated per beam) drop, and sum the same values."""
  beams = 3
  mha = attention.MultiHeadAttention(H * D, H, attention="scaled_dot", dropout_rate=0.5,
                                     rngs=nnx.Rngs(0))
  source = jax.random.normal(jax.random.key(1), (2, 6, H * D))
  queries = jax.random.normal(jax.random.key(2), (2 * beams, 2, H * D))
  source_ids = jnp.array([[5, 6, 7, 3, 0, 0], [8, 3, 0, 0, 0, 0]])
  keys, values = mha.project_kv(source)
  grouped = mha(queries, keys, values, masks.padding_mask(source_ids), rngs=nnx.Rngs(dropout=4))
  repeat = lambda x: jnp.repeat(x, beams, axis=0)  # noqa: E731
  ungrouped = mha(queries, repeat(keys), repeat(values),
                  masks.padding_mask(repeat(source_ids)), rngs=nnx.Rngs(dropout=4))
  np.testing.assert_allclose(grouped, ungrouped, rtol=1e-5, atol=1e-6)
  no_dropout = mha(queries, keys, values, masks.padding_mask(source_ids))
  assert not np.allclose(grouped, no_dropout)  # Dropout did drop something.


def test_a_variant_with_its_own_hyperparameter_has_it_bound_from_the_config(monkeypatch):
  """docs/extending.md: a variant registered in VARIANTS with a hyperparameter (a softmax
  temperature) and its config field is built from the config by the Transformer's layers,
  with its value bound; temperature 1 is scaled dot-product attention, temperature t that of
  queries divided by t."""
  from seq2seq.models import transformer

  tempered = attention.Variant(
      attention.no_params, attention.keys_as_they_are,
      lambda query, keys, values, mask, params, attention_temperature: attention.attend(
          attention.SCORES["scaled_dot"], query / attention_temperature, keys, values,
          mask.dense(query.shape[2]), params),
      hyperparameters=("attention_temperature",))
  monkeypatch.setitem(attention.VARIANTS, "tempered", tempered)
  config = config_lib.base_config()
  with config.model.unlocked():
    config.model.attention, config.model.attention_temperature = "tempered", 2.0
  models.check_config(config)  # As a command checks it: the Transformer takes it.
  base = config_lib.base_config().model
  x = jax.random.normal(jax.random.key(1), (B, 6, base.emb_dim))
  mask = masks.padding_mask(KEY_IDS)
  weights = {}
  for name, temperature in (("scaled_dot", 1.0), ("tempered", 1.0), ("tempered", 2.0)):
    model = config_lib.base_config().model
    with model.unlocked():
      model.attention, model.attention_temperature = name, temperature  # Its config field.
    layer = transformer._attention(model, nnx.Rngs(0), None)
    assert layer.hyperparameters == (() if name == "scaled_dot"
                                     else (("attention_temperature", temperature),))
    keys, values = layer.project_kv(x)
    weights[name, temperature] = layer(x, keys, values, mask, return_weights=True)[1]
  np.testing.assert_allclose(weights["tempered", 1.0], weights["scaled_dot", 1.0], atol=1e-6)
  assert np.abs(weights["tempered", 2.0] - weights["scaled_dot", 1.0]).max() > 1e-3
  flatter = lambda w: -(w * jnp.log(jnp.maximum(w, 1e-9))).sum(-1).mean()  # noqa: E731
  assert flatter(weights["tempered", 2.0]) > flatter(weights["scaled_dot", 1.0])
