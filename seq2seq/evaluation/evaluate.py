"""Evaluating a run: on a split of its corpus or on files (`run_evaluation`), and choosing
among its checkpoints on validation data (`select_checkpoint`)."""

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from seq2seq.data import corpus
from seq2seq.data.textio import read_lines
from seq2seq.decoding.alignment import check_attends
from seq2seq.decoding.translator import Translator, check_candidates
from seq2seq.errors import UserError
from seq2seq.evaluation.alignment_error import alignment_scores, read_gold
from seq2seq.evaluation.scores import evaluate_split, output_files
from seq2seq.runs import released, workdirs
from seq2seq.runs.selection import record_selection

log = logging.getLogger("seq2seq")

# --plot_attention on a run without attention (`alignment.check_attends`): the fix.
_WITHOUT_PICTURES = "drop --plot_attention, or evaluate a run trained with attention"


def select_checkpoint(workdir: str | Path, candidates: Sequence[str], *, split: str = "val",
                      beam_size: int = 4, alpha: float = 0.6,
                      batch_size: int | None = None, out: str | Path = "") -> dict:
  """Scores every candidate spec (e.g. best, avg:5, avg:10) on the validation split, and
  records the one with the highest BLEU in `<workdir>/eval/selected.json`; each candidate's
  .hyp and .json go to `out`, or to `<workdir>/eval` (`eval_dir`).

  Choosing on test data would make its score optimistic, so only `val` is allowed.

  Returns:
    {"checkpoint": the winner, "split", "beam_size", "alpha", "bleu": {spec: BLEU}}.
  """
  if split != "val":
    raise UserError(f"--split={split} with several checkpoints would choose one on {split}"
                    " data; choose on validation data (--split=val), then score the choice"
                    " with --checkpoint=selected --split=test.")
  workdir = Path(workdir)
  released.check_no_choice(workdir, candidates)
  check_candidates(workdir, candidates)  # Every one, before any is decoded.
  translator, found = None, {}
  for spec in candidates:
    # Parameters swap into the compiled search; an ensemble (`ensemble:N`) is another model.
    if translator is None or "ensemble:" in spec + translator.checkpoint:
      translator = Translator(workdir, spec, beam_size=beam_size, alpha=alpha,
                              batch_size=batch_size)
      text = corpus.read_split(translator.config.data, split)
    elif spec != translator.checkpoint:
      translator.load_checkpoint(spec)
    prefix = eval_dir(workdir, out) / f"{split}.{spec.replace(':', '')}.beam{beam_size}"
    found[spec] = evaluate_split(translator, text.src, text.tgt, prefix)["bleu"]
    log.info("%s: BLEU %.2f; wrote %s.hyp and %s.json", spec, found[spec], prefix, prefix)
  winner = max(candidates, key=lambda spec: found[spec])  # The first listed wins a tie.
  result = {"checkpoint": winner, "split": split, "beam_size": beam_size, "alpha": alpha,
            "bleu": found}
  record_selection(workdir, result)
  return result


def eval_dir(workdir: str | Path, out: str | Path = "") -> Path:
  """Where an evaluation of `workdir` writes its .hyp, .json and pictures: `out` if given,
  else `<workdir>/eval`, or a released model's `released.outputs` (runs/released/<its
  path>/eval): a released model stays as released."""
  return Path(out) if out else released.outputs(workdir) / workdirs.EVAL


def _members_id(ensemble: Sequence[str]) -> str:
  """8 hex digits naming the set of --ensemble runs: two ensembles write apart."""
  members = "\n".join(sorted(str(Path(member).resolve()) for member in ensemble))
  return hashlib.sha256(members.encode()).hexdigest()[:8]


def _apart(prefix: Path, reference: dict) -> Path:
  """Where the scores of a --src_file against `reference` (its --ref_file and sha256) go:
  `prefix`, unless its .json holds scores against another reference (or names none, as
  older ones did); then `<prefix>.ref-<8 hex of its sha256>`, so that scoring one source
  against a second reference keeps the first one's scores."""
  _, json_path = output_files(prefix)
  if not json_path.is_file():
    return prefix
  try:
    earlier = json.loads(json_path.read_text(encoding="utf-8"))
  except ValueError:
    earlier = {}
  earlier = earlier if isinstance(earlier, dict) else {}
  if earlier.get("ref_sha256") == reference["ref_sha256"]:
    return prefix  # The same reference (wherever it lies now): scored again, replaced.
  apart = prefix.with_name(f"{prefix.name}.ref-{reference['ref_sha256'][:8]}")
  log.warning("%s holds scores against another reference (%s); they are kept, and these, against"
              " --ref_file=%s, go to %s.json.", json_path,
              earlier.get("ref_file", "one it does not record"), reference["ref_file"], apart)
  return apart


def run_evaluation(workdir: str | Path, *, split: str = "test", checkpoint: str = "best",
                   beam_size: int = 4, alpha: float = 0.6, batch_size: int | None = None,
                   src_file: str = "", ref_file: str = "",
                   plot_attention: int = 0, ensemble: Sequence[str] = (),
                   gold_alignment: str = "", alignment_layer: int = -2,
                   gold_one_based: bool = False, out: str | Path = "",
                   matmul_dtype: str = "float32") -> tuple[dict, Path]:
  """Evaluates a run on a split of its corpus, or on `src_file` against `ref_file`.

  With `gold_alignment` (a file), also the alignment error rate of the attention of layer
  `alignment_layer` on the references (`alignment_error.alignment_scores`; `gold_one_based`:
  the file counts words from 1, `read_gold`), in the scores as `aer` and `alignment_*`.

  With `plot_attention` K > 0, also draws the attention of the first K non-empty
  source sentences to `<prefix>.attention<i>.png` (i: the sentence's line number).
  With `ensemble`, those runs decode with `workdir`'s as one model (`Translator`).
  With `src_file`, the scores record `ref_file` (`ref_file`, `ref_sha256`), and scores of the
  same source against another reference are written apart (`_apart`), not over these.
  They go to `out`, or to `<workdir>/eval`, or a released model's place beside it (`eval_dir`).
  With `matmul_dtype` other than float32 (`Translator`), the files' names say it (`_prefix`).

  Returns:
    The scores and the path prefix of the written `.hyp` / `.json` files.
  """
  _check_flags(checkpoint, ensemble, plot_attention, gold_alignment, src_file, ref_file)
  workdir = Path(workdir)
  if src_file:  # Checked before the model loads: a wrong path fails at once.
    sources, references = _read_pairs(src_file, ref_file)
  translator = Translator(workdir, checkpoint, beam_size=beam_size, alpha=alpha,
                          batch_size=batch_size, ensemble=ensemble, matmul_dtype=matmul_dtype)
  if plot_attention:  # Before decoding: the pictures would come last, and blank.
    check_attends(translator, _WITHOUT_PICTURES)
  reference = {}
  if src_file:
    name = Path(src_file).name
    reference = {"ref_file": str(Path(ref_file).resolve()),
                 "ref_sha256": hashlib.sha256(Path(ref_file).read_bytes()).hexdigest()}
  else:
    text = corpus.read_split(translator.config.data, split)
    sources, references, name = text.src, text.tgt, split
  prefix = _prefix(eval_dir(workdir, out), name, checkpoint, ensemble,
                   f"beam{beam_size}" + _matmul_tag(matmul_dtype), reference)
  aer = (alignment_scores(translator, sources, references,
                          read_gold(gold_alignment, sources, references, gold_one_based),
                          layer=alignment_layer)
         if gold_alignment else None)  # Before decoding: a wrong gold file fails at once.
  result = evaluate_split(translator, sources, references, prefix, checkpoint,
                          {**(aer or {}), **reference})
  _draw_attention(translator, sources, name, prefix, plot_attention)
  return result, prefix


def _matmul_tag(matmul_dtype: str) -> str:
  """What the files of a decode with `--matmul_dtype` add after `beam<k>`: nothing for float32,
  else `.matmul-<dtype>` (`test.selected.beam4.matmul-bfloat16.json`), beside float32's."""
  return "" if matmul_dtype == "float32" else f".matmul-{matmul_dtype}"


def _prefix(directory: Path, name: str, checkpoint: str, ensemble: Sequence[str],
            search: str, reference: dict) -> Path:
  """The path prefix of the evaluation's files in `directory`: `<name>.<checkpoint>.<search>`
  (`beam<k>`, and its `_matmul_tag`), the checkpoint tagged with the `ensemble`'s members, and
  set apart from another reference's scores of the same source (`_apart`) where `reference`
  names one."""
  tag = checkpoint.replace(":", "") + (f".ensemble{len(ensemble) + 1}-{_members_id(ensemble)}"
                                       if ensemble else "")
  prefix = directory / f"{name}.{tag}.{search}"
  return _apart(prefix, reference) if reference else prefix


def _check_flags(checkpoint: str, ensemble: Sequence[str], plot_attention: int,
                 gold_alignment: str, src_file: str, ref_file: str) -> None:
  """Refuses, before anything loads, `run_evaluation`'s arguments that do not go together:
  an ensemble's attention drawn or scored, a negative `plot_attention`, or one of `src_file`
  and `ref_file` without the other."""
  if plot_attention and (ensemble or checkpoint.startswith("ensemble:")):
    raise UserError("--plot_attention draws one model's attention, not an ensemble's; drop one"
                    " of them.")
  if gold_alignment and (ensemble or checkpoint.startswith("ensemble:")):
    raise UserError("--gold_alignment scores one model's attention, not an ensemble's; drop one"
                    " of them.")
  if plot_attention < 0:
    raise UserError(f"--plot_attention={plot_attention} must not be negative; pass the number"
                    " of sentences to draw (0: none).")
  if bool(src_file) != bool(ref_file):
    raise UserError("Pass both --src_file and --ref_file, or neither (to use --split).")


def _read_pairs(src_file: str, ref_file: str) -> tuple[list[str], list[str]]:
  """The lines of `src_file` and of `ref_file`, a reference for every source."""
  sources, references = read_lines(src_file, "--src_file"), read_lines(ref_file, "--ref_file")
  if len(sources) != len(references):
    raise UserError(f"--src_file={src_file} has {len(sources)} lines but --ref_file={ref_file}"
                    f" has {len(references)}; pass a reference line for every source line.")
  return sources, references


def _draw_attention(translator: Translator, sources: Sequence[str], name: str, prefix: Path,
                    count: int) -> None:
  """Draws the attention of the first `count` non-empty `sources` (of `name`) to
  `<prefix>.attention<i>.png` (i: the sentence's line number)."""
  drawn = [i for i, text in enumerate(sources) if text.strip()][:count]
  if drawn:
    from seq2seq.evaluation.plots import plot_alignment  # matplotlib only where pictures are drawn.
  for i in drawn:
    path = plot_alignment(translator, sources[i], f"{prefix}.attention{i + 1}.png",
                          _WITHOUT_PICTURES)
    log.info("Drew the attention of %s line %d in %s", name, i + 1, path)
