"""A training run's vocabulary: trained once in its workdir (or copied from
config.data.vocab_from), loaded by every process, and shared by a seed group's members."""

from collections.abc import Callable
from pathlib import Path

import jax
import ml_collections
from jax.experimental import multihost_utils

from seq2seq.data import tokenizer
from seq2seq.errors import UserError
from seq2seq.runs import workdirs

VOCAB_SEED = 0  # Seeds SentencePiece: runs that differ in train.seed share a vocabulary.


def load(workdir: Path, texts: Callable[[], list[str]],
         d: ml_collections.ConfigDict) -> tokenizer.Tokenizer:
  """Trains the run's SentencePiece model on `texts()` once (process 0), or copies the one of
  `d.vocab_from` (config.data); then every process loads it."""
  if jax.process_index() == 0:
    if d.vocab_from and not (workdir / workdirs.VOCAB).is_file():
      _check_vocab_from(Path(d.vocab_from), d.vocab_size)
      workdirs.copy_vocabulary(Path(d.vocab_from), workdir)
    tok = tokenizer.load_or_train(workdir / workdirs.VOCAB, texts, d.vocab_size, seed=VOCAB_SEED)
  multihost_utils.sync_global_devices("tokenizer")
  return tok if jax.process_index() == 0 else tokenizer.Tokenizer.load(workdir / workdirs.VOCAB)


def _check_vocab_from(source: Path, vocab_size: int) -> None:
  """Raises `UserError` if the run `source` (config.data.vocab_from) trained its vocabulary at
  another config.data.vocab_size than this run's, which config.json would then misstate."""
  if not (source / workdirs.CONFIG).is_file():
    return  # workdirs.copy_vocabulary says what is missing.
  size = workdirs.read_run_config(source).data.vocab_size
  if size != vocab_size:
    raise UserError(f"config.data.vocab_from={source} holds a vocabulary of"
                    f" config.data.vocab_size={size}, not this run's {vocab_size}; pass"
                    f" --config.data.vocab_size={size}, or drop vocab_from to train one of"
                    f" {vocab_size}.")


def share(first: Path, others: list[Path]) -> None:
  """Runs trained as one program (a seed group) share the vocabulary of the run in `first`:
  copied where missing, checked where present (process 0)."""
  if jax.process_index() != 0:
    return
  for workdir in others:
    if not (workdir / workdirs.VOCAB).is_file():
      workdirs.copy_vocabulary(first, workdir)
    elif tokenizer.fingerprint(workdir / workdirs.VOCAB) != tokenizer.fingerprint(
        first / workdirs.VOCAB):
      raise UserError(f"{workdir / workdirs.VOCAB} is not the vocabulary of"
                      f" {first / workdirs.VOCAB}: the runs cannot train as one program; train"
                      " them one by one (seq2seq-sweep --one_by_one).")
