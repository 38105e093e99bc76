"""The recurrence of the RNN family (`rnn`): LSTM and GRU cells with their gates side by side.

A recurrence is latency-bound on a CPU, so each loop body holds only what depends on the step
before, as cuDNN and flax's `OptimizedLSTMCell` arrange it: the products of the inputs known in
advance are taken for every step at once before the loop (`GateKernels.project`), and each
step's remaining inputs and its state go through one product with the gates side by side. The
parameters are the `nnx` cells' own (same names and initialization).
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from seq2seq.models.linear import matmul

Carry = jnp.ndarray | tuple[jnp.ndarray, jnp.ndarray]  # GRU: h; LSTM: (c, h)
CELLS = {"lstm": nnx.LSTMCell, "gru": nnx.GRUCell}


def hidden_of(carry: Carry) -> jnp.ndarray:
  return carry[1] if isinstance(carry, tuple) else carry


def zeros_like_carry(cell_type: str, batch: int, size: int, dtype) -> Carry:
  zeros = jnp.zeros((batch, size), dtype)
  return (zeros, zeros) if cell_type == "lstm" else zeros


class GateKernels(NamedTuple):
  """An `nnx` LSTM or GRU cell's weights with its gates side by side.

  The cell's first `hoisted` input rows are multiplied outside the recurrence, for every step
  at once (`project`); each step (`__call__`) multiplies the other input rows and the state.
  LSTM: gates i, f, g, o; one product per step, the other rows stacked over the recurrent
  kernel; the bias sits on the recurrent side, as in `nnx.LSTMCell`. GRU: gates r, z, n; the
  state's product stays apart (n scales it by r), the bias sits on the input side.
  """
  lstm: bool
  hoisted: jnp.ndarray  # [hoisted, gates * hidden]
  step: jnp.ndarray  # LSTM: [in - hoisted + hidden, 4 hidden]; GRU: [in - hoisted, 3 hidden]
  recurrent: jnp.ndarray | None  # GRU: [hidden, 3 hidden]
  bias: jnp.ndarray  # [gates * hidden]
  dtype: Any

  @classmethod
  def of(cls, cell: nnx.Module, hoisted: int) -> "GateKernels":
    """`cell`'s kernels, its first `hoisted` input rows apart (call outside the loop)."""
    if isinstance(cell, nnx.LSTMCell):
      inputs = jnp.concatenate([cell.ii.kernel[...], cell.if_.kernel[...], cell.ig.kernel[...],
                                cell.io.kernel[...]], axis=1)
      recurrent = jnp.concatenate([cell.hi.kernel[...], cell.hf.kernel[...], cell.hg.kernel[...],
                                   cell.ho.kernel[...]], axis=1)
      bias = jnp.concatenate([cell.hi.bias[...], cell.hf.bias[...], cell.hg.bias[...],
                              cell.ho.bias[...]])
      return cls(True, inputs[:hoisted], jnp.concatenate([inputs[hoisted:], recurrent]), None,
                 bias, cell.dtype)
    kernel = cell.dense_i.kernel[...]
    return cls(False, kernel[:hoisted], kernel[hoisted:], cell.dense_h.kernel[...],
               cell.dense_i.bias[...], cell.dtype)

  def _product(self, x: jnp.ndarray, kernel: jnp.ndarray) -> jnp.ndarray:
    x, kernel = dtypes.promote_dtype((x, kernel), dtype=self.dtype)
    return matmul(x, kernel)

  def project(self, x: jnp.ndarray) -> jnp.ndarray:
    """The hoisted rows' part of every gate: `x [..., hoisted]` -> `[..., gates * hidden]`."""
    projected = self._product(x, self.hoisted)
    return projected if self.lstm else projected + self.bias.astype(projected.dtype)

  def __call__(self, carry: Carry, projected: jnp.ndarray | None,
               rest: Sequence[jnp.ndarray] = ()) -> tuple[Carry, jnp.ndarray]:
    """One step from `projected` (`project` of this step's hoisted inputs, or None when none
    are hoisted) and `rest`, the other inputs in row order: `(carry, output)`."""
    if self.lstm:
      c, h = carry
      z = self._product(jnp.concatenate([*rest, h], axis=-1), self.step)
      z = z + self.bias.astype(z.dtype)  # In the computation's dtype, as nnx.Linear adds it.
      if projected is not None:
        z = projected + z
      i, f, g, o = jnp.split(z, 4, axis=-1)
      new_c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      new_h = jax.nn.sigmoid(o) * jnp.tanh(new_c)
      return (new_c, new_h), new_h
    h, x = carry, projected
    if rest:
      x = self._product(jnp.concatenate(rest, axis=-1), self.step)
      x = x + (projected if projected is not None else self.bias.astype(x.dtype))
    x_r, x_z, x_n = jnp.split(x, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(self._product(h, self.recurrent), 3, axis=-1)
    r, z = jax.nn.sigmoid(x_r + h_r), jax.nn.sigmoid(x_z + h_z)
    new_h = (1.0 - z) * jnp.tanh(x_n + r * h_n) + z * h
    return new_h, new_h


def time_major(x: jnp.ndarray) -> jnp.ndarray:
  """`[batch, t, ...]` <-> `[t, batch, ...]`: the scans' layout. Inputs are turned before
  `GateKernels.project`, whose products are several times wider."""
  return x.swapaxes(0, 1)


def scan_cell(gates, carry: Carry, projected: jnp.ndarray, valid: jnp.ndarray):
  """Runs `gates` over `projected [t, batch, gates * hidden]` (`gates.project` of the
  time-major inputs); the carry stops at the last valid step. Outputs `[batch, t, hidden]`."""

  def body(carry, xs):
    x, ok = xs
    new_carry, y = gates(carry, x)
    carry = jax.tree.map(lambda new, old: jnp.where(ok[:, None], new, old), new_carry, carry)
    return carry, y

  carry, ys = jax.lax.scan(body, carry, (projected, time_major(valid)))
  return carry, time_major(ys)
