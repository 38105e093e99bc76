"""`nnx.Linear` whose product is one matrix multiply over the flattened leading axes.

`nnx.Linear` applies `x [batch, length, in] @ kernel [in, out]` as a 3-D
`dot_general`. Its value is the same as the 2-D product of
`x.reshape(-1, in)`, but its gradient with respect to the kernel is not: JAX
differentiates the 3-D form into a product contracting two axes (batch and
length), which XLA:CPU lays out with a transposed operand and multiplies well below
the rate of a plain `[in, N] x [N, out]` product; weight gradients are a large share
of a train step's matmuls (docs/performance.md, "Where the time goes on a CPU").
Flattening first makes every weight gradient that plain product.
"""

import functools

import jax
from flax import nnx


def _last_by_first(ndim: int):
  """Dimension numbers contracting the last axis of an `ndim` array with a matrix's first."""
  return ((ndim - 1,), (0,)), ((), ())


def matrix_dot(x: jax.Array, kernel: jax.Array, dimension_numbers, precision=None,
               out_sharding=None, **kwargs) -> jax.Array:
  """`jax.lax.dot_general` for `nnx.Linear`: `[..., in] x [in, out]` through a 2-D product."""
  if dimension_numbers != _last_by_first(x.ndim) or out_sharding is not None or x.ndim == 2:
    return jax.lax.dot_general(x, kernel, dimension_numbers, precision=precision,
                               out_sharding=out_sharding, **kwargs)
  flat = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), kernel, _last_by_first(2),
                             precision=precision, **kwargs)
  return flat.reshape(*x.shape[:-1], kernel.shape[-1])


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x [..., in] @ kernel [in, out]`, as `Linear` multiplies (one 2-D product)."""
  return matrix_dot(x, kernel, _last_by_first(x.ndim))


Linear = functools.partial(nnx.Linear, dot_general=matrix_dot)
