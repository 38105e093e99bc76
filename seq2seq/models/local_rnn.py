"""Local attention of the RNN decoder (Luong et al. 2015, "Effective Approaches to
Attention-based Neural Machine Translation", section 3.2).

At target step t the decoder attends only to the source positions s within D
(`config.model.attention_window`; Luong et al. used D = 10) of an aligned position p_t:

  local_m (monotonic): p_t = t, the target position, and a softmax over the window (eq. 7);
  local_p (predictive): p_t = S sigmoid(v_p^T tanh(W_p h_t)) (eq. 9), S the sentence's real
    (unpadded) length, and the window's softmax times exp(-(s - p_t)^2 / (2 sigma^2)),
    sigma = D / 2, not renormalized (eq. 10).

Both score with `general`, h_t^T W_a h_s (Luong et al.'s best model is local-p with general),
from the decoder's current state h_t (`rnn.queries_previous_state`), and give every key
outside the window, and padding, exactly zero weight. Positions count from 0: source words
s = 0..S-1, target steps t = 0, 1, ...; local_p's p_t is real-valued, its window the integers
within D of it. The paper leaves open what local_m does past the source's end: here
p_t = min(t, S - 1), so that a target longer than its source still attends to the source's
last words. With `reverse_source` the memory holds word s at position S - 1 - s, so local_m's
window is placed there, on the same words; local_p learns its positions in the memory's order.

Each query gathers only its 2D + 1 window keys (O(t D) work, not O(t S)); the `[q, src_len]`
weights are spread out of the window's for the callers that use them (alignment pictures), and
XLA drops them otherwise.

`KERNELS` is what the RNN attends with, by `config.model.attention` name: every softmax score
(over the whole source) and the two windows, behind one call.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from seq2seq.models.attention import SCORES, Score, ScoreParams, attend, weighted_sum
from seq2seq.models.masks import Mask
from seq2seq.models.normalizers import masked_softmax
from seq2seq.registry import Registry

SCORE = SCORES["general"]  # The score inside the window.


def _gather(x: jnp.ndarray, index: jnp.ndarray) -> jnp.ndarray:
  """`x [batch, heads or 1, k, d]` at `index [batch, heads, q, w]` -> `[batch, heads, q, w, d]`."""
  b, h, q, w = index.shape
  x = jnp.broadcast_to(x, (b, h) + x.shape[2:])
  return jnp.take_along_axis(x, index.reshape(b, h, q * w, 1), axis=2).reshape(b, h, q, w, -1)


def _spread(weights: jnp.ndarray, start: jnp.ndarray, num_keys: int) -> jnp.ndarray:
  """The window's `weights [b, h, q, w]` (window of query i from `start[..., i]`) as
  `[b, h, q, num_keys]`, zero outside the window."""
  offset = jnp.arange(num_keys) - start[..., None]
  inside = (offset >= 0) & (offset < weights.shape[-1])
  dense = jnp.take_along_axis(weights, jnp.clip(offset, 0, weights.shape[-1] - 1), axis=-1)
  return jnp.where(inside, dense, 0.0).astype(weights.dtype)


class Local(NamedTuple):
  """A local attention, by how it places its window: `init`, `prepare` as a `Score`'s, and
  `attend` with the query's target positions on the mask (`Mask.query_offset`)."""
  predictive: bool  # local_p: p_t from h_t, and a Gaussian around it; local_m: p_t = t.
  # Its `attend` takes `dropout=` (attention dropout on the weights it sums, or None): a
  # kernel that does not says False, and `check_config` refuses the rate beside it.
  weight_dropout: bool = True

  def init(self, heads: int, head_dim: int, max_keys: int, rngs) -> ScoreParams:
    """general's W_a `[heads, d, d]`; local_p's W_p `[heads, d, d]` and v_p `[heads, d]` too."""
    w = SCORE.init(heads, head_dim, max_keys, rngs).w[...]
    if not self.predictive:
      return ScoreParams(w=w)
    normal = lambda shape: jax.random.normal(rngs.params(), shape) * head_dim**-0.5  # noqa: E731
    return ScoreParams(w=w, w_p=normal((heads, head_dim, head_dim)), v_p=normal((heads, head_dim)))

  def prepare(self, keys: jnp.ndarray, params: ScoreParams) -> jnp.ndarray:
    """W_a h_s, once per source word (general's)."""
    return SCORE.prepare(keys, params)

  def positions(self, query: jnp.ndarray, mask: Mask, params: ScoreParams,
                reverse: bool) -> jnp.ndarray:
    """The aligned positions p_t of `query [batch, heads, q, d]`: `[batch, heads, q]` float32,
    in the memory's order (reversed with `reverse`)."""
    length = mask.key_valid.sum(-1).astype(jnp.float32)[:, None, None]  # S, per sentence
    if self.predictive:  # Eq. 9, in float32 whatever the computation's dtype.
      hidden = jnp.tanh(jnp.einsum("bhqd,hde->bhqe", query.astype(jnp.float32), params.w_p[...]))
      return length * jax.nn.sigmoid(jnp.einsum("bhqe,he->bhq", hidden, params.v_p[...]))
    t = jnp.minimum(mask.query_positions(query.shape[2]), length - 1)  # [batch, 1, q]
    return jnp.broadcast_to(length - 1 - t if reverse else t, query.shape[:3])

  def attend(self, query: jnp.ndarray, keys: jnp.ndarray, values: jnp.ndarray, mask: Mask,
             params: ScoreParams, *, window: int, reverse: bool,
             normalizer: Callable = masked_softmax, dropout: Callable | None = None):
    """Attention within `window` (D) positions of each query's p_t.

    Args:
      query: `[batch, heads, q, d]`, at target positions `mask.query_positions(q)`.
      keys: `[batch, heads, k, d]`, through `prepare`.
      values: `[batch, heads, k, d_v]`.
      mask: the source's padding mask; its `query_offset` is the first query's target position.
      params: from `init`.
      window: D.
      reverse: the memory holds the source reversed (`config.model.reverse_source`).
      normalizer: turns the window's scores into weights (`normalizers.NORMALIZERS`).
      dropout: attention dropout on the window's weights (local_p's after the Gaussian)
        before their sum, or None.

    Returns:
      (context `[batch, heads, q, d_v]`, weights `[batch, heads, q, k]`, before dropout).
    """
    num_keys = keys.shape[2]
    centre = self.positions(query, mask, params, reverse)[..., None]  # [b, h, q, 1]
    start = jnp.ceil(centre[..., 0] - window).astype(jnp.int32)  # The first integer in it.
    index = start[..., None] + jnp.arange(2 * window + 1)  # [b, h, q, w]
    valid = (index <= centre + window) & (index >= 0) & (index < num_keys)
    gaussian = jnp.exp(-((index - centre) ** 2) / (2 * (window / 2) ** 2))
    index = jnp.clip(index, 0, num_keys - 1)
    valid = valid & _gather(mask.key_valid[:, None, :, None], index)[..., 0]
    scores = jnp.einsum("bhqd,bhqwd->bhqw", query, _gather(keys, index))  # h_t . W_a h_s
    weights = normalizer(scores, valid)
    if self.predictive:
      weights = weights * gaussian.astype(weights.dtype)
    context = jnp.einsum("bhqw,bhqwd->bhqd", weights if dropout is None else dropout(weights),
                         _gather(values, index))
    return context, _spread(weights, start, num_keys)


class Softmax(NamedTuple):
  """A softmax score over the whole source, with `Local`'s methods (it has no window)."""
  score: Score
  weight_dropout: bool = True  # As `Local`'s.

  def init(self, heads: int, head_dim: int, max_keys: int, rngs) -> ScoreParams | None:
    return self.score.init(heads, head_dim, max_keys, rngs)

  def prepare(self, keys: jnp.ndarray, params: ScoreParams | None) -> jnp.ndarray:
    return self.score.prepare(keys, params)

  def attend(self, query, keys, values, mask: Mask, params, *, window: int, reverse: bool,
             normalizer: Callable = masked_softmax, dropout: Callable | None = None):
    del window, reverse
    context, weights = attend(self.score, query, keys, values, mask.dense(query.shape[2]),
                              params, normalizer=normalizer)
    if dropout is not None:  # The sum again, of the dropped weights.
      context = weighted_sum(dropout(weights), values)
    return context, weights


# The `config.model.attention` names of the local attentions, which only the RNN takes.
LOCAL: dict[str, Local] = {"local_m": Local(predictive=False), "local_p": Local(predictive=True)}
# What the RNN attends with (but `none`): every softmax score, then the local windows.
KERNELS: Registry[str, Softmax | Local] = Registry(
    "attention of the RNN", "config.model.attention", entries={
        **{name: Softmax(score) for name, score in SCORES.items()}, **LOCAL})
KERNELS.follows(SCORES, lambda name, score: Softmax(score))  # Scores registered later too.
