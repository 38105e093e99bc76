"""Every model family implements `Seq2SeqModel` with the same keyword arguments."""

import inspect

import pytest

from seq2seq import models
from seq2seq.models.interface import Seq2SeqModel

METHODS = ("encode", "decode", "attention_weights", "init_cache", "decode_step",
           "config_problem")


def _parameters(function):
  """(name, kind, default) of each parameter: what a caller may pass and how."""
  return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("family", models.FAMILY_NAMES)
@pytest.mark.parametrize("method", METHODS)
def test_family_methods_take_the_protocols_arguments(family, method):
  cls = models.MODEL_CLASSES[family]
  assert _parameters(getattr(cls, method)) == _parameters(getattr(Seq2SeqModel, method))


@pytest.mark.parametrize("family", models.FAMILY_NAMES)
def test_family_declares_its_capabilities(family):
  cls = models.MODEL_CLASSES[family]
  assert isinstance(models.can_pack(family), bool)
  assert cls.ATTENTION_NAMES and all(isinstance(n, str) for n in cls.ATTENTION_NAMES)
  assert models.ATTENTION_BY_FAMILY[family] == cls.ATTENTION_NAMES


def test_a_family_that_cannot_pack_refuses_packed_rows(tiny_config):
  import jax.numpy as jnp
  family = next(name for name in models.FAMILY_NAMES if not models.can_pack(name))
  tiny_config.model.family = family
  tiny_config.model.attention = models.ATTENTION_BY_FAMILY[family][-1]
  model = models.build_model(tiny_config, 40)
  src = jnp.array([[5, 6, 3, 7, 3]])
  with pytest.raises(ValueError, match="one sentence per row"):
    model.encode(src, segments=jnp.array([[1, 1, 1, 2, 2]]))
