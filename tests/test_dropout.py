"""Dropout masks from 16-bit slices of Threefry words: rate, scaling, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.models.dropout import Dropout, keep_mask


def test_keep_probability_is_the_threshold_over_two_to_the_sixteen():
  mask, keep = keep_mask(jax.random.key(0), (1000, 1000), 0.9)
  assert keep == round(0.9 * 2**16) / 2**16
  # A million Bernoulli(0.9) draws: the standard deviation of the mean is 3e-4.
  assert abs(float(mask.mean()) - keep) < 1.5e-3


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_kept_units_are_scaled_so_the_mean_is_preserved(rate):
  x = jnp.ones((500, 1000))
  y = Dropout(rate)(x, rngs=jax.random.key(1))
  _, keep = keep_mask(jax.random.key(1), x.shape, 1.0 - rate)
  np.testing.assert_allclose(np.unique(np.asarray(y)), [0.0, 1.0 / keep], rtol=1e-6)
  assert abs(float(y.mean()) - 1.0) < 5e-3
  assert abs(float((y == 0).mean()) - rate) < 2e-3


def test_neighbouring_decisions_are_not_correlated():
  """The four 16-bit numbers of one Threefry block decide four units independently."""
  mask, _ = keep_mask(jax.random.key(2), (400_000, 4), 0.5)
  m = np.asarray(mask, np.float64)
  corr = np.corrcoef(m.T)
  assert np.abs(corr - np.eye(4)).max() < 0.01


def test_same_key_same_mask_other_key_other_mask():
  x = jnp.ones((7, 33))  # An odd size: the last Threefry block is partly used.
  d = Dropout(0.5)
  a = d(x, rngs=jax.random.key(3))
  np.testing.assert_array_equal(a, d(x, rngs=jax.random.key(3)))
  np.testing.assert_array_equal(a, d(x, rngs=jax.random.PRNGKey(3)))  # a raw uint32 key
  # An nnx.Rngs draws the key from its `dropout` stream.
  np.testing.assert_array_equal(d(x, rngs=nnx.Rngs(dropout=3)),
                                d(x, rngs=nnx.Rngs(dropout=3).dropout()))
  assert not np.array_equal(a, d(x, rngs=jax.random.key(4)))


def test_no_mask_when_deterministic_or_rate_zero():
  x = jax.random.normal(jax.random.key(5), (4, 8))
  np.testing.assert_array_equal(Dropout(0.5)(x, deterministic=True), x)
  np.testing.assert_array_equal(Dropout(0.0)(x, rngs=jax.random.key(0)), x)
  with pytest.raises(ValueError, match="needs `rngs`"):
    Dropout(0.5)(x)


def test_other_generators_use_their_own_bernoulli():
  x = jnp.ones((64, 64))
  key = jax.random.key(6, impl="rbg")
  expected = jnp.where(jax.random.bernoulli(key, 0.75, x.shape), x / 0.75, 0.0)
  np.testing.assert_array_equal(Dropout(0.25)(x, rngs=key), expected)


def test_a_masks_rows_do_not_depend_on_the_rows_after_them():
  """Filler rows appended for the devices leave the real rows' dropout as it was."""
  key = jax.random.key(3)
  rows, _ = keep_mask(key, (21, 5, 3), 0.9)
  padded, _ = keep_mask(key, (24, 5, 3), 0.9)
  np.testing.assert_array_equal(np.asarray(padded)[:21], np.asarray(rows))
