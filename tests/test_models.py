"""Transformer invariants: masking, cached decoding, dropout, config reaching the model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.models import ATTENTION_BY_FAMILY, attention, build_model, check_config, masks
from seq2seq.models.normalizers import NORMALIZERS
from seq2seq.models.positions import POSITIONS
from seq2seq.models.transformer import sinusoidal_positions
from tests.helpers import assert_stepping_matches_decode

VOCAB = 40


TRANSFORMER_VARIANTS = ATTENTION_BY_FAMILY["transformer"]


# Every attention variant; every way of giving positions, with each variant it composes with
# beyond scaled_dot; shared key/value heads (4 query heads on 2 and on 1), also beside
# positions inside attention; every normalizer. Each: {config.model field: value}.
MODEL_CASES = (
    [{"attention": "scaled_dot", "pre_ln": False}]
    + [{"attention": name} for name in TRANSFORMER_VARIANTS]
    + [{"positions": name} for name in POSITIONS if name != "sinusoidal"]
    + [{"positions": "rope", "attention": name} for name in ("dot", "local", "local_global")]
    + [{"num_heads": 4, "num_kv_heads": kv} for kv in (2, 1)]
    + [{"num_heads": 4, "num_kv_heads": 2, "positions": name} for name in ("relative", "rope",
                                                                           "alibi")]
    + [{"attention_normalizer": name} for name in NORMALIZERS if name != "softmax"]
    + [{"attention_normalizer": "entmax15", "attention": "local"},
       {"attention_normalizer": "sparsemax", "positions": "relative", "num_heads": 4,
        "num_kv_heads": 1}]
    # The attention of 2025: QK-norm beside each dot product, positions and shared heads;
    # gates; differential attention with rotary positions; sigmoid weights in a window; a
    # decoder without positions (or other positions than the encoder's).
    + [{"qk_norm": True, "attention": name} for name in ("scaled_dot", "dot", "local",
                                                          "local_global")]
    + [{"qk_norm": True, "positions": "rope"},
       {"qk_norm": True, "positions": "relative", "num_heads": 4, "num_kv_heads": 2}]
    + [{"attention_gate": gate} for gate in ("headwise", "elementwise")]
    + [{"attention_gate": "headwise", "num_heads": 4, "num_kv_heads": 1, "qk_norm": True},
       {"attention": "differential", "positions": "rope"},
       {"attention": "differential", "attention_gate": "headwise"},
       {"attention_normalizer": "sigmoid", "attention": "local"}]
    + [{"decoder_positions": "none"}, {"positions": "rope", "decoder_positions": "none"},
       {"positions": "relative", "decoder_positions": "learned"}]
)


# Core: what the default run steps. Every variant, each position scheme alone, multi-query
# heads, entmax15 and the learned alpha; the other combinations run with -m slow, and only the
# stepping test takes them (the padding and dropout tests take the variants).
CORE = ([case for case in MODEL_CASES[:len(TRANSFORMER_VARIANTS) + 1]]
        + [{"positions": name} for name in POSITIONS if name != "sinusoidal"]
        + [{"num_heads": 4, "num_kv_heads": 1}, {"attention_normalizer": "entmax15"},
           {"attention_normalizer": "entmax_learned"},
           {"positions": "rope", "attention": "local_global"},
           {"qk_norm": True, "positions": "rope"}, {"attention_gate": "headwise"},
           {"attention_gate": "elementwise"}, {"attention": "differential", "positions": "rope"},
           {"positions": "rope", "decoder_positions": "none"}])


def _case_id(case):
  return "-".join(f"{k}={v}" for k, v in case.items())


@pytest.fixture(params=[case if case in CORE else pytest.param(case, marks=pytest.mark.slow)
                        for case in MODEL_CASES], ids=_case_id)
def any_model(request, tiny_config):
  return _model(tiny_config, request.param)


@pytest.fixture(params=MODEL_CASES[:len(TRANSFORMER_VARIANTS) + 1], ids=_case_id)
def model(request, tiny_config):
  return _model(tiny_config, request.param)


def _model(tiny_config, case):
  tiny_config.model.attention_window = 2
  tiny_config.model.max_relative_distance = 3  # Shorter than the sentences: clipping acts.
  tiny_config.model.num_encoder_layers = 2
  tiny_config.model.num_decoder_layers = 2
  tiny_config.model.update(case)
  if tiny_config.model.num_heads == 4:
    tiny_config.model.emb_dim = 32  # Head size 8.
  check_config(tiny_config)
  return build_model(tiny_config, VOCAB)


SRC = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]])  # EOS=3, PAD=0
TGT = jnp.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]])  # BOS=2


def test_padded_key_gets_exactly_zero_weight():
  scores = jax.random.normal(jax.random.key(0), (2, 3, 4, 6))
  mask = masks.padding_mask(SRC).dense(4)
  weights = attention.masked_softmax(scores, mask)
  padded = np.broadcast_to(~np.asarray(mask), weights.shape)
  assert np.all(np.asarray(weights)[padded] == 0.0)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
  # A fully masked row (a padding query) gets no weight at all, not a uniform spread.
  assert np.all(attention.masked_softmax(scores, jnp.zeros((1, 1, 1, 6), bool)) == 0.0)


def test_causal_mask_blocks_future_positions():
  scores = jax.random.normal(jax.random.key(1), (2, 1, 5, 5))
  weights = np.asarray(attention.masked_softmax(scores, masks.decoder_self_mask(TGT).dense(5)))
  assert np.all(np.triu(weights[0, 0], k=1) == 0.0)
  assert np.all(weights[1, 0, :, 3:] == 0.0)  # padded target keys


def test_padding_does_not_change_encoder_outputs(any_model):
  """Appending PAD to a source leaves every real position's encoding unchanged."""
  short = any_model.encode(SRC[:, :5]).encoded
  long = any_model.encode(jnp.pad(SRC, ((0, 0), (0, 3)))).encoded
  np.testing.assert_allclose(short[0, :5], long[0, :5], atol=1e-5)


def test_decode_step_reproduces_teacher_forced_decode(any_model):
  cache = assert_stepping_matches_decode(any_model, SRC, TGT)
  assert int(cache.index) == TGT.shape[1]


def test_dropout_only_with_rngs(model):
  memory = model.encode(SRC)
  a, b = model.decode(memory, TGT), model.decode(memory, TGT)
  np.testing.assert_array_equal(a, b)
  c = model.decode(model.encode(SRC, rngs=nnx.Rngs(dropout=0)), TGT, rngs=nnx.Rngs(dropout=0))
  assert not np.allclose(a, c)


def test_sinusoidal_positions_match_formula():
  pe = np.asarray(sinusoidal_positions(jnp.arange(7), 8))
  pos, i = 5, 1
  np.testing.assert_allclose(pe[pos, i], np.sin(pos / 10000 ** (2 * i / 8)), rtol=1e-5)
  np.testing.assert_allclose(pe[pos, 4 + i], np.cos(pos / 10000 ** (2 * i / 8)), rtol=1e-5)


def test_multi_head_attention_matches_jax_reference():
  """Our projections + masked softmax equal jax.nn.dot_product_attention."""
  mha = attention.MultiHeadAttention(16, 4, attention="scaled_dot", dropout_rate=0.0,
                                     rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(2), (2, 5, 16))
  mem = jax.random.normal(jax.random.key(3), (2, 6, 16))
  mask = masks.padding_mask(SRC)
  ours = mha(x, *mha.project_kv(mem), mask)
  q = mha.query(x).reshape(2, 5, 4, 4)
  k, v = mha.key(mem).reshape(2, 6, 4, 4), mha.value(mem).reshape(2, 6, 4, 4)
  ref = jax.nn.dot_product_attention(q, k, v, mask=mask.dense(5)).reshape(2, 5, 16)
  np.testing.assert_allclose(ours, mha.out(ref), atol=1e-5)


def test_unshared_embeddings_have_separate_tables(tiny_config):
  tiny_config.model.share_embeddings = False
  model = build_model(tiny_config, VOCAB)
  assert model.src_embed is not model.tgt_embed
  assert model.decode(model.encode(SRC), TGT).shape == (2, 5, VOCAB)
