"""Attention: score functions picked by name, the normalizer, multi-head attention.

A score is three small functions in the `SCORES` registry (`scores`, with `attend`):
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
that act inside self-attention (`positions`) reach it through `MultiHeadAttention`, which
also holds QK-norm and the output gate. What every variant does with heads is in `heads`;
differential attention, whose two maps replace the softmax's one, in `differential`.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.models.differential import DifferentialParams, differential_attend
from seq2seq.models.dropout import Dropout
from seq2seq.models.heads import (  # noqa: F401
  dot_score,
  fold_heads,
  group_rows,
  merge_heads,
  scaled_dot_score,
  split_heads,
  unfold_heads,
  ungroup_rows,
  unit_length,
  weighted_sum,
)
from seq2seq.models.kernels import linear_attention, local_attention, local_global_attention
from seq2seq.models.linear import Linear
from seq2seq.models.masks import Mask
from seq2seq.models.normalizers import NORMALIZERS, Normalizer, bound, learned_alpha, masked_softmax  # noqa: F401
from seq2seq.models.positions import POSITIONS, Positions
from seq2seq.models.scores import SCORES, Score, ScoreParams, attend, keys_as_they_are, no_params  # noqa: F401
from seq2seq.registry import Registry


class Variant(NamedTuple):
  """An attention variant: the score's parameters and key preparation, and its kernel.

  attend: `(query, prepared keys, values, mask: Mask, params, **hyperparameters) ->
    (context, weights)`; a variant that `normalizes` also takes `normalizer=`, and a
    softmax score `bias=` (positions inside attention, `positions.Positions.bias`).
  weight_dropout: it takes attention dropout (`config.model.attention_dropout_rate`) on its
    weights; `check_config` refuses the rate beside a variant that does not (one that never
    forms the weights its output sums).
  drops_inside: its `attend` also takes `dropout=`, a function it applies to the weights it
    sums, before their sum (a kernel that forms the full `[q, k]` weights only for callers that
    read them); otherwise the weighted sum is taken again from the dropped `[q, k]` weights.
  normalizes: its weights come from a normalizer (`config.model.attention_normalizer`).
  packs: it keeps packed sentences apart (segment ids), so rows may be packed.
  cross: the variant that cross-attention uses instead (None: this one).
  hyperparameters: its own settings, as `attend`'s keyword arguments named after their
    `config.model` fields (`hyperparameters(cfg)` reads them); bound when a layer is built.
  qk_scale: `head_dim -> s`, where its scores are dot products of queries and keys divided by
    `s` (QK-norm then scales the query by `s` times its learned scale, so that the scale
    takes the divisor's place); None: its scores are not, and QK-norm does not apply.
  layered: `init` also takes `layer=`, the layer's index in its stack from 0.
  maps: its `attend` also takes `maps=True`, and then returns (context, weights, maps): what
    its weights are made of, by name, each `[batch, heads, q, k or 1]` (differential
    attention's two maps and lambda: `differential_attend`), for pictures.
  """
  init: Callable[..., ScoreParams | None]
  prepare: Callable[[jnp.ndarray, Any], jnp.ndarray]
  attend: Callable[..., tuple[jnp.ndarray, jnp.ndarray]]
  weight_dropout: bool = True
  drops_inside: bool = False
  packs: bool = True
  cross: str | None = None
  hyperparameters: tuple[str, ...] = ()
  normalizes: bool = True
  qk_scale: Callable[[int], float] | None = None
  layered: bool = False
  maps: bool = False


def _softmax_variant(score: Score, qk_scale: Callable[[int], float] | None = None) -> Variant:
  def attend_with_score(query, keys, values, mask: Mask, params, **options):
    return attend(score, query, keys, values, mask.dense(query.shape[2]), params, **options)
  return Variant(score.init, score.prepare, attend_with_score, qk_scale=qk_scale)


def _root(head_dim: int) -> float:
  """What scaled dot products divide by: sqrt(d)."""
  return math.sqrt(head_dim)


# The scores that are dot products of queries and keys, by what they divide them by.
_DOT_PRODUCTS: dict[str, Callable[[int], float]] = {"scaled_dot": _root, "dot": lambda d: 1.0}


VARIANTS: Registry[str, Variant] = Registry(
    "attention variant", "config.model.attention", entries={
    **{name: _softmax_variant(score, _DOT_PRODUCTS.get(name)) for name, score in SCORES.items()},
    "linear": Variant(
        no_params, keys_as_they_are,
        lambda query, keys, values, mask, params: linear_attention(query, keys, values, mask),
        weight_dropout=False, packs=False, normalizes=False),
    # A window over source positions would not follow the alignment between the two
    # sentences, so cross-attention stays full scaled dot-product attention.
    "local": Variant(
        no_params, keys_as_they_are,
        lambda query, keys, values, mask, params, attention_window, **options: local_attention(
            query, keys, values, mask, attention_window, **options),
        drops_inside=True, cross="scaled_dot", hyperparameters=("attention_window",),
        qk_scale=_root),
    # The window plus the first `attention_globals` positions, which see and are seen by all.
    "local_global": Variant(
        no_params, keys_as_they_are,
        lambda query, keys, values, mask, params, attention_window, attention_globals, **options:
        local_global_attention(query, keys, values, mask, attention_window, attention_globals,
                               **options),
        drops_inside=True, packs=False, cross="scaled_dot",
        hyperparameters=("attention_window", "attention_globals"), qk_scale=_root),
    # Two maps per head, subtracted. Its output is normalized per head after the weighted sum,
    # which dropout on the weights would skip; and its weights come from softmaxes only.
    "differential": Variant(
        lambda heads, head_dim, max_keys, rngs, layer: DifferentialParams(head_dim, layer, rngs),
        keys_as_they_are, differential_attend, weight_dropout=False, normalizes=False,
        layered=True, maps=True),
})
# Every softmax score is a variant, those registered later (a user's own: docs/extending.md)
# too.
VARIANTS.follows(SCORES, lambda name, score: _softmax_variant(score, _DOT_PRODUCTS.get(name)))


def hyperparameters(cfg, attention: str, positions: str | None = None,
                    normalizer: str = "softmax") -> dict[str, Any]:
  """The `config.model` fields that `attention`, `positions` and `normalizer` take (their
  entries' `hyperparameters`), read from `cfg`: a `MultiHeadAttention`'s keyword arguments."""
  names = VARIANTS[attention].hyperparameters + NORMALIZERS[normalizer].hyperparameters
  if positions is not None:
    names += POSITIONS[positions].hyperparameters
  return {field: cfg[field] for field in names}


# config.model.attention_gate: none, or Qiu et al.'s gate per head or per feature.
GATES = ("none", "headwise", "elementwise")


class MultiHeadAttention(nnx.Module):
  """Multi-head attention with the variant, the positions inside it and the normalizer
  chosen by name, and optionally fewer key/value heads than query heads.

  `project_kv` turns inputs into (prepared) keys and values separately from
  the query path, so callers compute them once (the cross-attention memory,
  the decoder's cache) and pass them in.
  """

  def __init__(self, dim: int, num_heads: int, *, attention: str, dropout_rate: float,
               rngs: nnx.Rngs, max_keys: int = 0, dtype: Any = None, num_kv_heads: int = 0,
               positions: str | None = None, normalizer: str = "softmax",
               qk_norm: bool = False, qk_norm_scale: float = 0.0, gate: str = "none",
               layer: int = 0, **hyperparameters):
    """`num_kv_heads`: key/value heads, each shared by `num_heads / num_kv_heads` query heads
    (Shazeer, 2019; Ainslie et al., 2023); 0: one per query head. `positions`: a
    `POSITIONS` entry that acts inside attention (None: none). `qk_norm`: queries and keys
    L2-normalized per head, their dot product scaled by a learned scalar starting at
    `qk_norm_scale` (0: log2(L^2 - L) for L = `max_keys`; Henry et al., 2020). `gate`:
    "headwise" or "elementwise", a sigmoid gate from the input `x` on each head's output (Qiu
    et al., 2025); "none". `layer`: the index in its stack, for variants that depend on it.
    `hyperparameters`: the variant's, the positions' and the normalizer's own
    (`hyperparameters(cfg, ...)`)."""
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
    self.score_params = self.variant.init(self.num_kv_heads, head_dim, max_keys, rngs,
                                          **({"layer": layer} if self.variant.layered else {}))
    self.position_params = (self.position.init(num_heads, head_dim, rngs,
                                                **self._options(self.position))
                            if self.position and self.position.init else None)
    linear = lambda out: Linear(dim, out, use_bias=False, dtype=dtype, rngs=rngs)  # noqa: E731
    kv_dim = self.num_kv_heads * head_dim
    self.query, self.key, self.value, self.out = linear(dim), linear(kv_dim), linear(kv_dim), \
        linear(dim)
    self.dropout = Dropout(dropout_rate)
    self.alpha = learned_alpha(normalizer, dict(hyperparameters), num_heads)
    if qk_norm and self.variant.qk_scale is None:
      raise TypeError(f"{attention} attention's scores are not dot products: no QK-norm.")
    length = max(max_keys, 2)  # Henry et al.'s L: log2(L^2 - L) unless a start is given.
    self.qk_scale = (nnx.Param(jnp.asarray(qk_norm_scale or math.log2(length**2 - length),
                                           jnp.float32)) if qk_norm else None)
    self.gate = None if gate == "none" else Linear(
        dim, num_heads if gate == "headwise" else dim, use_bias=False, dtype=dtype, rngs=rngs)

  def gate_values(self, x: jnp.ndarray) -> jnp.ndarray:
    """The gate of each head's output for inputs `x [batch, q, dim]`: `sigmoid(x W)` as
    `[batch, heads, q, 1]` (head-wise) or `[batch, heads, q, head_dim]` (element-wise)."""
    gate = jax.nn.sigmoid(self.gate(x).astype(jnp.float32))
    return split_heads(gate, self.num_heads)

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
    if self.qk_scale is not None:
      keys = unit_length(keys)
    if positions is not None and self.position and self.position.rotate:
      keys = self.position.rotate(keys, positions)
    keys = self.variant.prepare(keys, self.score_params)
    return keys, split_heads(self.value(x), self.num_kv_heads)

  def __call__(self, x, keys, values, mask: Mask, *, positions=None,
               rngs: nnx.Rngs | None = None, return_weights: bool = False,
               return_parts: bool = False):
    """Attends from `x [batch, q, dim]` to projected `keys`/`values`.

    `positions`: (query positions `[batch or 1, q]`, key positions `[batch or 1, k]`), for
    positions that act inside attention (self-attention), or None.

    Returns `[batch, q, dim]`, and the weights `[batch, heads, q, k]` when asked. With
    `return_parts` too, the weights come as a dict, for pictures: `weights`, and where this
    attention has them what makes them (the variant's `maps`: differential attention's `map1`,
    `map2` and `lambda`) and the `gate` on each head's output, `[batch, heads, q, 1]` (an
    element-wise gate's mean over the head's features).
    """
    query, options, relative = self._query(x, positions)
    # Fewer key rows than query rows: each sentence's keys serve `groups` adjacent query
    # rows (its beams), which attend together as one row's `groups * q` queries.
    groups = query.shape[0] // keys.shape[0]
    if groups > 1:
      query = group_rows(query, groups)
      if "bias" in options:
        options["bias"] = group_rows(options["bias"], groups)
    dropping = rngs is not None and self.dropout.rate > 0 and self.variant.weight_dropout
    if dropping and self.variant.drops_inside:  # The kernel drops the weights it sums.
      options["dropout"] = lambda w: self.dropout(w, deterministic=False, rngs=rngs)
    if return_parts and self.variant.maps:
      options["maps"] = True  # The variant also returns what makes its weights.
    context, weights, *maps = self.variant.attend(query, keys, values, mask, self.score_params,
                                                  **options)
    maps = {name: ungroup_rows(part, groups) if groups > 1 else part
            for name, part in (maps[0] if maps else {}).items()}
    if groups > 1:
      context, weights = ungroup_rows(context, groups), ungroup_rows(weights, groups)
    used = weights  # The weights the values are summed with.
    if dropping and not self.variant.drops_inside:
      used, context = self._dropped(weights, values, groups, rngs)
    if relative is not None and self.position.value:
      context = context + self.position.value(used, relative, self.position_params)
    gate = None if self.gate is None else self.gate_values(x)
    if gate is not None:
      context = context * gate.astype(context.dtype)
    out = self.out(merge_heads(context))
    if return_weights and return_parts:
      return out, self._parts(weights, maps, gate)
    return (out, weights) if return_weights else out

  def _query(self, x, positions) -> tuple[jnp.ndarray, dict[str, Any], jnp.ndarray | None]:
    """`__call__`'s query heads `[batch, heads, q, head_dim]` (unit length and scaled under
    QK-norm, turned by their positions where those rotate), the options of the variant's
    `attend` (its hyperparameters, the normalizer, the positions' bias), and the distances
    `[batch or 1, q, k]` from each query to each key where positions act inside attention."""
    query = split_heads(self.query(x), self.num_heads)
    if self.qk_scale is not None:  # The learned scale in place of the variant's divisor.
      scale = self.qk_scale[...] * self.variant.qk_scale(query.shape[-1])
      query = unit_length(query) * scale.astype(query.dtype)
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
    return query, options, relative

  def _dropped(self, weights, values, groups: int, rngs: nnx.Rngs):
    """Dropout on the attention `weights` outside the variant's kernel: the weights dropped,
    and the context summed again with them (dropout only changes the weighted sum). Its mask
    is drawn for the query rows as they are (so grouped beams drop what they would
    ungrouped), and the sum is taken grouped again, over each sentence's one copy of the
    values."""
    used = self.dropout(weights, deterministic=False, rngs=rngs)
    context = weighted_sum(group_rows(used, groups) if groups > 1 else used, values)
    if groups > 1:
      context = ungroup_rows(context, groups)
    return used, context

  @staticmethod
  def _parts(weights, maps, gate) -> dict[str, jnp.ndarray]:
    """`__call__`'s weights with `return_parts`: the `weights`, the variant's `maps`, and the
    `gate` on each head's output, `[batch, heads, q, 1]`: an element-wise gate's mean over
    the head's features."""
    if gate is None:
      return {"weights": weights, **maps}
    return {"weights": weights, **maps, "gate": jnp.mean(gate, axis=-1, keepdims=True)}


# Names from the papers, pointed at the variant that implements them: (name here, what it is).
PAPER_NAMES = {
    "bahdanau": ("concat", "Bahdanau et al.'s additive attention"),
    "additive": ("concat", "additive attention"),
    "luong": ("general", "Luong et al.'s bilinear (general) attention"),
    "multiplicative": ("general", "multiplicative attention"),
    "vaswani": ("scaled_dot", "Vaswani et al.'s scaled dot-product attention"),
    "sutskever": ("none", "Sutskever et al.'s fixed-vector encoder-decoder"),
}
