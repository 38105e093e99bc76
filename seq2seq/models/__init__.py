"""Model families behind one interface (`Seq2SeqModel`); `build_model` picks one by config."""

import jax.numpy as jnp
import ml_collections
from flax import nnx

from seq2seq.models.attention import PAPER_NAMES as PAPER_NAMES
from seq2seq.models.interface import Seq2SeqModel
from seq2seq.models.rnn import RNN
from seq2seq.models.transformer import Transformer

FAMILIES: dict[str, type[Seq2SeqModel]] = {"transformer": Transformer, "rnn": RNN}
# What each family declares it can do; config validation and the trainer read these.
ATTENTION_BY_FAMILY = {name: family.ATTENTION_NAMES for name, family in FAMILIES.items()}
PACKS = {name: family.PACKS for name, family in FAMILIES.items()}


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


def config_problem(cfg: ml_collections.ConfigDict) -> str | None:
  """What `config.model` asks of its family that the family cannot build (one line), if any."""
  return FAMILIES[cfg.family].config_problem(cfg)
