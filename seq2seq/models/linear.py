"""`nnx.Linear` whose product is one matrix multiply over the flattened leading axes.

`nnx.Linear` applies `x [batch, length, in] @ kernel [in, out]` as a 3-D
`dot_general`. Its value is the same as the 2-D product of
`x.reshape(-1, in)`, but its gradient with respect to the kernel is not: JAX
differentiates the 3-D form into a product contracting two axes (batch and
length), which XLA:CPU lays out with a transposed operand and multiplies well below
the rate of a plain `[in, N] x [N, out]` product; weight gradients are a large share
of a train step's matmuls (docs/performance.md, "Where the time goes on a CPU").
Flattening first makes every weight gradient that plain product.

Decoding may take these products with bfloat16 inputs summed in float32 (`MATRIX_DOTS`,
`use_matmul_dtype`): XLA:CPU multiplies so with AVX-512 BF16 and AMX several times faster
than in float32, while a product of bfloat16 out (`config.train.dtype`) is upcast and slower.
"""

import functools

import jax
import jax.numpy as jnp
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


def bfloat16_dot(x: jax.Array, kernel: jax.Array, dimension_numbers, precision=None,
                 out_sharding=None, preferred_element_type=None, **kwargs) -> jax.Array:
  """`matrix_dot` of `x` and `kernel` rounded to bfloat16, summed and returned in float32."""
  del preferred_element_type  # Always float32: the sums of bfloat16 products.
  return matrix_dot(x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16), dimension_numbers,
                    precision=precision, out_sharding=out_sharding,
                    preferred_element_type=jnp.float32, **kwargs)


# `--matmul_dtype` name -> the `dot_general` of `Linear` that multiplies in it.
MATRIX_DOTS = {"float32": matrix_dot, "bfloat16": bfloat16_dot}


def matmul(x: jax.Array, kernel: jax.Array, dtype: str = "float32") -> jax.Array:
  """`x [..., in] @ kernel [in, out]`, as `Linear` multiplies (one 2-D product), with the
  inputs of `MATRIX_DOTS[dtype]`."""
  return MATRIX_DOTS[dtype](x, kernel, _last_by_first(x.ndim))


def use_matmul_dtype(model: nnx.Module, dtype: str) -> None:
  """Makes every `Linear` in `model` multiply as `MATRIX_DOTS[dtype]` does, in place (an
  `nnx.Linear` of another product is left as it is)."""
  for _, module in nnx.iter_graph(model):
    if isinstance(module, nnx.Linear) and module.dot_general in MATRIX_DOTS.values():
      module.dot_general = MATRIX_DOTS[dtype]


def cast_kernels(graphdef, params, dtype: str):
  """`params`, the `nnx.Param` state of `graphdef`'s model, with the kernel of every `Linear`
  that multiplies in `dtype` (`use_matmul_dtype`) cast to it once, as a program reads it
  (nnx.Linear upcasts it to its input's float32, and XLA drops the pair of conversions). A
  program converts float32 kernels once per call, out of its loop: at one sentence a call,
  more than the bfloat16 products save. float32: `params` as they are."""
  if dtype == "float32":
    return params
  model = nnx.merge(graphdef, params)
  for _, module in nnx.iter_graph(model):
    if isinstance(module, nnx.Linear) and module.dot_general is MATRIX_DOTS[dtype]:
      module.kernel.set_value(module.kernel[...].astype(dtype))
  return nnx.split(model, nnx.Param)[1]


Linear = functools.partial(nnx.Linear, dot_general=matrix_dot)
