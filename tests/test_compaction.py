"""Beam search compacting its batch as sentences end (`beam_search`, `beams.take_sentences`):
each sentence gets what it gets in a search that steps the whole batch to the end."""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.config import base_config
from seq2seq.data.special_ids import EOS_ID, PAD_ID
from seq2seq.decoding import beams, ensemble, search
from seq2seq.models import build_model

# Eight sentences of lengths 1-8 and a filler row: their searches end at different steps.
SRC = np.zeros((9, 9), np.int32)
for _row, _n in enumerate([3, 8, 1, 6, 2, 7, 4, 5]):
  SRC[_row, :_n], SRC[_row, _n] = np.arange(5, 5 + _n), EOS_ID
SRC = jnp.asarray(SRC)  # Row 8: all PAD, a batch's filler.


class Memory(NamedTuple):
  model: Any  # The model's own memory.
  ends: jnp.ndarray  # [batch] (or [batch * beam]): the step from which EOS is favoured.

  def for_beams(self, beam_size: int) -> "Memory":
    return Memory(beams.expand_to_beams(self.model, beam_size),
                  jnp.repeat(self.ends, beam_size))


class ResizableCache(NamedTuple):
  """A Transformer's cache and the step: grown in phases as the model's own is."""
  model: Any
  step: jnp.ndarray

  def resized(self, length: int) -> "ResizableCache":
    return self._replace(model=self.model.resized(length))


class EndsByLength:
  """`model`, made to end each sentence near step 2 x its length: EOS is forbidden before
  then and favoured after, so its searches end at steps spread over 2-17. The steps it runs
  at are counted by batch rows (`rows_stepped`), as they run."""

  def __init__(self, model):
    self.model, self.rows_stepped, self.slots = model, [], []

  def encode(self, src):
    return Memory(self.model.encode(src), 2 * jnp.sum(src != PAD_ID, axis=1))

  def init_cache(self, memory, max_len):  # The model's, and the step.
    cache = self.model.init_cache(memory.model, max_len), jnp.zeros((), jnp.int32)
    return ResizableCache(*cache) if hasattr(cache[0], "resized") else cache

  def decode_step(self, memory, cache, token_ids):
    jax.debug.callback(self.rows_stepped.append, token_ids.shape[0])
    if hasattr(cache[0], "self_kv"):  # The Transformer's: the cache phase's slots.
      jax.debug.callback(self.slots.append, cache[0].self_kv[0][0].shape[2])
    logits, new_cache = self.model.decode_step(memory.model, cache[0], token_ids)
    ended = cache[1] + 1 >= memory.ends
    logits = logits.at[:, EOS_ID].set(jnp.where(ended, logits.max(axis=-1) + 2.0, -1e9))
    stepped = (new_cache, cache[1] + 1)
    return logits, ResizableCache(*stepped) if isinstance(cache, ResizableCache) else stepped


def search_both_ways(model, *, beam_size=3, nbest=2, max_len=20, shortest_phase=16, smallest=2):
  """The beam search of `SRC` compacted down to `smallest` sentences, and stepping all 9 to the
  end."""
  memory = beams.expand_to_beams(model.encode(SRC), beam_size)
  cache, rows = model.init_cache(memory, max_len), search.in_use(SRC, 9)
  kw = dict(beam_size=beam_size, alpha=0.6, nbest=nbest, rows=rows, shortest_phase=shortest_phase)
  compacted = jax.jit(lambda: search.beam_search(model.decode_step, cache, 9, max_len,
                                                 memory=memory, smallest=smallest, **kw))()
  steps_compacted = list(model.rows_stepped)
  whole = jax.jit(lambda: search.beam_search(functools.partial(model.decode_step, memory),
                                             cache, 9, max_len, **kw))()
  return compacted, whole, steps_compacted, model.rows_stepped[len(steps_compacted):]


def assert_same_translations(compacted, whole):
  """Ids exactly and scores to float rounding, for the 8 sentences (not the filler)."""
  np.testing.assert_array_equal(compacted[0][:8], whole[0][:8])
  np.testing.assert_allclose(compacted[1][:8], whole[1][:8], rtol=1e-5, atol=1e-5)


def small_config(family: str):
  c = base_config()
  c.model.family = family
  c.model.emb_dim, c.model.num_heads, c.model.mlp_dim = 32, 4, 64
  c.model.num_encoder_layers = c.model.num_decoder_layers = 2
  c.model.attention = "scaled_dot" if family == "transformer" else "general"
  return c


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_a_compacted_beam_search_translates_as_the_whole_batch(family):
  """Both families: the same n-best; fewer rows stepped, at the batch sizes 9, 2 and 1
  (x 3 beams), each once live sentences fit it."""
  model = EndsByLength(build_model(small_config(family), 30))
  compacted, whole, steps, steps_whole = search_both_ways(model, smallest=1)
  assert_same_translations(compacted, whole)
  ends = np.argmax(np.asarray(whole[0][:8, 0]) == EOS_ID, axis=1) + 1
  np.testing.assert_array_equal(ends, 2 * (np.asarray([3, 8, 1, 6, 2, 7, 4, 5]) + 1))
  steps, steps_whole = list(map(int, steps)), list(map(int, steps_whole))
  assert set(steps_whole) == {27} and len(steps_whole) > ends.max()  # To improve the 2nd best.
  assert set(steps) == {27, 6, 3} and len(steps) == len(steps_whole)
  assert steps[0] == 27 and sorted(steps, reverse=True) == steps
  # Steps at each size (9, 2 and 1 sentences), as the model's ends and scores decide: 0.82x and
  # 0.87x the whole batch's rows.
  assert [steps.count(rows) for rows in (27, 6, 3)] == {"transformer": [15, 2, 2],
                                                        "rnn": [16, 2, 1]}[family]


def test_an_ensembles_memory_and_cache_compact_member_by_member():
  """An ensemble of a Transformer and an RNN (two groups, members stacked): compacted, the same
  n-best as the whole batch's."""
  members = [build_model(small_config(family), 30) for family in ("transformer", "rnn")]
  graphdefs, params = zip(*(nnx.split(m) for m in members), strict=True)
  both = ensemble.Ensemble(graphdefs, [ensemble.stack([p]) for p in params])
  compacted, whole, steps, _ = search_both_ways(EndsByLength(both), nbest=1)
  assert_same_translations(compacted, whole)
  assert min(map(int, steps)) == 6


def test_compaction_sizes_quarter_down_to_the_smallest():
  assert beams.compaction_sizes(128) == (128, 32)
  assert beams.compaction_sizes(64) == (64, 32)
  assert beams.compaction_sizes(512) == (512, 128, 32)
  assert beams.compaction_sizes(32) == (32,)
  assert beams.compaction_sizes(9, smallest=2) == (9, 2)
  assert beams.compaction_sizes(9, smallest=1) == (9, 2, 1)
  assert beams.compaction_sizes(1, smallest=1) == (1,)


def test_sentences_taken_and_put_back_by_their_layout():
  """Per sentence (`[batch, ...]`), per hypothesis (`[batch * beam, ...]`) and shared arrays."""
  tree = {"sentence": jnp.arange(4) * 10, "hypothesis": jnp.arange(8), "step": jnp.int32(3),
          "broadcast": jnp.ones((1, 5))}
  part = beams.take_sentences(tree, jnp.array([2, 0]), 4, 2)
  np.testing.assert_array_equal(part["sentence"], [20, 0])
  np.testing.assert_array_equal(part["hypothesis"], [4, 5, 0, 1])
  assert part["step"] == 3 and part["broadcast"].shape == (1, 5)
  part = dict(part, sentence=part["sentence"] + 1, hypothesis=-part["hypothesis"], step=7)
  back = beams.put_sentences(tree, part, jnp.array([2, 0]), 4, 2)
  np.testing.assert_array_equal(back["sentence"], [1, 10, 21, 30])
  np.testing.assert_array_equal(back["hypothesis"], [0, -1, 2, 3, -4, -5, 6, 7])
  assert back["step"] == 7
  with pytest.raises(ValueError, match=r"neither per sentence \(4\) nor per hypothesis"):
    beams.take_sentences({"odd": jnp.zeros(3)}, jnp.array([0]), 4, 2)


def test_a_search_in_several_cache_phases_compacts_in_the_last():
  """Cache phases of 5, 10 and 20 slots: the whole batch steps through the first two until few
  sentences are live, then the smaller batches step in the last phase's cache only (a loop per
  phase and one per size, not one per pair); the n-best are the whole batch's."""
  model = EndsByLength(build_model(small_config("transformer"), 30))
  compacted, whole, steps, _ = search_both_ways(model, shortest_phase=5, smallest=1)
  assert_same_translations(compacted, whole)
  slots = list(map(int, model.slots[:len(steps)]))
  assert set(slots) == {5, 10, 20} and sorted(slots) == slots
  assert {s for s, rows in zip(slots, map(int, steps), strict=True) if rows < 27} == {20}
  assert set(map(int, steps)) == {27, 6, 3}
