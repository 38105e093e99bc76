"""Beam search with the GNMT length penalty and early stopping, over any model's `decode_step`
(`search.Beam` is its strategy), compacting its batch as sentences end.

A batch's sentences end at different steps; a search at fixed shapes would compute every row
until the last one ends. Given the model's memory, the search steps at smaller batch sizes
(`beams.compaction_sizes`: 128, then 32) once few enough sentences are live, each a loop of its
own over those sentences' part of the state (`beams.take_sentences`), written back when it ends.
A sentence whose search has ended keeps its best hypotheses as they were: what each sentence
gets is what it gets alone.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decoding.beams import (
  cache_lengths,
  compaction_sizes,
  put_sentences,
  select_rows,
  take_sentences,
)
from seq2seq.decoding.scores import NEG_INF, in_use, length_penalty, translatable
from seq2seq.decoding.top_k import best_extensions


class BeamState(NamedTuple):
  """Beam search's loop state for `b` sentences of `k` beams (a pytree)."""
  step: jnp.ndarray  # Scalar int32: tokens produced so far.
  cache: Any  # The model's cache of the `b * k` live hypotheses.
  last: jnp.ndarray  # [b, k] int32: each live hypothesis' last token.
  alive_seq: jnp.ndarray  # [b, k, max_len] int32: the live hypotheses, PAD after `step`.
  alive_log_probs: jnp.ndarray  # [b, k] float32: their log-probabilities, best first.
  finished_seq: jnp.ndarray  # [b, k, max_len] int32: the best hypotheses ended by EOS.
  finished_scores: jnp.ndarray  # [b, k] float32: theirs, length-normalized (NEG_INF: none).

  @classmethod
  def initial(cls, cache, batch_size: int, beam_size: int, max_len: int) -> "BeamState":
    """Before the first token: only the first beam is live, so the `beam_size` beams do not
    all repeat one hypothesis."""
    b, k = batch_size, beam_size
    empty = jnp.full((b, k, max_len), PAD_ID, jnp.int32)
    alive_log_probs = jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (b, 1))
    return cls(step=jnp.zeros((), jnp.int32), cache=cache,
               last=jnp.full((b, k), BOS_ID, jnp.int32), alive_seq=empty,
               alive_log_probs=alive_log_probs, finished_seq=empty,
               finished_scores=jnp.full((b, k), NEG_INF, jnp.float32))


def _gather_beams(x: jnp.ndarray, beam_index: jnp.ndarray) -> jnp.ndarray:
  """Picks `beam_index [b, n]` out of `x [b, k, ...]`."""
  return jnp.take_along_axis(x, beam_index.reshape(beam_index.shape + (1,) * (x.ndim - 2)),
                             axis=1)


def _live(state: BeamState, caps: jnp.ndarray, alpha: float, nbest: int,
          rows: jnp.ndarray) -> jnp.ndarray:
  """`[b]` bool: the sentences whose search goes on: in use (`rows`), before their cap, with a
  best live hypothesis that can still beat their `nbest`-th finished one. With alpha >= 0 a live
  score can only fall, to at best `log_prob / length_penalty(cap)`, so a sentence that is not
  live never is again: its `nbest` best are final."""
  best_possible = state.alive_log_probs[:, 0] / length_penalty(caps, alpha)
  improvable = best_possible > state.finished_scores[:, nbest - 1]
  return improvable & rows & (state.step < caps)


def _goes_on(state: BeamState, end: int, caps: jnp.ndarray, alpha: float, nbest: int,
             rows: jnp.ndarray, fewer: int):
  """Whether to take another step at this batch size: before `end`, while more than `fewer`
  sentences are live (at `fewer` or less, a smaller batch takes over)."""
  return (state.step < end) & (jnp.sum(_live(state, caps, alpha, nbest, rows)) > fewer)


def _beam_step(step_fn, alpha: float, caps: jnp.ndarray, state: BeamState) -> BeamState:
  """Extends every live beam by every token and keeps the `2 * k` best extensions: those
  ending in EOS join the finished set, the best `k` others stay live. A sentence at its cap
  (`caps [b]`) keeps its hypotheses as they are."""
  (b, k), i = state.last.shape, state.step
  logits, cache = step_fn(state.cache, state.last.reshape(b * k))
  logits = logits.astype(jnp.float32)
  top_log_probs, top_beam, top_token = best_extensions(logits, translatable(logits, NEG_INF),
                                                       state.alive_log_probs, 2 * k)
  top_seq = _gather_beams(state.alive_seq, top_beam).at[:, :, i].set(top_token)
  is_eos = top_token == EOS_ID

  # Live: the best k extensions that did not end.
  alive_log_probs, keep = jax.lax.top_k(jnp.where(is_eos, NEG_INF, top_log_probs), k)
  flat_beams = (jnp.arange(b)[:, None] * k + _gather_beams(top_beam, keep)).reshape(b * k)

  # Finished: merge the new EOS extensions into the best k so far.
  new_scores = jnp.where(is_eos, top_log_probs / length_penalty(i + 1.0, alpha), NEG_INF)
  scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)
  seqs = jnp.concatenate([state.finished_seq, top_seq], axis=1)
  finished_scores, best = jax.lax.top_k(scores, k)
  new = dict(last=_gather_beams(top_token, keep), alive_seq=_gather_beams(top_seq, keep),
             alive_log_probs=alive_log_probs, finished_seq=_gather_beams(seqs, best),
             finished_scores=finished_scores)
  going = i < caps
  new = {name: jnp.where(going.reshape((b,) + (1,) * (x.ndim - 1)), x, getattr(state, name))
         for name, x in new.items()}
  return BeamState(step=i + 1, cache=select_rows(cache, flat_beams), **new)


def _nbest(state: BeamState, alpha: float, nbest: int,
           caps: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
  """The `nbest` best hypotheses per sentence and their scores: finished ones first; a sentence
  with fewer than `nbest` of them (its cap reached) is completed with live ones, scored so."""
  length = jnp.minimum(state.step, caps).astype(jnp.float32)[:, None]
  alive_final = state.alive_log_probs / length_penalty(length, alpha)
  finished = state.finished_scores > NEG_INF / 2
  scores = jnp.concatenate([state.finished_scores, alive_final], axis=1)
  rank = scores + jnp.concatenate([jnp.where(finished, 0.0, 2 * NEG_INF),
                                   jnp.full_like(alive_final, NEG_INF)], axis=1)
  _, best = jax.lax.top_k(rank, nbest)
  seqs = jnp.concatenate([state.finished_seq, state.alive_seq], axis=1)
  return _gather_beams(seqs, best), _gather_beams(scores, best)


def beam_search(step_fn, cache, batch_size: int, max_len: int, *, beam_size: int,
                alpha: float, nbest: int = 1, rows: jnp.ndarray | None = None,
                caps: jnp.ndarray | None = None, memory=None, smallest: int = 32,
                shortest_phase: int = 16) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Beam search with the GNMT length penalty and early stopping.

  Each step extends every live beam by every token and keeps the `2 * beam` best extensions: those
  ending in EOS join the finished set (scored by log-probability / length_penalty), the best `beam`
  others stay live. A sentence's search ends once no live beam can beat its `nbest`-th finished
  hypothesis (with alpha >= 0 a live score can only fall below `log_prob /
  length_penalty(cap)`), or at its cap; the search stops when every sentence's has ended.

  A cache with a `resized(length)` method (the Transformer's) is grown in phases (`cache_lengths`):
  each phase is its own loop over a cache of fixed size. The unwritten slots it leaves out are
  masked anyway, so the search finds what one loop over the full cache finds (scores may differ in
  the last bit: attention sums the same terms over fewer slots). Given `memory`, the search also
  steps at smaller batch sizes as sentences end (the module docstring), in the last phase's
  cache (`_in_phases`).

  Args:
    step_fn: `step_fn(cache, token_ids)` (the `search` module docstring); given `memory`,
      `step_fn(memory, cache, token_ids)`, a model's `decode_step`. Works on `batch * beam` rows.
    cache: the initial cache, already expanded with `expand_to_beams` (room for
      `max_len` tokens; a resizable one may be any size).
    batch_size: number of sentences.
    max_len: most tokens per hypothesis (EOS included).
    beam_size: live hypotheses per sentence.
    alpha: length-penalty exponent (0: plain log-probability; not negative).
    nbest: hypotheses returned per sentence, 1 to `beam_size` (`Beam` checks it).
    rows: `[batch]` bool, the sentences in use (`in_use`): only they keep the search stepping
      (what the others get is not a translation). None: all.
    caps: `[batch]` int32, each sentence's own most tokens (at most `max_len`), so that
      sentences of several lengths share a batch; None: `max_len`.
    memory: the model's memory, expanded for the beams, to compact the batch with; None: every
      step takes the whole batch.
    smallest: the smallest batch size to compact to (`compaction_sizes`).
    shortest_phase: the fewest steps of a cache phase (`cache_lengths`).

  Returns:
    (ids `[batch, nbest, max_len]`: tokens up to and including EOS, then PAD; scores `[batch,
     nbest]`: length-normalized log-probabilities). Finished hypotheses come first, best first;
    unfinished ones (cut at max_len) only fill the list when fewer than `nbest` finished.
  """
  state = BeamState.initial(cache, batch_size, beam_size, max_len)
  rows = in_use(None, batch_size) if rows is None else rows
  caps = jnp.full((batch_size,), max_len, jnp.int32) if caps is None else caps
  sizes = (batch_size,) if memory is None else compaction_sizes(batch_size, smallest)
  search = functools.partial(_search_part, step_fn, memory, alpha=alpha, nbest=nbest)
  state = _in_phases(search, state, caps, rows, sizes, max_len, shortest_phase)
  return _nbest(state, alpha, nbest, caps)


def _in_phases(search, state: BeamState, caps: jnp.ndarray, rows: jnp.ndarray,
               sizes: tuple[int, ...], max_len: int, shortest_phase: int) -> BeamState:
  """`state` searched to the end: a loop per phase of a resizable cache (`cache_lengths`; one
  over `max_len` otherwise) at the whole batch, leaving once only `sizes[1]` sentences are live;
  then, in the last phase's cache, the batch sizes of `sizes` in turn (`search`: `_search_part`
  over the model's step), down to the next once only that many are live.

  Compacting only in the last phase compiles one loop per phase and one per smaller size, not
  one per pair: the 6 evaluation searches of the default recipe compiled in 0.8x the time, at
  the same speed, with the same translations (docs/performance.md, "Compile time")."""
  lengths = cache_lengths(max_len, shortest_phase) if hasattr(state.cache, "resized") else ()
  for length in lengths[:-1]:
    state = state._replace(cache=state.cache.resized(length))
    state = search(state, caps, rows, size=sizes[0], fewer=sizes[1] if sizes[1:] else 0,
                   end=length)
  if lengths:
    state = state._replace(cache=state.cache.resized(max_len))
  for size, fewer in zip(sizes, sizes[1:] + (0,), strict=True):
    state = search(state, caps, rows, size=size, fewer=fewer, end=max_len)
  return state


def _search_part(step_fn, memory, state: BeamState, caps: jnp.ndarray, rows: jnp.ndarray, *,
                 alpha: float, nbest: int, size: int, fewer: int, end: int) -> BeamState:
  """Steps `size` of the batch's sentences, the live ones first, until `end` or until `fewer`
  are live, and returns the whole batch's state with theirs written back."""
  (b, k) = state.last.shape
  if size == b:  # The whole batch, in its own order.
    step = step_fn if memory is None else functools.partial(step_fn, memory)
    cond = functools.partial(_goes_on, end=end, caps=caps, alpha=alpha, nbest=nbest, rows=rows,
                             fewer=fewer)
    return jax.lax.while_loop(cond, functools.partial(_beam_step, step, alpha, caps), state)
  live = _live(state, caps, alpha, nbest, rows)
  sentences = jnp.argsort(~live, stable=True)[:size]
  part_memory = take_sentences(memory, sentences, b, k)
  part_caps, part_rows = caps[sentences], rows[sentences]
  cond = functools.partial(_goes_on, end=end, caps=part_caps, alpha=alpha, nbest=nbest,
                           rows=part_rows, fewer=fewer)
  body = functools.partial(_beam_step, functools.partial(step_fn, part_memory), alpha, part_caps)
  part = jax.lax.while_loop(cond, body, take_sentences(state, sentences, b, k))
  return put_sentences(state, part, sentences, b, k)
