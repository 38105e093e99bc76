"""The attention kernels that replace the softmax over every key: `linear` (kernelized,
O(n)) and `local` (a window, O(n w)). `attention.VARIANTS` registers them; masks reach them
in their structured form (`Mask`), which is what makes them sub-quadratic."""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from seq2seq.models.masks import Mask
from seq2seq.models.normalizers import masked_softmax


def _feature_map(x):
  """Katharopoulos et al. (2020): phi(x) = elu(x) + 1, positive."""
  return jax.nn.elu(x) + 1.0


def _exclusive_cumsum(x, axis):
  """Sums of everything before each position along `axis` (zero at the first)."""
  total = jnp.cumsum(x, axis=axis)
  return jnp.concatenate([jnp.zeros_like(jax.lax.slice_in_dim(x, 0, 1, axis=axis)),
                          jax.lax.slice_in_dim(total, 0, -1, axis=axis)], axis=axis)


def _causal_linear_sums(q, k, v, chunk: int):
  """`sum_{j<=i} (q_i . k_j) v_j` and `sum_{j<=i} q_i . k_j` for every position i.

  Chunk by chunk: within a chunk the `[chunk, chunk]` products are formed
  directly; across chunks one `d x d_v` key-value sum per chunk is carried (not
  one per position, which would take `chunk` times the memory). Work is
  O(n * chunk * d + n * d^2), linear in the length n.
  """
  b, h, t, _ = q.shape
  size = min(chunk, t)
  n = -(-t // size)
  q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, n * size - t), (0, 0))).reshape(b, h, n, size, -1)
             for x in (q, k, v))
  within = jnp.einsum("bhncd,bhnkd->bhnck", q, k) * jnp.tril(jnp.ones((size, size), q.dtype))
  kv_before = _exclusive_cumsum(jnp.einsum("bhnkd,bhnke->bhnde", k, v), axis=2)
  k_before = _exclusive_cumsum(k.sum(axis=3), axis=2)
  numerator = (jnp.einsum("bhnck,bhnke->bhnce", within, v)
               + jnp.einsum("bhncd,bhnde->bhnce", q, kv_before))
  denominator = within.sum(-1) + jnp.einsum("bhncd,bhnd->bhnc", q, k_before)
  return (numerator.reshape(b, h, n * size, -1)[:, :, :t],
          denominator.reshape(b, h, n * size)[:, :, :t])


def linear_attention(query, keys, values, mask: Mask, eps: float = 1e-6, chunk: int = 64):
  """Kernelized attention: phi(q)^T sum_j phi(k_j) v_j^T / phi(q)^T sum_j phi(k_j).

  O(n) in sequence length: the key/value sums are formed once (chunked prefix
  sums when causal, see `_causal_linear_sums`) instead of a `[q, k]` matrix.

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`); the
    weights are formed only if a caller uses them (XLA drops them otherwise).
  """
  if mask.segmented:  # The prefix sums below would run across packed sentences.
    raise ValueError("linear attention does not support packed rows (segment ids).")
  q = _feature_map(query)
  k = _feature_map(keys) * mask.key_valid[:, None, :, None]
  if mask.causal:  # Teacher-forced decoder: query i sums keys 0..i.
    numerator, denominator = _causal_linear_sums(q, k, values, chunk)
  else:
    numerator = jnp.einsum("bhqd,bhde->bhqe", q, jnp.einsum("bhkd,bhke->bhde", k, values))
    denominator = jnp.einsum("bhqd,bhd->bhq", q, k.sum(axis=2))
  context = numerator / (denominator[..., None] + eps)
  similarity = jnp.einsum("bhqd,bhkd->bhqk", q, k) * mask.dense(query.shape[2])
  weights = similarity / (similarity.sum(-1, keepdims=True) + eps)
  return context, weights


def local_attention(query, keys, values, mask: Mask, window: int,
                    normalizer: Callable = masked_softmax, dropout: Callable | None = None):
  """Scaled dot-product attention within `window` positions of each query.

  Each query gathers only its `2 * window + 1` neighbouring keys, so the work
  is O(n * window), not O(n^2). Positions come from the mask, so a decoding
  step at position i sees cache slots i - window .. i. `dropout` (attention dropout, or
  None) acts on the window's weights before their sum, which stays O(n * window).

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`, before dropout).
  """
  num_queries, num_keys = query.shape[2], keys.shape[2]
  offsets = jnp.arange(-window, window + 1)
  index = mask.query_positions(num_queries)[:, None] + offsets  # [q, w]
  valid = (index >= 0) & (index < num_keys)
  index = jnp.clip(index, 0, num_keys - 1)
  valid = valid[None] & mask.key_valid[:, index]  # [batch, q, w]
  if mask.segmented:
    valid = valid & (mask.key_segments[:, index] == mask.query_segments[:, :, None])
  if mask.causal:
    valid = valid & (offsets <= 0)
  near_keys, near_values = keys[:, :, index], values[:, :, index]  # [b, h, q, w, d]
  scores = jnp.einsum("bhqd,bhqwd->bhqw", query, near_keys) / jnp.sqrt(query.shape[-1])
  near_weights = normalizer(scores, valid[:, None])
  summed = near_weights if dropout is None else dropout(near_weights)
  context = jnp.einsum("bhqw,bhqwd->bhqd", summed, near_values)
  one_hot = jax.nn.one_hot(index, num_keys, dtype=near_weights.dtype)  # [q, w, k]
  weights = jnp.einsum("bhqw,qwk->bhqk", near_weights, one_hot)
  return context, weights


def local_global_attention(query, keys, values, mask: Mask, window: int, num_global: int,
                           normalizer: Callable = masked_softmax,
                           dropout: Callable | None = None):
  """Scaled dot-product attention over a window plus global positions (Longformer, Beltagy et
  al. 2020; BigBird's window and global parts, Zaheer et al. 2020).

  The first `num_global` positions are global: every query sees them, and they see every key.
  Any other query sees the keys within `window` positions and the global ones, so the work is
  O(n (w + g)) for n queries, plus O(g n) for the global queries' rows. Causal or cached, a
  query never sees a key after it. Packed rows are refused (`Variant.packs`): the global
  positions are each row's first. `dropout` (attention dropout, or None) acts on the weights
  of the window and global keys, and on the global queries' rows, before their sums.

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`, before dropout).
  """
  num_queries, num_keys = query.shape[2], keys.shape[2]
  at = mask.query_positions(num_queries)  # [q]
  offsets = jnp.arange(-window, window + 1)
  near = at[:, None] + offsets  # [q, 2w + 1]
  near_valid = (near >= 0) & (near < num_keys) & (near >= num_global)  # Globals come below.
  far = jnp.broadcast_to(jnp.arange(num_global), (num_queries, num_global))  # [q, g]
  index = jnp.concatenate([jnp.clip(near, 0, num_keys - 1), jnp.minimum(far, num_keys - 1)], 1)
  valid = jnp.concatenate([near_valid, far < num_keys], axis=1)[None] & mask.key_valid[:, index]
  if mask.causal:
    valid = valid & (index <= at[:, None])
  scale = jnp.sqrt(query.shape[-1]).astype(query.dtype)
  scores = jnp.einsum("bhqd,bhqwd->bhqw", query, keys[:, :, index]) / scale
  picked = normalizer(scores, valid[:, None])
  context = jnp.einsum("bhqw,bhqwd->bhqd", picked if dropout is None else dropout(picked),
                       values[:, :, index])
  weights = jnp.einsum("bhqw,qwk->bhqk", picked, jax.nn.one_hot(index, num_keys,
                                                                  dtype=picked.dtype))
  # The global queries among the first rows: every key (not after them, when causal).
  rows = min(num_global, num_queries)
  dense_mask = mask.dense(num_queries)[:, :, :rows]
  dense = normalizer(jnp.einsum("bhqd,bhkd->bhqk", query[:, :, :rows], keys) / scale, dense_mask)
  is_global = (at[:rows] < num_global)[None, None, :, None]
  weights = weights.at[:, :, :rows].set(jnp.where(is_global, dense, weights[:, :, :rows]))
  summed = dense if dropout is None else dropout(dense)
  context = context.at[:, :, :rows].set(jnp.where(
      is_global, jnp.einsum("bhqk,bhkd->bhqd", summed, values), context[:, :, :rows]))
  return context, weights
