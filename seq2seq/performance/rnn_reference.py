"""The RNN as written step by step: the reference of `seq2seq.models.rnn`'s fused recurrence.

`StepwiseRNN` is `RNN` with the same parameters, run the way a decoder is first written:
each `nnx` cell called on its whole input at every step (one product per gate, the input's
included), and teacher forcing computing each step's logits inside the loop. The equality
tests compare its losses, gradients and translations with `RNN`'s, and
`seq2seq-benchmark --mode=recurrence` times the two train steps in one run.
"""

import jax.numpy as jnp
from flax import nnx

from seq2seq.models.rnn import RNN


class CellAsWritten:
  """`recurrence.GateKernels`' interface over the `nnx` cell itself: nothing multiplied before
  the loop, the cell applied to the concatenated inputs at every step."""

  def __init__(self, cell: nnx.Module):
    self.cell = cell

  def project(self, x: jnp.ndarray) -> jnp.ndarray:
    return x

  def __call__(self, carry, projected, rest=()):
    inputs = [projected] if projected is not None else []
    return self.cell(carry, jnp.concatenate([*inputs, *rest], axis=-1))


class StepwiseRNN(RNN):
  """`RNN` with the cells called as written and the logits inside the loop."""

  LOGITS_IN_LOOP = True

  def _gates(self, cell: nnx.Module, hoisted: int) -> CellAsWritten:
    del hoisted
    return CellAsWritten(cell)
