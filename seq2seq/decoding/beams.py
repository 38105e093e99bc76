"""How a model's memory and cache follow beam search's hypotheses (`search.beam_search`):
copied per beam, reordered as hypotheses take their parents' places, grown in phases, and
taken and put back by sentence as the batch compacts."""

import jax
import jax.numpy as jnp


def expand_to_beams(tree, beam_size: int, *, copy_all: bool = False):
  """Repeats every batch-major array of a memory/cache pytree `beam_size` times.

  `[batch, ...]` -> `[batch * beam_size, ...]`, each sentence's copies adjacent; scalars (positions,
  step counters) are shared and left as they are. A memory with a `for_beams(beam_size)` method
  expands itself instead (the Transformer's keeps one copy of what the beams only read), unless
  `copy_all` asks for a copy of everything per beam (a decoder without shared memory: the
  benchmark's baselines).
  """
  if hasattr(tree, "for_beams") and not copy_all:
    return tree.for_beams(beam_size)
  return jax.tree.map(lambda x: x if x.ndim == 0 else jnp.repeat(x, beam_size, axis=0), tree)


def _has_own(name: str):
  return lambda x: hasattr(x, name)


def select_rows(cache, rows: jnp.ndarray):
  """The cache of the hypotheses `rows` (`[batch * beam]` indices): every batch-major array
  gathered, scalars left as they are. A node with a `select(rows)` method (an ensemble's cache,
  whose arrays lead with a member axis) reorders itself."""

  def select(x):
    if hasattr(x, "select"):
      return x.select(rows)
    return x if x.ndim == 0 else x[rows]

  return jax.tree.map(select, cache, is_leaf=_has_own("select"))


def cache_lengths(max_len: int, shortest: int = 16) -> tuple[int, ...]:
  """The cache sizes beam search decodes with, one phase each: `max_len` halved while
  the half holds at least `shortest` tokens, smallest first (40: 20, 40; 150: 18, 37, 75, 150).

  Every beam-search step copies the whole cache (each hypothesis takes its parent's keys and
  values), and self-attention reads all of it; a cache sized for `max_len` from the first step
  copies and reads slots that nothing has written yet. Each phase costs one more compiled copy of
  the step, so phases are no shorter than `shortest` steps: shorter ones cost more compile time than
  they save (docs/performance.md).
  """
  lengths = [max_len]
  while lengths[0] // 2 >= shortest:
    lengths.insert(0, lengths[0] // 2)
  return tuple(lengths)


def compaction_sizes(batch_size: int, smallest: int = 32) -> tuple[int, ...]:
  """The batch sizes beam search steps with as sentences end, largest first: each a quarter of
  the one before, but no fewer than `smallest` sentences, while half of it holds that many
  (128: 128, 32; 64: 64, 32; 512: 512, 128, 32; 32: 32).

  Each size is one more compiled loop of the step (docs/performance.md, "Against CTranslate2",
  gives the compile time). Quartering compiles one loop fewer than halving at the evaluation's
  128 and decodes as fast (128, 32 against 128, 64, 32: 157.9 against 158.4 sentences/s on
  test_2016, quiet, the same translations); 16 and 8 gave no clear gain over 32 when halving."""
  sizes = [batch_size]
  while sizes[-1] // 2 >= smallest:
    sizes.append(max(sizes[-1] // 4, smallest))
  return tuple(sizes)


def _layout(x: jnp.ndarray, batch_size: int, beam_size: int) -> str:
  """How an array of a memory, cache or search state is laid out: "hypotheses" (`[batch *
  beam, ...]`), "sentences" (`[batch, ...]`) or "shared" (a scalar, or a leading 1 that
  broadcasts)."""
  if x.ndim == 0:
    return "shared"
  if x.shape[0] == batch_size * beam_size:
    return "hypotheses"
  if x.shape[0] == batch_size:
    return "sentences"
  if x.shape[0] == 1:
    return "shared"
  raise ValueError(f"An array of shape {x.shape} is neither per sentence ({batch_size}) nor per"
                   f" hypothesis ({batch_size} x {beam_size}).")


def _hypotheses(sentences: jnp.ndarray, beam_size: int) -> jnp.ndarray:
  return (sentences[:, None] * beam_size + jnp.arange(beam_size)).reshape(-1)


def take_sentences(tree, sentences: jnp.ndarray, batch_size: int, beam_size: int):
  """The part of a memory, cache or search state (any pytree whose arrays are batch-major by
  sentence or by hypothesis) that holds `sentences` (`[n]` indices), in their order: `n` rows
  of every per-sentence array, `n * beam_size` of every per-hypothesis one. A node with a
  `take_sentences` method of these arguments (an ensemble's, whose arrays lead with a member
  axis) takes its own."""

  def take(x):
    if hasattr(x, "take_sentences"):
      return x.take_sentences(sentences, batch_size, beam_size)
    layout = _layout(x, batch_size, beam_size)
    if layout == "hypotheses":
      return x[_hypotheses(sentences, beam_size)]
    return x[sentences] if layout == "sentences" else x

  return jax.tree.map(take, tree, is_leaf=_has_own("take_sentences"))


def put_sentences(tree, part, sentences: jnp.ndarray, batch_size: int, beam_size: int):
  """`tree` with `part` (`take_sentences(tree, sentences, ...)`, after a search changed it)
  written back into the rows of `sentences`; shared values (a cache's step) are `part`'s. A
  node with a `put_sentences(part, sentences, batch_size, beam_size)` method puts its own."""

  def put(x, y):
    if hasattr(x, "put_sentences"):
      return x.put_sentences(y, sentences, batch_size, beam_size)
    layout = _layout(x, batch_size, beam_size)
    if layout == "hypotheses":
      return x.at[_hypotheses(sentences, beam_size)].set(y)
    return x.at[sentences].set(y) if layout == "sentences" else y

  return jax.tree.map(put, tree, part, is_leaf=_has_own("put_sentences"))
