"""Dropout with masks cut from Threefry's words 16 bits per decision.

`nnx.Dropout` draws every keep/drop decision with `jax.random.bernoulli`: a
full Threefry-2x32 block per decision (under JAX's default partitionable
Threefry) and a float conversion. Here one block's two 32-bit words make four
16-bit numbers, and a unit is kept when its number is below
`round(keep * 2**16)`. The realized keep probability is that threshold over
2**16 (1 - 0.1 -> 0.899994), and kept units are scaled by its inverse, so the
expectation is preserved exactly. The bits come from `jax.extend.random`'s
Threefry with the key's own data: each decision is a pure function of the key
and its position in the (row-major) mask, the same on any device layout and
whatever rows follow it. Each Threefry block thus serves four
decisions instead of one, with no float conversion: dropout's random bits cost a
fraction of `bernoulli`'s.
"""

import math

import jax
import jax.extend.random as jex_random
import jax.numpy as jnp
from flax import nnx

_BITS = 16


def keep_mask(key: jax.Array, shape: tuple[int, ...], keep: float) -> tuple[jax.Array, float]:
  """A boolean `shape` mask, True with probability ~`keep`, and that exact probability."""
  threshold = round(keep * 2**_BITS)
  size = math.prod(shape)
  words = -(-size * _BITS // 32)
  if words % 2:  # Threefry-2x32 turns each pair of counters into two words.
    words += 1
  with jax.named_scope("random_bits"):  # How profiles (seq2seq.performance.profile) recognise it.
    # Block j hashes the counter pair (2j, 2j + 1) into words 2j and 2j + 1 (threefry_2x32
    # pairs its input's halves): each word is a function of the key and its position alone,
    # so a mask's first rows are the same whatever rows follow (filler rows for the devices).
    blocks = jnp.arange(words // 2, dtype=jnp.uint32)
    bits = jex_random.threefry_2x32(jax.random.key_data(key),
                                    jnp.concatenate([2 * blocks, 2 * blocks + 1]))
    bits = jnp.stack(jnp.split(bits, 2), axis=1)  # [blocks, 2]: word 2j, then 2j + 1.
  numbers = jax.lax.bitcast_convert_type(bits, jnp.uint16).reshape(-1)[:size]
  return numbers.reshape(shape) < threshold, threshold / 2**_BITS


class Dropout(nnx.Module):
  """Inverted dropout (`nnx.Dropout`'s calling convention, masks from `keep_mask`)."""

  def __init__(self, rate: float):
    self.rate = rate

  def __call__(self, inputs: jax.Array, *, deterministic: bool = False,
               rngs: nnx.Rngs | jax.Array | None = None) -> jax.Array:
    """Masks `inputs` unless `deterministic` or the rate is 0.

    `rngs`: an `nnx.Rngs` (its `dropout` stream) or a key.
    """
    if deterministic or self.rate == 0.0:
      return inputs
    if rngs is None:
      raise ValueError("Dropout needs `rngs` (an nnx.Rngs or a key) when not deterministic.")
    key = rngs.dropout() if isinstance(rngs, nnx.Rngs) else rngs
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(key)
    if "threefry" not in str(jax.random.key_impl(key)):  # Another generator: its own bits.
      keep = 1.0 - self.rate
      mask = jax.random.bernoulli(key, keep, inputs.shape)
    else:
      mask, keep = keep_mask(key, inputs.shape, 1.0 - self.rate)
    return jnp.where(mask, inputs / jnp.asarray(keep, inputs.dtype), jnp.zeros_like(inputs))
