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
         config: ml_collections.ConfigDict) -> tokenizer.Tokenizer:
  """Trains the run's SentencePiece model on `texts()` once (process 0), or copies the one of
  the run `source` names; then every process loads it."""
  d = config.data
  if jax.process_index() == 0:
    run, field = source(config)
    if run is not None and not (workdir / workdirs.VOCAB).is_file():
      check_source(run, d, field)
      workdirs.copy_vocabulary(run, workdir, field)
    tok = tokenizer.load_or_train(workdir / workdirs.VOCAB, texts, d.vocab_size, seed=VOCAB_SEED)
  multihost_utils.sync_global_devices("tokenizer")
  return tok if jax.process_index() == 0 else tokenizer.Tokenizer.load(workdir / workdirs.VOCAB)


def source(config: ml_collections.ConfigDict) -> tuple[Path | None, str]:
  """The run whose vocabulary a new run takes instead of training one, and the field that names
  it: config.data.vocab_from, else the parent (config.train.init_from, whose vocabulary
  `runs.parents` checks is vocab_from's where both are set); (None, "") if neither."""
  if config.data.vocab_from:
    return Path(config.data.vocab_from), "config.data.vocab_from"
  if config.train.init_from:
    return Path(config.train.init_from), "config.train.init_from"
  return None, ""


def check_source(run: Path, data: ml_collections.ConfigDict,
                 field: str = "config.data.vocab_from") -> None:
  """Raises `UserError` if `run` (named by `field`) trained its vocabulary at another
  config.data.vocab_size, or on other config.data.vocab_languages, than this run's `data`
  asks for, which config.json would then misstate."""
  if not (run / workdirs.CONFIG).is_file():
    return  # workdirs.copy_vocabulary says what is missing.
  theirs = workdirs.read_run_config(run).data
  drop = ("drop vocab_from" if field == "config.data.vocab_from"
          else "start a new run without init_from")
  if theirs.vocab_size != data.vocab_size:
    raise UserError(f"{field}={run} holds a vocabulary of config.data.vocab_size="
                    f"{theirs.vocab_size!r}, not this run's {data.vocab_size!r}; pass"
                    f" --config.data.vocab_size={theirs.vocab_size}, or {drop} to train one of"
                    f" {data.vocab_size!r}.")
  yours, own = languages(theirs), languages(data)
  if yours != own:
    raise UserError(f"{field}={run} holds a vocabulary of {', '.join(yours)}, and this run's is"
                    f" of {', '.join(own)}; pass --config.data.vocab_languages={','.join(yours)}"
                    f" to take it as it is, or {drop} to train one of {', '.join(own)}.")


def languages(data: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The languages whose training text a run's vocabulary is trained on, sorted:
  config.data.vocab_languages, or where that is empty, the pair's two."""
  listed = {name.strip() for name in data.get("vocab_languages", "").split(",") if name.strip()}
  return tuple(sorted(listed or {data.src_lang, data.tgt_lang}))


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
