"""Search over a step function: the decoder is seen only through `step_fn`.

`step_fn(cache, token_ids [batch]) -> (logits [batch, vocab], cache)` is any model's `decode_step`
with its encoder memory bound, e.g. `functools.partial(model.decode_step, memory)`. Loops run under
`lax.while_loop` so a whole batch decodes inside one compiled program.

A search strategy is a small frozen value: `Greedy(alpha)`, `Beam(beam_size, alpha, nbest)` or
`Sampling(seed, temperature, top_k, alpha)`. Every strategy scores what it returns by its
length-normalized log-probability under the model (the GNMT penalty at `alpha`), so a greedy,
sampled or beam output's score equals the forced score of that output (`alignment.Alignments`). None
picks PAD or BOS (`translatable`). Strategies are hashable: a jitted search closes over one, but
for sampling's seed (an argument); `generate(model, src_ids, strategy, max_len=...)` decodes.
"""

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp

from seq2seq.data import batching
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decoding.beam_search import beam_search
from seq2seq.decoding.beams import expand_to_beams
from seq2seq.decoding.lengths import max_decode_len  # noqa: F401 (re-export)
from seq2seq.decoding.scores import NEG_INF, in_use, length_penalty, translatable  # noqa: F401 (re-export)


def token_by_token(step_fn, cache, batch_size: int, max_len: int, pick,
                   rows: jnp.ndarray | None = None, caps: jnp.ndarray | None = None
                   ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Extends one hypothesis per sentence by the token `pick` chooses, until EOS or `max_len`.

  Args:
    step_fn: see the module docstring.
    cache: the model's initial cache for this batch (room for `max_len` steps).
    batch_size: number of sentences.
    max_len: most tokens to produce per sentence (EOS included).
    pick: `(logits [batch, vocab], step) -> token ids [batch]` (a strategy's `picker`), given
      the logits of PAD and BOS at -inf (`translatable`).
    rows: `[batch]` bool, the rows in use (`in_use`); the others start finished (all PAD,
      score 0). None: all.
    caps: `[batch]` int32, each row's own most tokens (at most `max_len`); None: `max_len`.

  Returns:
    `[batch, max_len]` int32 ids: the tokens up to and including EOS, then PAD; `[batch]`
    their summed log-probabilities under the model (float32), and `[batch]` their count.
  """

  def cond(carry):
    i, _, _, _, finished, _, _ = carry
    return (i < max_len) & ~jnp.all(finished)

  def body(carry):
    i, cache, tokens, last, finished, log_probs, lengths = carry
    logits, cache = step_fn(cache, last)
    next_ids = pick(translatable(logits), i).astype(jnp.int32)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)),
                                 next_ids[:, None], axis=-1)[:, 0]
    log_probs = log_probs + jnp.where(finished, 0.0, picked)
    lengths = lengths + (~finished).astype(jnp.int32)
    next_ids = jnp.where(finished, PAD_ID, next_ids)
    tokens = tokens.at[:, i].set(next_ids)
    return (i + 1, cache, tokens, next_ids, finished | (next_ids == EOS_ID) | (i + 1 >= caps),
            log_probs, lengths)

  caps = jnp.full((batch_size,), max_len, jnp.int32) if caps is None else caps
  init = (jnp.zeros((), jnp.int32), cache, jnp.full((batch_size, max_len), PAD_ID, jnp.int32),
          jnp.full((batch_size,), BOS_ID, jnp.int32),
          ~(in_use(None, batch_size) if rows is None else rows),
          jnp.zeros((batch_size,), jnp.float32), jnp.zeros((batch_size,), jnp.int32))
  _, _, tokens, _, _, log_probs, lengths = jax.lax.while_loop(cond, body, init)
  return tokens, log_probs, lengths


def greedy_search(step_fn, cache, batch_size: int, max_len: int) -> jnp.ndarray:
  """The most likely token at every step (`token_by_token`, `Greedy.pick`): `[batch, max_len]`."""
  return token_by_token(step_fn, cache, batch_size, max_len, Greedy.pick)[0]


def decode_caps(src, a: float, b: int, limit: int) -> jnp.ndarray:
  """Each sentence's most output tokens (`[batch]` int32, for `src [batch, src_len]`): the cap
  of its own length with EOS, padded to the evaluation grid (`batching.grid_length`), as if it
  were translated alone. Sentences of every length then share a batch, and a translation does
  not depend on the sentences beside it."""
  grid = batching.grid_lengths(limit)
  table = jnp.array([max_decode_len(n, a, b, limit) for n in grid], jnp.int32)
  lengths = jnp.minimum(jnp.sum(src != PAD_ID, axis=1), limit)
  return table[jnp.searchsorted(jnp.array(grid), lengths, side="left")]


class _OneHypothesis:
  """A strategy that extends one hypothesis per sentence by the token `pick` chooses, scored
  by its log-probability over the length penalty at `alpha`."""
  nbest: ClassVar[int] = 1
  alpha: float

  def prepare(self, memory):
    """The encoder memory as `search` decodes it: one row per sentence."""
    return memory

  def search(self, decode_step, memory, cache, batch_size: int, max_len: int,
             src_ids: jnp.ndarray | None = None, seed=None,
             caps: jnp.ndarray | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
    """ids `[batch, 1, max_len]` and length-normalized scores `[batch, 1]` of a model's
    `decode_step(memory, cache, token_ids)` (`src_ids`: the sentences, `[batch, src_len]`, and
    `seed`, for a strategy whose picks depend on them; `caps`: `token_by_token`'s)."""
    pick = self.picker(batch_size, src_ids, seed)
    ids, log_probs, lengths = token_by_token(functools.partial(decode_step, memory), cache,
                                             batch_size, max_len, pick,
                                             in_use(src_ids, batch_size), caps)
    return ids[:, None], (log_probs / length_penalty(lengths, self.alpha))[:, None]

  def picker(self, batch_size: int, src_ids: jnp.ndarray | None, seed=None):
    """`pick(logits [batch, vocab], step) -> token ids [batch]` for a batch of `batch_size`
    sentences, `src_ids` (`[batch, src_len]`, or None), drawn from `seed` if it draws."""
    raise NotImplementedError


def sentence_key(key: jax.Array, ids: jnp.ndarray) -> jax.Array:
  """`key` with a sentence's subword ids (`[src_len]`, PAD-padded) folded in one by one: distinct
  sentences get keys as distinct as the generator's (a 32-bit sum of id * 1000003^i gave [2600,
  800, 20, </s>] and [89, 12, 7, </s>] one), and PAD is skipped: one key at any padded length."""

  def fold(key, i):
    return jnp.where(i == PAD_ID, key, jax.random.fold_in(key, i)), None

  return jax.lax.scan(fold, key, ids)[0]


@dataclasses.dataclass(frozen=True)
class Greedy(_OneHypothesis):
  """The most likely token at every step."""
  alpha: float = 0.0

  @staticmethod
  def pick(logits: jnp.ndarray, step: jnp.ndarray) -> jnp.ndarray:
    del step
    return jnp.argmax(logits, axis=-1)

  def picker(self, batch_size: int, src_ids: jnp.ndarray | None, seed=None):
    """`pick`, the same for any sentences."""
    del batch_size, src_ids, seed
    return self.pick


@dataclasses.dataclass(frozen=True)
class Sampling(_OneHypothesis):
  """Each token drawn from softmax(logits / `temperature`), among the `top_k` most likely (0: all)
  but PAD and BOS, keyed by `seed` (or by `search`'s: one program samples every seed); the same
  seed, the same samples. Scores are the model's log-probabilities (not tempered, nor cut)."""
  seed: int
  temperature: float = 1.0
  top_k: int = 0
  alpha: float = 0.0

  def picker(self, batch_size: int, src_ids: jnp.ndarray | None, seed=None):
    """Draws with one key per sentence, from the seed and its subwords (`sentence_key`; without
    `src_ids`, its row): a sample does not depend on the other sentences of its batch, nor on
    its row or padding, and identical sentences get identical samples."""
    seed = jax.random.key(self.seed if seed is None else seed)
    keys = (jax.vmap(sentence_key, in_axes=(None, 0))(seed, src_ids) if src_ids is not None
            else jax.vmap(jax.random.fold_in, in_axes=(None, 0))(seed, jnp.arange(batch_size)))
    return functools.partial(self._pick, keys)

  def _pick(self, keys: jnp.ndarray, logits: jnp.ndarray, step: jnp.ndarray) -> jnp.ndarray:
    logits = logits.astype(jnp.float32) / self.temperature
    if self.top_k:
      kth_best = jax.lax.top_k(logits, self.top_k)[0][:, -1:]
      logits = jnp.where(logits < kth_best, -jnp.inf, logits)
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
    return jax.vmap(jax.random.categorical)(step_keys, logits)


def nbest_problem(nbest: int, beam_size: int) -> str | None:
  """Why a beam of `beam_size` cannot return `nbest` hypotheses per sentence, or None: the
  one check of it, which the searches, the commands and the server phrase their way."""
  if not 1 <= nbest <= beam_size:
    return f"nbest {nbest} must be between 1 and the beam size, {beam_size}."
  return None


@dataclasses.dataclass(frozen=True)
class Beam:
  """`beam_search` with `beam_size` live hypotheses per sentence, length-penalty exponent
  `alpha`, returning the `nbest` best."""
  beam_size: int
  alpha: float
  nbest: int = 1

  def __post_init__(self):
    if (problem := nbest_problem(self.nbest, self.beam_size)) is not None:
      raise ValueError(problem)

  def prepare(self, memory):
    """The encoder memory as `search` decodes it: `beam_size` rows per sentence."""
    return expand_to_beams(memory, self.beam_size)

  def search(self, decode_step, memory, cache, batch_size: int, max_len: int,
             src_ids: jnp.ndarray | None = None, seed=None,
             caps: jnp.ndarray | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
    """ids `[batch, nbest, max_len]` and length-normalized scores `[batch, nbest]`, the batch
    compacted as sentences end (`beam_search`)."""
    del seed
    return beam_search(decode_step, cache, batch_size, max_len, beam_size=self.beam_size,
                       alpha=self.alpha, nbest=self.nbest, rows=in_use(src_ids, batch_size),
                       caps=caps, memory=memory)


Strategy = Greedy | Sampling | Beam


def generate(model, src_ids: jnp.ndarray, strategy: Strategy, *, max_len: int,
             caps: jnp.ndarray | None = None, seed=None) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Encodes once and decodes with `strategy`.

  Args:
    model: any model family (the shared encode / init_cache / decode_step interface), or an
      `ensemble.Ensemble`.
    src_ids: `[batch, src_len]`.
    strategy: `Greedy()`, `Beam(...)` or `Sampling(...)`.
    max_len: most output tokens per sentence (EOS included).
    caps: `[batch]` int32, each sentence's own most tokens (at most `max_len`); None: max_len.
    seed: sampling's seed (a traced uint32) in place of `strategy.seed`; None: that one.

  Returns:
    ids `[batch, nbest, max_len]` and length-normalized scores `[batch, nbest]` (strategy.nbest).
  """
  memory, batch_size = strategy.prepare(model.encode(src_ids)), src_ids.shape[0]
  return strategy.search(model.decode_step, memory, model.init_cache(memory, max_len),
                         batch_size, max_len, src_ids, seed, caps)
