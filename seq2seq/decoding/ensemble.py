"""Several models decoding as one: at every step, the mean of their log-probabilities.

`Ensemble` has the decoding side of the model interface (`encode`, `init_cache`,
`decode_step`), so every search strategy (`search.generate`) runs it unchanged. Members
that share an architecture form a group: their parameter sets are stacked
along a leading axis, and the group's every call is one `jax.vmap` over it;
groups of different architectures follow each other in the same program.
Each member keeps its own memory and cache.
"""

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.decoding import beams


def stack(params: Sequence) -> object:
  """Parameter trees of one architecture -> one tree with a leading member axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *params)


class _Grouped(NamedTuple):
  """Per group, its members' pytrees stacked along a leading axis: taken and put back per
  sentence (beam search's compaction) member by member."""
  groups: tuple

  def take_sentences(self, sentences, batch_size: int, beam_size: int):
    """`beams.take_sentences` of each member's."""
    return type(self)(tuple(
        jax.vmap(lambda t: beams.take_sentences(t, sentences, batch_size, beam_size))(group)
        for group in self.groups))

  def put_sentences(self, part, sentences, batch_size: int, beam_size: int):
    """`beams.put_sentences` of each member's."""
    return type(self)(tuple(
        jax.vmap(lambda t, p: beams.put_sentences(t, p, sentences, batch_size, beam_size))(
            group, part_group) for group, part_group in zip(self.groups, part.groups,
                                                            strict=True)))


class Memory(_Grouped):
  """Per group, its members' memories stacked along a leading axis."""

  def for_beams(self, beam_size: int) -> "Memory":
    """Each member's memory expanded as `beams.expand_to_beams` expands one model's."""
    return Memory(tuple(jax.vmap(lambda m: beams.expand_to_beams(m, beam_size))(memory)
                        for memory in self.groups))


class Cache(_Grouped):
  """Per group, its members' caches stacked along a leading axis."""

  def select(self, rows: jnp.ndarray) -> "Cache":
    """The cache of hypotheses `rows` (beam search's reordering), member by member
    (`beams.select_rows` of each)."""
    return type(self)(tuple(jax.vmap(lambda c: beams.select_rows(c, rows))(cache)
                            for cache in self.groups))


class ResizableCache(Cache):
  """A `Cache` whose every member can be resized: beam search grows it in phases."""

  def resized(self, length: int) -> "ResizableCache":
    return ResizableCache(tuple(jax.vmap(lambda c: c.resized(length))(cache)
                                for cache in self.groups))


class Ensemble:
  """Models as one decoder.

  Args:
    graphdefs: per group, the architecture (`nnx.split`'s graph definition).
    params: per group, its members' parameters stacked (`stack`).
  """

  def __init__(self, graphdefs: Sequence, params: Sequence):
    self._groups = list(zip(graphdefs, params, strict=True))

  def encode(self, src_ids: jnp.ndarray) -> Memory:
    return Memory(tuple(jax.vmap(lambda p, g=graphdef: nnx.merge(g, p).encode(src_ids))(params)
                        for graphdef, params in self._groups))

  def init_cache(self, memory: Memory, max_len: int) -> Cache:
    caches = tuple(jax.vmap(lambda p, m, g=graphdef: nnx.merge(g, p).init_cache(m, max_len))(
        params, group_memory) for (graphdef, params), group_memory in zip(
            self._groups, memory.groups, strict=True))
    resizable = all(hasattr(cache, "resized") for cache in caches)
    return (ResizableCache if resizable else Cache)(caches)

  def decode_step(self, memory: Memory, cache: Cache,
                  token_ids: jnp.ndarray) -> tuple[jnp.ndarray, Cache]:
    """The mean of the members' log-probabilities `[batch, vocab]`, and the next cache."""
    log_probs, caches = [], []
    for (graphdef, params), group_memory, group_cache in zip(
        self._groups, memory.groups, cache.groups, strict=True):
      def step(p, m, c, g=graphdef):
        logits, c = nnx.merge(g, p).decode_step(m, c, token_ids)
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), c
      group_log_probs, group_cache = jax.vmap(step)(params, group_memory, group_cache)
      log_probs.append(group_log_probs)
      caches.append(group_cache)
    return jnp.concatenate(log_probs).mean(axis=0), type(cache)(tuple(caches))
