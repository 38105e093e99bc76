"""`models.linear.Linear`: nnx.Linear's values, with the kernel gradient as one 2-D product."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seq2seq.models.linear import Linear


def _pair():
  return Linear(16, 8, rngs=nnx.Rngs(0)), nnx.Linear(16, 8, rngs=nnx.Rngs(0))


def _loss(model, x):
  return jnp.sum(jnp.sin(model(x)))


def test_values_and_gradients_equal_nnx_linear():
  ours, theirs = _pair()
  for shape in ((5, 16), (3, 5, 16), (2, 3, 4, 16)):
    x = jax.random.normal(jax.random.key(1), shape)
    np.testing.assert_array_equal(ours(x), theirs(x))
    ours_grad, theirs_grad = jax.grad(_loss)(ours, x), jax.grad(_loss)(theirs, x)
    np.testing.assert_allclose(ours_grad.kernel[...], theirs_grad.kernel[...], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(ours_grad.bias[...], theirs_grad.bias[...], rtol=1e-5, atol=1e-5)


def _kernel_gradient_dots(model, x):
  """The dot_generals of the kernel gradient's jaxpr: (operand ranks, contracting dims)."""
  jaxpr = jax.make_jaxpr(jax.grad(lambda m: jnp.sum(m(x) ** 2)))(model)
  return [(tuple(v.aval.ndim for v in eqn.invars), eqn.params["dimension_numbers"][0])
          for eqn in jaxpr.jaxpr.eqns if eqn.primitive.name == "dot_general"]


def test_kernel_gradient_is_one_matrix_product():
  ours, theirs = _pair()
  x = jnp.ones((3, 5, 16))
  # nnx.Linear's weight gradient contracts batch and length at once (rank-3 operands) ...
  assert ((3, 3), ((0, 1), (0, 1))) in _kernel_gradient_dots(theirs, x)
  # ... ours multiplies [tokens, in] by [tokens, out]: every dot is between matrices.
  assert all(ranks == (2, 2) for ranks, _ in _kernel_gradient_dots(ours, x))
