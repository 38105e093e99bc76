"""Attention scores by name (`SCORES`), and `attend`, where masking, positions' biases, the
normalizer and the weighted sum of a softmax score happen (the module docstring of `attention`
says how a score is written)."""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.models.heads import dot_score, fold_heads, scaled_dot_score, unfold_heads, weighted_sum
from seq2seq.models.normalizers import masked_softmax
from seq2seq.registry import Registry


class ScoreParams(nnx.Module):
  """The weights of one score function, as named parameters."""

  def __init__(self, **arrays):
    for name, value in arrays.items():
      setattr(self, name, nnx.Param(value))


def _normal(rngs, shape, fan_in):
  return jax.random.normal(rngs.params(), shape) * fan_in**-0.5


class Score(NamedTuple):
  init: Callable[..., ScoreParams | None]
  prepare: Callable[[jnp.ndarray, Any], jnp.ndarray]
  score: Callable[[jnp.ndarray, jnp.ndarray, Any], jnp.ndarray]


def no_params(heads, head_dim, max_keys, rngs):
  del heads, head_dim, max_keys, rngs


def keys_as_they_are(keys, params):
  del params
  return keys


def general_prepare(keys, params):
  """W_a h_s, once per key."""
  return jnp.einsum("bhkd,hed->bhke", keys, params.w[...])


def concat_prepare(keys, params):
  """W_k h_s, once per key: only W_q s changes from step to step."""
  return jnp.einsum("bhkd,hda->bhka", keys, params.w_key[...])


def concat_score(query, keys, params):
  """Bahdanau et al. (2015), additive: v^T tanh(W_q s + W_k h_s) (keys already W_k h_s)."""
  q = jnp.einsum("bhqd,hda->bhqa", query, params.w_query[...])
  hidden = jnp.tanh(q[:, :, :, None, :] + keys[:, :, None, :, :])  # [b, h, q, k, a]
  return jnp.einsum("bhqka,ha->bhqk", hidden, params.v[...])


def location_score(query, keys, params):
  """Luong et al. (2015), location: a_t = softmax(W_a h_t), from the query alone."""
  scores = jnp.einsum("bhqd,hdl->bhql", query, params.w[...])
  return scores[..., :keys.shape[2]]


SCORES: Registry[str, Score] = Registry("attention score", "config.model.attention", entries={
    "scaled_dot": Score(no_params, keys_as_they_are, scaled_dot_score),
    "dot": Score(no_params, keys_as_they_are, dot_score),
    "general": Score(
        lambda h, d, n, rngs: ScoreParams(w=_normal(rngs, (h, d, d), d)),
        general_prepare, dot_score),
    "concat": Score(
        lambda h, d, n, rngs: ScoreParams(w_query=_normal(rngs, (h, d, d), d),
                                          w_key=_normal(rngs, (h, d, d), d),
                                          v=_normal(rngs, (h, d), d)),
        concat_prepare, concat_score),
    "location": Score(
        lambda h, d, n, rngs: ScoreParams(w=_normal(rngs, (h, d, n), d)),
        keys_as_they_are, location_score),
})


def attend(score: Score, query, keys, values, mask: jnp.ndarray | None, params=None, *,
           bias: jnp.ndarray | None = None, normalizer: Callable = masked_softmax):
  """Scores, masks, normalizes and averages the values.

  Args:
    score: an entry of `SCORES`.
    query: `[batch, heads, q, d]`.
    keys: `[batch, kv_heads, k, d']`, already through `score.prepare`; `kv_heads` divides
      `heads` (fewer: each key/value head serves `heads / kv_heads` query heads).
    values: `[batch, kv_heads, k, d_v]`.
    mask: boolean, broadcastable to `[batch, heads, q, k]`, or None.
    params: the score's parameters (None for parameter-free scores).
    bias: added to the scores (positions inside attention), `[batch or 1, heads, q, k]`.
    normalizer: `(scores, mask) -> weights` (`normalizers.NORMALIZERS`).

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`).
  """
  per_key_head = query.shape[1] // keys.shape[1]
  scores = unfold_heads(score.score(fold_heads(query, per_key_head), keys, params), per_key_head)
  if bias is not None:
    scores = scores + bias.astype(scores.dtype)
  weights = normalizer(scores, mask)
  return weighted_sum(weights, values), weights
