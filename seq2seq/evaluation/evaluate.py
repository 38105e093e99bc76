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
                      beam_size: int | Sequence[int] = 4, alpha: float | Sequence[float] = 0.6,
                      batch_size: int | None = None, out: str | Path = "") -> dict:
  """Scores every candidate spec (e.g. best, avg:5, avg:10) on the validation split, at each
  beam size and length-penalty alpha given (one, or several: every pair is a candidate
  search), and records the best in `<workdir>/eval/selected.json`; each candidate's .hyp and
  .json go to `out`, or to `<workdir>/eval` (`eval_dir`).

  Choosing on test data would make its score optimistic, so only `val` is allowed.

  Returns:
    {"checkpoint": the winner, "split", "beam_size" and "alpha": the winner's search, "bleu":
     {label: BLEU}}, a label being the spec, or with several searches `<spec> beam<k>
     alpha<a>` (`search_label`); with several searches also "searches": {"beam_sizes",
     "alphas"}, which `selection.selected_search` reads.
  """
  if split != "val":
    raise UserError(f"--split={split} with several checkpoints or searches would choose one on"
                    f" {split} data; choose on validation data (--split=val), then score the"
                    " choice with --checkpoint=selected --split=test.")
  workdir = Path(workdir)
  beams = [beam_size] if isinstance(beam_size, int) else list(beam_size)
  alphas = [alpha] if isinstance(alpha, (int, float)) else list(alpha)
  _check_searches(beams, alphas)
  released.check_no_choice(workdir, candidates)
  check_candidates(workdir, candidates)  # Every one, before any is decoded.
  searches = [(k, a) for k in beams for a in alphas]
  several = len(searches) > 1
  translators: dict[tuple[int, float], Translator] = {}
  found, text = {}, None
  for spec in candidates:
    for k, a in searches:
      translator = _translator_for(workdir, spec, translators, k, a, batch_size)
      text = text or corpus.read_split(translator.config.data, split)
      prefix = output_prefix(eval_dir(workdir, out), split, spec, search_tag(k, a))
      label = search_label(spec, k, a) if several else spec
      found[label] = (spec, k, a, evaluate_split(translator, text.src, text.tgt, prefix)["bleu"])
      log.info("%s: BLEU %.2f; wrote %s.hyp and %s.json", label, found[label][3], prefix, prefix)
  winner = max(found, key=lambda label: found[label][3])  # The first listed wins a tie.
  spec, k, a, _ = found[winner]
  result = {"checkpoint": spec, "split": split, "beam_size": k, "alpha": a,
            "bleu": {label: bleu for label, (*_, bleu) in found.items()}}
  if several:
    result["searches"] = {"beam_sizes": beams, "alphas": alphas}
  record_selection(workdir, result)
  return result


def search_tag(beam_size: int, alpha: float) -> str:
  """What an evaluation's file names say of its search: `beam<k>`, and `.alpha<a>` where the
  length penalty is not the usual 0.6 (`val.avg10.beam5.alpha1.hyp`)."""
  return f"beam{beam_size}" + ("" if alpha == 0.6 else f".alpha{alpha:g}")


def output_prefix(directory: Path, name: str, checkpoint: str, search: str) -> Path:
  """The path prefix of an evaluation's .hyp and .json (`scores.output_files`) in `directory`:
  `<name>.<checkpoint, its colon dropped>.<search>` (`val.avg5.beam4`, `test.selected.beam4`;
  `search`: `search_tag`'s, and what `_prefix` adds to it)."""
  return Path(directory) / f"{name}.{checkpoint.replace(':', '')}.{search}"


def search_label(spec: str, beam_size: int, alpha: float) -> str:
  """A candidate's name among several searches: `avg:10 beam5 alpha0.6`."""
  return f"{spec} beam{beam_size} alpha{alpha:g}"


def _check_searches(beams: Sequence[int], alphas: Sequence[float]) -> None:
  """Raises `UserError` for a repeated beam size or alpha among the candidates."""
  for name, values in (("--beam_size", beams), ("--alpha", alphas)):
    if len(set(values)) < len(values):
      raise UserError(f"{name}={','.join(f'{v:g}' for v in values)} names a value twice; name"
                      " each candidate once.")


def _translator_for(workdir: Path, spec: str, translators: dict, beam_size: int, alpha: float,
                    batch_size: int | None) -> Translator:
  """The translator of one candidate search (made once per search, its program compiled once)
  holding the parameters of `spec`: read once per spec, then shared by every search's
  translator; an ensemble (`ensemble:N`) is another model, made anew."""
  first = next(iter(translators.values()), None)
  if first is None or "ensemble:" in spec + first.checkpoint:
    translators.clear()
    first = translators[beam_size, alpha] = Translator(
        workdir, spec, beam_size=beam_size, alpha=alpha, batch_size=batch_size)
  elif spec != first.checkpoint:
    first.load_checkpoint(spec)
  if (beam_size, alpha) not in translators:
    translators[beam_size, alpha] = first.with_search(beam_size, alpha=alpha)
  translator = translators[beam_size, alpha]
  translator.params, translator.steps, translator.checkpoint = (
      first.params, first.steps, first.checkpoint)
  return translator


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
                   search_tag(beam_size, alpha) + _matmul_tag(matmul_dtype), reference)
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
  (`search_tag`, and its `_matmul_tag`), the checkpoint tagged with the `ensemble`'s members, and
  set apart from another reference's scores of the same source (`_apart`) where `reference`
  names one."""
  tag = checkpoint + (f".ensemble{len(ensemble) + 1}-{_members_id(ensemble)}" if ensemble else "")
  prefix = output_prefix(directory, name, tag, search)
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
