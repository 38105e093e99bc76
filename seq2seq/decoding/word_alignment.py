"""Word alignments from attention, and their score against a gold alignment.

Pure functions on arrays and strings, shared by `seq2seq-translate --alignment` (links beside
each translation), `seq2seq-evaluate --gold_alignment` (the alignment error rate of a run) and
whatever compares runs by it.

Links are in the Pharaoh format: `i-j`, 0-based source word i and target word j, space
separated. Words are the whitespace-separated words of the text; a SentencePiece piece starting
with '▁' begins one (`word_indices`). Subword attention becomes word links as Garg et al. (2019)
and fairseq's `--print-alignment` do it: each target subword links to the source subword it
attends to most (`</s>` left out on both sides), and a source word and a target word are linked
where any of their subwords are (`word_links`). Both families go this way: the RNN's one
attention (Luong et al., 2015, take its argmax per target word), and for the Transformer one
chosen layer's heads averaged (`layer_index`: the penultimate by default, which Garg et al.
found best).

The alignment error rate (Och & Ney, 2003) of links A against sure links S and possible links
P (S ⊆ P): AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|), counted over the whole test set (`aer`).
"""

from collections.abc import Sequence

import numpy as np

WORD_START = "▁"  # SentencePiece's mark of a space: a piece starting with it begins a word.
UNKNOWN_PIECE = "<unk>"

Link = tuple[int, int]  # (source word, target word), 0-based.


def word_indices(pieces: Sequence[str], unknown_is_word: bool = False) -> list[int | None]:
  """The 0-based word of each SentencePiece piece (without BOS/EOS): a piece starting with '▁'
  begins a word, the others continue the one before. A piece that is only '▁' belongs to the
  word that follows it (None if none does).

  `unknown_is_word`: an unknown piece (`<unk>`) is a word of its own, and the piece after it
  begins another, as in detokenized output, where it reads ' ⁇ ' between spaces; in the text
  a source was encoded from, it is part of the word it stands in.
  """
  words, index, begins = [], -1, True
  for piece in pieces:
    if unknown_is_word and piece == UNKNOWN_PIECE:
      index, begins = index + 1, True
      words.append(index)
      continue
    begins = begins or piece.startswith(WORD_START)
    if not piece.lstrip(WORD_START):
      words.append(index + 1)  # Whitespace alone: the next word's, if one comes.
      continue
    if begins:
      index, begins = index + 1, False
    words.append(index)
  return [w if w <= index else None for w in words]


def layer_index(layer: int, layers: int) -> int:
  """The layer `layer` names (Python indexing) among `layers`; -2, the penultimate layer (the
  default), is the only one of a 1-layer model. ValueError for a layer the model lacks."""
  if layers == 1 and layer == -2:
    return 0
  if not -layers <= layer < layers:
    raise ValueError(f"--alignment_layer={layer} is not a layer of this model, which has"
                     f" {layers} cross-attention layer{'s' if layers > 1 else ''}; pass one from"
                     f" {-layers} to {layers - 1} (-2: the penultimate).")
  return layer % layers


def subword_links(weights: np.ndarray) -> np.ndarray:
  """For `[target, source]` attention weights, the source subword each target subword attends
  to most: `[target]` indices (the first of equal weights)."""
  return np.asarray(weights).argmax(axis=-1)


def word_links(weights: np.ndarray, src_words: Sequence[int | None],
               tgt_words: Sequence[int | None]) -> list[Link]:
  """The word links of one sentence, sorted.

  Args:
    weights: `[target subwords, source subwords]` attention (one layer, heads averaged), the
      target's rows for its subwords without `</s>` and the source's columns without `</s>`
      (the caller drops both: they are no word and never linked).
    src_words, tgt_words: the word of each source and target subword (`word_indices`).

  A target subword whose weights are all zero (a model without attention) links nowhere.
  """
  weights = np.asarray(weights)
  assert weights.shape == (len(tgt_words), len(src_words)), (weights.shape, len(tgt_words),
                                                              len(src_words))
  if not weights.size:
    return []
  attends = weights.max(axis=-1) > 0  # A row of zeros (no attention, as the RNN's `none`): no link.
  links = {(src_words[s], tgt_words[t]) for t, s in enumerate(subword_links(weights))
           if attends[t]}
  return sorted((i, j) for i, j in links if i is not None and j is not None)


def pharaoh(links: Sequence[Link]) -> str:
  """Links as Pharaoh text: `i-j` pairs, space separated."""
  return " ".join(f"{i}-{j}" for i, j in links)


def parse_gold(line: str, one_based: bool = False) -> tuple[set[Link], set[Link]]:
  """One sentence of a gold alignment: (sure links, possible links), 0-based.

  `i-j` is a sure link, `i?j` or `ipj` a possible one (the two markers of the common
  files); `one_based` reads indices counted from 1 (as the gold sets of Zenkel et al. and
  Garg et al.'s alignment-scripts are). ValueError for any other item.
  """
  sure, possible = set(), set()
  for item in line.split():
    for marker, into in (("-", sure), ("?", possible), ("p", possible)):
      i, found, j = item.partition(marker)
      if found and i.isdigit() and j.isdigit():
        into.add((int(i) - one_based, int(j) - one_based))
        break
    else:
      raise ValueError(f"{item!r} is not a link: write i-j (sure) or i?j or ipj (possible),"
                       " with i the source word and j the target word")
  if one_based and any(min(link) < 0 for link in sure | possible):
    raise ValueError("a link holds a 0 where indices count from 1")
  return sure, possible


def out_of_range(links: set[Link], src_len: int, tgt_len: int) -> Link | None:
  """A link outside `src_len` source and `tgt_len` target words, or None."""
  return next((link for link in sorted(links) if not (0 <= link[0] < src_len
                                                      and 0 <= link[1] < tgt_len)), None)


def alignment_counts(predicted: set[Link], sure: set[Link],
                     possible: set[Link]) -> tuple[int, int, int, int]:
  """(|A|, |S|, |A∩S|, |A∩P|) of one sentence, with P the possible links and the sure ones."""
  predicted, sure = set(predicted), set(sure)
  return (len(predicted), len(sure), len(predicted & sure),
          len(predicted & (sure | set(possible))))


def aer(predicted: Sequence[set[Link]], sure: Sequence[set[Link]],
        possible: Sequence[set[Link]]) -> dict:
  """The alignment error rate of a test set (Och & Ney, 2003), with the precision (against P)
  and recall (against S) it is made of: per sentence its predicted links A, sure links S and
  possible links (P: these and S). The counts are summed over sentences before dividing.

  Returns:
    {"aer", "precision", "recall"} (fractions, not percentages) and "links": |A|.
  """
  totals = np.zeros(4, np.int64)
  for a, s, p in zip(predicted, sure, possible, strict=True):
    totals += alignment_counts(a, s, p)
  n_a, n_s, a_and_s, a_and_p = (int(x) for x in totals)
  if n_a + n_s == 0:
    raise ValueError("neither the alignment nor the gold has a link: no error rate to give")
  return {"aer": 1 - (a_and_s + a_and_p) / (n_a + n_s),
          "precision": a_and_p / n_a if n_a else 0.0,
          "recall": a_and_s / n_s if n_s else 0.0, "links": n_a}
