"""Attention masks: the only place they are built.

A `Mask` says which keys each query may see: keys marked valid (real tokens,
filled cache slots) and, when `causal`, only keys at or before the query's
position. Packed rows (several sentences per row, `config.data.pack`) add
segment ids: a query then sees only keys of its own segment, so self-attention
stays within a sentence and cross-attention goes from target sentence i to
source sentence i. Masks are built once from token ids at the model boundary
(`encode` / `decode` / `decode_step`) and passed down unchanged. Softmax
attention uses the dense form; linear and local attention use the structure
directly, which is what makes them O(n).
"""

import jax.numpy as jnp
from flax import struct

from seq2seq.data.special_ids import PAD_ID


@struct.dataclass
class Mask:
  key_valid: jnp.ndarray  # [batch or 1, keys] bool: the key may be attended to
  query_offset: jnp.ndarray  # scalar int: position of the first query
  causal: bool = struct.field(pytree_node=False, default=False)  # query i sees keys <= i
  # Packed rows only: [batch, keys] / [batch, queries] segment ids (1, 2, ...; 0 on PAD).
  # A query sees only keys of its own segment.
  key_segments: jnp.ndarray | None = None
  query_segments: jnp.ndarray | None = None

  @property
  def segmented(self) -> bool:
    return self.key_segments is not None and self.query_segments is not None

  def query_positions(self, num_queries: int) -> jnp.ndarray:
    return self.query_offset + jnp.arange(num_queries)

  def dense(self, num_queries: int) -> jnp.ndarray:
    """`[batch, 1, num_queries, keys]` boolean, broadcastable against attention scores."""
    allowed = self.key_valid[:, None, None, :]
    if self.causal:
      key_positions = jnp.arange(self.key_valid.shape[-1])
      allowed = allowed & (key_positions[None, :] <= self.query_positions(num_queries)[:, None])
    if self.segmented:
      allowed = allowed & (self.query_segments[:, None, :, None]
                           == self.key_segments[:, None, None, :])
    return allowed


def padding_mask(key_ids: jnp.ndarray, segments: jnp.ndarray | None = None) -> Mask:
  """Masks padded keys (and, for packed rows, other segments); `key_ids [batch, keys]`."""
  return Mask(key_ids != PAD_ID, jnp.zeros((), jnp.int32), key_segments=segments,
              query_segments=segments)


def decoder_self_mask(tgt_ids: jnp.ndarray, segments: jnp.ndarray | None = None) -> Mask:
  """Causal and padding mask of teacher-forced decoder self-attention; `tgt_ids [batch, t]`.

  With packed `segments [batch, t]`, causal within each target sentence.
  """
  return Mask(tgt_ids != PAD_ID, jnp.zeros((), jnp.int32), causal=True, key_segments=segments,
              query_segments=segments)


def cross_mask(src_mask: Mask, tgt_segments: jnp.ndarray | None = None) -> Mask:
  """Target queries over the source keys: with packed rows, target segment i sees source
  segment i only (`tgt_segments [batch, t]`); otherwise the source padding mask."""
  return src_mask.replace(query_segments=tgt_segments)


def cache_mask(index: jnp.ndarray, cache_len: int) -> Mask:
  """One decoding step at position `index` over a cache: slots 0..index are filled."""
  return Mask((jnp.arange(cache_len) <= index)[None, :], jnp.asarray(index, jnp.int32))
