"""Scores with sacreBLEU (BLEU, case-insensitive BLEU, chrF, TER, each with its signature),
and the files of an evaluation: detokenized hypotheses and a JSON of scores."""

import json
import time
from collections.abc import Sequence
from pathlib import Path

import sacrebleu

from seq2seq.data.textio import write_atomically, write_lines


def bleu(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> dict:
  """sacreBLEU corpus BLEU against one reference per sentence, with its signature (`lowercase`:
  case-insensitive, under the keys `bleu_lowercase` and `bleu_lowercase_signature`)."""
  metric = sacrebleu.metrics.BLEU(lowercase=lowercase)
  score = metric.corpus_score(list(hypotheses), [list(references)])
  name = "bleu_lowercase" if lowercase else "bleu"
  return {name: score.score, f"{name}_signature": str(metric.get_signature())}


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """sacreBLEU corpus chrF against one reference per sentence."""
  return sacrebleu.metrics.CHRF().corpus_score(list(hypotheses), [list(references)]).score


def scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
  """BLEU, case-insensitive BLEU, chrF and TER, each with its sacreBLEU signature."""
  refs = [list(references)]
  result = {**bleu(hypotheses, references), **bleu(hypotheses, references, lowercase=True)}
  for name, metric in (("chrf", sacrebleu.metrics.CHRF()), ("ter", sacrebleu.metrics.TER())):
    result[name] = metric.corpus_score(list(hypotheses), refs).score
    result[f"{name}_signature"] = str(metric.get_signature())
  return result


def output_files(prefix: Path) -> tuple[Path, Path]:
  """The hypotheses and scores files of an evaluation: `<prefix>.hyp`, `<prefix>.json`."""
  return Path(f"{prefix}.hyp"), Path(f"{prefix}.json")


def evaluate_split(translator, sources: Sequence[str], references: Sequence[str],
                   out_prefix: Path, checkpoint: str | None = None,
                   extra: dict | None = None) -> dict:
  """Translates with `translator` (a `translator.Translator`), scores, and writes
  `<out_prefix>.hyp` and `<out_prefix>.json` (with the scores `extra` beside the others, such
  as the alignment error rate).

  `checkpoint` is the spec as the user gave it (default: the translator's); where it named
  another (`selected`), the JSON records both, as `checkpoint` and `selected_checkpoint`.
  """
  start = time.perf_counter()
  hypotheses = [nbest[0][0] for nbest in translator.translate(sources)]
  seconds = time.perf_counter() - start
  result = {
      **scores(hypotheses, references), **(extra or {}),
      "sentences": len(sources), "checkpoint": checkpoint or translator.checkpoint,
      **({"selected_checkpoint": translator.checkpoint}
         if checkpoint and checkpoint != translator.checkpoint else {}),
      "checkpoint_steps": translator.steps, "beam_size": translator.beam_size,
      "alpha": translator.alpha,
      # The inputs' dtype of its dense products (`--matmul_dtype`); a stand-in has none.
      "matmul_dtype": getattr(translator, "matmul_dtype", "float32"), "decode_seconds": seconds,
      "sentences_per_second": len(sources) / seconds,
  }
  out_prefix.parent.mkdir(parents=True, exist_ok=True)
  hyp_path, json_path = output_files(out_prefix)
  write_lines(hyp_path, hypotheses)
  write_atomically(json_path, json.dumps(result, indent=2) + "\n")
  return result
