"""compare's evaluation of one run on one test set, cached so that a comparison redone is cheap,
and its test sets (`--test_set NAME=SRC,REF`: `parse_test_set`).

The evaluations are cached in `<workdir>/eval/compare/` (a released model's beside it, in
`runs/released/<its path>/eval/compare/`: `released.outputs`), each under the key of everything
that decides it (`evaluation_key`): the checkpoint compared (best, or the spec chosen on
validation), the steps it names now and a digest of their parameters, the search, the
decoding lengths, the run's config and vocabulary, and the sha256 of the source and reference
texts. A cached result is used only when its key is the one asked for, so a run trained
further or chosen again, another --alpha or another file of the same name is evaluated again;
the files seq2seq-evaluate writes (`<workdir>/eval/<name>.<checkpoint>.beam<k>.*`) are never
read.
"""

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from seq2seq.data import tokenizer
from seq2seq.data.textio import as_lines, read_lines, write_atomically
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation.scores import bleu, chrf, evaluate_split, output_files
from seq2seq.runs import released, workdirs

log = logging.getLogger("seq2seq")

CACHE = workdirs.EVAL / "compare"  # compare's own evaluations, relative to the workdir.


class TestSet(NamedTuple):
  """A set every run is scored on: a split of the runs' corpus, or a pair of files."""
  name: str
  src_file: str = ""
  ref_file: str = ""


def parse_test_set(spec: str) -> TestSet:
  """"NAME=SRC,REF" (the `--test_set` flag) -> TestSet."""
  name, sep, files = spec.partition("=")
  src, comma, ref = files.partition(",")
  if not (sep and comma and name and src and ref) or "," in ref:
    raise UserError(f"--test_set={spec} is not NAME=SRC,REF; e.g."
                    " --test_set=test2017=data/test_2017.en,data/test_2017.de.")
  if name in ("val", "test", "train"):
    raise UserError(f"--test_set={spec}: {name!r} is a split of the runs' corpus; give the files"
                    " another name.")
  for path in (src, ref):
    if not Path(path).is_file():
      raise UserError(f"--test_set={spec}: {path} is not a file; pass an existing text file.")
  lines = [len(read_lines(path, "--test_set")) for path in (src, ref)]
  if lines[0] != lines[1]:  # Before anything is decoded or cached.
    raise UserError(f"--test_set={spec}: {src} has {lines[0]} lines but {ref} has {lines[1]};"
                    " pass a reference line for every source line.")
  return TestSet(name, src, ref)


def read_test_set(config, test_set: TestSet) -> tuple[list[str], list[str]]:
  """(sources, references) of a test set."""
  if test_set.src_file:
    return read_lines(test_set.src_file), read_lines(test_set.ref_file)
  from seq2seq.data import corpus

  text = corpus.read_split(config.data, test_set.name)
  return text.src, text.tgt


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _params_sha256(params) -> str:
  """sha256 of a parameter tree (names, dtypes, shapes, values): the weights themselves, so a
  checkpoint replaced at the same step (a run trained again) is not mistaken for the old one."""
  import jax

  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    array = np.ascontiguousarray(jax.device_get(leaf))
    digest.update(f"{jax.tree_util.keystr(path)} {array.dtype} {array.shape}\n".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def evaluation_key(translator: Translator, sources: Sequence[str],
                   references: Sequence[str]) -> dict:
  """Everything that decides an evaluation's hypotheses and scores, as plain JSON values."""
  config = translator.config
  workdir = translator.workdir
  return {
      "checkpoint": translator.checkpoint,
      "checkpoint_steps": [int(step) for step in translator.steps],
      "params_sha256": _params_sha256(translator.params),
      "beam_size": translator.beam_size, "alpha": float(translator.alpha),
      "batch_size": translator.batch_size,  # Batches decide the padded, so decoded, lengths.
      "max_decode_len_a": config.eval.max_decode_len_a,
      "max_decode_len_b": config.eval.max_decode_len_b,
      "model.max_len": config.model.max_len, "data.bucket_step": config.data.bucket_step,
      "config_sha256": _sha256((workdir / workdirs.CONFIG).read_bytes()),
      "vocab_sha256": tokenizer.fingerprint(workdir / workdirs.VOCAB),
      "sentences": len(sources),
      "src_sha256": _sha256(as_lines(sources).encode("utf-8")),
      "ref_sha256": _sha256(as_lines(references).encode("utf-8")),
  }


def evaluation(workdir: Path, test_set: TestSet, beam_size: int, alpha: float,
               translator: Translator | None = None,
               text: tuple[list[str], list[str]] | None = None) -> tuple[dict, list]:
  """The run's scores on `test_set` (the translator's checkpoint: best by default) and its
  hypotheses.

  Read from compare's cache when one was written under the same `evaluation_key`, otherwise
  evaluated as seq2seq-evaluate does (`evaluate_split`) and cached under that key.
  `translator` (of the checkpoint compared, `beam_size`, `alpha`; "best" by default) and
  `text` (sources, references) are built when not given.
  """
  workdir = Path(workdir)
  if translator is None:
    translator = Translator(workdir, "best", beam_size=beam_size, alpha=alpha)
  sources, references = (text if text is not None
                         else read_test_set(translator.config, test_set))
  key = json.loads(json.dumps(evaluation_key(translator, sources, references)))
  digest = _sha256(json.dumps(key, sort_keys=True).encode())[:12]
  name = f"{test_set.name}.beam{translator.beam_size}.{digest}"
  prefix = released.outputs(workdir) / CACHE / name  # A released model's beside it.
  hyp_path, json_path = output_files(prefix)
  if json_path.is_file() and hyp_path.is_file():
    try:
      cached = json.loads(json_path.read_text(encoding="utf-8"))
    except ValueError:
      cached = {}  # Damaged: evaluated again and rewritten below.
    hypotheses = read_lines(hyp_path)
    if (isinstance(cached, dict) and cached.get("key") == key
        and len(hypotheses) == len(sources) and _agree(cached, hyp_path, hypotheses,
                                                       references)):
      return {k: v for k, v in cached.items() if k not in ("key", "hyp_sha256")}, hypotheses
  result = evaluate_split(translator, sources, references, prefix)
  # The key last: a kill before this line leaves a result without it, which is not reused.
  write_atomically(json_path, json.dumps({**result, "hyp_sha256": _sha256(hyp_path.read_bytes()),
                                          "key": key}, indent=2) + "\n")
  return result, read_lines(hyp_path)


def _agree(cached: dict, hyp_path: Path, hypotheses: list[str], references: list[str]) -> bool:
  """Whether a cached evaluation's scores are those of its .hyp, as written: the file is the
  one scored, and the BLEU, lowercase BLEU and chrF the comparison shows are its own (a file
  edited by hand is evaluated again)."""
  if "hyp_sha256" not in cached:
    reason = "written before cached scores were checked against their hypotheses"
  elif cached["hyp_sha256"] != _sha256(hyp_path.read_bytes()):
    reason = "its hypotheses are not the ones scored"
  else:
    reason = disagreement(cached, hypotheses, references)
    if reason is None:
      return True
  log.warning("%s: %s; evaluating again.", hyp_path.with_suffix(".json"), reason)
  return False


def disagreement(scores: dict, hypotheses: list[str], references: list[str]) -> str | None:
  """Where `scores` (an evaluation's .json) are not those of `hypotheses` against `references`:
  the first of its BLEU, lowercase BLEU and chrF, which the comparison shows, that sacreBLEU
  does not give them (to 1e-6), as `its <name>, <value>, is not that of its hypotheses`; None
  where all three are theirs."""
  shown = {"bleu": lambda: bleu(hypotheses, references)["bleu"],
           "bleu_lowercase": lambda: bleu(hypotheses, references,
                                          lowercase=True)["bleu_lowercase"],
           "chrf": lambda: chrf(hypotheses, references)}
  for name, score in shown.items():
    if not abs(score() - scores.get(name, float("nan"))) <= 1e-6:
      return f"its {name}, {scores.get(name)}, is not that of its hypotheses"
  return None
