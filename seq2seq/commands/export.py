r"""Converts a run's checkpoint into a model for another inference engine, or releases it.

  seq2seq-export --workdir=runs/m30k_transformer --output=m30k_ct2 [--checkpoint=avg:5]
  seq2seq-export --format=seq2seq --workdir=runs/m30k_transformer --checkpoint=selected \
      --output=models/m30k_transformer

--format=seq2seq writes a released model: the run's config, vocabulary, evaluation scores and
the parameters `--checkpoint` names, without the optimizer state (a third of one of the run's
checkpoints). Every command that reads a run reads it (seq2seq-translate, seq2seq-evaluate,
--ensemble members, seq2seq-serve, config.train.init_from) and decodes what the run decodes;
its --checkpoint=selected (and best, latest) is those parameters.

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
from seq2seq.errors import require_extra
from seq2seq.runs import released

_FORMAT = flags.DEFINE_enum("format", "ctranslate2", ["ctranslate2", "seq2seq"], "The engine to"
                            " convert for: CTranslate2 (OpenNMT's C++ inference engine), or"
                            " seq2seq (a released model: the parameters alone).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of a training run.", required=True)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "best", "best, latest, a step, avg:N (the average of the last N), or"
    " selected (chosen on validation by seq2seq-evaluate --checkpoint=best,avg:N --split=val).")
_OUTPUT = flags.DEFINE_string("output", None, "The model directory to write; it must not"
                              " exist.", required=True)


def main(argv):
  del argv

  def convert():
    if _FORMAT.value == "seq2seq":
      print(f"wrote {released.release(_WORKDIR.value, _CHECKPOINT.value, _OUTPUT.value)}")
      return
    require_extra("export", "seq2seq-export", ("ctranslate2",))
    from seq2seq.decoding import deploy  # Imports CTranslate2: after the check.

    print(f"wrote {deploy.export(_WORKDIR.value, _CHECKPOINT.value, _OUTPUT.value)}")

  run_main(convert)
