"""SentencePiece training and loading, with the special ids of `seq2seq.data.special_ids` reserved.

One joint (source + target) unigram vocabulary is trained on the training split
once per run and stored in the workdir, so evaluating a run always uses its own
vocabulary.
"""

import functools
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.errors import UserError
from seq2seq.runtime.signals import raise_if_interrupted

# Reservoir-sample at most this many sentences for training: unigram training on
# a full WMT corpus would take hours and tens of GiB, and gains nothing over a
# sample this size. Multi30k (58k sentences) is used whole.
_MAX_TRAINING_SENTENCES = 2_000_000


class Tokenizer:
  """A SentencePiece model with PAD/UNK/BOS/EOS at ids 0..3."""

  def __init__(self, processor: spm.SentencePieceProcessor):
    self._sp = processor

  @classmethod
  def load(cls, path: str | Path) -> "Tokenizer":
    """Loads `<something>.model` written by `train_tokenizer`."""
    path = Path(path)
    if not path.is_file():
      raise UserError(f"SentencePiece model {path} does not exist; train one with"
                      " load_or_train() or point to an existing .model file.")
    processor = spm.SentencePieceProcessor(model_file=str(path))
    ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
      raise UserError(f"{path} has special ids (pad, unk, bos, eos) = {ids}, not"
                      f" {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}: seq2seq did not write it. Put back"
                      " the run's own vocabulary, or train in a new --workdir.")
    return cls(processor)

  @property
  def vocab_size(self) -> int:
    return self._sp.vocab_size()

  def encode(self, text: str) -> list[int]:
    """Subword ids of `text`, without BOS/EOS."""
    return self._sp.encode(text, out_type=int)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` of each text; one C++ call, much faster than a Python loop."""
    return self._sp.encode(list(texts), out_type=int)

  def nbest(self, text: str, size: int) -> list[list[int]]:
    """The subword ids of the `size` most probable segmentations of `text` (fewer where it
    has fewer), the best first: SentencePiece's n-best search of its unigram lattice."""
    return self._sp.nbest_encode_as_ids(text, nbest_size=size)

  @functools.cached_property
  def log_probs(self) -> np.ndarray:
    """`[vocab_size]` float64: each piece's log-probability in the unigram model, whose sum
    over a segmentation's pieces is the score SentencePiece gives it. Not for the unknown
    piece (0 here, a penalty there), which covers the same characters in every segmentation
    of a text and so changes no comparison between them."""
    return np.array([0.0 if self._sp.is_unknown(i) else self._sp.get_score(i)
                     for i in range(self.vocab_size)])

  def pieces(self, ids: Sequence[int] | np.ndarray) -> list[str]:
    """The subword string of each id (for axis labels)."""
    return [self._sp.id_to_piece(int(i)) for i in np.asarray(ids).reshape(-1)]

  def piece_id(self, piece: str) -> int | None:
    """The id of subword `piece` (as `pieces` names it), or None where the vocabulary lacks it."""
    i = self._sp.piece_to_id(piece)
    return None if i == UNK_ID and piece != self._sp.id_to_piece(UNK_ID) else i

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Detokenized text of `ids`, up to the first EOS; PAD and BOS are skipped.

    Args:
      ids: `[length]` token ids, a list or a 1-D integer array.
    """
    vocab_size = self.vocab_size
    pieces = []
    for i in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
      if i == EOS_ID:
        break
      if i in (PAD_ID, BOS_ID):
        continue
      # A model whose output layer is padded past the vocabulary can emit such
      # ids early in training; evaluation must not crash on them.
      pieces.append(i if 0 <= i < vocab_size else UNK_ID)
    return self._sp.decode(pieces)


def fingerprint(path: str | Path) -> str | None:
  """sha256 of a SentencePiece model's content: each piece with its score and kind, in id
  order (None if there is no file). Training writes its own file name into the model, so
  two trainings of one vocabulary differ in bytes but not in this."""
  path = Path(path)
  if not path.is_file():
    return None
  processor = spm.SentencePieceProcessor(model_file=str(path))
  digest = hashlib.sha256()
  for i in range(processor.vocab_size()):
    kind = "".join(str(int(test(i))) for test in (processor.is_unknown, processor.is_control,
                                                   processor.is_unused, processor.is_byte))
    digest.update(f"{processor.id_to_piece(i)}\t{processor.get_score(i)!r}\t{kind}\n"
                  .encode())
  return digest.hexdigest()


def _in_a_thread(fn, **kwargs) -> None:
  """Runs `fn(**kwargs)` in a thread while the main thread waits in short joins, so that a
  signal (Ctrl-C) is handled at once rather than after minutes inside SentencePiece's C++."""
  errors = []

  def target():
    try:
      fn(**kwargs)
    except Exception as e:  # Re-raised in the caller's thread.
      errors.append(e)

  thread = threading.Thread(target=target, name="sentencepiece", daemon=True)
  thread.start()
  while thread.is_alive():
    thread.join(0.1)
    raise_if_interrupted()
  if errors:
    raise errors[0]


def train_tokenizer(texts: Iterable[str], model_prefix: str | Path, vocab_size: int,
                    seed: int = 0) -> Tokenizer:
  """Trains a unigram SentencePiece model and writes `<model_prefix>.model` / `.vocab`.

  Args:
    texts: training sentences (for a joint vocabulary, both languages).
    model_prefix: output path without extension.
    vocab_size: target vocabulary size; a soft limit, so tiny corpora get fewer.
    seed: seeds SentencePiece's sampling, for a reproducible vocabulary.

  Returns:
    The trained tokenizer.
  """
  model_prefix = Path(model_prefix)
  model_prefix.parent.mkdir(parents=True, exist_ok=True)
  # Train under a private name and rename, so a killed run never leaves a
  # half-written model that a later run would load.
  tmp_prefix = model_prefix.with_name(f"{model_prefix.name}.tmp{os.getpid()}")
  spm.set_random_generator_seed(seed)
  try:
    _in_a_thread(
        spm.SentencePieceTrainer.train,
        sentence_iterator=iter(texts),
        model_prefix=str(tmp_prefix),
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        character_coverage=1.0,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        input_sentence_size=_MAX_TRAINING_SENTENCES,
        shuffle_input_sentence=True,
        num_threads=1,  # Multi-threaded EM is not bit-reproducible.
        minloglevel=2,
    )
  except RuntimeError as e:
    raise UserError(f"SentencePiece training failed ({str(e).splitlines()[0]}); check that"
                    " the training split is non-empty text.") from None
  # The .model appears last: whoever sees it also finds the .vocab.
  for ext in (".vocab", ".model"):
    os.replace(f"{tmp_prefix}{ext}", f"{model_prefix}{ext}")
  return Tokenizer.load(f"{model_prefix}.model")


def load_or_train(path: str | Path, texts_fn: Callable[[], Iterable[str]], vocab_size: int,
                  seed: int = 0) -> Tokenizer:
  """Loads the SentencePiece model `path`, training it from `texts_fn()` first if missing.

  Args:
    path: the model file (a run's is `<workdir>/vocab/spm.model`, `runs.workdirs.VOCAB`).
    texts_fn: returns the training sentences; only called when training is needed.
    vocab_size: target vocabulary size (soft limit).
    seed: seeds SentencePiece's sampling.

  Returns:
    The run's tokenizer.
  """
  path = Path(path)
  if path.is_file():
    return Tokenizer.load(path)
  logging.getLogger("seq2seq").info("Training the %d-piece SentencePiece vocabulary on the"
                                    " training split...", vocab_size)
  return train_tokenizer(texts_fn(), path.with_suffix(""), vocab_size, seed=seed)
