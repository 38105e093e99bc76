"""Attention masks: the only place they are built.

Masks are boolean and broadcast against attention scores `[batch, heads, q, k]`:
True means "may attend". They are built once from token ids at the model
boundary (`encode` / `decode` / `decode_step`) and passed down unchanged.
"""

import jax.numpy as jnp

from seq2seq.data.tokenizer import PAD_ID


def padding_mask(key_ids: jnp.ndarray) -> jnp.ndarray:
  """Masks padded keys.

  Args:
    key_ids: `[batch, k]` token ids of the keys.

  Returns:
    `[batch, 1, 1, k]`: True where the key is a real token.
  """
  return (key_ids != PAD_ID)[:, None, None, :]


def causal_mask(length: int) -> jnp.ndarray:
  """`[1, 1, length, length]`: query i may attend to keys 0..i."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def decoder_self_mask(tgt_ids: jnp.ndarray) -> jnp.ndarray:
  """Causal and padding mask of teacher-forced decoder self-attention.

  Args:
    tgt_ids: `[batch, t]` decoder input ids.

  Returns:
    `[batch, 1, t, t]`.
  """
  return causal_mask(tgt_ids.shape[1]) & padding_mask(tgt_ids)


def cache_mask(index: jnp.ndarray, cache_len: int) -> jnp.ndarray:
  """Mask of one decoding step over a key/value cache.

  Args:
    index: scalar position of the token being decoded.
    cache_len: length of the cache.

  Returns:
    `[1, 1, 1, cache_len]`: True for cache slots 0..index (filled so far).
  """
  return (jnp.arange(cache_len) <= index)[None, None, None, :]
