"""Model families behind one interface; `build_model` picks by config.model.family."""

import jax.numpy as jnp
import ml_collections
from flax import nnx

from seq2seq.models import rnn, transformer
from seq2seq.models.rnn import RNN
from seq2seq.models.transformer import Transformer

FAMILIES = {"transformer": Transformer, "rnn": RNN}
# What each family declares it can do; config validation and the trainer read these.
ATTENTION_BY_FAMILY = {"transformer": transformer.ATTENTION_NAMES, "rnn": rnn.ATTENTION_NAMES}
PACKS = {"transformer": transformer.PACKS, "rnn": rnn.PACKS}


def build_model(config: ml_collections.ConfigDict, vocab_size: int, *, seed: int | None = None):
  """Builds `config.model.family` with freshly initialized parameters.

  Args:
    config: the full run config (validated).
    vocab_size: size of the joint SentencePiece vocabulary.
    seed: parameter seed (default: config.train.seed).
  """
  seed = config.train.seed if seed is None else seed
  return FAMILIES[config.model.family](config.model, vocab_size, rngs=nnx.Rngs(params=seed),
                                       dtype=jnp.dtype(config.train.dtype))
