"""Search over a step function: the decoder is seen only through `step_fn`.

`step_fn(cache, token_ids [batch]) -> (logits [batch, vocab], cache)` is any
model's `decode_step` with its encoder memory bound, e.g.
`functools.partial(model.decode_step, memory)`. Loops run under
`lax.while_loop` so a whole batch decodes inside one compiled program.
"""

import functools

import jax
import jax.numpy as jnp

from seq2seq.special_ids import BOS_ID, EOS_ID, PAD_ID


def greedy_search(step_fn, cache, batch_size: int, max_len: int, *, sample_key=None,
                  temperature: float = 1.0, top_k: int = 0) -> jnp.ndarray:
  """Picks the most likely token at every step until EOS or `max_len`; or samples one.

  Args:
    step_fn: see the module docstring.
    cache: the model's initial cache for this batch (room for `max_len` steps).
    batch_size: number of sentences.
    max_len: most tokens to produce per sentence (EOS included).
    sample_key: when given, sample each token from softmax(logits / temperature),
      restricted to the `top_k` most likely tokens if `top_k` > 0.

  Returns:
    `[batch, max_len]` int32 ids: the tokens up to and including EOS, then PAD.
  """

  def choose(logits, i):
    if sample_key is None:
      return jnp.argmax(logits, axis=-1)
    logits = logits.astype(jnp.float32) / temperature
    if top_k:
      kth_best = jax.lax.top_k(logits, top_k)[0][:, -1:]
      logits = jnp.where(logits < kth_best, -jnp.inf, logits)
    return jax.random.categorical(jax.random.fold_in(sample_key, i), logits, axis=-1)

  def cond(carry):
    i, _, _, _, finished = carry
    return (i < max_len) & ~jnp.all(finished)

  def body(carry):
    i, cache, tokens, last, finished = carry
    logits, cache = step_fn(cache, last)
    next_ids = choose(logits, i).astype(jnp.int32)
    next_ids = jnp.where(finished, PAD_ID, next_ids)
    tokens = tokens.at[:, i].set(next_ids)
    return i + 1, cache, tokens, next_ids, finished | (next_ids == EOS_ID)

  init = (jnp.zeros((), jnp.int32), cache, jnp.full((batch_size, max_len), PAD_ID, jnp.int32),
          jnp.full((batch_size,), BOS_ID, jnp.int32), jnp.zeros((batch_size,), bool))
  return jax.lax.while_loop(cond, body, init)[2]


def max_decode_len(src_len: int, a: float, b: int, limit: int) -> int:
  """Longest hypothesis for a padded source length: `a * src_len + b`, at most `limit`."""
  return max(1, min(int(a * src_len + b), limit))


def length_penalty(length, alpha: float):
  """GNMT length penalty (Wu et al., 2016): ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def expand_to_beams(tree, beam_size: int, *, copy_all: bool = False):
  """Repeats every batch-major array of a memory/cache pytree `beam_size` times.

  `[batch, ...]` -> `[batch * beam_size, ...]`, each sentence's copies adjacent;
  scalars (positions, step counters) are shared and left as they are. A memory
  with a `for_beams(beam_size)` method expands itself instead (the Transformer's
  keeps one copy of what the beams only read), unless `copy_all` asks for a copy
  of everything per beam (a decoder without shared memory: the benchmark's
  baselines).
  """
  if hasattr(tree, "for_beams") and not copy_all:
    return tree.for_beams(beam_size)
  return jax.tree.map(lambda x: x if x.ndim == 0 else jnp.repeat(x, beam_size, axis=0), tree)


def select_rows(cache, rows: jnp.ndarray):
  """The cache of the hypotheses `rows` (`[batch * beam]` indices): every batch-major array
  gathered, scalars left as they are. A cache with a `select(rows)` method (an ensemble's,
  whose arrays lead with a member axis) reorders itself."""
  if hasattr(cache, "select"):
    return cache.select(rows)
  return jax.tree.map(lambda x: x if x.ndim == 0 else x[rows], cache)


def cache_lengths(max_len: int, shortest: int = 16) -> tuple[int, ...]:
  """The cache sizes beam search decodes with, one phase each: `max_len` halved while
  the half holds at least `shortest` tokens, smallest first (40: 20, 40; 150: 18, 37, 75, 150).

  Every beam-search step copies the whole cache (each hypothesis takes its
  parent's keys and values), and self-attention reads all of it; a cache sized
  for `max_len` from the first step copies and reads slots that nothing has
  written yet. Each phase costs one more compiled copy of the step, so phases
  are no shorter than `shortest` steps (README, "Speed on the 2-core CPU":
  phases doubling from 8 slots compiled enough more to slow down a test_2016
  evaluation).
  """
  lengths = [max_len]
  while lengths[0] // 2 >= shortest:
    lengths.insert(0, lengths[0] // 2)
  return tuple(lengths)


def top_k(x: jnp.ndarray, k: int, chunk: int = 128) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`jax.lax.top_k` of `x [rows, n]`, searching only the chunks that can hold a winner.

  Every one of the k best lies in a chunk of `chunk` neighbours whose maximum is
  among the k best chunk maxima, so one vectorised max over all of `x` and a
  top_k over `k * chunk` candidates replace XLA:CPU's TopK over all n (beam
  search's `[batch, beam * vocab]`: 0.24 ms instead of 1.46 ms for 32 x 32,000).
  Values and indices equal `jax.lax.top_k`'s, ties included (lower index first):
  the chosen chunks are kept in index order.
  """
  rows, n = x.shape
  if n <= 2 * k * chunk:
    return jax.lax.top_k(x, k)
  x = jnp.pad(x, ((0, 0), (0, -n % chunk)), constant_values=-jnp.inf)
  chunks = x.reshape(rows, -1, chunk)
  best_chunks = jnp.sort(jax.lax.top_k(chunks.max(axis=-1), k)[1], axis=-1)  # [rows, k]
  candidates = jnp.take_along_axis(chunks, best_chunks[:, :, None], axis=1).reshape(rows, -1)
  values, index = jax.lax.top_k(candidates, k)
  return values, jnp.take_along_axis(best_chunks, index // chunk, axis=1) * chunk + index % chunk


def beam_search(step_fn, cache, batch_size: int, max_len: int, *, beam_size: int,
                alpha: float, nbest: int = 1):
  """Beam search with the GNMT length penalty and early stopping.

  Each step extends every live beam by every token and keeps the `2 * beam`
  best extensions: those ending in EOS join the finished set (scored by
  log-probability / length_penalty), the best `beam` others stay live. The
  search stops once no live beam can beat the `nbest`-th finished hypothesis
  of any sentence (with alpha >= 0 a live score can only fall below
  `log_prob / length_penalty(max_len)`), or after `max_len` steps.

  A cache with a `resized(length)` method (the Transformer's) is grown in
  phases (`cache_lengths`): each phase is its own loop over a cache of fixed
  size. The unwritten slots it leaves out are masked anyway, so the search
  finds what one loop over the full cache finds (scores may differ in the last
  bit: attention sums the same terms over fewer slots).

  Args:
    step_fn: see the module docstring; works on `batch * beam` rows.
    cache: the initial cache, already expanded with `expand_to_beams` (room for
      `max_len` tokens; a resizable one may be any size).
    batch_size: number of sentences.
    max_len: most tokens per hypothesis (EOS included).
    beam_size: live hypotheses per sentence.
    alpha: length-penalty exponent (0: plain log-probability).
    nbest: hypotheses returned per sentence (at most `beam_size`).

  Returns:
    (ids `[batch, nbest, max_len]`: tokens up to and including EOS, then PAD;
     scores `[batch, nbest]`: length-normalized log-probabilities). Finished
    hypotheses come first, best first; unfinished ones (cut at max_len) only
    fill the list when fewer than `nbest` finished.
  """
  if not 1 <= nbest <= beam_size:
    raise ValueError(f"nbest={nbest} must be between 1 and beam_size={beam_size}.")
  b, k = batch_size, beam_size
  neg_inf = jnp.array(-1e9, jnp.float32)

  def gather_beams(x, beam_index):
    """Picks `beam_index [b, n]` out of `x [b, k, ...]`."""
    return jnp.take_along_axis(x, beam_index.reshape(beam_index.shape + (1,) * (x.ndim - 2)),
                               axis=1)

  def best_possible(state):
    """Upper bound of any live hypothesis' final score, per sentence `[b]`."""
    return state["alive_log_probs"][:, 0] / length_penalty(max_len, alpha)

  def cond(end, state):
    nth_finished = state["finished_scores"][:, nbest - 1]
    can_improve = best_possible(state) > nth_finished
    return (state["i"] < end) & jnp.any(can_improve)

  def body(state):
    i = state["i"]
    logits, cache = step_fn(state["cache"], state["last"].reshape(b * k))
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(b, k, -1)
    vocab = log_probs.shape[-1]
    candidates = (state["alive_log_probs"][:, :, None] + log_probs).reshape(b, k * vocab)
    top_log_probs, top_index = top_k(candidates, 2 * k)  # [b, 2k]
    top_beam, top_token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    top_seq = gather_beams(state["alive_seq"], top_beam).at[:, :, i].set(top_token)
    is_eos = top_token == EOS_ID

    # Live: the best k extensions that did not end.
    alive_scores = jnp.where(is_eos, neg_inf, top_log_probs)
    alive_log_probs, keep = jax.lax.top_k(alive_scores, k)
    alive_seq = gather_beams(top_seq, keep)
    flat_beams = (jnp.arange(b)[:, None] * k + gather_beams(top_beam, keep)).reshape(b * k)
    cache = select_rows(cache, flat_beams)

    # Finished: merge the new EOS extensions into the best k so far.
    new_scores = jnp.where(is_eos, top_log_probs / length_penalty(i + 1.0, alpha), neg_inf)
    scores = jnp.concatenate([state["finished_scores"], new_scores], axis=1)
    seqs = jnp.concatenate([state["finished_seq"], top_seq], axis=1)
    finished_scores, best = jax.lax.top_k(scores, k)
    return {"i": i + 1, "cache": cache, "last": gather_beams(top_token, keep),
            "alive_seq": alive_seq, "alive_log_probs": alive_log_probs,
            "finished_seq": gather_beams(seqs, best), "finished_scores": finished_scores}

  empty = jnp.full((b, k, max_len), PAD_ID, jnp.int32)
  # Only the first beam starts live, so the k beams do not all repeat one hypothesis.
  alive_log_probs = jnp.tile(jnp.array([0.0] + [-1e9] * (k - 1), jnp.float32), (b, 1))
  state = {"i": jnp.zeros((), jnp.int32), "cache": cache,
           "last": jnp.full((b, k), BOS_ID, jnp.int32), "alive_seq": empty,
           "alive_log_probs": alive_log_probs, "finished_seq": empty,
           "finished_scores": jnp.full((b, k), neg_inf)}
  resizable = hasattr(cache, "resized")
  for length in cache_lengths(max_len) if resizable else (max_len,):
    if resizable:
      state["cache"] = state["cache"].resized(length)
    state = jax.lax.while_loop(functools.partial(cond, length), body, state)

  # Finished hypotheses come first; a sentence with fewer than nbest of them
  # (max_len reached) is completed with live ones, scored as if they ended there.
  alive_final = state["alive_log_probs"] / length_penalty(state["i"].astype(jnp.float32), alpha)
  finished = state["finished_scores"] > neg_inf / 2
  scores = jnp.concatenate([state["finished_scores"], alive_final], axis=1)
  rank = scores + jnp.concatenate([jnp.where(finished, 0.0, 2 * neg_inf),
                                   jnp.full_like(alive_final, neg_inf)], axis=1)
  _, best = jax.lax.top_k(rank, nbest)
  seqs = jnp.concatenate([state["finished_seq"], state["alive_seq"]], axis=1)
  return gather_beams(seqs, best), gather_beams(scores, best)


def translate(model, src_ids: jnp.ndarray, *, max_len: int, beam_size: int = 1,
              alpha: float = 0.0, nbest: int = 1, sample_key=None, temperature: float = 1.0,
              top_k: int = 0):
  """Encodes once and searches: beam search, greedy (`beam_size == 1`, `nbest == 1`),
  or sampling when `sample_key` is given (see `greedy_search`).

  Args:
    model: any model family (the shared encode / init_cache / decode_step interface).
    src_ids: `[batch, src_len]`.
    max_len: most output tokens per sentence (EOS included).

  Returns:
    ids `[batch, nbest, max_len]` and scores `[batch, nbest]` (greedy: the
    unnormalized log-probability is not tracked, so scores are 0).
  """
  batch = src_ids.shape[0]
  memory = model.encode(src_ids)
  if sample_key is not None or (beam_size == 1 and nbest == 1):
    ids = greedy_search(functools.partial(model.decode_step, memory),
                        model.init_cache(memory, max_len), batch, max_len,
                        sample_key=sample_key, temperature=temperature, top_k=top_k)
    return ids[:, None], jnp.zeros((batch, 1), jnp.float32)
  memory = expand_to_beams(memory, beam_size)  # [batch * beam, ...]
  return beam_search(functools.partial(model.decode_step, memory),
                     model.init_cache(memory, max_len), batch, max_len,
                     beam_size=beam_size, alpha=alpha, nbest=nbest)
