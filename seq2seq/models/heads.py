"""What every attention does with heads: scores of dot products, the weighted sum, the heads'
split and merge, their sharing of key/value heads (`fold_heads`), and the rows of beams that
share one sentence's keys (`group_rows`)."""

import jax
import jax.numpy as jnp


def dot_score(query, keys, params=None):
  """Luong et al. (2015), dot: score(h_t, h_s) = h_t . h_s."""
  del params
  return jnp.einsum("bhqd,bhkd->bhqk", query, keys)


def scaled_dot_score(query, keys, params=None):
  """Vaswani et al. (2017): q . k / sqrt(d)."""
  return dot_score(query, keys, params) / jnp.sqrt(query.shape[-1]).astype(query.dtype)


def fold_heads(x: jnp.ndarray, per_key_head: int) -> jnp.ndarray:
  """`[batch, heads, q, ...]` -> `[batch, kv_heads, per_key_head * q, ...]`: the query heads
  that share one key/value head (Ainslie et al., 2023: consecutive heads) as one head's rows.
  A reshape, so keys and values are never copied per query head."""
  if per_key_head == 1:
    return x
  b, h, q = x.shape[:3]
  return x.reshape(b, h // per_key_head, per_key_head * q, *x.shape[3:])


def unfold_heads(x: jnp.ndarray, per_key_head: int) -> jnp.ndarray:
  """The inverse of `fold_heads`."""
  if per_key_head == 1:
    return x
  b, kv, rows = x.shape[:3]
  return x.reshape(b, kv * per_key_head, rows // per_key_head, *x.shape[3:])


def weighted_sum(weights: jnp.ndarray, values: jnp.ndarray) -> jnp.ndarray:
  """`sum_k weights[b, h, q, k] values[b, kv(h), k, :]`, where `values` may have fewer heads
  than `weights` (shared key/value heads)."""
  per_key_head = weights.shape[1] // values.shape[1]
  context = jnp.einsum("bhqk,bhkd->bhqd", fold_heads(weights, per_key_head), values)
  return unfold_heads(context, per_key_head)


def unit_length(x: jnp.ndarray) -> jnp.ndarray:
  """Each vector over the last axis divided by its L2 norm (in float32; zeros stay zeros)."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + 1e-12)).astype(x.dtype)


def split_heads(x: jnp.ndarray, num_heads: int) -> jnp.ndarray:
  """`[batch, length, heads * d]` -> `[batch, heads, length, d]`."""
  b, length, _ = x.shape
  return x.reshape(b, length, num_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x: jnp.ndarray) -> jnp.ndarray:
  """`[batch, heads, length, d]` -> `[batch, length, heads * d]`."""
  b, h, length, d = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b, length, h * d)


def group_rows(x: jnp.ndarray, groups: int) -> jnp.ndarray:
  """`[batch * groups, heads, q, d]` -> `[batch, heads, groups * q, d]`."""
  rows, h, q, d = x.shape
  return x.reshape(rows // groups, groups, h, q, d).swapaxes(1, 2).reshape(-1, h, groups * q, d)


def ungroup_rows(x: jnp.ndarray, groups: int) -> jnp.ndarray:
  """The inverse of `group_rows`."""
  b, h, gq, d = x.shape
  return x.reshape(b, h, groups, gq // groups, d).swapaxes(1, 2).reshape(-1, h, gq // groups, d)
