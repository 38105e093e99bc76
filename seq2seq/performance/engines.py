"""Our translation against CTranslate2's (`seq2seq-benchmark --mode=ctranslate2 --workdir=RUN`):
sentences/s of `Translator`'s beam search and of the run exported to CTranslate2
(`decoding.deploy`) in float32 and int8 (its weights quantized as it loads them), on the
run's test sentences, at one sentence per batch and at the run's config.eval.batch_size.

Rounds are interleaved (ours, float32, int8, ours, ...) so that a busy machine slows each
alike; every engine translates once before the timed rounds (ours compiles then), and the
median round counts. Both rank by log-probability (alpha 0, CTranslate2's length penalty 0),
so they search alike; `equal_lines` is the share of CTranslate2's translations (float32) that
are ours.
"""

import statistics
import tempfile
import time
from pathlib import Path

from seq2seq.data import corpus
from seq2seq.decoding import deploy
from seq2seq.decoding.translator import Translator
from seq2seq.runs import workdirs

COMPUTE_TYPES = ("float32", "int8")


def _seconds(translate, sentences: list[str]) -> tuple[float, list[str]]:
  start = time.perf_counter()
  texts = translate(sentences)
  return time.perf_counter() - start, texts


def _engines(workdir: str | Path, checkpoint: str, exported: Path, *, beam: int, batch: int,
             threads: int) -> dict:
  """name -> `sentences -> translations`: ours, then CTranslate2 at each compute type."""
  ours = Translator(workdir, checkpoint, beam_size=beam, alpha=0.0, batch_size=batch)
  engines = {"ours": lambda texts: [nbest[0][0] for nbest in ours.translate(texts)]}
  for compute_type in COMPUTE_TYPES:
    theirs = deploy.CTranslate2Translator(exported, compute_type=compute_type,
                                          intra_threads=threads)
    engines[f"ctranslate2_{compute_type}"] = (
        lambda texts, theirs=theirs: [text for text, _ in theirs.translate(
            texts, beam_size=beam, batch_size=batch)])
  return engines


def ctranslate2_benchmark(workdir: str | Path, checkpoint: str = "best", *, beam: int = 4,
                          sentences: int = 200, rounds: int = 3, threads: int = 2) -> list[dict]:
  """One result per batch size (1, config.eval.batch_size): each engine's sentences/s (the
  median of `rounds` interleaved rounds over the first `sentences` non-empty test sentences),
  CTranslate2's speedups over ours, and how many of its lines are ours. `threads`:
  CTranslate2's intra_threads (ours uses the threads XLA takes)."""
  config = workdirs.read_run_config(Path(workdir))
  texts = [s for s in corpus.read_split(config.data, "test").src if s.strip()][:sentences]
  results = []
  with tempfile.TemporaryDirectory(prefix="seq2seq-ctranslate2-") as directory:
    exported = deploy.export(workdir, checkpoint, Path(directory) / "model")
    for batch in sorted({1, config.eval.batch_size}):
      engines = _engines(workdir, checkpoint, exported, beam=beam, batch=batch, threads=threads)
      outputs = {name: translate(texts) for name, translate in engines.items()}  # Warm-up.
      times = {name: [] for name in engines}
      for _ in range(rounds):
        for name, translate in engines.items():
          times[name].append(_seconds(translate, texts)[0])
      per_second = {name: len(texts) / statistics.median(t) for name, t in times.items()}
      result = {"mode": "ctranslate2", "batch": batch, "beam": beam, "sentences": len(texts),
                "rounds": rounds, "intra_threads": threads,
                **{f"{name}_sentences_per_s": round(v, 2) for name, v in per_second.items()}}
      for compute_type in COMPUTE_TYPES:
        name = f"ctranslate2_{compute_type}"
        result[f"{compute_type}_speedup"] = round(per_second[name] / per_second["ours"], 2)
      result["equal_lines"] = round(sum(a == b for a, b in zip(
          outputs["ours"], outputs["ctranslate2_float32"], strict=True)) / len(texts), 4)
      results.append(result)
  return results
