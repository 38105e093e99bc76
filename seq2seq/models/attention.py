"""Attention: score functions picked by name, masked softmax, multi-head attention.

Every score function has the signature `score(query, keys, params) -> scores`
with `query [batch, heads, q, d]`, `keys [batch, heads, k, d]` and scores
`[batch, heads, q, k]`. Masking, the softmax and the weighted sum live in
`attend`, the one place they happen, so every variant shares them.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def dot_score(query, keys, params=None):
  """Luong et al. (2015) dot: q . k."""
  del params
  return jnp.einsum("bhqd,bhkd->bhqk", query, keys)


def scaled_dot_score(query, keys, params=None):
  """Vaswani et al. (2017): q . k / sqrt(d)."""
  del params
  return dot_score(query, keys) / jnp.sqrt(query.shape[-1]).astype(query.dtype)


SCORES: dict[str, Callable[..., jnp.ndarray]] = {
    "dot": dot_score,
    "scaled_dot": scaled_dot_score,
}


def masked_softmax(scores: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
  """Softmax over the last axis that gives masked keys exactly zero weight.

  A query whose keys are all masked (a padding row) gets all-zero weights
  instead of a uniform distribution over padding.
  """
  if mask is None:
    return jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(scores.dtype)
  scores = jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1)
  return jnp.where(mask, weights, 0.0).astype(scores.dtype)


def attend(score_fn, query, keys, values, mask, params=None):
  """Scores, masks, normalizes and averages the values.

  Args:
    score_fn: an entry of `SCORES`.
    query: `[batch, heads, q, d]`.
    keys: `[batch, heads, k, d]`.
    values: `[batch, heads, k, d_v]`.
    mask: boolean, broadcastable to `[batch, heads, q, k]`, or None.
    params: whatever the score function needs (None for parameter-free scores).

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`).
  """
  weights = masked_softmax(score_fn(query, keys, params), mask)
  return jnp.einsum("bhqk,bhkd->bhqd", weights, values), weights


def split_heads(x: jnp.ndarray, num_heads: int) -> jnp.ndarray:
  """`[batch, length, heads * d]` -> `[batch, heads, length, d]`."""
  b, length, _ = x.shape
  return x.reshape(b, length, num_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x: jnp.ndarray) -> jnp.ndarray:
  """`[batch, heads, length, d]` -> `[batch, length, heads * d]`."""
  b, h, length, d = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b, length, h * d)


class MultiHeadAttention(nnx.Module):
  """Multi-head attention with a score function chosen by name.

  Keys and values are projected by `project_kv` separately from the query
  path so that callers can compute them once (cross-attention memory, the
  decoder's key/value cache) and pass them in.
  """

  def __init__(self, dim: int, num_heads: int, *, attention: str, dropout_rate: float,
               rngs: nnx.Rngs, dtype: Any = None):
    self.num_heads = num_heads
    self.score_fn = SCORES[attention]
    linear = lambda: nnx.Linear(dim, dim, use_bias=False, dtype=dtype, rngs=rngs)  # noqa: E731
    self.query, self.key, self.value, self.out = linear(), linear(), linear(), linear()
    self.dropout = nnx.Dropout(dropout_rate)

  def project_kv(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`[batch, k, dim]` -> keys, values, each `[batch, heads, k, dim / heads]`."""
    return split_heads(self.key(x), self.num_heads), split_heads(self.value(x), self.num_heads)

  def __call__(self, x, keys, values, mask, *, rngs: nnx.Rngs | None = None,
               return_weights: bool = False):
    """Attends from `x [batch, q, dim]` to projected `keys`/`values`.

    Returns `[batch, q, dim]`, and the weights `[batch, heads, q, k]` when asked.
    """
    query = split_heads(self.query(x), self.num_heads)
    context, weights = attend(self.score_fn, query, keys, values, mask)
    # Dropout on the attention weights only changes the weighted sum.
    if rngs is not None and self.dropout.rate > 0:
      dropped = self.dropout(weights, deterministic=False, rngs=rngs)
      context = jnp.einsum("bhqk,bhkd->bhqd", dropped, values)
    out = self.out(merge_heads(context))
    return (out, weights) if return_weights else out
