"""A run deployed through CTranslate2 (the optional `[export]` extra): `export` writes a
checkpoint as a CTranslate2 model directory, and `CTranslate2Translator` translates with one
as `Translator` would: the same subwords (the run's SentencePiece model travels with the
model), sources cut to config.model.max_len with EOS, the same decoding cap per sentence, and
PAD and BOS never output. The search is CTranslate2's own: greedy search picks what ours picks,
beam search may not (docs/evaluation.md, "Deployment through CTranslate2", says where they part).

Imports CTranslate2: commands import this module only after `errors.require_extra`.
"""

import collections
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import ctranslate2
import numpy as np
from flax import nnx

from seq2seq.data import batching
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding import search
from seq2seq.decoding.translator import Translator, check_is_run
from seq2seq.decoding.word_alignment import layer_index
from seq2seq.errors import UserError
from seq2seq.models import export as conversion
from seq2seq.runs import workdirs

# Beside CTranslate2's files: what the model was converted from, and the decoding lengths of
# its run (`CTranslate2Translator` reads them).
SETTINGS = "seq2seq.json"


def check_exportable(workdir: str | Path, checkpoint: str) -> None:
  """Raises `UserError` unless `checkpoint` of the run `workdir` converts: one model (not an
  ensemble) of a configuration CTranslate2 computes (`models.export.ctranslate2_problem`)."""
  check_is_run(Path(workdir))
  problem = conversion.ctranslate2_problem(workdirs.read_run_config(Path(workdir)).model)
  if problem:
    raise UserError(f"{workdir} does not convert to CTranslate2: {problem}")
  if checkpoint.startswith("ensemble:"):
    raise UserError(f"--checkpoint={checkpoint} is an ensemble; CTranslate2 runs one model:"
                    " export one checkpoint, or --checkpoint=avg:N (their average).")


def export(workdir: str | Path, checkpoint: str, output: str | Path,
           alignment_layer: int = -2) -> Path:
  """Writes `checkpoint` of the run `workdir` (best, latest, a step, avg:N, selected) as a
  CTranslate2 model directory `output`, which must not exist; returns it. The directory appears
  whole or not at all: it is written under another name, then renamed. CTranslate2's
  `return_attention` gives the cross-attention that `--alignment` reads at `alignment_layer`
  (its default, the penultimate decoder layer), all heads averaged."""
  check_exportable(workdir, checkpoint)
  output = Path(output)
  if output.exists():
    raise UserError(f"--output={output} exists; pass a new directory, or remove it first.")
  translator = Translator(workdir, checkpoint, beam_size=1)
  model = nnx.merge(translator.graphdef, translator.params)
  pieces = translator.tokenizer.pieces(np.arange(translator.tokenizer.vocab_size))
  c = translator.config
  layer = layer_index(alignment_layer, c.model.num_decoder_layers)
  converter = conversion.TransformerConverter(model, c.model, pieces,
                                              str(Path(workdir) / workdirs.VOCAB), layer)
  partial = workdirs.partial_folder(output)
  try:
    converter.convert(str(partial), force=True)
    settings = {"workdir": str(workdir), "checkpoint": checkpoint, "steps": translator.steps,
                "max_len": c.model.max_len, "max_decode_len_a": c.eval.max_decode_len_a,
                "max_decode_len_b": c.eval.max_decode_len_b, "alignment_layer": layer}
    (partial / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, output)
  except OSError as e:  # A full disk names the folder asked for, not its hidden partial one.
    raise OSError(e.errno, e.strerror, str(output)) from e
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  return output


class CTranslate2Translator:
  """An exported model (`export`) in CTranslate2 on the CPU, translating text as `Translator`
  does.

  Args:
    model_dir: the directory `export` wrote.
    compute_type: CTranslate2's ("float32"; "int8" quantizes the weights as it loads them).
    intra_threads: threads per translation (0: CTranslate2's default).
  """

  def __init__(self, model_dir: str | Path, *, compute_type: str = "float32",
               intra_threads: int = 0):
    model_dir = Path(model_dir)
    self.settings = json.loads((model_dir / SETTINGS).read_text(encoding="utf-8"))
    self.tokenizer = Tokenizer.load(model_dir / conversion.SENTENCEPIECE_FILE)
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
    length = batching.grid_length(min(len(pieces), s["max_len"] - 1) + 1, s["max_len"])
    return search.max_decode_len(length, s["max_decode_len_a"], s["max_decode_len_b"],
                                 s["max_len"])

  def translate(self, texts: Sequence[str], *, beam_size: int = 4, length_penalty: float = 0.0,
                batch_size: int = 64) -> list[tuple[str, float]]:
    """Per text, its translation and CTranslate2's score (`length_penalty`: its exponent of
    the length, not our GNMT alpha; 0: the log-probability, renormalized without PAD and BOS).
    Empty texts translate to "" unread, as `Translator` does. Sentences of one decoding cap
    are translated together, `batch_size` at a time."""
    sources = [self.pieces(text) if text.strip() else [] for text in texts]
    groups = collections.defaultdict(list)
    for i, source in enumerate(sources):
      if source:
        groups[self.max_length(source)].append(i)
    results, max_len = [("", 0.0)] * len(texts), self.settings["max_len"]
    for cap, indices in groups.items():
      for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        found = self.translator.translate_batch(
            [sources[i] for i in chunk], beam_size=beam_size, length_penalty=length_penalty,
            min_decoding_length=0, max_decoding_length=cap, max_input_length=max_len,
            suppress_sequences=self.never, return_scores=True)
        for i, result in zip(chunk, found, strict=True):
          ids = [self._ids[piece] for piece in result.hypotheses[0]]
          results[i] = (self.tokenizer.decode(ids), result.scores[0])
    return results

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
