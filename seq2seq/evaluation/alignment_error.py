"""The alignment error rate of a run (`seq2seq-evaluate --gold_alignment`): the word links of
its attention on the reference, teacher-forced, against a gold alignment of the test set
(`seq2seq.decoding.word_alignment` has the links, the gold format and the formula)."""

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from seq2seq.data.special_ids import EOS_ID
from seq2seq.data.textio import read_lines
from seq2seq.decoding import alignment, word_alignment
from seq2seq.errors import UserError

Links = set[word_alignment.Link]


class Gold(NamedTuple):
  """A gold alignment file as `read_gold` checked and parsed it, once: the sure and the
  possible links of each sentence, for every run that a comparison scores against it."""
  path: str
  sure: list[Links]
  possible: list[Links]


def read_gold(path: str | Path, sources: Sequence[str], references: Sequence[str],
              one_based: bool = False) -> Gold:
  """The sure and the possible links of each sentence of the gold file `path`, one line per
  sentence of the test set; `UserError` for another line count, an item that is no link, or
  a link outside its sentence's words (the whitespace-separated words of its source line and
  reference line)."""
  lines = read_lines(path, "--gold_alignment")
  if len(lines) != len(sources):
    raise UserError(f"--gold_alignment={path} has {len(lines)} line{'s' * (len(lines) != 1)} but"
                    f" the test set has"
                    f" {len(sources)} sentences; pass the gold alignment of this test set, one"
                    " line per sentence (empty for none).")
  sure, possible = [], []
  for number, (line, src, ref) in enumerate(zip(lines, sources, references, strict=True), 1):
    try:
      s, p = word_alignment.parse_gold(line, one_based)
    except ValueError as e:
      raise UserError(f"--gold_alignment={path} line {number}: {e}.") from None
    words = len(src.split()), len(ref.split())
    bad = word_alignment.out_of_range(s | p, *words)
    if bad is not None:
      shown = tuple(i + one_based for i in bad)
      raise UserError(f"--gold_alignment={path} line {number}: the link {shown[0]}-{shown[1]}"
                      f" is outside the sentence's {words[0]} source and {words[1]} target"
                      f" words (counted from {int(one_based)}); align the test set's own text,"
                      " tokenized as the gold set is.")
    sure.append(s)
    possible.append(p)
  return Gold(str(path), sure, possible)


def alignment_scores(translator, sources: Sequence[str], references: Sequence[str], gold: Gold,
                     *, layer: int = -2) -> dict:
  """The AER of `translator`'s attention (layer `layer`, heads averaged) on each reference,
  teacher-forced, against `gold`, the alignment `read_gold` read of these sentences (read
  before: a wrong file fails before anything decodes, and a comparison reads it once for all
  its runs), with its precision and recall.

  Returns:
    {"aer", "alignment_precision", "alignment_recall", "alignment_links", "alignment_layer"
    (0-based), "gold_alignment"}.
  """
  layer_index = alignment.alignment_layer(translator, layer)
  encode = translator.tokenizer.encode
  links = alignment.word_alignments(
      translator, [translator.source_ids(s) for s in sources],
      [np.asarray(encode(r) + [EOS_ID], np.int32) for r in references], layer=layer)
  try:
    scores = word_alignment.aer([set(x) for x in links], gold.sure, gold.possible)
  except ValueError as e:
    raise UserError(f"--gold_alignment={gold.path}: {e}; pass a test set with words.") from None
  return {"aer": scores["aer"], "alignment_precision": scores["precision"],
          "alignment_recall": scores["recall"], "alignment_links": scores["links"],
          "alignment_layer": layer_index, "gold_alignment": gold.path}
