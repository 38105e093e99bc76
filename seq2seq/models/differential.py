"""Differential attention (Ye et al., 2025, "Differential Transformer"): each head's two
softmax maps, subtracted; `attention.VARIANTS["differential"]`."""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.models.heads import fold_heads, scaled_dot_score, unfold_heads, weighted_sum
from seq2seq.models.masks import Mask
from seq2seq.models.normalizers import masked_softmax


def map_features(x: jnp.ndarray, which: int) -> jnp.ndarray:
  """`[..., d] -> [..., d / 2]`: the features of map `which` (0 or 1) of a differential head.

  Of the head's two halves (feature i and i + d/2 are the pair that rotary positions turn
  together), each map takes the even (0) or odd (1) features of both: whole pairs, at
  frequencies spread over the whole range, so each map's scores stay relative under `rope`.
  For positions outside attention any fixed split is the same up to the learned projections.
  """
  *lead, d = x.shape
  return x.reshape(*lead, 2, d // 4, 2)[..., which].reshape(*lead, d // 2)


class DifferentialParams(nnx.Module):
  """Ye et al. (2025), "Differential Transformer": the layer's lambda, reparameterized as
  `exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init` (each vector of the maps' size, drawn from
  N(0, 0.1^2)), with `lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))` for the layer's depth l
  (from 1), and the per-head RMSNorm's gain (one per feature, shared by the heads)."""

  def __init__(self, head_dim: int, layer: int, rngs: nnx.Rngs):
    half = head_dim // 2
    self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)  # Static: `layer` counts from 0.
    draw = lambda: nnx.Param(jax.random.normal(rngs.params(), (half,)) * 0.1)  # noqa: E731
    self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = draw(), draw(), draw(), draw()
    self.gain = nnx.Param(jnp.ones((head_dim,), jnp.float32))

  def strength(self) -> jnp.ndarray:
    """lambda, a float32 scalar."""
    dot = lambda a, b: jnp.sum(a[...] * b[...])  # noqa: E731
    return (jnp.exp(dot(self.lambda_q1, self.lambda_k1))
            - jnp.exp(dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init)


def differential_attend(query, keys, values, mask: Mask, params: DifferentialParams, *,
                        bias: jnp.ndarray | None = None, maps: bool = False):
  """Ye et al. (2025), eq. (1) and (3): each head's two softmax maps, of its queries' and
  keys' two feature sets (`map_features`) scaled by sqrt(d / 2), subtracted,
  `w = softmax(Q1 K1^T / sqrt(d/2)) - lambda softmax(Q2 K2^T / sqrt(d/2))`; the head's output
  `(1 - lambda_init) RMSNorm(w V)`. Returns that and `w`, whose rows sum to `1 - lambda` and
  may be negative. `bias` (positions inside attention) is added to both maps' scores. With
  `maps`, also the maps: `{"map1", "map2"}` (`[batch, heads, q, k]`, each row summing to 1)
  and `lambda` (`[batch, heads, q, 1]`, the layer's one lambda repeated)."""
  dense = mask.dense(query.shape[2])
  per_key_head = query.shape[1] // keys.shape[1]

  def weights_of(which):
    q, k = map_features(query, which), map_features(keys, which)
    scores = unfold_heads(scaled_dot_score(fold_heads(q, per_key_head), k), per_key_head)
    if bias is not None:
      scores = scores + bias.astype(scores.dtype)
    return masked_softmax(scores, dense)

  first, second, strength = weights_of(0), weights_of(1), params.strength().astype(query.dtype)
  weights = first - strength * second
  context = weighted_sum(weights, values).astype(jnp.float32)
  normed = context * jax.lax.rsqrt(jnp.mean(context**2, axis=-1, keepdims=True) + 1e-5)
  out = normed * params.gain[...] * (1.0 - params.lambda_init)
  if maps:
    return out.astype(values.dtype), weights, {
        "map1": first, "map2": second,
        "lambda": jnp.broadcast_to(strength, weights.shape[:-1] + (1,))}
  return out.astype(values.dtype), weights
