"""The attention of a translation: for each output subword, its weights over the source
subwords (the Transformer's cross-attention per layer and head, the RNN's alignment), and
for the server the Transformer's self-attention of both sides too.

`alignment` computes it op by op for one sentence, for pictures. `Alignments` compiles it
ahead per source length of the grid, as the searches are, for a server that must never
compile while it answers, together with the log-probability of each output subword: the
score of any given translation (forced decoding), the search's own or a reference.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seq2seq.data import batching
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decoding import search
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.runtime import compiling


def _inputs(src: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The model's inputs for the attention of output `out` (ids through EOS) on source `src`
  (ids without EOS): the source with EOS, and the teacher-forced target (BOS, then `out`
  but its last)."""
  return (np.concatenate([src, [EOS_ID]]).astype(np.int32),
          np.concatenate([[BOS_ID], out[:-1]]).astype(np.int32))


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
  return (np.asarray(weights), translator.tokenizer.pieces(src_ids),
          translator.tokenizer.pieces(out))


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
    chunk = pairs[start:start + batch] + [pairs[0]] * (batch - len(pairs[start:start + batch]))
    real = min(batch, len(pairs) - start)
    src, tgt_in = (np.stack([np.pad(p[i], (0, lengths[i] - len(p[i]))) for p in chunk])
                   for i in (0, 1))
    src[real:], tgt_in[real:] = PAD_ID, PAD_ID  # Filler rows: nothing counted.
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

  def compile_ahead(self) -> int:
    """Compiles every program; returns their count."""
    params = compiling.shapes(self.translator.params)
    for n in self.lengths:
      target = jax.ShapeDtypeStruct((1, self._target_length(n)), np.int32)
      self._programs.add(params, jax.ShapeDtypeStruct((1, n), np.int32), target, target)
    self._programs.wait()
    return len(self._programs)

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
    each subword of `out`."""
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
    return ({kind: np.asarray(w)[:, :, :rows[kind][0], :rows[kind][1]]
             for kind, w in weights.items()}, np.asarray(log_probs)[:len(out)])
