"""Positions (models/positions.py): known answers, the papers' formulas written out, packing,
and config validation. Cached decoding against teacher forcing for every entry is
test_models.py's (its `model` fixture loops over POSITIONS)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.errors import UserError
from seq2seq.models import attention, build_model, check_config, masks, positions
from seq2seq.models.positions import POSITIONS
from tests.helpers import assert_stepping_matches_decode

VOCAB = 40
SRC = jnp.array([[5, 6, 7, 8, 9, 10, 3, 0], [9, 10, 3, 0, 0, 0, 0, 0]])  # EOS=3, PAD=0


def test_alibi_slopes_are_the_papers():
  # Press et al. (2022), section 3: 8 heads get 1/2, 1/4, ..., 1/256.
  np.testing.assert_allclose(positions.alibi_slopes(8), [2.0**-i for i in range(1, 9)])
  # 4 heads: 2^-2, 2^-4, 2^-6, 2^-8.
  np.testing.assert_allclose(positions.alibi_slopes(4), [2.0**-i for i in (2, 4, 6, 8)])
  # 6 heads (not a power of 2): the 4 of 4 heads, then every other slope of 8 heads: 1/2, 1/8.
  np.testing.assert_allclose(positions.alibi_slopes(6),
                             [2.0**-i for i in (2, 4, 6, 8)] + [2.0**-1, 2.0**-3])


def test_rope_scores_depend_on_the_distance_only():
  q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 8))
  def score(m, n):
    return float(jnp.sum(positions.rotary(q, jnp.array([[m]])) * positions.rotary(k,
                                                                                  jnp.array([[n]]))))
  np.testing.assert_allclose(score(5, 2), score(13, 10), rtol=1e-5)
  np.testing.assert_allclose(score(0, 0), float(jnp.sum(q * k)), rtol=1e-5)  # No turn at 0.
  assert abs(score(5, 2) - score(2, 5)) > 1e-3  # But the sign of the distance matters.
  # Turning keeps the length of every pair.
  turned = positions.rotary(q, jnp.array([[7]]))
  np.testing.assert_allclose(jnp.linalg.norm(turned), jnp.linalg.norm(q), rtol=1e-6)


def test_rope_turns_the_first_pair_by_the_position():
  x = jnp.zeros((1, 1, 1, 4)).at[..., 0].set(1.0)  # (x_0, x_2) = (1, 0), frequency 1.
  turned = positions.rotary(x, jnp.array([[3]]))
  np.testing.assert_allclose(turned[0, 0, 0], [np.cos(3.0), 0.0, np.sin(3.0), 0.0], atol=1e-6)


def test_rope_turns_every_pair_at_su_et_als_frequency():
  """Pair i (features i and i + d/2, GPT-NeoX's pairing) turns by position * 10000^(-2i/d)
  (Su et al., 2021, eq. 15), written out here for each pair of a d = 16 head: a wrong base,
  exponent or pairing fails, as the two tests above would not see."""
  d, position = 16, 11
  x = np.asarray(jax.random.normal(jax.random.key(3), (d,)), np.float64)
  turned = np.asarray(positions.rotary(jnp.asarray(x, jnp.float32)[None, None, None],
                                       jnp.array([[position]])))[0, 0, 0]
  expected = np.empty(d)
  for i in range(d // 2):
    theta = position * 10000.0 ** (-2 * i / d)
    expected[i] = x[i] * np.cos(theta) - x[i + d // 2] * np.sin(theta)
    expected[i + d // 2] = x[i + d // 2] * np.cos(theta) + x[i] * np.sin(theta)
  np.testing.assert_allclose(turned, expected, rtol=1e-5, atol=1e-5)


def _layer(position: str, num_heads=2, num_kv_heads=0, **hyperparameters):
  return attention.MultiHeadAttention(8, num_heads, attention="scaled_dot", dropout_rate=0.0,
                                      rngs=nnx.Rngs(params=0), num_kv_heads=num_kv_heads,
                                      positions=position, **hyperparameters)


def test_relative_attention_is_shaw_et_als_equations():
  """Eqs. (3)-(4) of Shaw et al. (2018), written as loops over i and j."""
  layer = _layer("relative", max_relative_distance=2)
  x = jax.random.normal(jax.random.key(1), (1, 5, 8))
  pos = jnp.arange(5)[None]
  mask = masks.padding_mask(jnp.ones((1, 5), jnp.int32))
  out, weights = layer(x, *layer.project_kv(x, pos), mask, positions=(pos, pos),
                       return_weights=True)
  q = np.asarray(attention.split_heads(layer.query(x), 2))[0]
  k = np.asarray(attention.split_heads(layer.key(x), 2))[0]
  v = np.asarray(attention.split_heads(layer.value(x), 2))[0]
  table = layer.position_params
  a_k, a_v = np.asarray(table.keys[...]), np.asarray(table.values[...])
  context = np.zeros((2, 5, 4))
  for h in range(2):
    for i in range(5):
      e = np.array([q[h, i] @ (k[h, j] + a_k[np.clip(j - i, -2, 2) + 2]) / 2.0 for j in range(5)])
      alpha = np.exp(e - e.max()) / np.exp(e - e.max()).sum()
      np.testing.assert_allclose(weights[0, h, i], alpha, rtol=1e-5, atol=1e-6)
      context[h, i] = sum(alpha[j] * (v[h, j] + a_v[np.clip(j - i, -2, 2) + 2]) for j in range(5))
  expected = np.asarray(layer.out(attention.merge_heads(jnp.asarray(context)[None])))
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_alibi_subtracts_the_slope_times_the_distance():
  layer, plain = _layer("alibi"), _layer(None)
  x = jax.random.normal(jax.random.key(2), (1, 4, 8))
  pos = jnp.arange(4)[None]
  mask = masks.padding_mask(jnp.ones((1, 4), jnp.int32))
  _, weights = layer(x, *layer.project_kv(x, pos), mask, positions=(pos, pos),
                     return_weights=True)
  _, plain_weights = plain(x, *plain.project_kv(x), mask, return_weights=True)
  # The log-weights differ from plain attention's by -m_h |i - j|, up to a constant per row.
  distance = np.abs(np.arange(4)[None] - np.arange(4)[:, None])
  for h, slope in enumerate(positions.alibi_slopes(2)):
    diff = np.log(weights[0, h]) - np.log(plain_weights[0, h]) + slope * distance
    np.testing.assert_allclose(diff - diff[:, :1], 0.0, atol=1e-5)


@pytest.mark.parametrize("position, mirrored", [("alibi", True), ("rope", False),
                                                  ("sinusoidal", False),
                                                  ("alibi_directional", False)])
def test_only_alibi_cannot_tell_a_sentence_from_its_reverse(tiny_config, position, mirrored):
  """ALiBi's encoder bias is -m_h |i - j|, the same on both sides, and cross-attention takes no
  positions: a source whose tokens are reversed gives the reversed encoder states, and so the
  same logits for every target (docs/experiments.md, "Rotary and ALiBi positions. Two seeds")."""
  tiny_config.model.positions = position
  model = build_model(tiny_config, VOCAB)
  forward = model.encode(SRC[:1])  # 5 6 7 8 9 10 EOS PAD
  backward = model.encode(jnp.array([[3, 10, 9, 8, 7, 6, 5, 0]]))
  same_states = np.allclose(forward.encoded[0, :7], backward.encoded[0, 6::-1], atol=1e-5)
  tgt_in = jnp.array([[2, 11, 12, 13]])
  same_logits = np.allclose(model.decode(forward, tgt_in), model.decode(backward, tgt_in),
                            atol=1e-5)
  assert same_states == same_logits == mirrored


# Press et al.'s slopes written out (section 3): 4 heads 2^-2, 2^-4, 2^-6, 2^-8; 3 heads the
# two of 2 heads (2^-4, 2^-8), then the first of 4 heads' (2^-2).
PAPER_SLOPES = {4: [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], 3: [2.0**-4, 2.0**-8, 2.0**-2]}


@pytest.mark.parametrize("num_heads", sorted(PAPER_SLOPES))
def test_directional_alibi_has_the_papers_slopes_on_the_left_and_mirrored_on_the_right(
    num_heads):
  """Head h: -m_h (i - j) for a key j left of query i, -m_(H-1-h) (j - i) for one to its
  right; positions as a packed row's (restarting at each sentence), written as loops."""
  m = PAPER_SLOPES[num_heads]
  pos = np.array([0, 1, 2, 3, 4, 0, 1, 2])
  relative = jnp.asarray(pos[None, None, :] - pos[None, :, None])
  bias = np.asarray(positions.alibi_directional_bias(None, relative, None, num_heads))
  assert bias.shape == (1, num_heads, 8, 8)
  for h in range(num_heads):
    for i in range(8):
      for j in range(8):
        d = int(pos[j] - pos[i])
        expected = -m[h] * -d if d < 0 else -m[num_heads - 1 - h] * d
        np.testing.assert_allclose(bias[0, h, i, j], expected, rtol=1e-6, atol=0)
  # Every head but a middle one (of an odd number) tells left from right.
  for h in range(num_heads):
    symmetric = np.allclose(bias[0, h, :5, :5], bias[0, h, :5, :5].T)
    assert symmetric == (2 * h + 1 == num_heads)


def test_directional_alibi_is_the_papers_causal_alibi_in_the_decoder(tiny_config):
  """Left of the query (all a decoder sees) the bias is `alibi`'s, bit for bit; a model with
  each, from the same seed, decodes the same memory to the same logits, and encodes
  differently."""
  relative = jnp.arange(9)[None, None, :] - jnp.arange(9)[None, :, None]
  causal = np.tril(np.ones((9, 9), bool))
  for heads in (1, 2, 3, 4, 8):
    directional = positions.alibi_directional_bias(None, relative, None, heads)
    symmetric = positions.alibi_bias(None, relative, None, heads)
    np.testing.assert_array_equal(np.asarray(directional)[..., causal],
                                  np.asarray(symmetric)[..., causal])
  tiny_config.model.update(num_heads=4, num_decoder_layers=2)
  built = {}
  for name in ("alibi", "alibi_directional"):
    tiny_config.model.positions = name
    built[name] = build_model(tiny_config, VOCAB)
  memory = built["alibi"].encode(SRC)
  tgt_in = jnp.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]])
  np.testing.assert_array_equal(built["alibi_directional"].decode(memory, tgt_in),
                                built["alibi"].decode(memory, tgt_in))
  assert not np.allclose(built["alibi_directional"].encode(SRC).encoded, memory.encoded)


def _reversal_change(config, position: str) -> float:
  """How much reversing a sentence's words (its EOS kept last) moves the decoder's
  log-probabilities, relative to how far they are from uniform, at fresh parameters."""
  config.model.positions = position
  model = build_model(config, VOCAB)
  forward = jnp.array([[5, 6, 7, 8, 9, 10, 11, 3]])
  backward = jnp.array([[11, 10, 9, 8, 7, 6, 5, 3]])
  tgt_in = jnp.array([[2, 12, 13, 14, 15]])
  a, b = (jax.nn.log_softmax(model.decode(model.encode(src), tgt_in)) for src in (forward,
                                                                                  backward))
  return float(jnp.abs(a - b).mean() / jnp.abs(a - a.mean(-1, keepdims=True)).mean())


@pytest.mark.parametrize("seed", [0, 1])
def test_directional_alibi_tells_a_sentence_from_its_reverse_as_rope_does(tiny_config, seed):
  """Reversing the words (EOS kept last) moves the logits of a `rope` model; `alibi`'s
  symmetric encoder bias sees only where EOS went, `alibi_directional` sees every word's
  side. Four heads (the recipe's; slopes 1/4 .. 1/256): with configs/tiny.py's two, the
  slopes are 1/16 and 1/256, and fresh weights hardly feel any distance."""
  tiny_config.model.num_heads = 4
  tiny_config.train.seed = seed
  change = {name: _reversal_change(tiny_config, name)
            for name in ("rope", "alibi", "alibi_directional")}
  assert change["alibi_directional"] > change["rope"] / 3, change
  assert change["alibi_directional"] > 1.5 * change["alibi"], change


def test_shared_key_value_heads_equal_repeated_heads():
  """Grouped-query attention is attention whose key/value heads are repeated per group."""
  grouped = _layer("alibi", num_heads=4, num_kv_heads=2)
  x = jax.random.normal(jax.random.key(3), (2, 5, 8))
  pos = jnp.arange(5)[None]
  mask = masks.padding_mask(jnp.array([[5, 6, 7, 3, 0], [5, 3, 0, 0, 0]]))
  keys, values = grouped.project_kv(x, pos)
  assert keys.shape == values.shape == (2, 2, 5, 2)
  out = grouped(x, keys, values, mask, positions=(pos, pos))
  repeated = grouped(x, jnp.repeat(keys, 2, axis=1), jnp.repeat(values, 2, axis=1), mask,
                     positions=(pos, pos))
  np.testing.assert_allclose(out, repeated, rtol=1e-6, atol=1e-6)


def test_the_cache_holds_only_the_shared_heads(tiny_config):
  tiny_config.model.update(num_heads=4, num_kv_heads=1)
  model = build_model(tiny_config, VOCAB)
  cache = model.init_cache(model.encode(SRC), 10)
  assert cache.self_kv[0][0].shape == (2, 1, 10, 8)


def test_learned_positions_are_a_table_of_max_len_rows(tiny_config):
  tiny_config.model.positions = "learned"
  model = build_model(tiny_config, VOCAB)
  assert model.position_table.embedding.shape == (tiny_config.model.max_len, 32)
  # The table is what separates two positions of one token: change a row, change the encoding.
  before = model.encode(SRC).encoded
  model.position_table.embedding[...] = model.position_table.embedding[...].at[2].add(
      jax.random.normal(jax.random.key(4), (32,)))
  after = model.encode(SRC).encoded
  assert not np.allclose(before[0, 2], after[0, 2])


@pytest.mark.parametrize("overrides, says", [
    ({"positions": "absolute"}, "is not a way of giving positions"),
    ({"positions": "relative", "attention": "linear"}, "works inside scaled_dot attention"),
    ({"positions": "rope", "attention": "linear"}, "works inside scaled_dot, dot, local"),
    ({"num_kv_heads": 3, "num_heads": 4}, "does not divide config.model.num_heads=4"),
    ({"num_kv_heads": 1, "attention": "local"}, "which 'local' attention cannot"),
    ({"positions": "rope", "emb_dim": 30, "num_heads": 10}, "heads an even size"),
    ({"family": "rnn", "attention": "general", "positions": "rope"}, "not available for the rnn"),
    ({"family": "rnn", "attention": "general", "num_kv_heads": 1}, "no key/value heads"),
])
def test_what_does_not_compose_is_refused_in_one_line(tiny_config, overrides, says):
  tiny_config.model.update(overrides)
  with pytest.raises(UserError, match=says) as error:
    check_config(tiny_config)
  assert "\n" not in str(error.value)


def test_every_entry_declares_only_variants_that_exist():
  for entry in POSITIONS.values():
    assert entry.attention is None or set(entry.attention) <= set(attention.VARIANTS)


class HeadDistanceBias(nnx.Module):
  """docs/extending.md's example: a learned scalar per head and clipped distance."""

  def __init__(self, num_heads, max_distance, rngs):
    self.max_distance = max_distance
    self.table = nnx.Param(jnp.zeros((num_heads, 2 * max_distance + 1)))


def head_distance_bias(query, relative, params, num_heads):
  k = params.max_distance
  return params.table[...][:, jnp.clip(relative, -k, k) + k].swapaxes(0, 1)


def test_a_new_position_entry_decodes_as_it_trains(monkeypatch, tiny_config):
  """docs/extending.md, "Positions": the example entry, registered, passes check_config as a
  command checks it (and beside another attention is refused in one line), steps as it
  teacher-forces, and its bias reaches the scores."""
  monkeypatch.setitem(POSITIONS, "t5_bias", positions.Positions(
      init=lambda num_heads, head_dim, rngs, max_relative_distance: HeadDistanceBias(
          num_heads, max_relative_distance, rngs),
      bias=head_distance_bias, attention=("scaled_dot",),
      hyperparameters=("max_relative_distance",)))
  tiny_config.model.update(positions="t5_bias", max_relative_distance=2, attention="dot")
  with pytest.raises(UserError, match="'t5_bias' works inside scaled_dot attention, not 'dot'"):
    check_config(tiny_config)
  tiny_config.model.attention = "scaled_dot"
  check_config(tiny_config)
  model = build_model(tiny_config, VOCAB)
  tgt = jnp.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]])
  assert_stepping_matches_decode(model, SRC, tgt)
  before = model.encode(SRC).encoded
  table = model.encoder_layers[0].self_attention.position_params.table
  table[...] = jax.random.normal(jax.random.key(5), table.shape)
  assert not np.allclose(before, model.encode(SRC).encoded)
