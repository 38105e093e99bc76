"""A file of your own that registers parts of a model outside the package (docs/extending.md,
"Your own file"): an attention score and a way of giving positions. A run chooses them with

  seq2seq-train --config=configs/tiny.py --workdir=runs/mine \
      --config.train.extensions=examples/my_parts.py \
      --config.model.attention=cosine_sim --config.model.positions=distance_bias

and every later command that reads runs/mine imports this file again from its config.json.
"""

import jax.numpy as jnp

from seq2seq.models.attention import SCORES, Score
from seq2seq.models.positions import POSITIONS, Positions


def unit(x):
  """Each vector over the last axis scaled to length 1."""
  return x / (jnp.linalg.norm(x, axis=-1, keepdims=True) + 1e-6)


def cosine_score(query, keys, params=None):
  """Cosine similarity times sqrt(d) (the keys are unit vectors already: `prepare`)."""
  return jnp.einsum("bhqd,bhkd->bhqk", unit(query), keys) * jnp.sqrt(query.shape[-1])


SCORES.register("cosine_sim", Score(lambda heads, head_dim, max_keys, rngs: None,
                                    lambda keys, params: unit(keys), cosine_score))


def distance_bias(query, relative, params, num_heads):
  """Minus a sixteenth of each key's distance from its query, in every head."""
  del query, params
  return jnp.broadcast_to(-jnp.abs(relative[:, None]) / 16.0,
                          (relative.shape[0], num_heads, *relative.shape[1:]))


POSITIONS.register("distance_bias", Positions(bias=distance_bias))
