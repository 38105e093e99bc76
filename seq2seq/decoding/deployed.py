"""A run exported to CTranslate2 (`deploy.export`, the optional `[export]` extra), translating
text as `Translator` does (`CTranslate2Translator`): the same subwords (the run's
SentencePiece model travels with the model), sources cut to config.model.max_len with EOS, the
same decoding cap per sentence, and PAD and BOS never output. The search is CTranslate2's own:
greedy search picks what ours picks, beam search may not (docs/evaluation.md, "Deployment
through CTranslate2", says where they part).

This module imports neither JAX nor Flax, so that a process that only runs CTranslate2 (the
benchmark's workers, `performance.engine_worker`) starts no XLA threads. It imports
CTranslate2: commands import it only after `errors.require_extra`.
"""

import collections
import json
from collections.abc import Sequence
from pathlib import Path

import ctranslate2
import numpy as np

from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding import lengths

# Beside CTranslate2's files: what the model was converted from, and the decoding lengths of
# its run (`CTranslate2Translator` reads them).
SETTINGS = "seq2seq.json"
# The run's SentencePiece model in the directory, as `models.export` writes it (which imports
# JAX; tests/test_export.py checks the directory's files).
SENTENCEPIECE_FILE = "sentencepiece.model"


class CTranslate2Translator:
  """An exported model (`deploy.export`) in CTranslate2 on the CPU, translating text as
  `Translator` does.

  Args:
    model_dir: the directory `export` wrote.
    compute_type: CTranslate2's ("float32"; "int8" quantizes the weights as it loads them).
    intra_threads: threads per translation (0: CTranslate2's default).
  """

  def __init__(self, model_dir: str | Path, *, compute_type: str = "float32",
               intra_threads: int = 0):
    model_dir = Path(model_dir)
    self.settings = json.loads((model_dir / SETTINGS).read_text(encoding="utf-8"))
    self.tokenizer = Tokenizer.load(model_dir / SENTENCEPIECE_FILE)
    self.translator = ctranslate2.Translator(str(model_dir), device="cpu",
                                             compute_type=compute_type,
                                             intra_threads=intra_threads)
    pieces = self.tokenizer.pieces(np.arange(self.tokenizer.vocab_size))
    self._ids = {piece: i for i, piece in enumerate(pieces)}
    # Our searches never output PAD or BOS; CTranslate2 would (rarely, once trained).
    self.never = [[pieces[PAD_ID]], [pieces[BOS_ID]]]

  def pieces(self, text: str) -> list[str]:
    """The subwords of `text` (CTranslate2 adds EOS and cuts to config.model.max_len)."""
    return self.tokenizer.pieces(self.tokenizer.encode(text))

  def max_length(self, pieces: Sequence[str]) -> int:
    """The most tokens (EOS included) `Translator` outputs for a source of `pieces`: a function
    of its length with EOS, padded to the evaluation grid (`Translator.search_ids`)."""
    s = self.settings
    return lengths.source_cap(min(len(pieces), s["max_len"] - 1) + 1, s["max_decode_len_a"],
                              s["max_decode_len_b"], s["max_len"])

  def translate(self, texts: Sequence[str], *, beam_size: int = 4, length_penalty: float = 0.0,
                batch_size: int = 64, by_cap: bool = True) -> list[tuple[str, float]]:
    """Per text, its translation and CTranslate2's score (`length_penalty`: its exponent of
    the length, not our GNMT alpha; 0: the log-probability, renormalized without PAD and BOS).
    Empty texts translate to "" unread, as `Translator` does.

    `by_cap`: sentences of one decoding cap are translated together, `batch_size` at a time,
    each to the cap ours gives it. Otherwise as CTranslate2's users run it: all in one
    `translate_batch` call, which sorts them by length into batches of `batch_size`, under one
    cap for all, the largest of theirs (`one_cap`): a sentence that reaches its own cap
    unfinished may then go on where ours stops."""
    sources = [self.pieces(text) if text.strip() else [] for text in texts]
    todo = [i for i, source in enumerate(sources) if source]
    if by_cap:
      groups = collections.defaultdict(list)
      for i in todo:
        groups[self.max_length(sources[i])].append(i)
      calls = [(cap, indices[start:start + batch_size], {}) for cap, indices in groups.items()
               for start in range(0, len(indices), batch_size)]
    else:
      cap = max((self.max_length(sources[i]) for i in todo), default=1)  # `one_cap`
      calls = [(cap, todo, {"max_batch_size": batch_size, "batch_type": "examples"})] * bool(todo)
    results = [("", 0.0)] * len(texts)
    for cap, chunk, options in calls:
      found = self.translator.translate_batch(
          [sources[i] for i in chunk], beam_size=beam_size, length_penalty=length_penalty,
          min_decoding_length=0, max_decoding_length=cap,
          max_input_length=self.settings["max_len"], suppress_sequences=self.never,
          return_scores=True, **options)
      for i, result in zip(chunk, found, strict=True):
        ids = [self._ids[piece] for piece in result.hypotheses[0]]
        results[i] = (self.tokenizer.decode(ids), result.scores[0])
    return results

  def one_cap(self, texts: Sequence[str]) -> int:
    """The decoding cap of `translate(texts, by_cap=False)`: the largest that ours gives any
    of `texts` (1 if all are empty)."""
    return max((self.max_length(self.pieces(text)) for text in texts if text.strip()),
               default=1)

  def log_probs(self, texts: Sequence[str], outputs: Sequence[Sequence[int]]) -> list[float]:
    """Per text, the log-probability CTranslate2's model gives output ids `outputs` (through
    EOS where they reach it, as `Hypothesis.ids`): the sum over its subwords, each after the
    ones before it, as our searches score them."""
    targets = [self.tokenizer.pieces([i for i in out if i != EOS_ID]) for out in outputs]
    # Sources cut as `translate` cuts them; the targets whole (CTranslate2 would cut an output
    # of config.model.max_len subwords: its limit counts BOS and EOS).
    sources = [self.pieces(text)[:self.settings["max_len"] - 1] for text in texts]
    scored = self.translator.score_batch(sources, targets, max_input_length=0)
    # score_batch scores the target with EOS after it: an output cut before EOS lacks it.
    return [float(sum(result.log_probs[:None if len(out) and out[-1] == EOS_ID else -1]))
            for result, out in zip(scored, outputs, strict=True)]
