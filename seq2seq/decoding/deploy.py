"""A run deployed through CTranslate2 (the optional `[export]` extra): `export` writes a
checkpoint as a CTranslate2 model directory, and `CTranslate2Translator` (of `deployed`, which
imports no JAX; here too) translates with one as `Translator` would.

Imports CTranslate2: commands import this module only after `errors.require_extra`.
"""

import json
from pathlib import Path

import numpy as np
from flax import nnx

from seq2seq.decoding.deployed import SETTINGS, CTranslate2Translator  # noqa: F401 (re-export)
from seq2seq.decoding.translator import Translator, check_is_run
from seq2seq.decoding.word_alignment import layer_index
from seq2seq.errors import UserError
from seq2seq.models import export as conversion
from seq2seq.runs import workdirs


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
  with workdirs.written_whole(output) as partial:
    converter.convert(str(partial), force=True)
    settings = {"workdir": str(workdir), "checkpoint": checkpoint, "steps": translator.steps,
                "max_len": c.model.max_len, "max_decode_len_a": c.eval.max_decode_len_a,
                "max_decode_len_b": c.eval.max_decode_len_b, "alignment_layer": layer}
    (partial / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
  return output
