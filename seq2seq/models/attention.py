"""Attention: score functions picked by name, masked softmax, multi-head attention.

A score is three small functions in the `SCORES` registry:
  `init(heads, head_dim, max_keys, rngs) -> params` (None when it has none),
  `prepare(keys, params) -> keys'`, applied once per key (so once per source
    sentence, or once per cached target token), and
  `score(query, keys', params) -> scores`,
with `query [batch, heads, q, d]`, `keys [batch, heads, k, d]` and scores
`[batch, heads, q, k]`. Masking, the softmax and the weighted sum happen in
`attend`, the one place they live.

`VARIANTS` is the one registry `config.model.attention` names: every softmax
score above, and the variants that replace the softmax kernel altogether,
`linear` (kernelized, O(n)) and `local` (a window). Each entry says how it
attends, whether it can keep packed sentences apart, and what cross-attention
uses in its place. A new softmax score is one function and one `SCORES` entry;
it is then a variant, tested by every test that loops over the registry.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.models.dropout import Dropout
from seq2seq.models.linear import Linear
from seq2seq.models.masks import Mask


class ScoreParams(nnx.Module):
  """The weights of one score function, as named parameters."""

  def __init__(self, **arrays):
    for name, value in arrays.items():
      setattr(self, name, nnx.Param(value))


def _normal(rngs, shape, fan_in):
  return jax.random.normal(rngs.params(), shape) * fan_in**-0.5


class Score(NamedTuple):
  init: Callable[..., ScoreParams | None]
  prepare: Callable[[jnp.ndarray, Any], jnp.ndarray]
  score: Callable[[jnp.ndarray, jnp.ndarray, Any], jnp.ndarray]


def _no_params(heads, head_dim, max_keys, rngs):
  del heads, head_dim, max_keys, rngs


def _keys_as_they_are(keys, params):
  del params
  return keys


def dot_score(query, keys, params=None):
  """Luong et al. (2015), dot: score(h_t, h_s) = h_t . h_s."""
  del params
  return jnp.einsum("bhqd,bhkd->bhqk", query, keys)


def scaled_dot_score(query, keys, params=None):
  """Vaswani et al. (2017): q . k / sqrt(d)."""
  return dot_score(query, keys, params) / jnp.sqrt(query.shape[-1]).astype(query.dtype)


def general_prepare(keys, params):
  """W_a h_s, once per key."""
  return jnp.einsum("bhkd,hed->bhke", keys, params.w[...])


def concat_prepare(keys, params):
  """W_k h_s, once per key: only W_q s changes from step to step."""
  return jnp.einsum("bhkd,hda->bhka", keys, params.w_key[...])


def concat_score(query, keys, params):
  """Bahdanau et al. (2015), additive: v^T tanh(W_q s + W_k h_s) (keys already W_k h_s)."""
  q = jnp.einsum("bhqd,hda->bhqa", query, params.w_query[...])
  hidden = jnp.tanh(q[:, :, :, None, :] + keys[:, :, None, :, :])  # [b, h, q, k, a]
  return jnp.einsum("bhqka,ha->bhqk", hidden, params.v[...])


def location_score(query, keys, params):
  """Luong et al. (2015), location: a_t = softmax(W_a h_t), from the query alone."""
  scores = jnp.einsum("bhqd,hdl->bhql", query, params.w[...])
  return scores[..., :keys.shape[2]]


SCORES: dict[str, Score] = {
    "scaled_dot": Score(_no_params, _keys_as_they_are, scaled_dot_score),
    "dot": Score(_no_params, _keys_as_they_are, dot_score),
    "general": Score(
        lambda h, d, n, rngs: ScoreParams(w=_normal(rngs, (h, d, d), d)),
        general_prepare, dot_score),
    "concat": Score(
        lambda h, d, n, rngs: ScoreParams(w_query=_normal(rngs, (h, d, d), d),
                                          w_key=_normal(rngs, (h, d, d), d),
                                          v=_normal(rngs, (h, d), d)),
        concat_prepare, concat_score),
    "location": Score(
        lambda h, d, n, rngs: ScoreParams(w=_normal(rngs, (h, d, n), d)),
        _keys_as_they_are, location_score),
}


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


def attend(score: Score, query, keys, values, mask: jnp.ndarray | None, params=None):
  """Scores, masks, normalizes and averages the values.

  Args:
    score: an entry of `SCORES`.
    query: `[batch, heads, q, d]`.
    keys: `[batch, heads, k, d']`, already through `score.prepare`.
    values: `[batch, heads, k, d_v]`.
    mask: boolean, broadcastable to `[batch, heads, q, k]`, or None.
    params: the score's parameters (None for parameter-free scores).

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`).
  """
  weights = masked_softmax(score.score(query, keys, params), mask)
  return jnp.einsum("bhqk,bhkd->bhqd", weights, values), weights


def _feature_map(x):
  """Katharopoulos et al. (2020): phi(x) = elu(x) + 1, positive."""
  return jax.nn.elu(x) + 1.0


def _exclusive_cumsum(x, axis):
  """Sums of everything before each position along `axis` (zero at the first)."""
  total = jnp.cumsum(x, axis=axis)
  return jnp.concatenate([jnp.zeros_like(jax.lax.slice_in_dim(x, 0, 1, axis=axis)),
                          jax.lax.slice_in_dim(total, 0, -1, axis=axis)], axis=axis)


def _causal_linear_sums(q, k, v, chunk: int):
  """`sum_{j<=i} (q_i . k_j) v_j` and `sum_{j<=i} q_i . k_j` for every position i.

  Chunk by chunk: within a chunk the `[chunk, chunk]` products are formed
  directly; across chunks one `d x d_v` key-value sum per chunk is carried (not
  one per position, which would take `chunk` times the memory). Work is
  O(n * chunk * d + n * d^2), linear in the length n.
  """
  b, h, t, _ = q.shape
  size = min(chunk, t)
  n = -(-t // size)
  q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, n * size - t), (0, 0))).reshape(b, h, n, size, -1)
             for x in (q, k, v))
  within = jnp.einsum("bhncd,bhnkd->bhnck", q, k) * jnp.tril(jnp.ones((size, size), q.dtype))
  kv_before = _exclusive_cumsum(jnp.einsum("bhnkd,bhnke->bhnde", k, v), axis=2)
  k_before = _exclusive_cumsum(k.sum(axis=3), axis=2)
  numerator = (jnp.einsum("bhnck,bhnke->bhnce", within, v)
               + jnp.einsum("bhncd,bhnde->bhnce", q, kv_before))
  denominator = within.sum(-1) + jnp.einsum("bhncd,bhnd->bhnc", q, k_before)
  return (numerator.reshape(b, h, n * size, -1)[:, :, :t],
          denominator.reshape(b, h, n * size)[:, :, :t])


def linear_attention(query, keys, values, mask: Mask, eps: float = 1e-6, chunk: int = 64):
  """Kernelized attention: phi(q)^T sum_j phi(k_j) v_j^T / phi(q)^T sum_j phi(k_j).

  O(n) in sequence length: the key/value sums are formed once (chunked prefix
  sums when causal, see `_causal_linear_sums`) instead of a `[q, k]` matrix.

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`); the
    weights are formed only if a caller uses them (XLA drops them otherwise).
  """
  if mask.segmented:  # The prefix sums below would run across packed sentences.
    raise ValueError("linear attention does not support packed rows (segment ids).")
  q = _feature_map(query)
  k = _feature_map(keys) * mask.key_valid[:, None, :, None]
  if mask.causal:  # Teacher-forced decoder: query i sums keys 0..i.
    numerator, denominator = _causal_linear_sums(q, k, values, chunk)
  else:
    numerator = jnp.einsum("bhqd,bhde->bhqe", q, jnp.einsum("bhkd,bhke->bhde", k, values))
    denominator = jnp.einsum("bhqd,bhd->bhq", q, k.sum(axis=2))
  context = numerator / (denominator[..., None] + eps)
  similarity = jnp.einsum("bhqd,bhkd->bhqk", q, k) * mask.dense(query.shape[2])
  weights = similarity / (similarity.sum(-1, keepdims=True) + eps)
  return context, weights


def local_attention(query, keys, values, mask: Mask, window: int):
  """Scaled dot-product attention within `window` positions of each query.

  Each query gathers only its `2 * window + 1` neighbouring keys, so the work
  is O(n * window), not O(n^2). Positions come from the mask, so a decoding
  step at position i sees cache slots i - window .. i.

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`).
  """
  num_queries, num_keys = query.shape[2], keys.shape[2]
  offsets = jnp.arange(-window, window + 1)
  index = mask.query_positions(num_queries)[:, None] + offsets  # [q, w]
  valid = (index >= 0) & (index < num_keys)
  index = jnp.clip(index, 0, num_keys - 1)
  valid = valid[None] & mask.key_valid[:, index]  # [batch, q, w]
  if mask.segmented:
    valid = valid & (mask.key_segments[:, index] == mask.query_segments[:, :, None])
  if mask.causal:
    valid = valid & (offsets <= 0)
  near_keys, near_values = keys[:, :, index], values[:, :, index]  # [b, h, q, w, d]
  scores = jnp.einsum("bhqd,bhqwd->bhqw", query, near_keys) / jnp.sqrt(query.shape[-1])
  near_weights = masked_softmax(scores, valid[:, None])
  context = jnp.einsum("bhqw,bhqwd->bhqd", near_weights, near_values)
  one_hot = jax.nn.one_hot(index, num_keys, dtype=near_weights.dtype)  # [q, w, k]
  weights = jnp.einsum("bhqw,qwk->bhqk", near_weights, one_hot)
  return context, weights


class Variant(NamedTuple):
  """An attention variant: the score's parameters and key preparation, and its kernel.

  attend: `(query, prepared keys, values, mask: Mask, params, **hyperparameters) ->
    (context, weights)`.
  weight_dropout: attention dropout applies to its (softmax) weights.
  packs: it keeps packed sentences apart (segment ids), so rows may be packed.
  cross: the variant that cross-attention uses instead (None: this one).
  hyperparameters: its own settings, as `attend`'s keyword arguments named after their
    `config.model` fields (`hyperparameters(cfg)` reads them); bound when a layer is built.
  """
  init: Callable[..., ScoreParams | None]
  prepare: Callable[[jnp.ndarray, Any], jnp.ndarray]
  attend: Callable[..., tuple[jnp.ndarray, jnp.ndarray]]
  weight_dropout: bool = True
  packs: bool = True
  cross: str | None = None
  hyperparameters: tuple[str, ...] = ()


def hyperparameters(name: str, cfg) -> dict[str, Any]:
  """Variant `name`'s hyperparameters, read from `cfg` (config.model)."""
  return {field: cfg[field] for field in VARIANTS[name].hyperparameters}


def _softmax_variant(score: Score) -> Variant:
  def attend_with_score(query, keys, values, mask: Mask, params):
    return attend(score, query, keys, values, mask.dense(query.shape[2]), params)
  return Variant(score.init, score.prepare, attend_with_score)


VARIANTS: dict[str, Variant] = {
    **{name: _softmax_variant(score) for name, score in SCORES.items()},
    "linear": Variant(
        _no_params, _keys_as_they_are,
        lambda query, keys, values, mask, params: linear_attention(query, keys, values, mask),
        weight_dropout=False, packs=False),
    # A window over source positions would not follow the alignment between the two
    # sentences, so cross-attention stays full scaled dot-product attention.
    "local": Variant(
        _no_params, _keys_as_they_are,
        lambda query, keys, values, mask, params, attention_window: local_attention(
            query, keys, values, mask, attention_window),
        weight_dropout=False, cross="scaled_dot", hyperparameters=("attention_window",)),
}


def split_heads(x: jnp.ndarray, num_heads: int) -> jnp.ndarray:
  """`[batch, length, heads * d]` -> `[batch, heads, length, d]`."""
  b, length, _ = x.shape
  return x.reshape(b, length, num_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x: jnp.ndarray) -> jnp.ndarray:
  """`[batch, heads, length, d]` -> `[batch, length, heads * d]`."""
  b, h, length, d = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b, length, h * d)


def _group_rows(x: jnp.ndarray, groups: int) -> jnp.ndarray:
  """`[batch * groups, heads, q, d]` -> `[batch, heads, groups * q, d]`."""
  rows, h, q, d = x.shape
  return x.reshape(rows // groups, groups, h, q, d).swapaxes(1, 2).reshape(-1, h, groups * q, d)


def _ungroup_rows(x: jnp.ndarray, groups: int) -> jnp.ndarray:
  """The inverse of `_group_rows`."""
  b, h, gq, d = x.shape
  return x.reshape(b, h, groups, gq // groups, d).swapaxes(1, 2).reshape(-1, h, gq // groups, d)


class MultiHeadAttention(nnx.Module):
  """Multi-head attention with the variant chosen by name.

  `project_kv` turns inputs into (prepared) keys and values separately from
  the query path, so callers compute them once (the cross-attention memory,
  the decoder's cache) and pass them in.
  """

  def __init__(self, dim: int, num_heads: int, *, attention: str, dropout_rate: float,
               rngs: nnx.Rngs, max_keys: int = 0, dtype: Any = None, **hyperparameters):
    """`hyperparameters`: the variant's own (`Variant.hyperparameters`), bound here."""
    self.num_heads = num_heads
    self.attention = attention  # The name (static); `variant` looks it up.
    missing = set(self.variant.hyperparameters) - set(hyperparameters)
    if missing or set(hyperparameters) - set(self.variant.hyperparameters):
      raise TypeError(f"{attention} attention takes the hyperparameters"
                      f" {self.variant.hyperparameters}, not {tuple(hyperparameters)}.")
    self.hyperparameters = tuple(sorted(hyperparameters.items()))  # Static.
    head_dim = dim // num_heads
    self.score_params = self.variant.init(num_heads, head_dim, max_keys, rngs)
    linear = lambda: Linear(dim, dim, use_bias=False, dtype=dtype, rngs=rngs)  # noqa: E731
    self.query, self.key, self.value, self.out = linear(), linear(), linear(), linear()
    self.dropout = Dropout(dropout_rate)

  @property
  def variant(self) -> Variant:
    return VARIANTS[self.attention]

  def project_kv(self, x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """`[batch, k, dim]` -> (prepared keys, values), each `[batch, heads, k, head_dim]`."""
    keys = self.variant.prepare(split_heads(self.key(x), self.num_heads), self.score_params)
    return keys, split_heads(self.value(x), self.num_heads)

  def __call__(self, x, keys, values, mask: Mask, *, rngs: nnx.Rngs | None = None,
               return_weights: bool = False):
    """Attends from `x [batch, q, dim]` to projected `keys`/`values`.

    Returns `[batch, q, dim]`, and the weights `[batch, heads, q, k]` when asked.
    """
    query = split_heads(self.query(x), self.num_heads)
    # Fewer key rows than query rows: each sentence's keys serve `groups` adjacent query
    # rows (its beams), which attend together as one row's `groups * q` queries.
    groups = query.shape[0] // keys.shape[0]
    if groups > 1:
      query = _group_rows(query, groups)
    context, weights = self.variant.attend(query, keys, values, mask, self.score_params,
                                           **dict(self.hyperparameters))
    if groups > 1:
      context, weights = _ungroup_rows(context, groups), _ungroup_rows(weights, groups)
    # Dropout on the attention weights only changes the weighted sum. Its mask is drawn for
    # the query rows as they are (so grouped beams drop what they would ungrouped), and the
    # sum is taken grouped again, over each sentence's one copy of the values.
    if rngs is not None and self.dropout.rate > 0 and self.variant.weight_dropout:
      dropped = self.dropout(weights, deterministic=False, rngs=rngs)
      if groups > 1:
        dropped = _group_rows(dropped, groups)
      context = jnp.einsum("bhqk,bhkd->bhqd", dropped, values)
      if groups > 1:
        context = _ungroup_rows(context, groups)
    out = self.out(merge_heads(context))
    return (out, weights) if return_weights else out


# Names from the papers, pointed at the variant that implements them: (name here, what it is).
PAPER_NAMES = {
    "bahdanau": ("concat", "Bahdanau et al.'s additive attention"),
    "additive": ("concat", "additive attention"),
    "luong": ("general", "Luong et al.'s bilinear (general) attention"),
    "multiplicative": ("general", "multiplicative attention"),
    "vaswani": ("scaled_dot", "Vaswani et al.'s scaled dot-product attention"),
    "sutskever": ("none", "Sutskever et al.'s fixed-vector encoder-decoder"),
}
