"""How a model's memory and cache follow beam search's hypotheses (`search.beam_search`):
copied per beam, reordered as hypotheses take their parents' places, grown in phases."""

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
