"""Translate a split and score it with sacreBLEU (BLEU with its signature)."""

from collections.abc import Callable, Sequence

import numpy as np
import sacrebleu


def translate_batches(translate_fn: Callable[[dict], np.ndarray], batches: Sequence[dict],
                      decode_ids: Callable[[np.ndarray], str], num_sentences: int) -> list[str]:
  """Decodes every batch and returns detokenized hypotheses in the split's order.

  Args:
    translate_fn: `batch -> [batch_size, max_len]` output ids (host numpy).
    batches: from `batching.eval_batches`; each has an `index` row map.
    decode_ids: ids -> detokenized text (stops at EOS).
    num_sentences: size of the split.
  """
  hypotheses: list[str | None] = [None] * num_sentences
  for batch in batches:
    ids = translate_fn(batch)
    for row, index in enumerate(batch["index"]):
      if index >= 0:
        hypotheses[index] = decode_ids(ids[row])
  missing = [i for i, h in enumerate(hypotheses) if h is None]
  assert not missing, f"sentences {missing[:5]} were not translated"
  return hypotheses


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
  """sacreBLEU corpus BLEU against one reference per sentence, with its signature."""
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return {"bleu": score.score, "bleu_signature": str(metric.get_signature())}
