"""Attention: score functions picked by name, the normalizer, multi-head attention.

A score is three small functions in the `SCORES` registry:
  `init(heads, head_dim, max_keys, rngs) -> params` (None when it has none),
  `prepare(keys, params) -> keys'`, applied once per key (so once per source
    sentence, or once per cached target token), and
  `score(query, keys', params) -> scores`,
with `query [batch, heads, q, d]`, `keys [batch, heads, k, d]` and scores
`[batch, heads, q, k]`. Masking, positions' biases, the normalizer (softmax unless
`config.model.attention_normalizer` names another: `normalizers`) and the weighted sum happen
in `attend`, the one place they live; so does the sharing of key/value heads.

`VARIANTS` is the one registry `config.model.attention` names: every softmax
score above, and the variants that replace the softmax kernel altogether (`kernels`):
`linear` (kernelized, O(n)), `local` (a window) and `local_global` (a window and global
positions). Each entry says how it attends, whether it can keep packed sentences apart, and
what cross-attention uses in its place. A new softmax score is one function and one `SCORES`
entry; it is then a variant, tested by every test that loops over the registry. Positions
that act inside self-attention (`positions`) reach it through `MultiHeadAttention`.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.models.dropout import Dropout
from seq2seq.models.kernels import linear_attention, local_attention, local_global_attention
from seq2seq.models.linear import Linear
from seq2seq.models.masks import Mask
from seq2seq.models.normalizers import NORMALIZERS, Normalizer, bound, learned_alpha, masked_softmax
from seq2seq.models.positions import POSITIONS, Positions


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


def fold_heads(x: jnp.ndarray, per_key_head: int) -> jnp.ndarray:
  """`[batch, heads, q, ...]` -> `[batch, kv_heads, per_key_head * q, ...]`: the query heads
  that share one key/value head (Ainslie et al., 2023: consecutive heads) as one head's rows.
  A reshape, so keys and values are never copied per query head."""
  if per_key_head == 1:
    return x
  b, h, q = x.shape[:3]
  return x.reshape(b, h // per_key_head, per_key_head * q, *x.shape[3:])


def unfold_heads(x: jnp.ndarray, per_key_head: int) -> jnp.ndarray:
  """The inverse of `fold_heads`."""
  if per_key_head == 1:
    return x
  b, kv, rows = x.shape[:3]
  return x.reshape(b, kv * per_key_head, rows // per_key_head, *x.shape[3:])


def weighted_sum(weights: jnp.ndarray, values: jnp.ndarray) -> jnp.ndarray:
  """`sum_k weights[b, h, q, k] values[b, kv(h), k, :]`, where `values` may have fewer heads
  than `weights` (shared key/value heads)."""
  per_key_head = weights.shape[1] // values.shape[1]
  context = jnp.einsum("bhqk,bhkd->bhqd", fold_heads(weights, per_key_head), values)
  return unfold_heads(context, per_key_head)


def attend(score: Score, query, keys, values, mask: jnp.ndarray | None, params=None, *,
           bias: jnp.ndarray | None = None, normalizer: Callable = masked_softmax):
  """Scores, masks, normalizes and averages the values.

  Args:
    score: an entry of `SCORES`.
    query: `[batch, heads, q, d]`.
    keys: `[batch, kv_heads, k, d']`, already through `score.prepare`; `kv_heads` divides
      `heads` (fewer: each key/value head serves `heads / kv_heads` query heads).
    values: `[batch, kv_heads, k, d_v]`.
    mask: boolean, broadcastable to `[batch, heads, q, k]`, or None.
    params: the score's parameters (None for parameter-free scores).
    bias: added to the scores (positions inside attention), `[batch or 1, heads, q, k]`.
    normalizer: `(scores, mask) -> weights` (`normalizers.NORMALIZERS`).

  Returns:
    (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`).
  """
  per_key_head = query.shape[1] // keys.shape[1]
  scores = unfold_heads(score.score(fold_heads(query, per_key_head), keys, params), per_key_head)
  if bias is not None:
    scores = scores + bias.astype(scores.dtype)
  weights = normalizer(scores, mask)
  return weighted_sum(weights, values), weights


class Variant(NamedTuple):
  """An attention variant: the score's parameters and key preparation, and its kernel.

  attend: `(query, prepared keys, values, mask: Mask, params, **hyperparameters) ->
    (context, weights)`; a variant that `normalizes` also takes `normalizer=`, and a
    softmax score `bias=` (positions inside attention, `positions.Positions.bias`).
  weight_dropout: attention dropout applies to its (softmax) weights.
  normalizes: its weights come from a normalizer (`config.model.attention_normalizer`).
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
  normalizes: bool = True


def _softmax_variant(score: Score) -> Variant:
  def attend_with_score(query, keys, values, mask: Mask, params, **options):
    return attend(score, query, keys, values, mask.dense(query.shape[2]), params, **options)
  return Variant(score.init, score.prepare, attend_with_score)


VARIANTS: dict[str, Variant] = {
    **{name: _softmax_variant(score) for name, score in SCORES.items()},
    "linear": Variant(
        _no_params, _keys_as_they_are,
        lambda query, keys, values, mask, params: linear_attention(query, keys, values, mask),
        weight_dropout=False, packs=False, normalizes=False),
    # A window over source positions would not follow the alignment between the two
    # sentences, so cross-attention stays full scaled dot-product attention.
    "local": Variant(
        _no_params, _keys_as_they_are,
        lambda query, keys, values, mask, params, attention_window, **options: local_attention(
            query, keys, values, mask, attention_window, **options),
        weight_dropout=False, cross="scaled_dot", hyperparameters=("attention_window",)),
    # The window plus the first `attention_globals` positions, which see and are seen by all.
    "local_global": Variant(
        _no_params, _keys_as_they_are,
        lambda query, keys, values, mask, params, attention_window, attention_globals, **options:
        local_global_attention(query, keys, values, mask, attention_window, attention_globals,
                               **options),
        weight_dropout=False, packs=False, cross="scaled_dot",
        hyperparameters=("attention_window", "attention_globals")),
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


def hyperparameters(cfg, attention: str, positions: str | None = None,
                    normalizer: str = "softmax") -> dict[str, Any]:
  """The `config.model` fields that `attention`, `positions` and `normalizer` take (their
  entries' `hyperparameters`), read from `cfg`: a `MultiHeadAttention`'s keyword arguments."""
  names = VARIANTS[attention].hyperparameters + NORMALIZERS[normalizer].hyperparameters
  if positions is not None:
    names += POSITIONS[positions].hyperparameters
  return {field: cfg[field] for field in names}


class MultiHeadAttention(nnx.Module):
  """Multi-head attention with the variant, the positions inside it and the normalizer
  chosen by name, and optionally fewer key/value heads than query heads.

  `project_kv` turns inputs into (prepared) keys and values separately from
  the query path, so callers compute them once (the cross-attention memory,
  the decoder's cache) and pass them in.
  """

  def __init__(self, dim: int, num_heads: int, *, attention: str, dropout_rate: float,
               rngs: nnx.Rngs, max_keys: int = 0, dtype: Any = None, num_kv_heads: int = 0,
               positions: str | None = None, normalizer: str = "softmax", **hyperparameters):
    """`num_kv_heads`: key/value heads, each shared by `num_heads / num_kv_heads` query heads
    (Shazeer, 2019; Ainslie et al., 2023); 0: one per query head. `positions`: a
    `POSITIONS` entry that acts inside attention (None: none). `hyperparameters`: the
    variant's, the positions' and the normalizer's own (`hyperparameters(cfg, ...)`)."""
    self.num_heads = num_heads
    self.num_kv_heads = num_kv_heads or num_heads
    # The names (static); `variant`, `position` and `normalize` look them up.
    self.attention, self.position_name, self.normalizer = attention, positions, normalizer
    declared = set(self.variant.hyperparameters + self._normalizer.hyperparameters
                   + (self.position.hyperparameters if self.position else ()))
    if set(hyperparameters) != declared:
      raise TypeError(f"{attention} attention with positions {positions} and {normalizer}"
                      f" takes the hyperparameters {sorted(declared)}, not"
                      f" {sorted(hyperparameters)}.")
    self.hyperparameters = tuple(sorted(hyperparameters.items()))  # Static.
    head_dim = dim // num_heads
    self.score_params = self.variant.init(self.num_kv_heads, head_dim, max_keys, rngs)
    self.position_params = (self.position.init(num_heads, head_dim, rngs,
                                                **self._options(self.position))
                            if self.position and self.position.init else None)
    linear = lambda out: Linear(dim, out, use_bias=False, dtype=dtype, rngs=rngs)  # noqa: E731
    kv_dim = self.num_kv_heads * head_dim
    self.query, self.key, self.value, self.out = linear(dim), linear(kv_dim), linear(kv_dim), \
        linear(dim)
    self.dropout = Dropout(dropout_rate)
    self.alpha = learned_alpha(normalizer, dict(hyperparameters), num_heads)

  @property
  def variant(self) -> Variant:
    return VARIANTS[self.attention]

  @property
  def position(self) -> Positions | None:
    return POSITIONS[self.position_name] if self.position_name else None

  @property
  def _normalizer(self) -> Normalizer:
    return NORMALIZERS[self.normalizer]

  def _options(self, entry) -> dict[str, Any]:
    """The bound hyperparameters that `entry` (a variant, positions or normalizer) takes."""
    return {k: v for k, v in self.hyperparameters if k in entry.hyperparameters}

  def project_kv(self, x: jnp.ndarray, positions: jnp.ndarray | None = None):
    """`[batch, k, dim]` -> (prepared keys, values), each `[batch, kv_heads, k, head_dim]`;
    keys turned by their `positions [batch or 1, k]` where the positions rotate them."""
    keys = split_heads(self.key(x), self.num_kv_heads)
    if positions is not None and self.position and self.position.rotate:
      keys = self.position.rotate(keys, positions)
    keys = self.variant.prepare(keys, self.score_params)
    return keys, split_heads(self.value(x), self.num_kv_heads)

  def __call__(self, x, keys, values, mask: Mask, *, positions=None,
               rngs: nnx.Rngs | None = None, return_weights: bool = False):
    """Attends from `x [batch, q, dim]` to projected `keys`/`values`.

    `positions`: (query positions `[batch or 1, q]`, key positions `[batch or 1, k]`), for
    positions that act inside attention (self-attention), or None.

    Returns `[batch, q, dim]`, and the weights `[batch, heads, q, k]` when asked.
    """
    query = split_heads(self.query(x), self.num_heads)
    options = self._options(self.variant)
    if self.normalizer != "softmax":  # A variant's own default is the softmax.
      options["normalizer"] = bound(self.normalizer, tuple(self._options(self._normalizer).items()),
                                    self.alpha)
    relative, entry = None, self.position
    if positions is not None and entry is not None:
      if entry.rotate:
        query = entry.rotate(query, positions[0])
      relative = positions[1][:, None, :] - positions[0][:, :, None]  # [b or 1, q, k]
      if entry.bias:
        bias = entry.bias(query, relative, self.position_params, self.num_heads)
        options["bias"] = jnp.broadcast_to(bias, query.shape[:2] + bias.shape[2:])
    # Fewer key rows than query rows: each sentence's keys serve `groups` adjacent query
    # rows (its beams), which attend together as one row's `groups * q` queries.
    groups = query.shape[0] // keys.shape[0]
    if groups > 1:
      query = _group_rows(query, groups)
      if "bias" in options:
        options["bias"] = _group_rows(options["bias"], groups)
    context, weights = self.variant.attend(query, keys, values, mask, self.score_params,
                                           **options)
    if groups > 1:
      context, weights = _ungroup_rows(context, groups), _ungroup_rows(weights, groups)
    # Dropout on the attention weights only changes the weighted sum. Its mask is drawn for
    # the query rows as they are (so grouped beams drop what they would ungrouped), and the
    # sum is taken grouped again, over each sentence's one copy of the values.
    used = weights
    if rngs is not None and self.dropout.rate > 0 and self.variant.weight_dropout:
      used = self.dropout(weights, deterministic=False, rngs=rngs)
      context = weighted_sum(_group_rows(used, groups) if groups > 1 else used, values)
      if groups > 1:
        context = _ungroup_rows(context, groups)
    if relative is not None and entry.value:
      context = context + entry.value(used, relative, self.position_params)
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
