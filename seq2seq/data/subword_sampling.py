"""Subword regularization (Kudo 2018): the training pairs resegmented at each epoch.

With `config.data.subword_sampling` (alpha) above 0, each epoch trains on segmentations drawn
as SentencePiece's sampling draws them with an n-best size (`subword_nbest`): SentencePiece
finds each sentence's n best segmentations in its unigram lattice, and one is drawn with
probability proportional to P(x) ** alpha. Validation, test and decoding always read the one
best segmentation.

An epoch's segmentation is a pure function of (train.seed, epoch) (epoch 0's, of the data
alone: `epoch_key`), so a resumed run reads what the uninterrupted one read. That is why the
draw among the n best is numpy's, from a generator seeded by them: SentencePiece's own
sampling (0.2.3), given the same seed, draws other segmentations in each new process, so a
resumed run could not draw its epochs again. For the same reason there is no sampling over the
whole lattice (SentencePiece's nbest_size=-1). A text's n best, which depend on the text
alone, are searched once and kept (`NBest`), so after the first draw an epoch's costs a table
lookup per text. The next epoch's segmentation is drawn in the background while this one
trains.

The batches keep the run's shapes. Their plan (which pairs share a batch, and its length) is
made once, from each sentence's longer segmentation of two: its best and its draw of epoch 0
(`sizing`), which depends on the data alone, so that a typical draw fits. Then
`SubwordSampler.fit` keeps each epoch's draw of a sentence only where its row still holds it,
and otherwise its best segmentation, which always fits (as it does where the draw is longer
than `data.max_len`).
"""

import collections
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from concurrent.futures import Future

import ml_collections
import numpy as np

from seq2seq.data.corpus import ParallelText
from seq2seq.data.tokenizer import Tokenizer

log = logging.getLogger("seq2seq")

_SALT = 0x5EC5  # Keeps these generators apart from other draws of (train.seed, epoch).

Ids = list[np.ndarray]


def epoch_key(seed: int, epoch: int) -> tuple[int, ...]:
  """What draws `epoch`'s segmentation in a run of train.seed `seed` (`generator`): (seed,
  epoch); for epoch 0, nothing (the data alone): its draw also sizes the batches' plan, which
  is one for every seed, so that runs differing only in their seed have batches of one shape
  (`training.seeds`)."""
  return (seed, epoch) if epoch else ()


def generator(*key: int) -> np.random.Generator:
  """The generator of the draw that `key` names (`epoch_key`)."""
  return np.random.default_rng([*key, _SALT])


class Abandoned(Exception):
  """A draw stopped because its process is exiting."""


# The most subword ids `NBest` keeps (2 bytes each under a vocabulary of 65,536): Multi30k's
# 58,000 training texts at 64 best hold about 66 million, 130 MB; a larger corpus keeps its
# first texts' lists and computes the others' again at each draw.
NBEST_IDS_KEPT = 1 << 28


class NBest:
  """Each text's `nbest_size` best segmentations and the cumulative weights a draw chooses
  among them with (P(x) ** alpha, as SentencePiece's sampling weighs them), computed once per
  text: they depend on the text alone, so every later epoch's draw is a table lookup, the same
  ids as computing them again (up to `NBEST_IDS_KEPT` ids in all; a text past that is
  computed at each draw)."""

  def __init__(self, tokenizer: Tokenizer, *, alpha: float, nbest_size: int,
               ids_kept: int = NBEST_IDS_KEPT):
    self._tokenizer, self._alpha, self._nbest_size = tokenizer, alpha, nbest_size
    self._dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
    self._room = ids_kept
    self._kept: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # By text index.
    self._lock = threading.Lock()

  def lists(self, index: int, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Text `index`'s (ids of its segmentations end to end, where each starts (and the end),
    the cumulative weights of choosing each)."""
    kept = self._kept.get(index)
    if kept is not None:
      return kept
    candidates = self._tokenizer.nbest(text, self._nbest_size) or [[]]  # "": one, empty.
    lengths = [len(c) for c in candidates]
    flat = np.fromiter(itertools.chain.from_iterable(candidates), np.int64, sum(lengths))
    starts = np.cumsum([0, *lengths])
    scores = np.zeros(1)  # One segmentation: chosen whatever its score.
    if len(candidates) > 1:
      scores = np.add.reduceat(self._tokenizer.log_probs[flat], starts[:-1])
    computed = (flat.astype(self._dtype), starts,
                np.cumsum(np.exp(self._alpha * (scores - scores.max()))))
    with self._lock:
      if flat.size <= self._room:
        self._kept[index], self._room = computed, self._room - flat.size
    return computed


def sample(texts: Sequence[str], nbest: NBest, rng: np.random.Generator) -> Ids:
  """Each text's ids in a segmentation drawn among its n best (`nbest`), with probability
  proportional to P(x) ** alpha: SentencePiece's SampleEncode with nbest_size > 1 (the same
  n best, scores and probabilities), the choice made with `rng`, one uniform per text.

  Raises:
    Abandoned: in a background thread, once the main thread has ended (the process exits).
  """
  uniforms = rng.random(len(texts))
  drawn = []
  for index, (text, uniform) in enumerate(zip(texts, uniforms, strict=True)):
    if not threading.main_thread().is_alive():
      raise Abandoned("the process is exiting")
    flat, starts, cumulative = nbest.lists(index, text)
    pick = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
    pick = min(pick, len(cumulative) - 1)
    drawn.append(flat[starts[pick]:starts[pick + 1]].astype(np.int32))
  return drawn


def _in_background(fn, *args) -> Future:
  """`fn(*args)` in a thread. Not a daemon: one stopped at exit inside SentencePiece's C++
  aborts the process; `sample` instead stops within a sentence of the main thread's end."""
  future = Future()

  def run():
    try:
      future.set_result(fn(*args))
    except BaseException as e:  # Raised again in whoever waits for the result.
      future.set_exception(e)

  threading.Thread(target=run, name="subword-sampling").start()
  return future


class SubwordSampler:
  """Draws the training pairs' segmentation of each epoch (`epoch_key`)."""

  def __init__(self, tokenizer: Tokenizer, text: ParallelText, *, alpha: float,
               nbest_size: int):
    """
    Args:
      tokenizer: the run's vocabulary (a unigram model, as every run's is).
      text: the training pairs.
      alpha: the exponent of the segmentations' probabilities (small: nearly uniform).
      nbest_size: samples among this many best segmentations.
    """
    self._tokenizer, self._text = tokenizer, text
    self._nbest = NBest(tokenizer, alpha=alpha, nbest_size=nbest_size)
    self._draws: dict[tuple[int, ...], Future] = {}  # By `epoch_key`.
    self._lock = threading.Lock()
    # Sentences that `fit` placed, per side ("source", "target"), and those on their draw.
    self.placed, self.on_draw = collections.Counter(), collections.Counter()
    self._newest = -1  # The newest epoch asked for.
    self._reported = (collections.Counter(), collections.Counter())  # Those counts when logged.

  @classmethod
  def from_config(cls, tokenizer: Tokenizer, text: ParallelText,
                  data_config: ml_collections.ConfigDict) -> "SubwordSampler | None":
    """The sampler `config.data` asks for: None where subword_sampling is 0 (off)."""
    if not data_config.subword_sampling > 0:
      return None
    return cls(tokenizer, text, alpha=data_config.subword_sampling,
               nbest_size=data_config.subword_nbest)

  def draw(self, rng: np.random.Generator) -> tuple[Ids, Ids]:
    """Every pair's sampled source and target ids (int32, without BOS/EOS), drawn by `rng`."""
    n = len(self._text)
    ids = sample(self._text.src + self._text.tgt, self._nbest, rng)
    return ids[:n], ids[n:]

  def _timed_draw(self, key: tuple[int, ...], after: Future | None) -> tuple[Ids, Ids]:
    """`draw` of `generator(*key)`, once `after` (the epoch before) is drawn, so that the
    epoch a run waits for has the CPU; its seconds logged, what each epoch costs."""
    if after is not None:
      futures.wait([after])
    start = time.perf_counter()
    drawn = self.draw(generator(*key))
    log.info("Subword sampling: drew epoch %d's segmentation of %d training pairs in %.1f s.",
             key[1] if key else 0, len(self._text), time.perf_counter() - start)
    return drawn

  def _started(self, key: tuple[int, ...], after: Future | None = None) -> Future:
    if key not in self._draws:
      self._draws[key] = _in_background(self._timed_draw, key, after)
    return self._draws[key]

  def sizing(self) -> tuple[Ids, Ids]:
    """The draw that sizes the batches' plan: epoch 0's, the same for every train.seed."""
    with self._lock:
      draw = self._started(epoch_key(0, 0))
    return draw.result()

  def epoch(self, seed: int, epoch: int) -> tuple[Ids, Ids]:
    """The segmentation of `epoch` for train.seed `seed` (`draw` of `epoch_key`); starts
    drawing the next epoch's in the background. Keeps the two newest epochs of each seed."""
    key, ahead = epoch_key(seed, epoch), epoch_key(seed, epoch + 1)
    with self._lock:
      if epoch > self._newest >= 0:  # Once per epoch (a seed group's too).
        self._report(self._newest)
      self._newest = max(self._newest, epoch)
      draw = self._started(key)
      self._started(ahead, after=draw)
      self._draws = {k: d for k, d in self._draws.items()
                     if k in (key, ahead) or (k and k[0] != seed)}
    return draw.result()

  def _report(self, epoch: int) -> None:
    """Logs the share of the sentences that `fit` placed since the last report (in `epoch`)
    that trained on their draw."""
    placed, on_draw = self.placed - self._reported[0], self.on_draw - self._reported[1]
    if placed:
      log.info("Subword sampling: in epoch %d, %s sentences trained on their draw (the others on"
               " their best segmentation, where the draw did not fit).", epoch,
               " and ".join(f"{on_draw[side] / placed[side]:.1%} of the {side}"
                            for side in sorted(placed)))
    self._reported = (self.placed.copy(), self.on_draw.copy())

  def fit(self, side: str, rows: list, best: Ids, drawn: Ids, length: int,
          max_len: int) -> dict[int, np.ndarray]:
    """The ids each example of `rows` enters its row with on one `side`: its draw where the
    row still holds it, else its best segmentation (and `placed`, `on_draw` count them).

    Args:
      side: "source" or "target", for the counts.
      rows: per row of a batch, the examples it holds (each with one more token: EOS or BOS),
        which fit in `length` tokens at their best segmentations.
      best: per example, its best segmentation's ids.
      drawn: per example, this epoch's sampled ids.
      length: the tokens of a row.
      max_len: config.data.max_len; a draw longer than that with EOS/BOS is not kept.

    Returns:
      The ids of every example in `rows`. In row order, each keeps its draw where the row's
      room left (`length` less every example at its best) pays for its growth.
    """
    chosen = {}
    for row in rows:
      room = length - sum(len(best[i]) + 1 for i in row)
      for i in row:
        growth = len(drawn[i]) - len(best[i])
        if growth <= room and 0 < len(drawn[i]) < max_len:
          chosen[i], room = drawn[i], room - growth
          self.on_draw[side] += 1
        else:
          chosen[i] = best[i]
    self.placed[side] += len(chosen)
    return chosen
