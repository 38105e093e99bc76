"""Whether a run's workdir matches what a command brings to it.

A run is its config.json, its vocabulary and its checkpoints, and they only work together:
resuming with another model or data config, restoring a checkpoint into a model of other
shapes, or decoding with another vocabulary would train or translate garbage, or fail deep
inside orbax as if the checkpoint were damaged. Each check here refuses such a mismatch with
one `UserError` that names what differs and how to put the run back together.
"""

import hashlib
from pathlib import Path

import jax
import ml_collections

from seq2seq import config as config_lib
from seq2seq.data import tokenizer
from seq2seq.data.textio import write_atomically
from seq2seq.errors import UserError
from seq2seq.runs import workdirs

# The fields that say which parent a run started from (docs/training.md).
PARENT_FIELDS = ("init_from", "init_checkpoint", "init_keep", "init_fresh")


def check_run_config(workdir: Path, config: ml_collections.ConfigDict) -> None:
  """Refuses to resume a run whose model or data config, or parent, differ from `config`
  (a parent named by another path to it is the same: `config` takes the run's path).

  Raises:
    UserError: naming every differing field, its value in the run and in `config`.
  """
  path = Path(workdir) / workdirs.CONFIG
  if not path.exists():
    return
  saved = workdirs.read_json(path, workdirs.RUN_CONFIG_FIX)
  differ, flags = [], []
  # And where it started from: a resumed run never reads a parent again, so another one named
  # now would stand in its config.json beside the parent.json of the one it started from.
  fields = [(section, key) for section in ("model", "data") for key in config[section]]
  fields += [("train", key) for key in PARENT_FIELDS]
  for section, key in fields:
    value = config[section][key]
    was = workdirs.saved_value(saved, section, key, value)
    if key == "init_from" and was and value and Path(was).resolve() == Path(value).resolve():
      config.train.init_from = was  # The same parent by another path: recorded as it was.
    elif was != value:
      differ.append(f"config.{section}.{key}={was!r} (not {value!r})")
      flags.append(f"--config.{section}.{key}={was}")
  if differ:
    raise UserError(f"{workdir} holds a run trained with {', '.join(differ)}; resume it with"
                    f" the run's values ({' '.join(flags)}), or pass a new --workdir.")


def save_run_config(workdir: Path, config: ml_collections.ConfigDict) -> None:
  """Writes `<workdir>/config.json` atomically, and only if it changes (a failed start of
  a finished or mismatched run leaves the file untouched)."""
  path, text = Path(workdir) / workdirs.CONFIG, config_lib.to_json(config)
  if path.exists() and path.read_text(encoding="utf-8") == text:
    return
  write_atomically(path, text)


def check_vocab(path: Path, step: int, recorded: str | None) -> None:
  """Raises `UserError` if the vocabulary at `path` is missing or is not the one whose
  fingerprint the checkpoint at `step` recorded (None: it recorded none, nothing to check)."""
  if recorded is None:
    return  # A checkpoint without a fingerprint in its metadata: nothing to compare.
  found = tokenizer.fingerprint(path)
  if found is None:
    raise UserError(f"{path} is missing: the checkpoint at step {step} only works with the"
                    " vocabulary it was trained with; put it back from a copy of the run.")
  # The content's fingerprint, or the file's sha256 that some checkpoints carry instead.
  if recorded not in (found, _bytes_sha256(path)):
    raise UserError(f"{path} is not the vocabulary the checkpoint at step {step} was trained"
                    f" with (sha256 {found[:12]}..., recorded {recorded[:12]}...); put back the"
                    " run's vocab/ or train in a new --workdir.")


def check_shapes(workdir: Path, step: int, saved_params: dict, params_like) -> None:
  """Raises `UserError` if the parameter shapes saved at `step` (`saved_params`, nested dicts
  of shapes) do not fit `params_like`: names the first differing parameter, and says whether
  the run's vocabulary or its config no longer matches the checkpoint."""
  saved = flat_shapes(saved_params)
  model = flat_shapes(params_like)
  names = sorted(saved.keys() | model.keys())
  differ = [(n, saved.get(n), model.get(n)) for n in names if saved.get(n) != model.get(n)]
  if not differ:
    return
  vocab = vocab_size(workdir / workdirs.VOCAB)
  # Only the vocabulary-sized axis of embedding/output tables differs: a foreign vocabulary.
  rows = [_vocab_axis(s, m, vocab) for _, s, m in differ]
  if vocab is not None and None not in rows and len(set(rows)) == 1:
    raise UserError(f"{workdir / workdirs.VOCAB} has {vocab} subwords but the checkpoint at"
                    f" step {step} was trained with {rows[0]} ({differ[0][0]}): the vocabulary"
                    " is not this run's; put back the run's vocab/ or train in a new --workdir.")
  name, in_checkpoint, in_model = differ[0]
  more = f", and {len(differ) - 1} more parameters differ" if len(differ) > 1 else ""
  raise UserError(
      f"The checkpoint at step {step} in {workdir} does not fit the model of its config.json"
      f" ({name} is {_describe(in_checkpoint)} in the checkpoint but {_describe(in_model)} in"
      f" the model{more}); was config.json edited? Put back the run's config.json or train in"
      " a new --workdir.")


def leaf_name(path) -> str:
  """"decoder_layers.0.mlp.kernel": the dotted name of a leaf's key path, saved or live."""
  parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
  return ".".join(parts[:-1] if parts and parts[-1] == "value" else parts)


def flat_shapes(tree) -> dict[str, tuple]:
  """{"decoder_layers.0.mlp.kernel": shape} of a parameter tree, saved or live."""
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x))[0]
  return {leaf_name(path): tuple(leaf) if isinstance(leaf, tuple) else tuple(leaf.shape)
          for path, leaf in leaves}


def _vocab_axis(saved: tuple | None, model: tuple | None, vocab: int | None) -> int | None:
  """The saved size of the one axis where the shapes differ, if the model has `vocab` there."""
  if saved is None or model is None or len(saved) != len(model):
    return None
  axes = [i for i, (a, b) in enumerate(zip(saved, model, strict=True)) if a != b]
  return saved[axes[0]] if len(axes) == 1 and model[axes[0]] == vocab else None


def _describe(shape: tuple | None) -> str:
  return "missing" if shape is None else f"of shape {shape}"


def vocab_size(path: Path) -> int | None:
  """Pieces in the run's SentencePiece model (None if there is none)."""
  if not path.is_file():
    return None
  import sentencepiece as spm
  return spm.SentencePieceProcessor(model_file=str(path)).vocab_size()


def _bytes_sha256(path: Path) -> str:
  """sha256 of a file's bytes: the vocabulary fingerprint some checkpoints carry instead of
  `vocab_fingerprint`'s (which hashes the content, so that a vocabulary trained again
  matches), accepted as well."""
  return hashlib.sha256(path.read_bytes()).hexdigest()
