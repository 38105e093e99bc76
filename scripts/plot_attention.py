"""Draws the attention of a run's model translating one sentence.

  python scripts/plot_attention.py --workdir=runs/m30k_transformer \
      --text="A little girl climbs into a wooden playhouse." [--out=attention.png]

The RNN's alignment, or the Transformer's cross-attention per layer and head,
with subword labels on the axes.
"""

from absl import app, flags

from seq2seq.cli import run_main
from seq2seq.evaluate import Translator, alignment
from seq2seq.plots import attention_heatmaps

_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of a training run.")
_TEXT = flags.DEFINE_string("text", None, "The source sentence.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "best, latest, a step, or avg:N.")
_BEAM = flags.DEFINE_integer("beam_size", 4, "Beam size of the translation.")
_OUT = flags.DEFINE_string("out", "", "PNG to write (default: <workdir>/attention.png).")
flags.mark_flags_as_required(["workdir", "text"])


def main(argv):
  del argv

  def plot():
    translator = Translator(_WORKDIR.value, _CHECKPOINT.value, beam_size=_BEAM.value)
    weights, src, tgt = alignment(translator, _TEXT.value)
    path = attention_heatmaps(weights, src, tgt, _OUT.value or f"{_WORKDIR.value}/attention.png",
                              title=f"{translator.config.model.family},"
                              f" {translator.config.model.attention} attention")
    print(f"wrote {path}")

  run_main(plot)


if __name__ == "__main__":
  app.run(main)
