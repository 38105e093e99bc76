"""Where positions enter the Transformer: the registry `config.model.positions` names.

An entry either adds a vector to every token's embedding at the input
(`sinusoidal`, `learned`), or acts inside self-attention (`relative`, `rope`,
`alibi`, `alibi_directional`) and adds nothing at the input. Inside attention an entry sees the
positions of the queries and keys, `[batch or 1, n]` each (a packed row's
positions restart at every sentence; a decoding step's query is at the cache
index), through up to three functions:

  `rotate(x, positions)`: queries and keys turned by their positions before they
    are scored (RoPE), so the keys in the decoder's cache are stored turned;
  `bias(query, relative, params, num_heads)`: added to the scores `[b, h, q, k]`;
  `value(weights, relative, params)`: added to the weighted sum of the values.

`relative` is the signed distance `key position - query position`, `[b or 1, q,
k]`. Cross-attention takes no positions. Each entry names the attention variants
it composes with (None: every one), which `seq2seq.models.check_config` enforces.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seq2seq.registry import Registry


def sinusoidal_positions(positions: jnp.ndarray, dim: int) -> jnp.ndarray:
  """Sinusoidal position encodings, `[...] -> [..., dim]` (Vaswani et al., 3.5)."""
  inv_freq = np.exp(-np.log(10_000.0) * np.arange(0, dim, 2) / dim)
  angles = positions[..., None].astype(jnp.float32) * inv_freq
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def learned_positions(positions: jnp.ndarray, dim: int, table: nnx.Embed) -> jnp.ndarray:
  """A learned vector per absolute position (Gehring et al., 2017; BERT)."""
  del dim
  return table(positions)


def rotary(x: jnp.ndarray, positions: jnp.ndarray, base: float = 10_000.0) -> jnp.ndarray:
  """RoFormer (Su et al., 2021): each pair of features turned by `position * base^(-2i/d)`.

  `x [batch, heads, n, d]`, `positions [batch or 1, n]`. The pairs are the two halves of
  the head (feature i with feature i + d/2), as GPT-NeoX pairs them: the same rotation as
  the paper's interleaved pairs, up to a fixed permutation of features that the learned
  projections absorb. Then `rotary(q, m) . rotary(k, n)` depends on `m - n` only.
  """
  half = x.shape[-1] // 2
  inv_freq = base ** (-np.arange(half) / half)
  angles = positions[:, None, :, None].astype(jnp.float32) * inv_freq  # [b, 1, n, d/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  turned = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return turned.astype(x.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al. (2022): head h's slope; for 2^k heads the geometric sequence from
  2^(-8/n) with that ratio, otherwise the 2^k below and every other slope of 2^(k+1)."""
  def geometric(n):
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]
  if math.log2(num_heads).is_integer():
    return np.array(geometric(num_heads), np.float32)
  below = 2 ** math.floor(math.log2(num_heads))
  return np.array(geometric(below) + geometric(2 * below)[0::2][:num_heads - below], np.float32)


def alibi_bias(query, relative, params, num_heads):
  """`-slope_h * |key position - query position|`: the symmetric form. The decoder's keys are
  never ahead of its queries, so there it is the paper's causal bias; in the encoder the same
  slope on both sides tells a head how far a key is but not on which side, so a sentence and
  its reverse give mirrored encoder states (`alibi_directional` tells left from right)."""
  del query, params
  slopes = jnp.asarray(alibi_slopes(num_heads))[None, :, None, None]
  return -slopes * jnp.abs(relative[:, None]).astype(jnp.float32)


def alibi_directional_bias(query, relative, params, num_heads):
  """ALiBi with a slope for each side: head h subtracts `m_h * distance` for a key to the
  left of its query (before it) and `m_(H-1-h) * distance` for a key to its right, `m` being
  Press et al.'s slopes (`alibi_slopes`) and H the heads.

  Press et al. (2022) defined ALiBi for causal models only, where every key is on the left;
  the encoder needs the other side too. Keeping their slopes on the left and mirroring them
  on the right gives each head but a middle one (of an odd number) a different reach to
  either side: head 0 looks far right and near left, head H-1 the opposite, and the heads,
  taken together, favour neither direction. The decoder's keys are never to the right of its
  queries, so there it is exactly the paper's causal bias, equal to `alibi_bias`'s.
  """
  del query, params
  slopes = alibi_slopes(num_heads)
  left = jnp.asarray(slopes)[None, :, None, None]
  right = jnp.asarray(slopes[::-1].copy())[None, :, None, None]
  distance = relative[:, None].astype(jnp.float32)  # key - query: negative to the left.
  return jnp.where(distance < 0, left * distance, -right * distance)


class RelativeEmbeddings(nnx.Module):
  """Shaw et al. (2018): key and value vectors for each clipped distance -K..K, shared by
  the heads of one attention layer."""

  def __init__(self, head_dim: int, max_distance: int, rngs: nnx.Rngs):
    self.max_distance = max_distance
    shape = (2 * max_distance + 1, head_dim)
    self.keys = nnx.Param(jax.random.normal(rngs.params(), shape) * head_dim**-0.5)
    self.values = nnx.Param(jax.random.normal(rngs.params(), shape) * head_dim**-0.5)

  def one_hot(self, relative: jnp.ndarray, dtype) -> jnp.ndarray:
    """`[b or 1, q, k]` distances -> `[b or 1, q, k, 2K + 1]`, clipped to -K..K."""
    k = self.max_distance
    return jax.nn.one_hot(jnp.clip(relative, -k, k) + k, 2 * k + 1, dtype=dtype)


def relative_bias(query, relative, params: RelativeEmbeddings, num_heads):
  """`q_i . a^K_ij / sqrt(d)`: the key side of Shaw et al.'s eq. (4), scaled as the score."""
  del num_heads
  per_distance = jnp.einsum("bhqd,rd->bhqr", query, params.keys[...].astype(query.dtype))
  scores = jnp.einsum("bhqr,bqkr->bhqk", per_distance, params.one_hot(relative, query.dtype))
  return scores / jnp.sqrt(query.shape[-1]).astype(query.dtype)


def relative_value(weights, relative, params: RelativeEmbeddings):
  """`sum_j alpha_ij a^V_ij`: the value side of Shaw et al.'s eq. (3)."""
  per_distance = jnp.einsum("bhqk,bqkr->bhqr", weights, params.one_hot(relative, weights.dtype))
  return jnp.einsum("bhqr,rd->bhqd", per_distance, params.values[...].astype(weights.dtype))


class Positions(NamedTuple):
  """A way of giving the Transformer word order (the module docstring says how each acts).

  embed: `(positions, dim, table) -> [..., dim]` added to the scaled embeddings, or None.
  learned_table: it needs a learned `[max_len, dim]` table (the `table` above).
  init: `(num_heads, head_dim, rngs, **hyperparameters) -> params` of one self-attention
    layer, or None.
  attention: the `config.model.attention` names it composes with (None: all).
  hyperparameters: its own settings, named after their `config.model` fields (as
    `attention.Variant.hyperparameters`), bound when a layer is built.
  """
  embed: Callable[..., jnp.ndarray] | None = None
  learned_table: bool = False
  init: Callable[..., Any] | None = None
  rotate: Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray] | None = None
  bias: Callable[..., jnp.ndarray] | None = None
  value: Callable[..., jnp.ndarray] | None = None
  attention: tuple[str, ...] | None = None
  hyperparameters: tuple[str, ...] = ()

  @property
  def in_attention(self) -> bool:
    return self.rotate is not None or self.bias is not None or self.value is not None


# `relative` and the ALiBis add to the scores of scaled dot products (the scale Shaw et al.
# divide by is the score's); rotating queries and keys also suits the plain dot product and
# the window of `local`, whose scores are dot products too.
POSITIONS: Registry[str, Positions] = Registry(
    "position scheme", "config.model.positions", entries={
    "sinusoidal": Positions(embed=lambda positions, dim, table: sinusoidal_positions(
        positions, dim)),
    "learned": Positions(embed=learned_positions, learned_table=True),
    "relative": Positions(
        init=lambda num_heads, head_dim, rngs, max_relative_distance: RelativeEmbeddings(
            head_dim, max_relative_distance, rngs),
        bias=relative_bias, value=relative_value, attention=("scaled_dot",),
        hyperparameters=("max_relative_distance",)),
    "rope": Positions(rotate=rotary, attention=("scaled_dot", "dot", "local", "local_global",
                                                "differential")),
    "alibi": Positions(bias=alibi_bias, attention=("scaled_dot",)),
    # No positions at all (Kazemnejad et al., 2023, for a causal decoder:
    # `config.model.decoder_positions="none"`; in an encoder, a bag of words).
    "none": Positions(),
    "alibi_directional": Positions(bias=alibi_directional_bias, attention=("scaled_dot",)),
})
