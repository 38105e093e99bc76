"""Search over a step function: the decoder is seen only through `step_fn`.

`step_fn(cache, token_ids [batch]) -> (logits [batch, vocab], cache)` is any
model's `decode_step` with its encoder memory bound, e.g.
`functools.partial(model.decode_step, memory)`. Loops run under
`lax.while_loop` so a whole batch decodes inside one compiled program.
"""

import jax
import jax.numpy as jnp

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def greedy_search(step_fn, cache, batch_size: int, max_len: int) -> jnp.ndarray:
  """Picks the most likely token at every step until EOS or `max_len`.

  Args:
    step_fn: see the module docstring.
    cache: the model's initial cache for this batch (room for `max_len` steps).
    batch_size: number of sentences.
    max_len: most tokens to produce per sentence (EOS included).

  Returns:
    `[batch, max_len]` int32 ids: the tokens up to and including EOS, then PAD.
  """

  def cond(carry):
    i, _, _, _, finished = carry
    return (i < max_len) & ~jnp.all(finished)

  def body(carry):
    i, cache, tokens, last, finished = carry
    logits, cache = step_fn(cache, last)
    next_ids = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    next_ids = jnp.where(finished, PAD_ID, next_ids)
    tokens = tokens.at[:, i].set(next_ids)
    return i + 1, cache, tokens, next_ids, finished | (next_ids == EOS_ID)

  init = (jnp.zeros((), jnp.int32), cache, jnp.full((batch_size, max_len), PAD_ID, jnp.int32),
          jnp.full((batch_size,), BOS_ID, jnp.int32), jnp.zeros((batch_size,), bool))
  return jax.lax.while_loop(cond, body, init)[2]


def max_decode_len(src_len: int, a: float, b: int, limit: int) -> int:
  """Longest hypothesis for a padded source length: `a * src_len + b`, at most `limit`."""
  return max(1, min(int(a * src_len + b), limit))
