r"""Converts a run's checkpoint into a model for another inference engine, releases it, or
writes the run's record.

  seq2seq-export --workdir=runs/m30k_transformer --output=m30k_ct2 [--checkpoint=avg:5]
  seq2seq-export --format=seq2seq --workdir=runs/m30k_transformer --checkpoint=selected \
      --output=models/m30k_transformer
  seq2seq-export --format=record --workdir=runs/m30k_transformer --output=docs/study/m30k

--format=seq2seq writes a released model: the run's config, vocabulary, evaluation scores and
the parameters `--checkpoint` names, without the optimizer state (a third of one of the run's
checkpoints). Every command that reads a run reads it (seq2seq-translate, seq2seq-evaluate,
--ensemble members, seq2seq-serve, config.train.init_from) and decodes what the run decodes;
its --checkpoint=selected (and best, latest) is those parameters.

--format=record writes the run's record, what of it is kept once its checkpoints are not:
config.json, metrics.jsonl (and parent.json), eval/selected.json (the checkpoint
seq2seq-evaluate --split=val chose, and at which beam size and alpha), every candidate's
eval/val.<checkpoint>.beam<k>.json at that search, the chosen one's .hyp, and the choice
scored with --checkpoint=selected on test (and on val, where it was):
eval/test.selected.beam<k>.hyp and .json (.alpha<a> after beam<k> for an alpha other than
0.6). A run without that choice or its test scores is refused, naming the seq2seq-evaluate
command that makes them; --checkpoint is not read. seq2seq-compare --checkpoint=selected
compares a record as it compares the run, from these files (docs/recipe_study/ holds records).

--format=ctranslate2 writes a CTranslate2 model directory: model.bin,
config.json, shared_vocabulary.json (the SentencePiece pieces, in our id order), the run's
SentencePiece model as sentencepiece.model, and seq2seq.json (what it came from, and the
run's decoding lengths). Transformer runs convert; a configuration CTranslate2 does not
compute (the RNN, linear or windowed attention, a sparse normalizer, ALiBi) is refused in
one line that says why. Needs the [export] extra: pip install -e ".[export]".
docs/evaluation.md, "Deployment through CTranslate2", shows how to translate with it.
"""

from absl import flags

from seq2seq.commands.cli import run_main
from seq2seq.errors import UserError, require_extra
from seq2seq.runs import released

_FORMAT = flags.DEFINE_enum("format", "ctranslate2", ["ctranslate2", "seq2seq", "record"],
                            "The engine to convert for: CTranslate2 (OpenNMT's C++ inference"
                            " engine), seq2seq (a released model: the parameters alone), or"
                            " record (the run's config, metrics and chosen evaluations, no"
                            " parameters).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of a training run.", required=True)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "best", "best, latest, a step, avg:N (the average of the last N), or"
    " selected (chosen on validation by seq2seq-evaluate --checkpoint=best,avg:N --split=val).")
_OUTPUT = flags.DEFINE_string("output", None, "The model directory to write; it must not"
                              " exist.", required=True)


def main(argv):
  del argv

  def convert():
    if _FORMAT.value == "record":
      from seq2seq.evaluation.record import write_record

      if _CHECKPOINT.present:  # The record's checkpoint is the one chosen on validation.
        raise UserError("--checkpoint does not apply to --format=record, which holds the"
                        " checkpoint chosen on validation (eval/selected.json); drop it.")
      print(f"wrote {write_record(_WORKDIR.value, _OUTPUT.value)}")
      return
    if _FORMAT.value == "seq2seq":
      print(f"wrote {released.release(_WORKDIR.value, _CHECKPOINT.value, _OUTPUT.value)}")
      return
    require_extra("export", "seq2seq-export", ("ctranslate2",))
    from seq2seq.decoding import deploy  # Imports CTranslate2: after the check.

    print(f"wrote {deploy.export(_WORKDIR.value, _CHECKPOINT.value, _OUTPUT.value)}")

  run_main(convert)
