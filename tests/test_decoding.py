"""Greedy, beam search and sampling: known answers on hand-built models, and invariants on real
ones."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seq2seq.config import base_config
from seq2seq.data import batching
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decoding import beams, search, top_k, translator
from seq2seq.models import build_model
from seq2seq.runtime import compiling
from tests.helpers import VAL

A, B, C = 4, 5, 6  # token ids of a hand-built 7-token vocabulary


def table_step(table, floor: float = 1e-12):
  """A 'model' whose next-token distribution depends only on the last token; every token has
  at least probability `floor` (0: a token of none is never picked)."""
  log_table = jnp.log(jnp.asarray(table, jnp.float32) + floor)

  def step_fn(cache, token_ids):
    return log_table[token_ids], cache

  return step_fn


def transition_table(rows):
  table = np.zeros((7, 7), np.float32)
  table[:, EOS_ID] = 1.0  # default: end
  for token, probs in rows.items():
    table[token] = 0.0
    for nxt, p in probs.items():
      table[token, nxt] = p
  return table


def beam(step_fn, batch=1, max_len=8, **kw):
  cache = jnp.zeros((batch * kw.get("beam_size", 1),))
  return search.beam_search(step_fn, cache, batch, max_len, **kw)


def strategy_search(strategy, step_fn, cache, *args):
  """`strategy.search` of a step function without memory (`table_step`'s)."""
  return strategy.search(lambda memory, cache, ids: step_fn(cache, ids), None, cache, *args)


def test_beam_search_finds_the_sequence_greedy_misses():
  # Greedy takes A (0.6) and then ends: 0.6 * 0.4 = 0.24.  B EOS has 0.4 * 0.99.
  step = table_step(transition_table({BOS_ID: {A: 0.6, B: 0.4}, A: {EOS_ID: 0.4, C: 0.3, B: 0.3},
                                      B: {EOS_ID: 0.99, C: 0.01}}))
  greedy = search.greedy_search(step, jnp.zeros((1,)), 1, 8)
  np.testing.assert_array_equal(greedy[0, :3], [A, EOS_ID, PAD_ID])
  ids, scores = beam(step, beam_size=2, alpha=0.0)
  np.testing.assert_array_equal(ids[0, 0, :3], [B, EOS_ID, PAD_ID])
  np.testing.assert_allclose(scores[0, 0], np.log(0.4 * 0.99), rtol=1e-5)


def all_finished_hypotheses(table, max_len):
  """Exhaustive search: every sequence ending in EOS within max_len, with its log-probability."""
  out, frontier = [], [([], 0.0, BOS_ID)]
  for _ in range(max_len):
    nxt = []
    for seq, logp, last in frontier:
      for token in np.flatnonzero(table[last] > 0):
        item = (seq + [int(token)], logp + float(np.log(table[last, token])), int(token))
        (out if token == EOS_ID else nxt).append(item)
    frontier = nxt
  return [(seq, logp) for seq, logp, _ in out]


def test_length_penalty_reorders_finished_hypotheses_by_its_formula():
  # Short "A EOS" is likeliest; longer hypotheses overtake it as alpha grows.
  table = transition_table({BOS_ID: {A: 0.5, B: 0.5}, A: {EOS_ID: 0.5, C: 0.5},
                            B: {C: 1.0}, C: {C: 0.9, EOS_ID: 0.1}})
  hypotheses = all_finished_hypotheses(table, 4)
  winners = set()
  for alpha in (0.0, 1.0, 4.0):
    ids, scores = beam(table_step(table), beam_size=4, alpha=alpha, nbest=2, max_len=4)
    expected = sorted(((logp / search.length_penalty(len(seq), alpha), seq)
                       for seq, logp in hypotheses), key=lambda x: -x[0])[:2]
    np.testing.assert_allclose(scores[0], [e[0] for e in expected], rtol=1e-5)
    for n, (_, tokens) in enumerate(expected):
      np.testing.assert_array_equal(ids[0, n, :len(tokens)], tokens)
    winners.add(tuple(expected[0][1]))
  assert len(winners) > 1  # the penalty did reorder the best hypothesis


def test_nbest_puts_a_finished_hypothesis_before_an_unfinished_one():
  # "A EOS" finishes; "B B B ..." never does. Both have probability 0.5, and no other
  # hypothesis has any (with a floor, "EOS" would finish too, at 1e-12, and come first).
  table = transition_table({BOS_ID: {A: 0.5, B: 0.5}, A: {EOS_ID: 1.0}, B: {B: 1.0}})
  ids, scores = beam(table_step(table, floor=0.0), beam_size=2, alpha=0.0, nbest=2, max_len=3)
  np.testing.assert_array_equal(ids[0, 0], [A, EOS_ID, PAD_ID])
  np.testing.assert_array_equal(ids[0, 1], [B, B, B])
  np.testing.assert_allclose(scores[0], [np.log(0.5)] * 2, rtol=1e-5)


def test_length_penalty_known_values():
  """GNMT's ((5 + |Y|) / 6)^alpha: 1 for one token at any alpha, 2 where the base is 2 or 4."""
  for alpha in (0.2, 0.6, 1.0):
    np.testing.assert_allclose(search.length_penalty(1, alpha), 1.0)
  np.testing.assert_allclose(search.length_penalty(7, 1.0), 2.0)
  np.testing.assert_allclose(search.length_penalty(19, 0.5), 2.0)
  assert search.length_penalty(100, 0.0) == 1.0


@pytest.fixture(params=["transformer", "rnn"])
def model(request, tiny_config):
  tiny_config.model.family = request.param
  tiny_config.model.attention = "scaled_dot" if request.param == "transformer" else "concat"
  return build_model(tiny_config, 30)


SRC = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0], [11, 3, 0, 0, 0, 0]])


def test_beam_one_equals_greedy(model):
  greedy, _ = search.generate(model, SRC, search.Greedy(), max_len=10)
  memory = model.encode(SRC)
  ids, _ = search.beam_search(functools.partial(model.decode_step, memory),
                                model.init_cache(memory, 10), 3, 10, beam_size=1, alpha=0.0)
  np.testing.assert_array_equal(ids[:, 0], greedy[:, 0])


def test_padding_to_a_longer_grid_length_changes_no_translation(model):
  """The grid pads a batch further than its longest sentence: at the same decoding cap, the
  search reads PAD as nothing (scores equal to float rounding, ids exactly)."""
  wider = jnp.pad(SRC, ((0, 0), (0, 18)), constant_values=PAD_ID)  # 6 -> 24, a grid length.
  for strategy in (search.Greedy(), search.Beam(3, 0.6, 2)):
    ids, scores = search.generate(model, SRC, strategy, max_len=10)
    wide_ids, wide_scores = search.generate(model, wider, strategy, max_len=10)
    np.testing.assert_array_equal(wide_ids, ids)
    np.testing.assert_allclose(wide_scores, scores, rtol=1e-5, atol=1e-5)


class NeverEnds:
  """`model` with EOS never picked: every hypothesis runs to its cap."""

  def __init__(self, model):
    self.encode, self.init_cache = model.encode, model.init_cache
    self._step = model.decode_step

  def decode_step(self, memory, cache, token_ids):
    logits, cache = self._step(memory, cache, token_ids)
    return logits.at[:, EOS_ID].set(-1e9), cache


def test_each_sentence_decodes_to_its_own_cap(model):
  """`caps`: sentences of several caps share a batch, each cut at its own, and decode as each
  does alone with its cap as max_len (ids exactly, scores to float rounding)."""
  never, caps = NeverEnds(model), [3, 7, 5]
  for strategy in (search.Greedy(0.6), search.Beam(3, 0.6, 2)):
    ids, scores = search.generate(never, SRC, strategy, max_len=10, caps=jnp.array(caps))
    for row, cap in enumerate(caps):
      alone_ids, alone_scores = search.generate(never, SRC[row:row + 1], strategy, max_len=cap)
      assert np.all(alone_ids != PAD_ID)
      np.testing.assert_array_equal(ids[row, :, :cap], alone_ids[0])
      assert np.all(ids[row, :, cap:] == PAD_ID)
      np.testing.assert_allclose(scores[row], alone_scores[0], rtol=1e-5, atol=1e-5)


def test_a_sentences_cap_is_that_of_its_own_grid_length():
  """`search.decode_caps`: a * (the sentence's length with EOS, padded to the grid) + b, at
  most the model's max_len, whatever the batch's padded length."""
  lengths = [1, 8, 9, 17, 40, 60]  # Grid lengths 8, 8, 16, 24, 48, 64.
  src = np.zeros((len(lengths), 64), np.int32)
  for row, n in enumerate(lengths):
    src[row, :n - 1], src[row, n - 1] = 7, EOS_ID
  caps = search.decode_caps(jnp.asarray(src), 1.5, 10, 64)
  np.testing.assert_array_equal(caps, [22, 22, 34, 46, 64, 64])
  assert [search.max_decode_len(n, 1.5, 10, 64) for n in (8, 16, 24, 48)] == [22, 34, 46, 64]


def test_cached_decoding_equals_uncached(model):
  """Greedy with the cache equals re-running teacher-forced decode on each prefix."""
  cached, _ = search.generate(model, SRC, search.Greedy(), max_len=8)
  memory = model.encode(SRC)
  # Position t's logits see tokens 0..t only (causal), so one fixed-shape decode, compiled
  # once, re-runs the whole prefix at every step; later positions hold PAD until filled. Like
  # the searches, it picks neither PAD nor BOS (`search.translatable`).
  decode = jax.jit(lambda prefix: search.translatable(model.decode(memory, prefix)))
  prefix = jnp.zeros((3, 9), jnp.int32).at[:, 0].set(BOS_ID)
  for t in range(8):
    next_ids = jnp.argmax(decode(prefix)[:, t], axis=-1).astype(jnp.int32)
    prefix = prefix.at[:, t + 1].set(next_ids)
  uncached = np.asarray(prefix[:, 1:])
  for row, ids in enumerate(np.asarray(cached[:, 0])):
    end = list(ids).index(EOS_ID) + 1 if EOS_ID in ids else len(ids)
    np.testing.assert_array_equal(ids[:end], uncached[row, :end])


def test_nbest_is_sorted_and_distinct(model):
  ids, scores = search.generate(model, SRC, search.Beam(4, 0.6, nbest=3), max_len=8)
  assert ids.shape == (3, 3, 8)
  for sentence, sentence_scores in zip(np.asarray(ids), np.asarray(scores), strict=True):
    assert len({tuple(h) for h in sentence}) == 3
    # Finished hypotheses (with EOS) come first, best first; then unfinished ones, best first.
    finished = np.array([EOS_ID in h for h in sentence])
    assert not np.any(~finished[:-1] & finished[1:])
    for group in (finished, ~finished):
      assert np.all(np.diff(sentence_scores[group]) <= 1e-6)


def test_beam_search_under_jit_equals_eager(model):
  decode = lambda src: search.generate(model, src, search.Beam(3, 0.6), max_len=8)  # noqa: E731
  eager_ids, eager_scores = decode(SRC)
  ids, scores = jax.jit(decode)(SRC)
  assert ids.shape == (3, 1, 8)
  np.testing.assert_array_equal(ids, eager_ids)
  np.testing.assert_allclose(scores, eager_scores, rtol=1e-5)


# 32 distinct sentences of 2 to 5 subwords (ids 4..29 of the model's 30), EOS, then PAD.
MANY = np.zeros((32, 7), np.int32)
_rng = np.random.default_rng(0)
for _row, _n in enumerate(_rng.integers(2, 6, len(MANY))):
  MANY[_row, :_n + 1] = [*_rng.integers(4, 30, _n), EOS_ID]


def forced_scores(model, src, outputs, alpha: float) -> np.ndarray:
  """Each output's log-probability under the model, teacher-forced through its EOS (or all
  of it, cut at the cap), over the length penalty at `alpha`: one batched pass."""
  outputs = np.asarray(outputs)
  lengths = [list(out).index(EOS_ID) + 1 if EOS_ID in out else len(out) for out in outputs]
  tgt_in = np.full(outputs.shape, PAD_ID, np.int32)
  tgt_in[:, 0] = BOS_ID
  for row, n in enumerate(lengths):
    tgt_in[row, 1:n] = outputs[row, :n - 1]
  log_probs = np.asarray(jax.nn.log_softmax(model.decode(model.encode(src), jnp.asarray(tgt_in))))
  picked = np.take_along_axis(log_probs, outputs[..., None], axis=-1)[..., 0]
  return np.array([picked[row, :n].sum() / search.length_penalty(n, alpha)
                   for row, n in enumerate(lengths)])


@pytest.mark.parametrize("strategy", [search.Greedy(0.6), search.Sampling(5, temperature=20.0,
                                                                         alpha=1.0)],
                         ids=["greedy", "sampling"])
def test_one_hypothesis_scores_are_the_models_log_probability_of_the_output(model, strategy):
  """Greedy and sampling score their output as beam search does: its log-probability under
  the model, teacher-forced through EOS or the cap, over the length penalty at alpha. Hot
  sampling over the whole vocabulary draws some 2 in 30 tokens from PAD and BOS on this
  untrained model unless they are left out: a fed PAD is read by the cache but masked when
  teacher-forced, so the two scores would differ."""
  ids, scores = search.generate(model, jnp.asarray(MANY), strategy, max_len=8)
  outputs = np.asarray(ids)[:, 0]
  for out in outputs:
    real = out[:list(out).index(EOS_ID) + 1] if EOS_ID in out else out
    assert not np.isin(real, [PAD_ID, BOS_ID]).any(), out
  np.testing.assert_allclose(np.asarray(scores)[:, 0],
                             forced_scores(model, jnp.asarray(MANY), outputs, strategy.alpha),
                             rtol=1e-4, atol=1e-5)


def test_no_search_gives_pad_or_bos_even_where_the_model_prefers_them():
  """PAD and BOS are never in a translation: greedy, beam search and sampling pick among the
  other tokens even where the model puts most of its mass on those two, and score what they
  pick by the model's own log-probability (the mass of PAD and BOS included)."""
  step = table_step(transition_table({BOS_ID: {PAD_ID: 0.5, BOS_ID: 0.3, A: 0.15, B: 0.05},
                                      A: {PAD_ID: 0.6, EOS_ID: 0.4}, B: {BOS_ID: 0.9, C: 0.1}}))
  greedy, log_prob, _ = search.token_by_token(step, jnp.zeros((1,)), 1, 4, search.Greedy.pick)
  np.testing.assert_array_equal(greedy[0], [A, EOS_ID, PAD_ID, PAD_ID])
  np.testing.assert_allclose(log_prob[0], np.log(0.15 * 0.4), rtol=1e-5)
  ids, scores = beam(step, beam_size=2, alpha=0.0, nbest=2, max_len=4)
  np.testing.assert_array_equal(ids[0, 0], [A, EOS_ID, PAD_ID, PAD_ID])
  np.testing.assert_allclose(scores[0, 0], np.log(0.15 * 0.4), rtol=1e-5)
  sampled = strategy_search(search.Sampling(0), step, jnp.zeros((400,)), 400, 4)[0]
  sampled = np.asarray(sampled[:, 0])
  assert not np.isin(sampled[:, 0], [PAD_ID, BOS_ID]).any()
  assert set(sampled[:, 0].tolist()) == {A, B}


def test_filler_rows_keep_no_search_stepping():
  """A batch's filler rows (all-PAD sources: `search.in_use`) are finished before the first
  step. Here row 0's sentence ends after two tokens and row 1, a filler, would never end: greedy
  gives the filler nothing, and beam search stops with row 0, where it stepped to the cap (8)
  for the filler before; row 0's own translation is the same either way."""
  ends = jnp.log(jnp.asarray(transition_table({BOS_ID: {A: 1.0}, A: {EOS_ID: 1.0}})) + 1e-12)
  never = jnp.log(jnp.asarray(transition_table({BOS_ID: {C: 1.0}, C: {C: 1.0}})))

  def step(filler, token_ids):
    return jnp.where(filler[:, None], never[token_ids], ends[token_ids]), filler

  rows = search.in_use(jnp.array([[A, EOS_ID, PAD_ID], [PAD_ID] * 3]), 2)
  np.testing.assert_array_equal(rows, [True, False])
  filler = jnp.array([False, True])
  greedy, _, lengths = search.token_by_token(step, filler, 2, 8, search.Greedy.pick, rows)
  np.testing.assert_array_equal(greedy, [[A, EOS_ID] + [PAD_ID] * 6, [PAD_ID] * 8])
  np.testing.assert_array_equal(lengths, [2, 0])
  beams = jnp.repeat(filler, 2)
  ids, _ = search.beam_search(step, beams, 2, 8, beam_size=2, alpha=0.0, rows=rows)
  stepped_for_all, _ = search.beam_search(step, beams, 2, 8, beam_size=2, alpha=0.0)
  np.testing.assert_array_equal(ids[0], stepped_for_all[0])
  np.testing.assert_array_equal(ids[0, 0], [A, EOS_ID] + [PAD_ID] * 6)
  assert (ids[1, 0] != PAD_ID).sum() == 2 and (stepped_for_all[1, 0] != PAD_ID).sum() == 8


def test_distinct_sentences_draw_with_distinct_keys():
  """Each sentence's key comes from the seed and all of its subwords: two sentences that a
  sum of id * 1000003^i wrapping at 2^32 could not tell apart draw apart, on a model that
  ignores the source (its draws show the keys alone); one sentence padded longer draws as
  itself."""
  step = table_step(transition_table({t: {A: 0.34, B: 0.33, C: 0.33} for t in (BOS_ID, A, B, C)}))
  src = jnp.array([[2600, 800, 20, EOS_ID, PAD_ID], [89, 12, 7, EOS_ID, PAD_ID],
                   [2600, 800, 20, EOS_ID, PAD_ID]])
  ids = np.asarray(strategy_search(search.Sampling(1), step, jnp.zeros((3,)), 3, 12, src)[0][:, 0])
  assert not np.array_equal(ids[0], ids[1])
  np.testing.assert_array_equal(ids[0], ids[2])  # Identical lines: identical samples.
  longer = jnp.pad(src[:1], ((0, 0), (0, 4)))
  np.testing.assert_array_equal(
      strategy_search(search.Sampling(1), step, jnp.zeros((1,)), 1, 12, longer)[0][0, 0], ids[0])


def test_a_sample_depends_on_its_sentence_not_its_batch(model):
  """Each sentence draws with its own key, from the seed and its subwords: sampled alone, or
  in a batch of 16 at another row and padded longer, it gives the same output."""
  strategy = search.Sampling(7, temperature=3.0)  # Hot: rows keyed alike would differ.
  alone, _ = search.generate(model, SRC[1:2], strategy, max_len=8)
  batch = jnp.pad(jnp.concatenate([SRC] * 5 + [SRC[1:2]])[::-1], ((0, 0), (0, 10)))
  together, _ = search.generate(model, batch, strategy, max_len=8)
  assert batch.shape[0] == 16 and together.shape == (16, 1, 8)
  for row in np.flatnonzero(np.all(np.asarray(batch[:, :6]) == np.asarray(SRC[1]), axis=1)):
    np.testing.assert_array_equal(together[row], alone[0])
  other, _ = search.generate(model, SRC[1:2], search.Sampling(8, temperature=3.0), max_len=8)
  assert not np.array_equal(other, alone)  # The seed still decides.


def test_sampling_with_top_k_one_is_greedy(model):
  greedy, _ = search.generate(model, SRC, search.Greedy(), max_len=8)
  sampled, _ = search.generate(model, SRC, search.Sampling(3, temperature=2.0, top_k=1),
                                 max_len=8)
  np.testing.assert_array_equal(sampled, greedy)


def test_sampling_draws_only_from_the_top_k():
  # From BOS: A 0.5, B 0.3, C 0.2; with top_k=2, C must never be drawn, A and B both are.
  step = table_step(transition_table({BOS_ID: {A: 0.5, B: 0.3, C: 0.2}}))
  sampling = search.Sampling(seed=0, top_k=2)
  first = strategy_search(sampling, step, jnp.zeros((500,)), 500, 2)[0][:, 0, 0]
  counts = {t: int(np.sum(np.asarray(first) == t)) for t in (A, B, C)}
  assert counts[C] == 0 and counts[A] > counts[B] > 100
  # A fixed seed gives the same samples.
  again = strategy_search(search.Sampling(seed=0, top_k=2), step, jnp.zeros((500,)), 500,
                          2)[0][:, 0, 0]
  np.testing.assert_array_equal(first, again)


def test_strategies_are_hashable_values_that_a_jitted_search_closes_over():
  assert search.Beam(4, 0.6, nbest=2) == search.Beam(4, 0.6, nbest=2)
  assert len({search.Greedy(), search.Greedy(), search.Sampling(1), search.Sampling(2),
              search.Beam(4, 0.6), search.Beam(4, 0.6)}) == 4
  assert (search.Greedy().nbest, search.Sampling(0).nbest, search.Beam(4, 0.6, 3).nbest) \
      == (1, 1, 3)
  with pytest.raises(ValueError, match="nbest 3 must be between 1 and the beam size, 2"):
    search.Beam(2, 0.6, nbest=3)


def test_the_search_flags_name_one_strategy():
  assert translator.search_strategy(1, 0.6) == search.Greedy(0.6)
  assert translator.search_strategy(2, 0.6, nbest=2) == search.Beam(2, 0.6, nbest=2)
  assert translator.search_strategy(1, 0.6, nbest=1, sample_seed=5, temperature=0.5,
                                    top_k=3) == search.Sampling(5, 0.5, 3, 0.6)


def test_every_seed_samples_with_one_compiled_program(run):
  """The seed is the sampling program's argument, not a constant in it: a second seed's
  program is the first one, read from the persistent cache (each new `seq2seq-translate
  --sample --seed` compiled its own: 14-16 s, against 4), and its samples are its own; a seed
  draws as it did (a Python int of any size, keyed as a uint32)."""
  sentences = [VAL[0][0], VAL[2][0]]  # Short: one program per seed.
  samples, counts = [], []
  for seed in (1234567, 7654321):
    with compiling.counting() as count:
      sampler = translator.Translator(run, "latest", sample_seed=seed, temperature=3.0)
      samples.append(sampler.translate(sentences))
    counts.append((count.compiled["jit(search_fn)"], count.cached["jit(search_fn)"]))
  assert counts[1] == (0, sum(counts[0])) and counts[1][1]  # The first's, one per shape.
  assert samples[0] != samples[1]
  assert [jax.random.key_data(jax.random.key(seed)).tolist() for seed in (-1, 2**33)] == [
      jax.random.key_data(jax.random.key(translator.search_arguments(search.Sampling(seed))[0]))
      .tolist() for seed in (-1, 2**33)]


def test_sentences_of_every_length_share_a_batch_and_translate_as_alone(run):
  """`Translator` batches sentences of several grid lengths together (one program, one
  batch, where one-length batches took one each): each translation and score is the one it
  gets alone."""
  sentences = [VAL[0][0], VAL[1][0] + " " + VAL[2][0], "A dog."]
  together = translator.Translator(run, "latest", beam_size=3)
  lengths = [len(together.source_ids(sentence)) + 1 for sentence in sentences]
  assert len({batching.grid_length(n, together.config.model.max_len) for n in lengths}) == 3
  both = together.translate(sentences)
  assert len(together._search) == 1  # noqa: SLF001 (the programs it compiled, one per shape)
  for sentence, found in zip(sentences, both, strict=True):
    alone = translator.Translator(run, "latest", beam_size=3).translate([sentence])[0]
    assert found[0][0] == alone[0][0]
    np.testing.assert_allclose(found[0][1], alone[0][1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [None, 64])
@pytest.mark.parametrize("n,k", [(32_000, 8), (5_003, 6), (300, 4)])
def test_top_k_by_chunks_equals_lax_top_k(n, k, chunk):
  x = jax.random.normal(jax.random.key(0), (5, n))
  x = x.at[1].set(jnp.round(x[1] * 2) / 2)  # Many ties: the lower index must win.
  x = x.at[2, : n // 2].set(-1e9)  # Dead beams' candidates, as in beam search.
  values, index = top_k.chunked_top_k(x, k, chunk=chunk)
  expected_values, expected_index = jax.lax.top_k(x, k)
  np.testing.assert_array_equal(values, expected_values)
  np.testing.assert_array_equal(index, expected_index)


def test_best_extensions_are_the_best_of_every_hypothesis_and_token():
  """`top_k.best_extensions` (each hypothesis's best tokens first) picks what the top of all
  `beam * vocab` sums of live log-probability and log-softmax picks, PAD and BOS excluded."""
  b, k, vocab = 3, 4, 5000  # 5,000: chunks that divide it, no padding.
  logits = 4 * jax.random.normal(jax.random.key(1), (b * k, vocab))
  alive = jnp.array([[-1.0, -1.5, -2.0, -2.5], [0.0, search.NEG_INF, search.NEG_INF,
                                                search.NEG_INF], [-3.0, -3.1, -3.2, -9.0]])
  log_probs, beam, token = top_k.best_extensions(
      logits, search.translatable(logits, search.NEG_INF), alive, 2 * k)
  every = (alive.reshape(b * k, 1) + search.translatable(jax.nn.log_softmax(logits),
                                                         search.NEG_INF)).reshape(b, -1)
  expected, index = jax.lax.top_k(every, 2 * k)
  np.testing.assert_allclose(log_probs, expected, rtol=1e-6)
  np.testing.assert_array_equal(beam, index // vocab)
  np.testing.assert_array_equal(token, index % vocab)
  assert np.all(beam[1] == 0)  # Only the first beam lives at the first step.


def test_beams_sharing_one_memory_row_equal_beams_with_copies():
  """The Transformer's `for_beams` memory (one row per sentence) decodes as the copied one."""
  c = base_config()
  c.model.emb_dim, c.model.num_heads, c.model.mlp_dim = 32, 4, 64
  c.model.num_encoder_layers = c.model.num_decoder_layers = 2
  model = build_model(c, 30)
  memory = model.encode(SRC)
  shared = beams.expand_to_beams(memory, 3)
  copied = beams.expand_to_beams(memory, 3, copy_all=True)
  assert shared.cross_kv[0][0].shape[0] == 3 and copied.cross_kv[0][0].shape[0] == 9
  results = [search.beam_search(functools.partial(model.decode_step, m),
                                  model.init_cache(m, 8), 3, 8, beam_size=3, alpha=0.6)
             for m in (shared, copied)]
  np.testing.assert_array_equal(results[0][0], results[1][0])
  np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5)
  logits = [model.decode_step(m, model.init_cache(m, 8), jnp.arange(9, dtype=jnp.int32))[0]
            for m in (shared, copied)]
  np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)


def test_cache_lengths_halve_max_len_down_to_the_shortest_phase():
  assert beams.cache_lengths(40) == (20, 40)
  assert beams.cache_lengths(150) == (18, 37, 75, 150)
  assert beams.cache_lengths(256) == (16, 32, 64, 128, 256)
  assert beams.cache_lengths(31) == (31,)
  assert beams.cache_lengths(20, shortest=8) == (10, 20)
  assert beams.cache_lengths(3, shortest=1) == (1, 3)


@pytest.mark.parametrize("attention", ["scaled_dot", "local"])
def test_beam_search_in_cache_phases_equals_one_full_cache(attention):
  """Growing the Transformer's cache 5 -> 10 -> 20 slots decodes as a 20-slot cache."""
  c = base_config()
  c.model.emb_dim, c.model.num_heads, c.model.mlp_dim = 32, 4, 64
  c.model.num_encoder_layers = c.model.num_decoder_layers = 2
  c.model.attention, c.model.attention_window = attention, 3
  model = build_model(c, 30)
  memory = beams.expand_to_beams(model.encode(SRC), 3)
  cache = model.init_cache(memory, 20)

  def step(cache, token_ids):  # Never EOS: every hypothesis runs through all three phases.
    logits, cache = model.decode_step(memory, cache, token_ids)
    return logits.at[:, EOS_ID].set(-1e9), cache

  def decode(shortest_phase):
    return jax.jit(lambda cache: search.beam_search(
        step, cache, 3, 20, beam_size=3, alpha=0.6, nbest=3,
        shortest_phase=shortest_phase))(cache)

  assert beams.cache_lengths(20, 5) == (5, 10, 20) and beams.cache_lengths(20, 20) == (20,)
  phased, whole = decode(5), decode(20)
  assert np.all(np.asarray(whole[0]) != PAD_ID)
  np.testing.assert_array_equal(phased[0], whole[0])
  # The same terms, summed over 5 or 10 slots instead of 20: equal up to float rounding.
  np.testing.assert_allclose(phased[1], whole[1], rtol=1e-6)


def test_transformer_cache_resized_keeps_written_slots():
  c = base_config()
  c.model.emb_dim, c.model.num_heads, c.model.mlp_dim = 32, 4, 64
  model = build_model(c, 30)
  memory = model.encode(SRC)
  cache = model.init_cache(memory, 4)
  for token in (5, 6, 7):
    _, cache = model.decode_step(memory, cache, jnp.full((3,), token, jnp.int32))
  grown = cache.resized(10)
  assert grown.self_kv[0][0].shape[2] == 10 and int(grown.index) == 3
  for kv, grown_kv in zip(cache.self_kv, grown.self_kv, strict=True):
    for x, grown_x in zip(kv, grown_kv, strict=True):
      np.testing.assert_array_equal(grown_x[:, :, :4], x)
      np.testing.assert_array_equal(grown_x[:, :, 4:], 0.0)
  cut = grown.resized(3)
  np.testing.assert_array_equal(cut.self_kv[1][0], cache.self_kv[1][0][:, :, :3])
  # The next step sees the same slots, whatever the cache's size.
  logits = [model.decode_step(memory, x, jnp.full((3,), 8, jnp.int32))[0]
            for x in (cache, grown)]
  np.testing.assert_allclose(logits[0], logits[1], atol=1e-6)
