"""Reading parallel text: the bundled Multi30k, local files, or a TFDS catalog name.

`read_split(config.data, split)` returns the sentences of one split as Python
strings, line i of the source aligned with line i of the target. TensorFlow is
imported only when `config.data.corpus` is "tfds:<name>".
"""

import dataclasses
import gzip
import zlib
from pathlib import Path

import ml_collections

from seq2seq.data import textio
from seq2seq.errors import UserError, describe

SPLITS = ("train", "val", "test")

_MULTI30K_DIR = Path(__file__).resolve().parents[2] / "data" / "multi30k"
_MULTI30K_FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}
_TFDS_SPLITS = {"train": "train", "val": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class ParallelText:
  """Aligned sentences: `tgt[i]` is the translation of `src[i]`."""
  src: list[str]
  tgt: list[str]

  def __len__(self) -> int:
    return len(self.src)

  def first(self, n: int) -> "ParallelText":
    """The first `n` pairs; all of them where `n` is 0 (or less)."""
    return ParallelText(self.src[:n], self.tgt[:n]) if n > 0 else self


def read_split(data_config: ml_collections.ConfigDict, split: str) -> ParallelText:
  """Reads one split of the corpus named by `data_config.corpus`.

  Args:
    data_config: `config.data` (corpus, src_lang, tgt_lang, multi30k_dir,
      tfds_data_dir, and optionally max_train_examples).
    split: one of SPLITS.

  Returns:
    The split's sentence pairs, with only the trailing newline of each line
    removed. For "train", only the first `max_train_examples` pairs when that
    is positive.
  """
  if split not in SPLITS:
    raise UserError(f"Unknown split {split!r}; use one of: {', '.join(SPLITS)}.")
  limit = data_config.get("max_train_examples", 0) if split == "train" else 0
  corpus = data_config.corpus
  if corpus == "multi30k":
    text = _read_multi30k(data_config, split)
  elif corpus.startswith("tfds:"):
    text = _read_tfds(data_config, corpus[len("tfds:"):], split, limit)
  else:
    directory = Path(corpus).expanduser()
    if not directory.is_dir():
      raise UserError(f"config.data.corpus={corpus!r} is not \"multi30k\", \"tfds:<name>\" or"
                      " an existing directory; use one of those.")
    text = _read_pair(directory, split, split, data_config.src_lang, data_config.tgt_lang)
  return text.first(limit)


def vocabulary_text(data_config: ml_collections.ConfigDict, train: ParallelText) -> list[str]:
  """The text a run's SentencePiece model trains on: both sides of its training pairs `train`,
  or, with `data_config.vocab_languages` ("de,en,cs"), the training text of each language
  named, its first max_train_examples lines, so that a parent's vocabulary covers the
  languages of a child that starts from it (config.train.init_from)."""
  names = list(dict.fromkeys(n.strip() for n in data_config.get("vocab_languages", "").split(",")
                             if n.strip()))
  if not names:
    return train.src + train.tgt
  field = f"config.data.vocab_languages={data_config.vocab_languages!r}"
  left_out = [n for n in (data_config.src_lang, data_config.tgt_lang) if n not in names]
  if left_out:
    raise UserError(f"{field} leaves out {left_out[0]}, a language of the pair; add it: the"
                    " vocabulary must spell what the run trains on.")
  if data_config.corpus.startswith("tfds:"):
    raise UserError(f"{field} reads each language's own training file, which a TFDS corpus"
                    " has not; drop it, or use Multi30k or a directory of files.")
  read = {data_config.src_lang: train.src, data_config.tgt_lang: train.tgt}
  text = []
  for name in names:  # The pair's sides as read; another language beside the target's.
    if name not in read:
      other = ml_collections.ConfigDict({**data_config.to_dict(), "src_lang": name})
      read[name] = read_split(other, "train").src
    text += read[name]
  return text


def _read_multi30k(data_config: ml_collections.ConfigDict, split: str) -> ParallelText:
  directory = Path(data_config.multi30k_dir or _MULTI30K_DIR).expanduser()
  if not directory.is_dir():
    raise UserError(f"Multi30k directory {directory} does not exist; set"
                    " config.data.multi30k_dir to the folder holding train.en.gz etc.")
  available = sorted(p.name.split(".")[1] for p in directory.glob("train.*.gz"))
  for lang in (data_config.src_lang, data_config.tgt_lang):
    if lang not in available:
      raise UserError(f"Multi30k has no language {lang!r}; set config.data.src_lang/tgt_lang"
                      f" to one of: {', '.join(available)}.")
  name = _MULTI30K_FILES[split]
  return _read_pair(directory, name, split, data_config.src_lang, data_config.tgt_lang)


def _read_pair(directory: Path, name: str, split: str, src_lang: str,
               tgt_lang: str) -> ParallelText:
  """Reads `<name>.<lang>` or `<name>.<lang>.gz` for both languages."""
  paths = [_find_file(directory, name, lang, split) for lang in (src_lang, tgt_lang)]
  src, tgt = (_read_lines(p) for p in paths)
  if len(src) != len(tgt):
    raise UserError(f"{paths[0]} has {len(src)} lines but {paths[1]} has {len(tgt)}; the two"
                    " sides of a parallel corpus must have one line per sentence pair.")
  if not src:
    raise UserError(f"{paths[0]} and {paths[1]} are empty; the {split} split needs sentence"
                    " pairs, one per line.")
  return ParallelText(src, tgt)


def _find_file(directory: Path, name: str, lang: str, split: str) -> Path:
  plain = directory / f"{name}.{lang}"
  for path in (plain, plain.with_name(plain.name + ".gz")):
    if path.is_file():
      return path
  raise UserError(f"Missing {split} file {plain} (or {plain.name}.gz); add it or check"
                  " config.data.corpus, src_lang and tgt_lang.")


def _read_lines(path: Path) -> list[str]:
  try:
    if path.suffix == ".gz":
      with gzip.open(path, "rb") as f:
        data = f.read()
    else:
      data = path.read_bytes()
  except (OSError, EOFError, zlib.error) as e:
    kind = "gzip" if path.suffix == ".gz" else "text"
    raise UserError(f"Cannot read {path} ({e}); replace it with a valid {kind} file.") from None
  try:
    text = data.decode("utf-8").removeprefix(textio.BOM)
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise UserError(f"{path} line {line} is not valid UTF-8; re-encode the file as"
                    " UTF-8.") from None
  if not text:
    return []
  # Split on "\n" only: str.splitlines() would also break at characters such as
  # U+2028 or \x0c inside a sentence and misalign the two sides.
  lines = text.split("\n")
  if lines[-1] == "":
    lines.pop()
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def _read_tfds(data_config: ml_collections.ConfigDict, name: str, split: str,
               limit: int) -> ParallelText:
  try:
    import tensorflow_datasets as tfds  # Slow, and pulls in TensorFlow: only here.
  except ImportError:
    raise UserError(f"config.data.corpus='tfds:{name}' needs TensorFlow Datasets, an optional"
                    " extra; install it with pip install -e \".[tfds]\".") from None

  data_dir = data_config.tfds_data_dir or None
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise UserError(f"config.data.corpus='tfds:{name}' is not in the TFDS catalog; use a"
                    " name from https://www.tensorflow.org/datasets/catalog.") from None
  languages = sorted(builder.info.features.keys())
  for lang in (data_config.src_lang, data_config.tgt_lang):
    if lang not in languages:
      raise UserError(f"TFDS dataset {name} has no language {lang!r}; set"
                      f" config.data.src_lang/tgt_lang to one of: {', '.join(languages)}.")
  tfds_split = _TFDS_SPLITS[split]
  if limit > 0:
    tfds_split += f"[:{limit}]"  # Read only the pairs that will be used.
  try:
    builder.download_and_prepare()  # Returns at once where the dataset is prepared.
  except Exception as e:  # Offline, a manual download missing, a full disk: TFDS's many kinds.
    raise UserError(
        f"TFDS dataset {name} is not prepared in {builder.data_dir} and preparing it failed"
        f" ({describe(e)}); prepare it once where the network is reachable"
        f" with tfds.builder({name!r}).download_and_prepare() (manual downloads: pass"
        " download_config=tfds.download.DownloadConfig(manual_dir=...)), or set"
        " config.data.tfds_data_dir to a directory where it is prepared.") from None
  dataset = tfds.load(name, split=tfds_split, data_dir=data_dir, shuffle_files=False,
                      download=False)
  src, tgt = [], []
  for example in tfds.as_numpy(dataset):
    src.append(example[data_config.src_lang].decode("utf-8"))
    tgt.append(example[data_config.tgt_lang].decode("utf-8"))
  if not src:
    raise UserError(f"The {split} split of TFDS dataset {name} is empty; use a dataset whose"
                    f" {tfds_split} split has examples.")
  return ParallelText(src, tgt)
