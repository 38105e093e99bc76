"""What every search scores with: the score of no hypothesis, the tokens no translation holds,
the rows that hold a sentence, and the GNMT length penalty."""

import jax.numpy as jnp

from seq2seq.data.special_ids import BOS_ID, PAD_ID

NEG_INF = -1e9  # The score of no hypothesis: far below any log-probability, yet finite.


def translatable(scores: jnp.ndarray, fill: float = -jnp.inf) -> jnp.ndarray:
  """`scores [..., vocab]` with PAD and BOS at `fill`, to pick from: no translation holds them
  (a fed PAD is read by the cache but masked when teacher-forced: its score would differ), yet
  models give them mass. A pick's score stays the model's log-probability, their mass included."""
  return scores.at[..., jnp.array([PAD_ID, BOS_ID])].set(fill)


def in_use(src_ids: jnp.ndarray | None, batch_size: int) -> jnp.ndarray:
  """`[batch]` bool: the rows that hold a sentence, not all PAD as a batch's filler rows are
  (even an empty sentence has EOS). A search must not step for fillers: their hypotheses, from a
  source of nothing, seldom end, and one kept a whole batch of 128 stepping to its cap."""
  if src_ids is None:
    return jnp.ones((batch_size,), bool)
  return src_ids[:, 0] != PAD_ID


def length_penalty(length, alpha: float):
  """GNMT length penalty (Wu et al., 2016): ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha
