"""The attention of a translation: for each output subword, its weights over the source
subwords (the Transformer's cross-attention per layer and head, the RNN's alignment), and
for the server the Transformer's self-attention of both sides too.

`alignment` computes it op by op for one sentence, for pictures. `Alignments` compiles it
ahead per source length of the grid, as the searches are, for a server that must never
compile while it answers, together with the log-probability of each output subword: the
score of any given translation (forced decoding), the search's own or a reference.
`word_alignments` turns the attention of many translations into word links, in batches
(`seq2seq.decoding.word_alignment` says how).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seq2seq import models
from seq2seq.data import batching
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.decoding import search, word_alignment
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.runtime import compiling


def _inputs(src: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The model's inputs for the attention of output `out` (ids through EOS) on source `src`
  (ids without EOS): the source with EOS, and the teacher-forced target (BOS, then `out`
  but its last)."""
  return (np.concatenate([src, [EOS_ID]]).astype(np.int32),
          np.concatenate([[BOS_ID], out[:-1]]).astype(np.int32))


def labels(pieces, src: np.ndarray, out: np.ndarray) -> dict[str, tuple[list[str], list[str]]]:
  """The subwords of the rows and of the columns of every kind of attention of output `out`
  (ids through EOS) on source `src` (ids without EOS), in the order `attention_weights` gives
  its queries and keys: the inputs' order, whatever order the model reads them in (the RNN
  puts a reversed source back). `cross`: the outputs on the source with `</s>`; `encoder`:
  that source on itself; `decoder`: the outputs on what the decoder read, `<s>` then the
  outputs but the last (so a row sees `<s>` and the outputs before its own, never `</s>`).
  `pieces`: ids -> subwords (`Tokenizer.pieces`)."""
  src_ids, tgt_in = _inputs(src, out)
  source, target = pieces(src_ids), pieces(out)
  return {"cross": (target, source), "encoder": (source, source),
          "decoder": (target, pieces(tgt_in))}


def alignment(translator: Translator, text: str):
  """Translates `text` and returns the attention of each output subword.

  Returns:
    (weights `[layers, heads, tgt_len, src_len]`, source subwords, target subwords),
    where the source ends with `</s>` and the target is the best translation + `</s>`.
  """
  src = translator.source_ids(text)
  if not len(src):
    raise UserError("--text is empty; pass a sentence to translate.")
  out = translator.hypotheses([text])[0][0].ids
  src_ids, tgt_in = _inputs(src, out)
  weights = _weights(translator.params, jnp.asarray(src_ids[None]), jnp.asarray(tgt_in[None]),
                     graphdef=translator.graphdef)  # Op by op: no program for one picture.
  target, source = labels(translator.tokenizer.pieces, src, out)["cross"]
  return np.asarray(weights), source, target


def check_attends(translator: Translator, fix: str) -> None:
  """A `UserError` ending in `fix` for a run whose decoder attends to nothing (`models.attends`:
  the RNN's fixed-vector attention, Sutskever et al.'s), whose weights `alignment` gives as
  zeros, which a picture of that run alone would draw as a blank map without a word. (Such an
  RNN has no self-attention to show instead; a comparison shows such a run beside others,
  titled "no attention".)"""
  m = translator.config.model
  if not models.attends(m):
    raise UserError(f"{translator.workdir} was trained with config.model.attention={m.attention}:"
                    " its decoder reads one fixed vector of the source and attends to none of"
                    f" its words, so there is no attention to draw; {fix}.")


def _stacked(pairs: list[tuple[np.ndarray, np.ndarray]], rows: int,
             lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
  """`pairs` of (source, teacher-forced target) ids as two PAD-padded `[rows, length]` arrays,
  the rows after the pairs' all PAD."""
  src, tgt_in = (np.full((rows, length), PAD_ID, np.int32) for length in lengths)
  for row, (s, t) in enumerate(pairs):
    src[row, :len(s)], tgt_in[row, :len(t)] = s, t
  return src, tgt_in


def _allowed(src: jnp.ndarray, tgt_in: jnp.ndarray) -> dict[str, jnp.ndarray]:
  """Which weights each kind of attention may give (`[batch, queries, keys]`): a real query's
  on real keys, and the decoder's on keys not after it."""
  src_real, tgt_real = src != PAD_ID, tgt_in != PAD_ID
  causal = jnp.tril(jnp.ones((tgt_in.shape[1],) * 2, bool))
  return {"cross": tgt_real[:, :, None] & src_real[:, None, :],
          "encoder": src_real[:, :, None] & src_real[:, None, :],
          "decoder": tgt_real[:, :, None] & tgt_real[:, None, :] & causal}


@functools.partial(jax.jit, static_argnames="graphdef")
def _zero_counts(params, src, tgt_in, *, graphdef):
  """Per kind, `[layers]` counts of the allowed weights and of those exactly zero."""
  weights = nnx.merge(graphdef, params).attention_weights(src, tgt_in)
  allowed = _allowed(src, tgt_in)
  counts = {}
  for kind, w in weights.items():  # [layers, batch, heads, queries, keys]
    if kind not in allowed:  # What makes a kind's weights (`<kind>_<part>`), not weights.
      continue
    mask = jnp.broadcast_to(allowed[kind][None, :, None], w.shape)
    counts[kind] = (mask.sum((1, 2, 3, 4)), (mask & (w == 0)).sum((1, 2, 3, 4)))
  return counts


def zero_shares(translator: Translator, sources: list[str], references: list[str],
                batch: int = 64) -> dict[str, list[float]]:
  """The share of exactly-zero weights among those each attention layer may give, by kind
  (`cross`, and `encoder`/`decoder` where the family has self-attention), teacher-forced on
  `references`: what a sparse normalizer leaves out (softmax leaves none). Batches of
  `batch` sentences padded to the longest of the lot, one program."""
  encode = translator.tokenizer.encode
  pairs = [_inputs(np.asarray(encode(s), np.int32), np.asarray(encode(r) + [EOS_ID], np.int32))
           for s, r in zip(sources, references, strict=True)]
  lengths = [max(len(p[i]) for p in pairs) for i in (0, 1)]
  totals = {}
  for start in range(0, len(pairs), batch):
    # Filler rows are all PAD: nothing of them is counted.
    src, tgt_in = _stacked(pairs[start:start + batch], batch, lengths)
    counts = _zero_counts(translator.params, jnp.asarray(src), jnp.asarray(tgt_in),
                          graphdef=translator.graphdef)
    for kind, (allowed, zeros) in counts.items():
      before = totals.get(kind, (0, 0))
      totals[kind] = (before[0] + np.asarray(allowed, np.int64),
                      before[1] + np.asarray(zeros, np.int64))
  return {kind: [float(z / a) for a, z in zip(*totals[kind], strict=True)] for kind in totals}


def _weights(params, src, tgt_in, *, graphdef):
  """`[layers, heads, tgt_len, src_len]` attention of one sentence (`src`, `tgt_in`: [1, n])."""
  return nnx.merge(graphdef, params).attention_weights(src, tgt_in)["cross"][:, 0]


def _forced(params, src, tgt_in, out, *, graphdef):
  """Every attention of one sentence (`src`, `tgt_in`: [1, n]) by kind, `[layers, heads,
  queries, keys]` (`Seq2SeqModel.attention_weights`), and the log-probability of each subword
  of `out` (`[1, n]`, `tgt_in` shifted left) after the ones before it, as the searches
  compute it: `[tgt_len]`. The two calls are one pass in the program: XLA merges them (the
  test `test_the_forced_program_runs_the_model_once` measures it)."""
  model = nnx.merge(graphdef, params)
  log_probs = jax.nn.log_softmax(model.decode(model.encode(src), tgt_in)[0].astype(jnp.float32))
  return ({kind: weights[:, 0] for kind, weights in
           model.attention_weights(src, tgt_in).items()},
          jnp.take_along_axis(log_probs, out[0][:, None], axis=-1)[:, 0])


class Alignments:
  """`alignment`'s weights, and each output subword's log-probability, for any output of a
  translator's sources, compiled ahead: one program per source length of the grid (up to
  `longest` subwords, EOS included), whose target length is the longest output the search
  gives such a source (`max_output`). Padding is masked out of the source and comes after
  the target, so the results equal those of the sentence alone (to float rounding)."""

  def __init__(self, translator: Translator, longest: int):
    if isinstance(translator.graphdef, tuple):
      raise UserError("An ensemble has no one attention to show; serve its runs one by one.")
    self.translator, c = translator, translator.config
    self.lengths = batching.grid_lengths_up_to(longest, c.model.max_len)
    self._programs = compiling.Programs(
        "attention", jax.jit(functools.partial(_forced, graphdef=translator.graphdef)),
        lambda params, src, tgt_in, out: (src.shape, tgt_in.shape),
        options=compiling.compiler_options(c.compile.eval_options), threads=c.compile.threads)

  def _target_length(self, n: int) -> int:
    e, c = self.translator.config.eval, self.translator.config
    return search.max_decode_len(n, e.max_decode_len_a, e.max_decode_len_b, c.model.max_len)

  def compile_ahead(self, *, background: bool = False) -> int:
    """Compiles every program (with `background`, on the pool, returning at once); returns
    their count."""
    params = compiling.shapes(self.translator.params)
    for n in self.lengths:
      target = jax.ShapeDtypeStruct((1, self._target_length(n)), np.int32)
      self._programs.add(params, jax.ShapeDtypeStruct((1, n), np.int32), target, target,
                         background=background)
    if not background:
      self._programs.wait()
    return len(self._programs)

  def compiled(self) -> list[compiling.Compiled]:
    """Waits for every program added so far; what each took."""
    return self._programs.wait()

  def _length_for(self, src_len: int, out_len: int) -> int | None:
    """The grid length whose program holds a source of `src_len` and an output of `out_len`
    subwords (EOS included in both), or None."""
    return next((n for n in self.lengths if n >= src_len and self._target_length(n) >= out_len),
                None)

  def max_output(self, src: np.ndarray) -> int:
    """The longest output (EOS included) any program holds for source `src` (without EOS)."""
    src_len = min(len(src), self.translator.config.model.max_len - 1) + 1
    return max((self._target_length(n) for n in self.lengths if n >= src_len), default=0)

  def __call__(self, src: np.ndarray, out: np.ndarray) -> tuple[dict[str, np.ndarray],
                                                                 np.ndarray]:
    """Every attention of output `out` (ids through EOS, as `Hypothesis.ids`) for source `src`
    (ids without EOS, as `Translator.source_ids`), by kind: `cross` `[layers, heads, len(out),
    len(src) + 1]`, and where the model has them `encoder` (`[..., len(src) + 1, len(src) +
    1]`) and `decoder` (`[..., len(out), len(out)]`); and the `[len(out)]` log-probability of
    each subword of `out`. What makes a kind's weights, where the model gives it
    (`<kind>_<part>`: `Seq2SeqModel.attention_weights`), comes cut to the kind's queries and
    keys (a part of one key column keeps it)."""
    src_ids, tgt_in = _inputs(src[:self.translator.config.model.max_len - 1], out)
    n = self._length_for(len(src_ids), len(tgt_in))
    if n is None:
      raise ValueError(f"no attention program holds {len(src_ids)} source and {len(tgt_in)}"
                       f" target subwords (compiled: {self.lengths}).")
    padded_src = np.zeros((1, n), np.int32)
    padded_src[0, :len(src_ids)] = src_ids
    padded_tgt = np.zeros((1, self._target_length(n)), np.int32)
    padded_tgt[0, :len(tgt_in)] = tgt_in
    padded_out = np.zeros_like(padded_tgt)
    padded_out[0, :len(out)] = out
    weights, log_probs = jax.device_get(self._programs(
        self.translator.params, jnp.asarray(padded_src), jnp.asarray(padded_tgt),
        jnp.asarray(padded_out)))
    rows = {"cross": (len(tgt_in), len(src_ids)), "encoder": (len(src_ids), len(src_ids)),
            "decoder": (len(tgt_in), len(tgt_in))}
    found = {}
    for kind, w in weights.items():
      queries, keys = rows[kind.split("_")[0]]
      found[kind] = np.asarray(w)[:, :, :queries, :keys]
    return found, np.asarray(log_probs)[:len(out)]


@functools.partial(jax.jit, static_argnames=("graphdef", "layer"))
def _layer_attention(params, src, tgt_in, *, graphdef, layer):
  """`[batch, t, src_len]`: the cross-attention of layer `layer`, its heads averaged."""
  return nnx.merge(graphdef, params).attention_weights(src, tgt_in)["cross"][layer].mean(axis=1)


def cross_layers(translator: Translator) -> int:
  """How many layers of cross-attention the translator's model has (the RNN: one)."""
  if isinstance(translator.graphdef, tuple):
    raise UserError("An ensemble has no one attention to align words with; align with its runs"
                    " one by one.")
  ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  return jax.eval_shape(lambda p, s, t: nnx.merge(translator.graphdef, p).attention_weights(
      s, t)["cross"], translator.params, ids, ids).shape[0]


def alignment_layer(translator: Translator, layer: int) -> int:
  """The index of the layer `--alignment_layer=layer` names (`word_alignment.layer_index`);
  `UserError` for one the model lacks, or an ensemble."""
  try:
    return word_alignment.layer_index(layer, cross_layers(translator))
  except ValueError as e:
    raise UserError(str(e)) from None


def translations_with_links(translator: Translator, texts: list[str], *,
                            layer: int = -2) -> list[list[tuple[str, float, str]]]:
  """`Translator.translate`, each translation with its word links on its source as Pharaoh
  text (`word_alignment.pharaoh`; empty for an empty translation)."""
  nbests = translator.hypotheses(texts)
  flat = [(i, h) for i, nbest in enumerate(nbests) for h in nbest]
  links = word_alignments(translator, [translator.source_ids(texts[i]) for i, _ in flat],
                          [h.ids for _, h in flat], layer=layer, output_words=True)
  found = iter(links)
  return [[(h.text, h.score, word_alignment.pharaoh(next(found))) for h in nbest]
          for nbest in nbests]


def _pieces(translator: Translator, ids: np.ndarray) -> list[str]:
  """The pieces of output ids as the detokenizer reads them: PAD and BOS are nothing (empty),
  ids past the vocabulary unknown."""
  size = translator.tokenizer.vocab_size
  ids = np.where((ids < 0) | (ids >= size), UNK_ID, ids)
  return ["" if i in (PAD_ID, BOS_ID) else p
          for i, p in zip(ids.tolist(), translator.tokenizer.pieces(ids), strict=True)]


def word_alignments(translator: Translator, sources: list[np.ndarray], outputs: list[np.ndarray],
                    *, layer: int = -2, output_words: bool = False,
                    batch: int | None = None) -> list[list[word_alignment.Link]]:
  """The word links of each output on its source (`word_alignment.word_links`), from the
  attention of layer `layer` (heads averaged) on the output teacher-forced.

  Args:
    sources: per sentence, its source ids without EOS (cut to fit the model, as searched).
    outputs: per sentence, the output ids (`Hypothesis.ids`: through EOS where it has one).
    output_words: the outputs' words are those of their detokenized text (`<unk>` is a word:
      `word_alignment.word_indices`), not of a text they were encoded from.
    batch: sentences per program (default: the translator's batch size), padded to grid
      lengths.
  """
  layer = alignment_layer(translator, layer)
  c, results = translator.config.model, [[] for _ in sources]
  batch = batch or translator.batch_size
  pairs = {i: _inputs(src[:c.max_len - 1], out[:c.max_len]) for i, (src, out)
           in enumerate(zip(sources, outputs, strict=True)) if len(src) and len(out)}
  order = sorted(pairs, key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
  for start in range(0, len(order), batch):
    chunk = order[start:start + batch]
    lengths = [batching.grid_length(max(len(pairs[i][k]) for i in chunk), c.max_len)
               for k in (0, 1)]
    src, tgt_in = _stacked([pairs[i] for i in chunk], batch, lengths)
    src[len(chunk):, 0] = EOS_ID  # Filler rows: a source of EOS alone, never read.
    weights = np.asarray(_layer_attention(translator.params, jnp.asarray(src),
                                          jnp.asarray(tgt_in), graphdef=translator.graphdef,
                                          layer=layer))
    for row, i in enumerate(chunk):
      results[i] = _links(translator, pairs[i][0][:-1], outputs[i][:c.max_len], weights[row],
                          output_words)
  return results


def _links(translator: Translator, src: np.ndarray, out: np.ndarray, weights: np.ndarray,
           output_words: bool) -> list[word_alignment.Link]:
  """The word links of one sentence from its `[t, src_len]` weights (padded): `</s>` left out
  on both sides."""
  words = len(out) - int(out[-1] == EOS_ID)
  src_words = word_alignment.word_indices(translator.tokenizer.pieces(src))
  tgt_words = word_alignment.word_indices(_pieces(translator, out[:words]), output_words)
  return word_alignment.word_links(weights[:words, :len(src)], src_words, tgt_words)
