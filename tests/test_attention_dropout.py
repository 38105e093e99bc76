"""Attention dropout (`config.model.attention_dropout_rate`) acts in every attention that takes
it, Transformer variants and RNN attentions alike, only in training; beside one that never forms
weights to drop it is refused in one line (each entry's declared `weight_dropout`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.errors import UserError
from seq2seq.models import ATTENTION_BY_FAMILY, MODEL_CLASSES, build_model, check_config, masks
from seq2seq.models.kernels import local_attention, local_global_attention
from seq2seq.training.steps import cross_entropy

VOCAB = 40
SRC = jnp.array([[5, 6, 7, 8, 9, 3, 0], [9, 10, 3, 0, 0, 0, 0]])  # EOS=3, PAD=0
TGT_IN = jnp.array([[2, 11, 12, 13, 14, 15], [2, 15, 16, 17, 0, 0]])  # BOS=2
TGT_OUT = jnp.array([[11, 12, 13, 14, 15, 3], [15, 16, 17, 3, 0, 0]])


def _config(tiny_config, family: str, attention: str, rate: float, **model):
  c = tiny_config
  c.model.update(family=family, attention=attention, attention_dropout_rate=rate,
                 dropout_rate=0.0,  # Attention dropout alone.
                 attention_window=2, attention_globals=1, **model)
  if family == "rnn":
    c.model.emb_dim, c.model.rnn_hidden_dim = 16, 24
  return c


def _losses(config) -> tuple[float, float]:
  """(the teacher-forced loss with dropout rngs, the same without: evaluation), at the
  parameters of `config.train.seed`."""
  model = build_model(config, VOCAB)

  def loss(rngs):
    encode_rngs, decode_rngs = (nnx.Rngs(dropout=1), nnx.Rngs(dropout=2)) if rngs else (None,
                                                                                      None)
    logits = model.decode(model.encode(SRC, rngs=encode_rngs), TGT_IN, rngs=decode_rngs)
    return cross_entropy(logits, TGT_OUT, 0.0)["loss"]

  return float(loss(True)), float(loss(False))


def _takes(family: str) -> list[str]:
  return [name for name in ATTENTION_BY_FAMILY[family]
          if name in MODEL_CLASSES[family].WEIGHT_DROPOUT]


# Every attention that takes it: the Transformer's variants, and the RNN's with input feeding
# (a step at a time, in the loop) and, for a global and a local one, without (every step at
# once). Each: (family, attention, other config.model fields). The default run takes one of
# each kind of kernel (a softmax score's weights dropped after the fact, the Transformer's
# windows inside their kernels, the RNN's scores with the current and the previous state, its
# windows, every step at once); -m slow the rest.
CASES = ([("transformer", name, {}) for name in _takes("transformer")]
         + [("rnn", name, {}) for name in _takes("rnn")]
         + [("rnn", name, {"input_feeding": False}) for name in ("general", "local_p")])
CORE = [("transformer", "scaled_dot", {}), ("transformer", "local", {}),
        ("transformer", "local_global", {}), ("rnn", "general", {}), ("rnn", "concat", {}),
        ("rnn", "local_m", {}), ("rnn", "local_p", {}),
        ("rnn", "general", {"input_feeding": False})]


@pytest.mark.parametrize("family,attention,model", [
    pytest.param(*case, marks=() if case in CORE else pytest.mark.slow,
                 id=f"{case[0]}-{case[1]}" + ("-no_feeding" if case[2] else ""))
    for case in CASES])
def test_attention_dropout_changes_the_training_loss_only(tiny_config, family, attention, model):
  with_dropout = _config(tiny_config, family, attention, 0.3, **model)
  check_config(with_dropout)
  trained, evaluated = _losses(with_dropout)
  without = _config(tiny_config, family, attention, 0.0, **model)
  trained_without, evaluated_without = _losses(without)
  assert evaluated == evaluated_without == trained_without  # Bit for bit without dropout.
  # Fresh weights: the Transformer's loss moves by 1-7%, the RNN's by 0.007-0.3% (its
  # context reaches the logits through one tanh layer); float32's rounding, by ~1e-7.
  assert abs(trained - trained_without) > 1e-5 * abs(trained_without)


@pytest.mark.parametrize("family", sorted(MODEL_CLASSES))
def test_attention_that_forms_no_weights_refuses_attention_dropout_in_one_line(tiny_config,
                                                                               family):
  refused = [name for name in ATTENTION_BY_FAMILY[family]
             if name not in MODEL_CLASSES[family].WEIGHT_DROPOUT]
  assert refused  # The Transformer's `linear`, the RNN's `none`.
  for name in refused:
    c = _config(tiny_config, family, name, 0.1)
    with pytest.raises(UserError, match="attention_dropout_rate=0.1: .* takes no dropout on its"
                                        " weights; set it to 0") as error:
      check_config(c)
    assert "\n" not in str(error.value)
    c.model.attention_dropout_rate = 0.0
    check_config(c)


@pytest.mark.parametrize("kernel", ["local", "local_global"])
def test_the_window_kernels_drop_the_weights_they_sum(kernel):
  """`dropout` acts on the weights before the weighted sum (a stand-in that doubles them
  doubles the context; one that drops all of them leaves none), and the weights returned are
  those before it."""
  q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 2, 7, 4))
  mask = masks.padding_mask(jnp.array([[5, 6, 7, 8, 9, 3, 0], [5, 6, 3, 0, 0, 0, 0]]))
  attend = ((lambda **d: local_attention(q, k, v, mask, 2, **d)) if kernel == "local" else
            (lambda **d: local_global_attention(q, k, v, mask, 2, 1, **d)))
  context, weights = attend()
  doubled, same_weights = attend(dropout=lambda w: 2 * w)
  np.testing.assert_allclose(doubled, 2 * context, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(same_weights, weights)
  np.testing.assert_array_equal(attend(dropout=jnp.zeros_like)[0], 0.0)
  # Against the weights returned: their sum, as without dropout.
  np.testing.assert_allclose(jnp.einsum("bhqk,bhkd->bhqd", weights, v), context, rtol=1e-5,
                             atol=1e-6)
