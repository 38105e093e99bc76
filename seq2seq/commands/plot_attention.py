r"""Draws the attention of a run's model translating one sentence.

  seq2seq-plot-attention --workdir=runs/m30k_transformer \
      --text="A little girl climbs into a wooden playhouse." [--out=attention.png]

The RNN's alignment, or the Transformer's cross-attention per layer and head,
with subword labels on the axes. A run trained without attention (the RNN's
`none`) is refused in one line: it has no attention to draw. For a released model
(models/), the default picture goes beside it, to runs/released/<its path>/attention.png
under the working directory: a released model stays as released.
"""

from absl import flags

from seq2seq.commands.cli import define_run_flags, run_main
from seq2seq.decoding.translator import Translator
from seq2seq.evaluation.plots import image_path, plot_alignment
from seq2seq.runs import released

_RUN = define_run_flags()
_TEXT = flags.DEFINE_string("text", None, "The source sentence.", required=True)
_OUT = flags.DEFINE_string("out", "", "Picture to write, PNG unless the suffix names another"
                           " format (default: <workdir>/attention.png; a released model's:"
                           " runs/released/<its path>/attention.png).")


def main(argv):
  del argv

  def plot():
    workdir = _RUN["workdir"].value
    out = image_path(_OUT.value or released.outputs(workdir) / "attention.png",
                     "--out")  # Before any work.
    translator = Translator(workdir, _RUN["checkpoint"].value,
                            beam_size=_RUN["beam_size"].value, alpha=_RUN["alpha"].value)
    print(f"wrote {plot_alignment(translator, _TEXT.value, out)}")

  run_main(plot)
