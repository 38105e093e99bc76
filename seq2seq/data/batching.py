"""Length filtering, token-budget batches of similar lengths, per-process sharding.

A batch is a dict of int32 arrays, all `[rows, L]`:
  "src":     source ids, EOS, then PAD;
  "tgt_in":  BOS, target ids, then PAD (the decoder's teacher-forced input);
  "tgt_out": target ids, EOS, then PAD (what the decoder predicts).
Source and target share L, a multiple of `bucket_step`, so only a few shapes
ever reach the compiler. Filler rows are all PAD, which the loss ignores.

Packed training batches (`pack=True`, Transformer only) put several pairs in
each row, one shape for all: the i-th source and i-th target sentence of a row
form a pair, and four more `[rows, L]` arrays say where:
  "src_segments", "tgt_segments":   1, 2, ... per sentence of the row, 0 on PAD;
  "src_positions", "tgt_positions": each token's position in its own sentence.

Training batches are a pure function of (seed, step, process index), resegmented
by subword sampling or not (`subword_sampling`): resuming at any step needs no
iterator state and reproduces the uninterrupted run.
"""

import copy
import math

import numpy as np

from seq2seq.data.corpus import ParallelText
from seq2seq.data.subword_sampling import SubwordSampler
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from seq2seq.errors import UserError


def encode_pairs(tokenizer: Tokenizer,
                 text: ParallelText) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Subword ids of each side, without BOS/EOS, as int32 arrays."""
  def encode(sentences):
    return [np.asarray(ids, dtype=np.int32) for ids in tokenizer.encode_batch(sentences)]
  return encode(text.src), encode(text.tgt)


def _padded_length(length: int, bucket_step: int) -> int:
  return bucket_step * math.ceil(length / bucket_step)


def bucket_lengths(lengths: np.ndarray, bucket_step: int, count: int) -> list[int]:
  """At most `count` padded lengths for sequences of `lengths` that waste the fewest tokens.

  Each sequence is padded to the shortest chosen length that holds it, and each
  chosen length is one compiled program. The lengths are multiples of
  `bucket_step`, the longest holds the longest sequence, and together they
  minimize the summed padded length (an exact dynamic program over the
  multiples of `bucket_step`). `count` 0: every multiple that some sequence needs.
  """
  padded = bucket_step * -(-np.asarray(lengths, np.int64) // bucket_step)
  needed = np.unique(padded)
  if count <= 0 or len(needed) <= count:
    return needed.tolist()
  sizes = np.array([np.sum(padded == n) for n in needed])
  below = np.concatenate([[0], np.cumsum(sizes)])  # below[i]: sequences needing < needed[i].
  # best[j][i]: least padded total of the sequences needing needed[:i + 1], with j + 1
  # lengths, the longest needed[i]; choice[j][i]: the previous length's index.
  best = [needed[i] * below[i + 1] for i in range(len(needed))]
  choices = []
  for _ in range(1, count):
    new, choice = list(best), list(range(len(needed)))
    for i in range(len(needed)):
      for k in range(i):
        total = best[k] + needed[i] * (below[i + 1] - below[k + 1])
        if total < new[i]:
          new[i], choice[i] = total, k
    best = new
    choices.append(choice)
  chosen, i = [int(needed[-1])], len(needed) - 1
  for choice in reversed(choices):
    if choice[i] != i:  # Else this many lengths did no better than one fewer.
      i = choice[i]
      chosen.insert(0, int(needed[i]))
  return chosen


def _fill(src_ids, tgt_ids, rows: np.ndarray, length: int) -> dict[str, np.ndarray]:
  """Builds one batch; `rows` holds example indices, -1 for an all-PAD filler row."""
  return _fill_packed(src_ids, tgt_ids, [[i] if i >= 0 else [] for i in rows], length,
                      segments=False)


PACKING_KEYS = ("src_segments", "tgt_segments", "src_positions", "tgt_positions")


def _fill_packed(src_ids, tgt_ids, rows: list, length: int, *,
                 segments: bool = True) -> dict[str, np.ndarray]:
  """Builds one batch whose row r holds the examples `rows[r]` one after the other."""
  keys = ("src", "tgt_in", "tgt_out") + (PACKING_KEYS if segments else ())
  batch = {k: np.full((len(rows), length), PAD_ID, np.int32) for k in keys}
  for r, examples in enumerate(rows):
    s_at = t_at = 0  # Where the next sentence starts on each side.
    for segment, i in enumerate(examples, start=1):
      s, t = src_ids[i], tgt_ids[i]
      batch["src"][r, s_at:s_at + len(s)] = s
      batch["src"][r, s_at + len(s)] = EOS_ID
      batch["tgt_in"][r, t_at] = BOS_ID
      batch["tgt_in"][r, t_at + 1:t_at + len(t) + 1] = t
      batch["tgt_out"][r, t_at:t_at + len(t)] = t
      batch["tgt_out"][r, t_at + len(t)] = EOS_ID
      if segments:
        batch["src_segments"][r, s_at:s_at + len(s) + 1] = segment
        batch["tgt_segments"][r, t_at:t_at + len(t) + 1] = segment
        batch["src_positions"][r, s_at:s_at + len(s) + 1] = np.arange(len(s) + 1)
        batch["tgt_positions"][r, t_at:t_at + len(t) + 1] = np.arange(len(t) + 1)
      s_at, t_at = s_at + len(s) + 1, t_at + len(t) + 1
  return batch


def _pack(examples: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray,
          length: int) -> list[np.ndarray]:
  """Groups examples into rows of at most `length` tokens a side (with EOS/BOS).

  Best fit decreasing on each pair's longer side: longest pairs first, each
  into the open row it fills most tightly. Simulated with WMT-like lengths
  (mean ~30 subwords), this fills ~97% of the target side, against ~83% for
  next fit in random order. Time: a sort, then at most `length` capacity
  classes looked at per example.
  """
  sizes = np.maximum(src_len, tgt_len) + 1
  order = examples[np.argsort(-sizes[examples], kind="stable")].tolist()
  sizes = sizes.tolist()
  rows: list[list[int]] = []
  open_rows: list[list[int]] = [[] for _ in range(length + 1)]  # Row ids by free slots.
  for i in order:
    need = sizes[i]
    for free in range(need, length + 1):
      if open_rows[free]:
        row = open_rows[free].pop()
        break
    else:
      row, free = len(rows), length
      rows.append([])
    rows[row].append(i)
    open_rows[free - need].append(row)
  return [np.array(row) for row in rows]


def stack(batches: list[dict]) -> dict:
  """Batches (dicts of equal-shaped arrays) stacked on a new leading axis."""
  return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


# Seeds the order of a bucketed epoch's batch lengths, the same for every train.seed.
SHAPE_ORDER_SEED = 0


class TrainBatches:
  """Training batches of at most `tokens_per_batch` padded tokens, by global step.

  Examples are bucketed by padded length L; bucket L always yields batches of
  `rows(L)` rows, so each bucket has one shape. An epoch visits every kept
  example exactly once, in an order drawn from (seed, epoch). With `pack`,
  there is one bucket, L = max_len rounded up to `bucket_step`, whose rows
  each hold several examples; the grouping into rows is fixed (`_pack`), the
  order of the rows is drawn per epoch. With a `sampler`, each epoch's segmentation fills
  the rows where it fits (`subword_sampling`).

  Attributes:
    num_examples: pairs kept after length filtering.
    num_dropped: pairs dropped (empty side, or longer than max_len with EOS/BOS).
    batches_per_epoch: global batches in one epoch.
    shapes: sorted distinct (rows, L) that `__call__` returns on this process.
    keys: the names of the arrays in each batch.
  """

  def __init__(self, src_ids: list[np.ndarray], tgt_ids: list[np.ndarray], *,
               tokens_per_batch: int, max_len: int, bucket_step: int, seed: int,
               row_multiple: int = 1, process_index: int = 0, process_count: int = 1,
               pack: bool = False, num_buckets: int = 0, pad_rows_to: int = 1,
               sampler: SubwordSampler | None = None):
    """Filters and buckets the examples.

    Args:
      src_ids: per example, `[src_length]` source ids without EOS.
      tgt_ids: per example, `[tgt_length]` target ids without BOS/EOS.
      tokens_per_batch: padded-token budget of one global batch (all processes).
      max_len: longest kept sequence, counting the added EOS (or BOS).
      bucket_step: padded lengths are multiples of this.
      seed: seeds the batch order.
      row_multiple: the examples of a batch are a multiple of this many rows (the gradient
        accumulation's micro-batches).
      pad_rows_to: global rows are completed with filler rows (all PAD) to a multiple of this
        (the data-parallel devices times `row_multiple`); must be a multiple of
        `process_count`. The batches' examples do not depend on it: a run on other hardware
        sees the same examples at every step.
      process_index: which contiguous slice of each global batch to return.
      process_count: number of processes sharing each global batch.
      pack: put several examples in each row (see the module docstring).
      num_buckets: unpacked, pad to at most this many lengths (`bucket_lengths`; 0: every
        multiple of `bucket_step`).
      sampler: resegments the examples at each epoch (subword regularization; None: off).
    """
    if len(src_ids) != len(tgt_ids):
      raise ValueError(f"{len(src_ids)} source but {len(tgt_ids)} target sequences.")
    if pad_rows_to % process_count:
      raise ValueError(f"pad_rows_to={pad_rows_to} is not a multiple of"
                       f" process_count={process_count}.")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index={process_index} not in [0, {process_count}).")
    self._src, self._tgt = src_ids, tgt_ids
    self._seed, self._sampler, self._max_len = seed, sampler, max_len
    self.keys = ("src", "tgt_in", "tgt_out") + (PACKING_KEYS if pack else ())
    self._process_index, self._process_count = process_index, process_count
    self._make_buckets(*self._kept(), bucket_step, pack, num_buckets)
    self._rows = {b: max(row_multiple, (tokens_per_batch // b) // row_multiple * row_multiple)
                  for b in self._buckets}  # Examples per batch: the config's alone.
    self._padded = {b: -(-rows // pad_rows_to) * pad_rows_to for b, rows in self._rows.items()}
    self.batches_per_epoch = sum(-(-len(ex) // self._rows[b]) for b, ex in self._buckets.items())
    self.shapes = sorted((self._padded[b] // process_count, b) for b in self._buckets)
    self._plans = {}

  def _kept(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The examples kept by length (`num_examples`; the others are `num_dropped`), and each
    example's source and target length that rows are planned for."""
    max_len, sampler = self._max_len, self._sampler
    src_len = np.array([len(s) for s in self._src], dtype=np.int64)
    tgt_len = np.array([len(t) for t in self._tgt], dtype=np.int64)
    keep = (src_len > 0) & (tgt_len > 0) & (src_len + 1 <= max_len) & (tgt_len + 1 <= max_len)
    kept = np.flatnonzero(keep)
    self.num_examples = len(kept)
    self.num_dropped = len(self._src) - len(kept)
    if not len(kept):
      raise UserError(f"The training corpus is empty after length filtering"
                      f" (config.data.max_len={max_len}); raise config.data.max_len.")
    if sampler is not None:
      # Rows planned to hold a typical draw too (`subword_sampling`): each side at the longer
      # of its best segmentation and its draw of epoch 0. Which pairs are kept stays the best's.
      drawn = sampler.sizing()
      src_len = np.minimum(np.maximum(src_len, [len(s) for s in drawn[0]]), max_len - 1)
      tgt_len = np.minimum(np.maximum(tgt_len, [len(t) for t in drawn[1]]), max_len - 1)
    return kept, src_len, tgt_len

  def _make_buckets(self, kept: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray,
                    bucket_step: int, pack: bool, num_buckets: int) -> None:
    """The buckets: padded length L -> the items of its batches; packed, one bucket whose
    items are rows of `self._packs`, not examples."""
    if pack:
      length = _padded_length(self._max_len, bucket_step)
      self._packs = _pack(kept, src_len, tgt_len, length)
      self._buckets = {length: np.arange(len(self._packs))}
    else:
      self._packs = None
      lengths = np.maximum(src_len[kept], tgt_len[kept]) + 1
      chosen = np.array(bucket_lengths(lengths, bucket_step, num_buckets))
      padded = chosen[np.searchsorted(chosen, lengths)]  # The shortest that holds each.
      self._buckets = {int(b): kept[padded == b] for b in np.unique(padded)}

  def reseeded(self, seed: int) -> "TrainBatches":
    """These batches in the order of another seed: the filtering, buckets and packs, which
    no seed decides, are shared (a seed group's members build them once)."""
    other = copy.copy(self)
    other._seed, other._plans = seed, {}
    return other

  def _plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """The epoch's global batches in order: (L, example indices), pure in (seed, epoch).

    The order of the lengths is the data's alone (drawn from the epoch, not the seed): runs
    that differ only in their seed get batches of the same shape at every step, so their
    seeds can train as one program (`training.seeds`). The seed draws which examples
    fill each batch, and in which order each length's batches come."""
    plan = self._plans.get(epoch)
    if plan is None:
      rng = np.random.default_rng([self._seed, epoch])
      chunks = {}
      for length in sorted(self._buckets):
        order = rng.permutation(self._buckets[length])
        rows = self._rows[length]
        chunks[length] = [order[i:i + rows] for i in range(0, len(order), rows)]
      slots = [length for length in sorted(chunks) for _ in chunks[length]]
      lengths = [slots[i] for i in np.random.default_rng([SHAPE_ORDER_SEED, epoch])
                 .permutation(len(slots))] if len(chunks) > 1 else slots
      taken = {length: iter(rng.permutation(len(chunks[length]))) for length in sorted(chunks)}
      plan = [(length, chunks[length][next(taken[length])]) for length in lengths]
      # Steps arrive in order, so the newest two epochs suffice. Rebinding rather
      # than mutating the dict keeps a concurrent prefetch thread safe.
      self._plans = dict(list(self._plans.items())[-1:] + [(epoch, plan)])
    return plan

  def length(self, step: int) -> int:
    """The padded length L of the batch of `step` (its shape is `(rows(L), L)`)."""
    epoch, index = divmod(step, self.batches_per_epoch)
    return self._plan(epoch)[index][0]

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    """This process's rows of the global batch for `step`.

    Args:
      step: global training step, >= 0.

    Returns:
      "src", "tgt_in", "tgt_out" (and, packed, the segment ids and positions):
      int32 `[rows(L) / process_count, L]`.
    """
    if step < 0:
      raise ValueError(f"step={step} must be >= 0.")
    epoch, index = divmod(step, self.batches_per_epoch)
    length, examples = self._plan(epoch)[index]
    rows = self._padded[length]
    # The last batch of a bucket is short, and rows are padded for the devices: complete it
    # with PAD rows (-1).
    examples = np.concatenate([examples, np.full(rows - len(examples), -1, examples.dtype)])
    per_process = rows // self._process_count
    start = self._process_index * per_process
    mine = examples[start:start + per_process]
    if self._packs is None:
      rows = [[i] if i >= 0 else [] for i in mine]
    else:
      rows = [self._packs[i] if i >= 0 else [] for i in mine]
    src, tgt = self._src, self._tgt
    if self._sampler is not None:  # This epoch's draw, where each row holds it.
      drawn_src, drawn_tgt = self._sampler.epoch(self._seed, epoch)
      src = self._sampler.fit("source", rows, self._src, drawn_src, length, self._max_len)
      tgt = self._sampler.fit("target", rows, self._tgt, drawn_tgt, length, self._max_len)
    return _fill_packed(src, tgt, rows, length, segments=self._packs is not None)

  def steps(self, step: int, size: int) -> dict[str, np.ndarray]:
    """This process's rows of the batches of steps `step`..`step + size - 1`: one step's
    batch, or `size` stacked (`[size, rows, L]`, for a call of several steps)."""
    return self(step) if size == 1 else stack([self(step + i) for i in range(size)])


# The one grid of evaluation lengths. Every validation loss and every search (validation,
# seq2seq-evaluate, -translate, -compare) pads a batch to the shortest of these that holds its
# longest sentence (or to model.max_len, the cap), always with the same number of rows. So a
# program is a function of (length, rows), not of the test set, and every test set of similar
# lengths reads the programs of the first one from the persistent compilation cache. Steps of
# 8 up to 32, then of half the length: a batch pads at most 50% over its longest sentence.
GRID = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def grid_lengths(max_len: int) -> list[int]:
  """The evaluation lengths for sequences up to `max_len` (which caps the grid): every grid
  length below it, then `max_len` itself."""
  return [n for n in GRID if n < max_len] + [max_len]


def grid_length(length: int, max_len: int) -> int:
  """The shortest evaluation length that holds `length` tokens (at most `max_len`)."""
  return next(n for n in grid_lengths(max_len) if n >= min(length, max_len))


def grid_lengths_up_to(longest: int, max_len: int) -> list[int]:
  """The grid lengths a batch of sequences up to `longest` tokens may be padded to."""
  return [n for n in grid_lengths(max_len) if n <= grid_length(longest, max_len)]


def eval_batches(src_ids: list[np.ndarray], tgt_ids: list[np.ndarray], *, batch_size: int,
                 max_len: int, one_length: bool = False) -> list[dict[str, np.ndarray]]:
  """Every pair of a split exactly once, in batches of similar lengths on the `GRID`.

  Args:
    src_ids: per example, `[src_length]` source ids without EOS.
    tgt_ids: per example, `[tgt_length]` target ids without BOS/EOS.
    batch_size: rows of every batch (the last is completed with PAD rows).
    max_len: truncate each side to `max_len - 1` ids so that with EOS/BOS it fits in
      `max_len`, the grid's cap (config.model.max_len).
    one_length: each batch holds examples of one grid length only, so every example is
      padded to its own length, and a batch has one decoding cap: for a decoder that takes
      one per batch (JoeyNMT's, in the comparison of benchmarks/joeynmt). Ours decode each
      sentence to its own cap (`search.decode_caps`) in batches of every length.

  Returns:
    Batches with "src", "tgt_in", "tgt_out" (int32 `[batch_size, L]`, L from
    `grid_lengths(max_len)`) and "index" (int32 `[batch_size]`): each row's position in the
    split, -1 for filler rows.
  """
  if len(src_ids) != len(tgt_ids):
    raise ValueError(f"{len(src_ids)} source but {len(tgt_ids)} target sequences.")
  src_ids = [s[:max_len - 1] for s in src_ids]
  tgt_ids = [t[:max_len - 1] for t in tgt_ids]
  src_len = np.array([len(s) for s in src_ids], dtype=np.int64)
  tgt_len = np.array([len(t) for t in tgt_ids], dtype=np.int64)
  lengths = np.maximum(src_len, tgt_len) + 1
  # By padded length, then source length (which bounds the decoding length).
  order = np.lexsort((src_len, lengths))
  padded = np.array([grid_length(int(n), max_len) for n in lengths[order]], dtype=np.int64)
  groups = [order[padded == n] for n in np.unique(padded)] if one_length else [order]
  batches = []
  for group in groups:
    for i in range(0, len(group), batch_size):
      examples = group[i:i + batch_size]
      index = np.full(batch_size, -1, np.int32)
      index[:len(examples)] = examples
      batch = _fill(src_ids, tgt_ids, index, grid_length(int(lengths[examples].max()), max_len))
      batch["index"] = index
      batches.append(batch)
  return batches
