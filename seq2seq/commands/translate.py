"""Translates text with a run's checkpoint: one output line per input line.

  echo "A dog runs on the beach." | seq2seq-translate --workdir=runs/m30k_transformer
  seq2seq-translate --workdir=DIR --input=in.en --output=out.de [--beam_size=4]

Empty input lines give empty output lines. Typed at a terminal, each line is
translated as soon as it is entered. With --nbest=N > 1 the output is in
Moses n-best format, `index ||| translation ||| score`, N lines per input line.
--sample [--temperature=T --top_k=K --seed=S] samples instead of searching.
With --alignment, each translation is followed by a tab and its word links on its
source in the Pharaoh format, `i-j` (0-based source word i, target word j,
space separated; words are split at spaces), from the attention of the model
on its own translation: the line is `translation<TAB>links` (an empty input
line gives a lone tab), and an n-best line ends ` ||| links`.
--alignment_layer=L picks the Transformer's layer (default -2, the penultimate).
--ensemble=DIR[,DIR...] decodes with other runs of the same vocabulary as one
model, and --checkpoint=ensemble:N with the run's last N checkpoints.
A released model (seq2seq-export --format=seq2seq, as models/ holds) decodes as its run
does and is only read: nothing is written but the output, here or on a read-only disk.
"""

import sys

from absl import flags

from seq2seq.commands import cli
from seq2seq.commands.cli import define_run_flags, run_main, selected_search
from seq2seq.data.textio import as_lines, check_output, read_lines, write_lines
from seq2seq.decoding import alignment
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.runtime import signals

_RUN = define_run_flags(ensemble=True)
_NBEST = flags.DEFINE_integer("nbest", 1, "Translations per input line (<= beam_size).")
_SAMPLE = flags.DEFINE_bool("sample", False, "Sample translations instead of searching.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling: softmax temperature.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sampling: only the k likeliest tokens (0: all).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling: random seed.")
_INPUT = flags.DEFINE_string("input", "-", "Input file ('-': standard input).")
_OUTPUT = flags.DEFINE_string("output", "-", "Output file ('-': standard output).")
_ALIGNMENT = flags.DEFINE_bool("alignment", False, "Add each translation's source-target word"
                               " links (Pharaoh i-j) after a tab.")
_MATMUL = cli.define_matmul_flag()
_LAYER = flags.DEFINE_integer("alignment_layer", -2, "The cross-attention layer (heads averaged)"
                              " that --alignment reads; -2: the penultimate (1 layer: that one).")


def _output_lines(translated: list, first_index: int = 0) -> list[str]:
  """The output lines of translated inputs: the best translation, or the n-best list; each
  with its word links after a tab (n-best: a field) where --alignment asks for them."""
  if _NBEST.value == 1:
    return ["\t".join(nbest[0][:1] + nbest[0][2:]) for nbest in translated]
  return [" ||| ".join([str(index), text, f"{score:.4f}", *links])
          for index, nbest in enumerate(translated, start=first_index)
          for text, score, *links in nbest]


def _translate(translator: Translator, lines: list[str]) -> list:
  """Per line, its n-best (text, score), with the links of each where --alignment asks."""
  if _ALIGNMENT.value:
    return alignment.translations_with_links(translator, lines, layer=_LAYER.value)
  return translator.translate(lines)


def _check_flags() -> None:
  """Refuses the sampling flags without --sample, --alignment_layer without --alignment, and
  --alignment with an ensemble."""
  given = [f"--{name}" for name in ("temperature", "top_k", "seed") if flags.FLAGS[name].present]
  if given and not _SAMPLE.value:
    raise UserError(f"{', '.join(given)} applies to sampling only; add --sample, or drop"
                    f" {given[0]}.")
  if _LAYER.present and not _ALIGNMENT.value:
    raise UserError("--alignment_layer applies to --alignment only; add --alignment, or drop"
                    " --alignment_layer.")
  if _ALIGNMENT.value and (_RUN["ensemble"].value
                           or _RUN["checkpoint"].value.startswith("ensemble:")):
    raise UserError("--alignment reads one model's attention, not an ensemble's; drop one of"
                    " them.")


def _answer_each_line(translator: Translator, printed: list[int]) -> None:
  """Answers each line typed at the terminal as it comes, until Ctrl-D; `printed` gets the
  index of each line printed."""
  print("Type a sentence and Enter; Ctrl-D ends.", file=sys.stderr, flush=True)
  for index, line in enumerate(sys.stdin):
    out = _output_lines(_translate(translator, [line.rstrip("\r\n")]), index)
    # A signal as the line is printed waits for its count: the reader may have seen the line
    # and pressed Ctrl-C before `flush` returned here.
    with signals.defer_interrupts():
      sys.stdout.write(as_lines(out))
      sys.stdout.flush()
      printed.append(index)
    signals.raise_if_interrupted()


def main(argv):
  del argv

  printed = []  # Interactive: the lines answered so far.

  def translate():
    _check_flags()
    if _OUTPUT.value != "-":
      check_output(_OUTPUT.value, "--output",
                   inputs={"--input": _INPUT.value} if _INPUT.value != "-" else {})
    # Typed at a terminal, each line is answered as it comes; otherwise all at once.
    interactive = _INPUT.value == "-" and _OUTPUT.value == "-" and sys.stdin.isatty()
    lines = [] if interactive else read_lines(_INPUT.value if _INPUT.value != "-"
                                              else "/dev/stdin", "--input")
    beam_size, alpha = selected_search(_RUN, _RUN["beam_size"].value, _RUN["alpha"].value)
    translator = Translator(_RUN["workdir"].value, _RUN["checkpoint"].value,
                            beam_size=beam_size, alpha=alpha,
                            nbest=_NBEST.value,
                            sample_seed=_SEED.value if _SAMPLE.value else None,
                            temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                            ensemble=_RUN["ensemble"].value, matmul_dtype=_MATMUL.value)
    if _ALIGNMENT.value:
      alignment.alignment_layer(translator, _LAYER.value)  # A wrong layer fails at once.
    if interactive:
      _answer_each_line(translator, printed)
      return
    out = _output_lines(_translate(translator, lines))
    if _OUTPUT.value == "-":
      sys.stdout.write(as_lines(out))
    else:
      write_lines(_OUTPUT.value, out)

  def kept() -> str:
    if not printed:
      return "no output was written"
    n = len(printed)
    return (f"{n} translation{' was' if n == 1 else 's were'} printed, the line in progress"
            " was not")

  run_main(translate, interrupted=kept)
