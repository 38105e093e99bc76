"""What turns attention scores into weights: softmax, sparsemax, entmax and sigmoid, by name.

`NORMALIZERS` is the registry `config.model.attention_normalizer` names. Every entry maps
scores `[..., k]` and a boolean mask broadcastable to them (True: the key may be attended;
None: every key may) to weights over the last axis that
  - sum to 1 over a row's allowed keys (but sigmoid attention's, `Normalizer.sums_to_one`)
    and give masked keys exactly 0,
  - are all 0 on a row whose keys are all masked (a padding row), never NaN,
  - are computed in float32 and returned in the scores' dtype.
Sparsemax and entmax also give exact zeros to low scores; `zero_share` measures how many.
Their gradients are the papers' closed forms (`jax.custom_vjp`): each Jacobian is
`diag(s) - s s^T / sum(s)`, for a nonnegative `s` that is zero off the support.
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seq2seq.registry import Registry

# Sparsemax gives exactly zero weight to every score 1 or more below its row's largest, and
# 1.5-entmax to every score 2 or more below. Raising lower scores (and masked keys) to this
# floor, after subtracting the row's largest allowed score, changes no weight and keeps every
# number the sorts and prefix sums see small.
_FLOOR = -3.0
# Bisection halves a bracket of width < 1 around tau, which lies in [-1, 0] once the row's
# largest allowed score is 0: 2^-30 is below float32's resolution there.
_BISECTIONS = 30


def masked_softmax(scores: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
  """Softmax over the last axis that gives masked keys exactly zero weight.

  A query whose keys are all masked (a padding row) gets all-zero weights
  instead of a uniform distribution over padding.
  """
  if mask is None:
    return jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(scores.dtype)
  masked = jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(masked, axis=-1)
  return jnp.where(mask, weights, 0.0).astype(scores.dtype)


def sigmoid_attention(scores: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
  """Ramapuram et al. (2025): each weight `sigmoid(score - log n)`, on its own, for a row of
  `n` allowed keys (their bias b = -log n, which starts a row's weights near summing to one).

  The weights need not sum to one. `n` is counted per row, so a decoder row at position i of
  a causal mask (i + 1 keys) gets the bias that the same row gets from the cache's mask, and
  packed sentences each count their own keys. Masked keys get exactly zero weight, and so do
  the keys of a row whose keys are all masked.
  """
  z = scores.astype(jnp.float32)
  if mask is None:
    return jax.nn.sigmoid(z - math.log(z.shape[-1])).astype(scores.dtype)
  allowed = jnp.broadcast_to(mask, z.shape)
  n = jnp.maximum(jnp.sum(allowed, axis=-1, keepdims=True), 1).astype(jnp.float32)
  return jnp.where(allowed, jax.nn.sigmoid(z - jnp.log(n)), 0.0).astype(scores.dtype)


def _shifted(scores, mask):
  """float32 scores minus their row's largest allowed score (so that is 0), -inf where masked,
  and the mask broadcast to the scores' shape. Sparsemax and entmax are shift invariant."""
  z = scores.astype(jnp.float32)
  valid = jnp.broadcast_to(True if mask is None else mask, z.shape)
  top = jnp.max(jnp.where(valid, z, -jnp.inf), axis=-1, keepdims=True)
  return jnp.where(valid, z - top, -jnp.inf), valid


def _sum_over_keys(x):
  return jnp.sum(x, axis=-1, keepdims=True)


def descending(x: jnp.ndarray) -> jnp.ndarray:
  """`x` sorted over its last axis, largest first: the values of `-jnp.sort(-x, axis=-1)`, by
  a bitonic sorting network (Batcher, 1968).

  The network is log2(n) (log2(n) + 1) / 2 rounds of elementwise max and min between fixed
  pairs of positions (n padded to a power of two with -inf, which sorts last), which XLA fuses
  and vectorizes; XLA:CPU's sort calls a comparator per pair, and took 7.3x the time at
  attention's `[64, 4, 64, 64]` (docs/performance.md, "Sparse normalizers' sort"). Max and min
  are exact, so the values are the sort's, bit for bit.
  """
  n = x.shape[-1]
  size = 1 << (n - 1).bit_length() if n > 1 else 1
  lead = x.shape[:-1]
  if size != n:
    x = jnp.concatenate([x, jnp.full(lead + (size - n,), -jnp.inf, x.dtype)], axis=-1)
  merge = 2
  while merge <= size:  # Sorted runs of merge / 2 become runs of `merge`, ...
    stride = merge // 2
    while stride >= 1:  # ... by comparing positions i and i + stride within blocks of 2 stride.
      blocks = size // (2 * stride)
      pairs = x.reshape(lead + (blocks, 2, stride))
      first, second = pairs[..., 0, :], pairs[..., 1, :]
      # A block whose run goes down (the `merge` bit of its first position clear) keeps the
      # larger value first; the others the smaller, so that the next merge sees bitonic runs.
      down = jnp.asarray((np.arange(blocks) * 2 * stride) & merge == 0)[:, None]
      larger, smaller = jnp.maximum(first, second), jnp.minimum(first, second)
      x = jnp.stack([jnp.where(down, larger, smaller), jnp.where(down, smaller, larger)],
                    axis=-2).reshape(lead + (size,))
      stride //= 2
    merge *= 2
  return x[..., :n]


def _jacobian_transpose_times(s, g):
  """`J^T g` for `J = diag(s) - s s^T / sum(s)` (zero on a row where s is all zero)."""
  total = _sum_over_keys(s)
  return s * (g - _sum_over_keys(s * g) / jnp.where(total > 0, total, 1.0))


def _closed_form_rules(forward, jacobian_s):
  """The `jax.custom_vjp` rules of `forward(scores, mask) -> float32 weights p`: the backward
  is `J^T g` with `J = diag(s) - s s^T / sum(s)` and `s = jacobian_s(p)`."""

  def fwd(scores, mask=None):
    p = forward(scores, mask)
    return p.astype(scores.dtype), p

  def bwd(p, g):
    return _jacobian_transpose_times(jacobian_s(p), g.astype(jnp.float32)).astype(g.dtype), None

  return fwd, bwd


def _sparsemax_weights(scores, mask):
  """Martins & Astudillo (2016), Alg. 1, in float32: sort, and from the prefix sums `c_k`
  take the support size `k(z) = max{k : 1 + k z_(k) > c_k}` and `tau = (c_k(z) - 1) / k(z)`."""
  z, valid = _shifted(scores, mask)
  z = jnp.maximum(z, _FLOOR)
  z_sorted = descending(z)
  rank = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
  prefix = jnp.cumsum(z_sorted, axis=-1)
  support = jnp.sum(1 + rank * z_sorted > prefix, axis=-1, keepdims=True)  # >= 1
  tau = (jnp.take_along_axis(prefix, support - 1, axis=-1) - 1) / support
  return jnp.where(valid, jnp.maximum(z - tau, 0.0), 0.0)


@jax.custom_vjp
def sparsemax(scores: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
  """Martins & Astudillo (2016), sparsemax: the Euclidean projection of the scores onto the
  simplex, `max(z - tau, 0)` over the last axis, by their exact sort-based Alg. 1.

  Backward (their Eq. 14): on the support S, `g - mean_S(g)`; zero off it.
  """
  return _sparsemax_weights(scores, mask).astype(scores.dtype)


sparsemax.defvjp(*_closed_form_rules(_sparsemax_weights, lambda p: (p > 0).astype(p.dtype)))


def _entmax15_weights(scores, mask):
  """Peters, Niculae & Martins (2019), Alg. 2 on `x = z / 2`, in float32. For each prefix
  of the sorted x, of size k, mean M_k and sum of squared deviations S_k, the candidate is
  `tau_k = M_k - sqrt(max((1 - S_k) / k, 0))`; tau is the candidate of the largest k with
  `tau_k <= x_(k)`."""
  z, valid = _shifted(scores, mask)
  x = jnp.maximum(z, _FLOOR) / 2
  x_sorted = descending(x)
  rank = jnp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
  mean = jnp.cumsum(x_sorted, axis=-1) / rank
  squared_deviations = jnp.cumsum(x_sorted**2, axis=-1) - rank * mean**2
  candidates = mean - jnp.sqrt(jnp.maximum((1 - squared_deviations) / rank, 0.0))
  support = jnp.sum(candidates <= x_sorted, axis=-1, keepdims=True)  # >= 1
  tau = jnp.take_along_axis(candidates, support - 1, axis=-1)
  return jnp.where(valid, jnp.maximum(x - tau, 0.0) ** 2, 0.0)


@jax.custom_vjp
def entmax15(scores: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
  """Peters, Niculae & Martins (2019), 1.5-entmax: `max(z / 2 - tau, 0)^2` over the last
  axis, with tau such that the weights sum to 1, by their exact sort-based Alg. 2.

  Backward (their Prop. 5): with `s = sqrt(p)`, `dz = s g - s (s . g) / sum(s)`.
  """
  return _entmax15_weights(scores, mask).astype(scores.dtype)


entmax15.defvjp(*_closed_form_rules(_entmax15_weights, jnp.sqrt))


def _entmax_bisect_forward(scores, mask, alpha):
  """`max((alpha - 1) z - tau, 0)^(1 / (alpha - 1))`, tau found by bisection (float32)."""
  z, valid = _shifted(scores, mask)
  power = 1 / (jnp.asarray(alpha, jnp.float32) - 1)
  x = z / power  # (alpha - 1) z; the row's largest allowed entry is 0.

  def weights(tau):
    return jnp.where(valid, jnp.maximum(x - tau, 0.0) ** power, 0.0)

  # Sum >= 1 at tau = -1 (the top weight is 1); sum <= 1 where each weight is <= 1/n.
  high = -(1.0 / jnp.maximum(_sum_over_keys(valid), 1)) ** (1 / power)
  low = jnp.full_like(high, -1.0)

  def halve(_, bracket):
    low, width = bracket
    middle = low + width / 2
    return jnp.where(_sum_over_keys(weights(middle)) >= 1, middle, low), width / 2

  low, _ = jax.lax.fori_loop(0, _BISECTIONS, halve, (low, high - low))
  p = weights(low)
  total = _sum_over_keys(p)
  return p / jnp.where(total > 0, total, 1.0)


@jax.custom_vjp
def entmax_bisect(scores: jnp.ndarray, mask: jnp.ndarray | None, alpha) -> jnp.ndarray:
  """alpha-entmax for any alpha > 1 (Blondel et al., 2019; Peters et al., 2019), by a fixed
  number of bisection steps on tau, as in Correia et al. (2019), "Adaptively Sparse
  Transformers": `max((alpha - 1) z - tau, 0)^(1 / (alpha - 1))` over the last axis.

  `alpha`: a scalar or an array broadcastable to `scores.shape[:-1] + (1,)`, so with a
  trailing axis of size 1 (e.g. `[heads, 1, 1]` for scores `[batch, heads, q, k]`: one
  learned alpha per head). alpha = 2 is sparsemax, alpha = 1.5 is 1.5-entmax; alpha near 1
  approaches softmax, but its gradient in alpha grows like 1 / (alpha - 1)^2.

  Backward: for the scores, `J^T g` with `s = p^(2 - alpha)` on the support; for alpha,
  Correia et al. (2019), Appendix B, summed over the axes alpha was broadcast over.
  """
  return _entmax_bisect_forward(scores, mask, alpha).astype(scores.dtype)


def _entmax_bisect_fwd(scores, mask, alpha):
  p = _entmax_bisect_forward(scores, mask, alpha)
  return p.astype(scores.dtype), (p, jnp.asarray(alpha))


def _entmax_bisect_bwd(residuals, g):
  p, alpha = residuals
  a, g32, support = alpha.astype(jnp.float32), g.astype(jnp.float32), p > 0
  s = jnp.where(support, p ** jnp.where(support, 2 - a, 0.0), 0.0)
  d_scores = _jacobian_transpose_times(s, g32)
  # dp/dalpha = (p - s_hat) / (alpha - 1)^2 - (p log p - s_hat H) / (alpha - 1), with
  # s_hat = s / sum(s) and H = sum(p log p).
  p_log_p = jnp.where(support, p * jnp.log(jnp.where(support, p, 1.0)), 0.0)
  total = _sum_over_keys(s)
  s_hat = s / jnp.where(total > 0, total, 1.0)
  dp = (p - s_hat) / (a - 1) ** 2 - (p_log_p - s_hat * _sum_over_keys(p_log_p)) / (a - 1)
  d_alpha = _sum_to_shape(_sum_over_keys(g32 * dp), alpha.shape)
  return d_scores.astype(g.dtype), None, d_alpha.astype(alpha.dtype)


def _sum_to_shape(x, shape):
  """Sums `x` over the axes that broadcasting `shape` to `x.shape` added or stretched."""
  x = jnp.sum(x, axis=tuple(range(x.ndim - len(shape))))
  stretched = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
  return jnp.sum(x, axis=stretched, keepdims=True).reshape(shape)


entmax_bisect.defvjp(_entmax_bisect_fwd, _entmax_bisect_bwd)


class LearnedAlpha(nnx.Module):
  """Correia et al. (2019), "Adaptively Sparse Transformers": each head learns its alpha,
  1 + sigmoid(a) in (1, 2) (from softmax-like to sparsemax), starting at `alpha`."""

  def __init__(self, num_heads: int, alpha: float):
    self.logit = nnx.Param(jnp.full((num_heads,), math.log((alpha - 1) / (2 - alpha)),
                                    jnp.float32))

  def __call__(self) -> jnp.ndarray:
    """`[heads, 1, 1]`: broadcasts against scores `[batch, heads, q, k]`' rows."""
    return (1 + jax.nn.sigmoid(self.logit[...]))[:, None, None]


def learned_alpha(name: str, cfg, num_heads: int) -> LearnedAlpha | None:
  """The alpha per head that `NORMALIZERS[name]` learns (None: it learns none)."""
  return LearnedAlpha(num_heads, cfg["entmax_alpha"]) if NORMALIZERS[name].learns_alpha else None


def bound(name: str, options: tuple = (), learned: LearnedAlpha | None = None) -> Callable:
  """`NORMALIZERS[name]`'s `normalize(scores, mask)`, its hyperparameters `options` ((field,
  value) pairs, as `options_of` reads them) bound, and its `learned` alpha in place of the
  configured one."""
  options = dict(options)
  if learned is not None:
    options["entmax_alpha"] = learned()
  return functools.partial(NORMALIZERS[name].normalize, **options)


def options_of(name: str, cfg) -> tuple:
  """`NORMALIZERS[name]`'s hyperparameters read from `cfg` (config.model), as static pairs."""
  return tuple((field, cfg[field]) for field in NORMALIZERS[name].hyperparameters)


def zero_share(weights: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
  """The share of exactly-zero weights among the allowed (unmasked) entries, a float32
  scalar (0 when none is allowed)."""
  allowed = jnp.broadcast_to(True if mask is None else mask, weights.shape)
  zeros = jnp.sum((weights == 0) & allowed)
  return (zeros / jnp.maximum(jnp.sum(allowed), 1)).astype(jnp.float32)


class Normalizer(NamedTuple):
  """A way to turn scores into weights.

  normalize: `(scores, mask, **hyperparameters) -> weights`, see the module's docstring.
  sparse: it can give allowed keys exactly zero weight (so `zero_share` is worth reporting).
  hyperparameters: its own settings, as `normalize`'s keyword arguments named after their
    `config.model` fields (as `attention.Variant.hyperparameters`); a layer that learns one
    (e.g. alpha per head) passes its parameter under the same keyword.
  """
  normalize: Callable[..., jnp.ndarray]
  sparse: bool
  hyperparameters: tuple[str, ...] = ()
  learns_alpha: bool = False  # Each head learns its alpha, from `config.model.entmax_alpha`.
  sums_to_one: bool = True  # A row's weights sum to 1 (sigmoid attention's need not).


NORMALIZERS: Registry[str, Normalizer] = Registry(
    "normalizer", "config.model.attention_normalizer", entries={
    "softmax": Normalizer(masked_softmax, sparse=False),
    "sparsemax": Normalizer(sparsemax, sparse=True),
    "entmax15": Normalizer(entmax15, sparse=True),
    "entmax_bisect": Normalizer(
        lambda scores, mask, entmax_alpha: entmax_bisect(scores, mask, entmax_alpha),
        sparse=True, hyperparameters=("entmax_alpha",)),
    "entmax_learned": Normalizer(
        lambda scores, mask, entmax_alpha: entmax_bisect(scores, mask, entmax_alpha),
        sparse=True, hyperparameters=("entmax_alpha",), learns_alpha=True),
    "sigmoid": Normalizer(sigmoid_attention, sparse=False, sums_to_one=False),
})
