"""Softmax, sparsemax and entmax: known answers, the bisection definition, masks, gradients."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq.models import attention
from seq2seq.models.normalizers import (
  NORMALIZERS,
  descending,
  entmax15,
  entmax_bisect,
  masked_softmax,
  sparsemax,
  zero_share,
)

# Values for the registry entries' hyperparameters (a new one needs a value here).
HYPERPARAMETERS = {"entmax_alpha": 1.3}
# The exact sort-based forwards, and the bisection one at alphas they do not cover.
BY_ALPHA = {
    "sparsemax": (2.0, sparsemax),
    "entmax15": (1.5, entmax15),
    **{f"bisect-{a}": (a, lambda z, m=None, a=a: entmax_bisect(z, m, a))
       for a in (1.25, 1.5, 2.0, 3.0)},
}


def normalize(name, scores, mask):
  entry = NORMALIZERS[name]
  return entry.normalize(scores, mask, **{h: HYPERPARAMETERS[h] for h in entry.hyperparameters})


def reference(z, alpha, iterations=200):
  """alpha-entmax by its definition, in float64: (p, tau) with
  p = max((alpha - 1) z - tau, 0)^(1 / (alpha - 1)) and tau bisected until sum(p) = 1."""
  x = (alpha - 1) * np.asarray(z, np.float64)
  low, high = x.max(-1, keepdims=True) - 1, x.max(-1, keepdims=True)  # sum(p) >= 1 >= sum(p)
  weights = lambda tau: np.maximum(x - tau, 0) ** (1 / (alpha - 1))  # noqa: E731
  for _ in range(iterations):
    middle = (low + high) / 2
    above = weights(middle).sum(-1, keepdims=True) >= 1
    low, high = np.where(above, middle, low), np.where(above, high, middle)
  return weights(low), low


def random_scores(shape, seed, scale=2.0):
  return scale * jax.random.normal(jax.random.key(seed), shape)


def test_sparsemax_known_answers():
  # [1, 0.5, -1]: prefix sums 1, 1.5, 0.5; 1 + k z_(k) > c_k for k = 1 (2 > 1), k = 2 (2 > 1.5),
  # not k = 3 (-2 > 0.5): support 2, tau = (1.5 - 1) / 2 = 0.25.
  np.testing.assert_allclose(sparsemax(jnp.array([1.0, 0.5, -1.0])), [0.75, 0.25, 0.0])
  # A tie inside the support, [0.3, 0.3, 0.9]: sorted 0.9, 0.3, 0.3, prefix sums 0.9, 1.2, 1.5;
  # k = 3 holds (1 + 0.9 > 1.5): tau = (1.5 - 1) / 3 = 1/6, p = [2/15, 2/15, 11/15].
  np.testing.assert_allclose(sparsemax(jnp.array([0.3, 0.3, 0.9])), [2 / 15, 2 / 15, 11 / 15],
                             rtol=1e-6)
  # A tie on the boundary, [0.5, 0.5, 0]: k = 3 fails (1 + 0 > 1 is false): tau = 0, z_3 = tau.
  np.testing.assert_allclose(sparsemax(jnp.array([0.5, 0.5, 0.0])), [0.5, 0.5, 0.0])
  # One-hot, [2, 0.5, 0]: k = 2 fails (1 + 1 > 2.5 is false): tau = 2 - 1 = 1, p = [1, 0, 0].
  np.testing.assert_array_equal(sparsemax(jnp.array([2.0, 0.5, 0.0])), [1.0, 0.0, 0.0])


def test_entmax15_known_answers():
  # [2, 1, 0]: x = z / 2 = [1, 0.5, 0]. With support {1, 2}, (1 - tau)^2 + (0.5 - tau)^2 = 1,
  # i.e. 2 tau^2 - 3 tau + 0.25 = 0, tau = (3 - sqrt(7)) / 4 ~ 0.0886 (in (0, 0.5), so x_3 = 0
  # is out): p = [((1 + sqrt 7) / 4)^2, ((sqrt 7 - 1) / 4)^2, 0] = [(4 + sqrt 7) / 8,
  # (4 - sqrt 7) / 8, 0].
  r7 = np.sqrt(7)
  np.testing.assert_allclose(entmax15(jnp.array([2.0, 1.0, 0.0])),
                             [(4 + r7) / 8, (4 - r7) / 8, 0.0], rtol=1e-6)
  # Full support, [0.2, 0, 0]: x = [0.1, 0, 0], (0.1 - tau)^2 + 2 tau^2 = 1, i.e.
  # 3 tau^2 - 0.2 tau - 0.99 = 0, tau = (0.2 - sqrt(11.92)) / 6 ~ -0.542.
  tau = (0.2 - np.sqrt(11.92)) / 6
  np.testing.assert_allclose(entmax15(jnp.array([0.2, 0.0, 0.0])),
                             [(0.1 - tau) ** 2, tau**2, tau**2], rtol=1e-6)
  # One-hot, [3, 0.5, 0]: x = [1.5, 0.25, 0]; support {1} gives tau = 1.5 - 1 = 0.5 > 0.25.
  np.testing.assert_array_equal(entmax15(jnp.array([3.0, 0.5, 0.0])), [1.0, 0.0, 0.0])


@pytest.mark.parametrize("n", [1, 2, 3, 8, 24, 37, 64, 150])
def test_the_sorting_network_gives_the_sorts_values_bit_for_bit(n):
  """Sparsemax's and entmax's sort: ties (scores floored to one value), -inf (the padding it
  adds), values of every magnitude, at lengths that are and are not powers of two."""
  rng = np.random.default_rng(n)
  x = rng.normal(size=(5, 3, n)) * 10.0 ** rng.integers(-3, 4, size=(5, 3, 1))
  x[0] = np.round(x[0])  # Many ties.
  x[1, :, ::3] = -np.inf
  x[2] = np.maximum(x[2], -3.0)  # The normalizers' floor.
  x = jnp.asarray(x, jnp.float32)
  expected = np.asarray(-jnp.sort(-x, axis=-1))
  got = np.asarray(jax.jit(descending)(x))
  assert got.dtype == expected.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize("normalizer", [sparsemax, entmax15], ids=["sparsemax", "entmax15"])
def test_the_weights_and_gradients_are_those_of_the_sort_bit_for_bit(normalizer, monkeypatch):
  """The network changes no weight and no gradient: with XLA's sort in its place (the
  forward as it was), the same scores, masks and cotangents give the same bits."""
  from seq2seq.models import normalizers
  rng = np.random.default_rng(7)
  scores = jnp.asarray(rng.normal(size=(4, 2, 5, 37)) * 3, jnp.float32)
  mask = jnp.asarray(rng.random((4, 1, 1, 37)) > 0.2)
  cotangent = jnp.asarray(rng.normal(size=scores.shape), jnp.float32)

  def weights_and_gradient():
    weights, pullback = jax.vjp(lambda z: normalizer(z, mask), scores)
    return (weights, *pullback(cotangent))

  got = jax.jit(lambda: weights_and_gradient())()  # A new function each time: traced anew.
  monkeypatch.setattr(normalizers, "descending", lambda x: -jnp.sort(-x, axis=-1))
  expected = jax.jit(lambda: weights_and_gradient())()
  assert all(np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("name", BY_ALPHA)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4, 9)])
def test_equals_the_bisection_definition(name, shape):
  alpha, fn = BY_ALPHA[name]
  z = random_scores(shape, seed=len(shape))
  expected, _ = reference(z, alpha)
  np.testing.assert_allclose(fn(z), expected, atol=2e-6)
  if alpha >= 1.5:  # So the random rows do reach exact zeros.
    assert zero_share(fn(z)) > 0


def test_bisection_takes_an_alpha_per_head():
  z = random_scores((2, 3, 4, 6), seed=3)  # [batch, heads, q, k]
  alpha = jnp.array([1.2, 1.5, 2.5])[:, None, None]
  expected, _ = reference(z, np.asarray(alpha))
  np.testing.assert_allclose(entmax_bisect(z, None, alpha), expected, atol=2e-6)


def some_masks(shape, seed):
  """A key-padding mask with one query row whose keys are all masked."""
  mask = jax.random.bernoulli(jax.random.key(seed), 0.7, shape)
  return mask.at[..., 0, :].set(False).at[..., 1, :2].set(True)


@pytest.mark.parametrize("name", NORMALIZERS)
def test_masks_zero_rows_and_sums(name):
  z = random_scores((2, 3, 4, 8), seed=1)
  mask = some_masks(z.shape, seed=2)
  weights = normalize(name, z, mask)
  assert weights.shape == z.shape and weights.dtype == z.dtype
  assert not np.isnan(weights).any()
  assert (weights >= 0).all()
  np.testing.assert_array_equal(np.where(mask, 0.0, weights), 0.0)  # masked: exactly 0
  np.testing.assert_array_equal(weights[..., 0, :], 0.0)  # all masked: all 0
  if NORMALIZERS[name].sums_to_one:  # (Sigmoid attention's rows need not: its own test.)
    np.testing.assert_allclose(weights.sum(-1)[..., 1:], 1.0, rtol=1e-6)
  gradient = jax.grad(lambda s: (normalize(name, s, mask) * z).sum())(z)
  assert not np.isnan(gradient).any()
  np.testing.assert_array_equal(np.where(mask, 0.0, gradient), 0.0)


@pytest.mark.parametrize("name", NORMALIZERS)
def test_a_masked_key_is_a_missing_key(name):
  z = random_scores((9,), seed=4)
  mask = np.array([1, 0, 1, 1, 0, 0, 1, 1, 1], bool)
  np.testing.assert_allclose(normalize(name, z, mask)[mask], normalize(name, z[mask], None),
                             rtol=1e-6, atol=1e-7)


def test_zero_share():
  weights = sparsemax(jnp.array([1.0, 0.5, -1.0]))  # [0.75, 0.25, 0]
  assert zero_share(weights) == pytest.approx(1 / 3)
  assert zero_share(weights, jnp.array([True, True, False])) == 0.0  # The zero is masked.
  padded = jnp.array([0.75, 0.25, 0.0, 0.0])  # One zero among the 3 allowed.
  assert zero_share(padded, jnp.array([True, True, True, False])) == pytest.approx(1 / 3)
  assert zero_share(jnp.zeros((2, 3)), jnp.zeros((2, 3), bool)) == 0.0  # Nothing allowed.
  peaked = jnp.array([[4.0, 1.0, 0.5, 0.0, -1.0]])
  for name, entry in NORMALIZERS.items():
    share = zero_share(normalize(name, peaked, None))
    assert share > 0 if entry.sparse else share == 0, name


def finite_difference_jacobian(z, alpha, h=1e-6):
  """d p_i / d z_j of `reference`, by central differences in float64."""
  z = np.asarray(z, np.float64)
  columns = [(reference(z + h * e, alpha)[0] - reference(z - h * e, alpha)[0]) / (2 * h)
             for e in np.eye(z.size)]
  return np.stack(columns, axis=-1)


@pytest.mark.parametrize("name", BY_ALPHA)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backward_equals_finite_differences(name, seed):
  alpha, fn = BY_ALPHA[name]
  z = random_scores((6,), seed=seed, scale=0.8 / (alpha - 1))
  p, tau = reference(z, alpha)
  assert np.abs((alpha - 1) * np.asarray(z) - tau).min() > 1e-3  # Away from the kinks.
  assert 1 < (p > 0).sum() < 6  # Both on and off the support.
  np.testing.assert_allclose(jax.jacobian(fn)(z), finite_difference_jacobian(z, alpha),
                             atol=5e-5)


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0, 3.0])
def test_alpha_gradient_equals_finite_differences(alpha, h=1e-6):
  z = random_scores((2, 6), seed=5)
  g = random_scores((2, 6), seed=6)
  loss = lambda a: (entmax_bisect(z, None, a) * g).sum()  # noqa: E731
  expected = ((reference(z, alpha + h)[0] - reference(z, alpha - h)[0]) * g).sum() / (2 * h)
  np.testing.assert_allclose(jax.grad(loss)(alpha), expected, rtol=1e-3, atol=1e-5)


def test_alpha_gradient_per_head_is_summed_over_the_rest():
  z = random_scores((2, 3, 4, 6), seed=7)
  alpha = jnp.array([1.2, 1.5, 2.5])[:, None, None]
  grad = jax.grad(lambda a: (entmax_bisect(z, None, a) * z).sum())(alpha)
  assert grad.shape == alpha.shape
  for head in range(3):
    z_head = z[:, head]
    one = jax.grad(lambda a, z=z_head: (entmax_bisect(z, None, a) * z).sum())
    np.testing.assert_allclose(grad[head, 0, 0], one(alpha[head, 0, 0]), rtol=1e-5)


def original_masked_softmax(scores, mask):
  """seq2seq/models/attention.py's masked_softmax before it moved here, verbatim."""
  if mask is None:
    return jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(scores.dtype)
  masked = jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(masked, axis=-1)
  return jnp.where(mask, weights, 0.0).astype(scores.dtype)


def test_masked_softmax_is_the_original_bit_for_bit():
  assert attention.masked_softmax is masked_softmax  # One copy, used by attention.
  for seed in range(3):
    z = random_scores((2, 3, 5, 7), seed=seed, scale=5.0)
    mask = some_masks(z.shape, seed=seed + 10)
    for m in (mask, mask[:, :1, :1], None):
      np.testing.assert_array_equal(masked_softmax(z, m), original_masked_softmax(z, m))
    z16 = z.astype(jnp.bfloat16)
    np.testing.assert_array_equal(masked_softmax(z16, mask), original_masked_softmax(z16, mask))


@pytest.mark.parametrize("name", [n if n == "entmax15" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in NORMALIZERS])
def test_jit_and_vmap(name):
  z = random_scores((3, 4, 6), seed=8)
  mask = some_masks(z.shape, seed=9)
  eager = normalize(name, z, mask)
  fn = lambda s, m: normalize(name, s, m)  # noqa: E731
  np.testing.assert_allclose(jax.jit(fn)(z, mask), eager, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(jax.vmap(fn)(z, mask), eager, rtol=1e-6, atol=1e-7)
  grad = jax.grad(lambda s, m, g: (fn(s, m) * g).sum())
  g = random_scores(z.shape, seed=10)
  np.testing.assert_allclose(jax.vmap(grad)(z, mask, g), grad(z, mask, g), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NORMALIZERS)
def test_bfloat16(name):
  z = random_scores((4, 16), seed=11).astype(jnp.bfloat16)
  weights = normalize(name, z, None)
  assert weights.dtype == jnp.bfloat16
  # Computed in float32 from the same values, then rounded.
  np.testing.assert_array_equal(weights, normalize(name, z.astype(jnp.float32), None)
                                .astype(jnp.bfloat16))
  if NORMALIZERS[name].sums_to_one:
    np.testing.assert_allclose(weights.astype(jnp.float32).sum(-1), 1.0, atol=2e-2)
  gradient = jax.grad(lambda s: normalize(name, s, None)[:, 0].astype(jnp.float32).sum())(z)
  assert gradient.dtype == jnp.bfloat16 and not np.isnan(gradient.astype(jnp.float32)).any()


class _Words:
  """A tokenizer stub: word i of the vocabulary is id i + 4."""

  def encode(self, text):
    return [4 + int(word) for word in text.split()]


# The Transformer's with -m slow (10 s): the RNN's checks the same code by default.
@pytest.mark.parametrize("family", [pytest.param("transformer", marks=pytest.mark.slow), "rnn"])
def test_zero_shares_count_exact_zeros_among_the_allowed_weights(tiny_config, family, tmp_path):
  """softmax gives no allowed weight exactly zero; sparsemax does, and its count is the one
  read off each sentence's own attention (padding, other sentences' length, never counted)."""
  from types import SimpleNamespace

  from flax import nnx

  from seq2seq.compare import report
  from seq2seq.config import copied
  from seq2seq.decoding import alignment
  from seq2seq.models import build_model

  sources, references = ["1 2 3 4 5 6 7", "8 9"], ["3 4 5", "6 7 8 9 10 11"]
  tiny_config.model.update(family=family, attention="general" if family == "rnn" else
                           "scaled_dot")
  shares, translators = {}, {}
  for name in ("softmax", "sparsemax"):
    tiny_config.model.attention_normalizer = name
    model = build_model(tiny_config, 40)
    if family == "rnn":  # Its scores at initialization lie within 1 of each other: spread them.
      model.score_params.w[...] = 30 * model.score_params.w[...]
    graphdef, params = nnx.split(model, nnx.Param)
    translators[name] = SimpleNamespace(tokenizer=_Words(), params=params, graphdef=graphdef,
                                        config=copied(tiny_config))
    shares[name] = alignment.zero_shares(translators[name], sources, references, batch=4)
  assert set(shares["softmax"]) == ({"cross"} if family == "rnn" else
                                    {"cross", "encoder", "decoder"})
  assert all(share == 0.0 for per_layer in shares["softmax"].values() for share in per_layer)
  model = nnx.merge(graphdef, params)
  allowed = zeros = 0
  for s, r in zip(sources, references, strict=True):  # One sentence at a time, unpadded.
    src, tgt_in = alignment._inputs(np.array(_Words().encode(s)), np.array(
        _Words().encode(r) + [3]))
    w = np.asarray(model.attention_weights(jnp.asarray(src[None]),
                                           jnp.asarray(tgt_in[None]))["cross"])[0]
    allowed, zeros = allowed + w.size, zeros + int((w == 0).sum())
  assert shares["sparsemax"]["cross"][0] == pytest.approx(zeros / allowed)
  assert zeros > 0
  # seq2seq-compare's zeros.csv: the sparse run's shares, and no row for softmax's (all 0).
  report.write_zeros(tmp_path, translators, (sources, references))
  rows = list(csv.DictReader(open(tmp_path / "zeros.csv", encoding="utf-8")))
  assert [row["run"] for row in rows] == ["sparsemax"]
  assert float(rows[0]["cross_1"]) == pytest.approx(zeros / allowed, abs=1e-4)


def test_a_learned_alpha_per_head_starts_at_the_config_and_learns(tiny_config):
  """entmax_learned: each head's alpha starts at config.model.entmax_alpha (1.5: the weights
  are entmax15's), and the loss's gradient reaches every head's alpha."""
  from flax import nnx

  from seq2seq.models import attention, build_model, masks

  layer = attention.MultiHeadAttention(8, 2, attention="scaled_dot", dropout_rate=0.0,
                                       rngs=nnx.Rngs(params=0), normalizer="entmax_learned",
                                       entmax_alpha=1.5)
  np.testing.assert_allclose(layer.alpha()[:, 0, 0], [1.5, 1.5], rtol=1e-6)
  x = jax.random.normal(jax.random.key(0), (1, 5, 8))
  mask = masks.padding_mask(jnp.array([[5, 6, 7, 8, 0]]))
  _, learned = layer(x, *layer.project_kv(x), mask, return_weights=True)
  query = attention.split_heads(layer.query(x), 2)
  keys = attention.split_heads(layer.key(x), 2)
  scores = jnp.einsum("bhqd,bhkd->bhqk", query, keys) / 2.0
  np.testing.assert_allclose(learned, entmax15(scores, mask.dense(5)), atol=1e-5)

  tiny_config.model.update(attention_normalizer="entmax_learned", entmax_alpha=1.3)
  graphdef, params = nnx.split(build_model(tiny_config, 40), nnx.Param)
  src, tgt = jnp.array([[5, 6, 7, 3]]), jnp.array([[2, 8, 9, 10]])

  def loss(params):
    model = nnx.merge(graphdef, params)
    return model.decode(model.encode(src), tgt).sum()

  logits = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(jax.grad(loss)(params))
            if ".alpha" in jax.tree_util.keystr(path) or "'alpha'" in jax.tree_util.keystr(path)]
  assert len(logits) == 3  # Encoder self-, decoder self- and cross-attention, one layer each.
  assert all(np.all(np.asarray(leaf) != 0) for leaf in logits)
