"""Every model family implements `Seq2SeqModel` with the same keyword arguments, and does what it
declares: the attention it takes, and packed rows or not."""

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq import config as config_lib
from seq2seq import models
from seq2seq.errors import UserError
from seq2seq.models.attention import SCORES, VARIANTS
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


# Every attention name there is, and names no family takes: what a config could ask for.
ASKED = sorted({name for names in models.ATTENTION_BY_FAMILY.values() for name in names}
               | set(VARIANTS) | set(SCORES) | {"none", "Scaled_Dot", "dott", ""})


@pytest.mark.parametrize("family", models.FAMILY_NAMES)
def test_check_config_takes_exactly_the_attention_its_family_declares(family):
  """The family's own list decides, not the attention registry: each name it declares passes,
  each other name is refused with that list."""
  declared = models.ATTENTION_BY_FAMILY[family]
  refused = []
  for name in ASKED:
    c = config_lib.base_config()
    c.model.family, c.model.attention = family, name
    config_lib.validate(c)
    if name in declared:
      models.check_config(c)
      continue
    with pytest.raises(UserError) as e:
      models.check_config(c)
    assert str(e.value).startswith(f"config.model.attention={name!r} is not available for the"
                                   f" {family}; use one of: {', '.join(declared)}."), name
    refused.append(name)
  assert set(refused) & (set(VARIANTS) | {"none"})  # Some registered names are not the family's.


@pytest.mark.parametrize("family", models.FAMILY_NAMES)
def test_a_family_takes_packed_rows_exactly_when_it_declares_it(tiny_config, family):
  """A family that packs encodes two sentences in one row as it encodes each alone; one that
  does not refuses such a row, and check_config refuses config.data.pack for it."""
  tiny_config.model.family, tiny_config.model.attention = family, "scaled_dot"  # Packs.
  tiny_config.data.pack = True
  model = models.build_model(tiny_config, 40)
  first, second = [5, 6, 3], [7, 3]
  src = jnp.array([first + second])
  segments, positions = jnp.array([[1, 1, 1, 2, 2]]), jnp.array([[0, 1, 2, 0, 1]])
  if models.can_pack(family):
    models.check_config(tiny_config)
    packed = np.asarray(model.encode(src, segments=segments, positions=positions).encoded[0])
    for part, ids in ((packed[:3], first), (packed[3:], second)):
      np.testing.assert_allclose(part, model.encode(jnp.array([ids])).encoded[0], atol=1e-5)
  else:
    with pytest.raises(UserError, match="config.data.pack=True packs several sentences per row"):
      models.check_config(tiny_config)
    with pytest.raises(ValueError, match="one sentence per row"):
      model.encode(src, segments=segments, positions=positions)
