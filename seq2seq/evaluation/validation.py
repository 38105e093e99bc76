"""What evaluation does while a run trains: its validation's scores (`scores`), and the
search that seq2seq-evaluate and -translate will compile for the run, compiled ahead so that
the persistent cache holds it when they run (`evaluation_search`, `compile_for_cache`)."""

import math
from collections.abc import Callable, Sequence

import jax
import numpy as np

from seq2seq.decoding import translator
from seq2seq.evaluation.scores import bleu
from seq2seq.runtime import compiling


def scores(batches: Sequence[dict], loss_sums: Callable[[dict], dict],
           search: Callable[[dict], np.ndarray], decode_ids: Callable[[np.ndarray], str],
           references: Sequence[str]) -> dict:
  """The validation loss, its perplexity and the sacreBLEU of the translations of `batches`
  (`batching.eval_batches` of the split whose targets are `references`), with the first
  translation as an example. `loss_sums(batch)`: the batch's summed NLL and target tokens
  ({"nll", "tokens"}); `search(batch)`: its output ids (`translator.translate_batches`)."""
  sums = {"nll": 0.0, "tokens": 0.0}
  for batch in batches:
    out = loss_sums(batch)
    sums = {k: sums[k] + float(out[k]) for k in sums}
  loss = sums["nll"] / max(sums["tokens"], 1.0)
  hypotheses = translator.translate_batches(search, batches, decode_ids, len(references))
  return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), **bleu(hypotheses, references),
          "example": hypotheses[0]}


def evaluation_search(graphdef, config) -> compiling.Programs:
  """The search programs seq2seq-evaluate and -translate compile for a run at its test beam
  (config.eval.test_beam_size; it compiles nothing where that is 0)."""
  strategy = translator.search_strategy(max(config.eval.test_beam_size, 1), config.eval.alpha)
  return translator.search_programs(graphdef, config, strategy, name="evaluation search")


def compile_for_cache(programs: compiling.Programs, config, params) -> None:
  """Starts compiling `programs` (`evaluation_search`) in the background for the grid's
  sources, only to fill the persistent cache: where there is one (process 0 writes it) and
  config.eval.test_beam_size asks for them. `params`: the parameters' shapes."""
  if (config.eval.test_beam_size and jax.process_index() == 0
      and jax.config.jax_compilation_cache_dir):
    params = compiling.shapes(params)
    for src in translator.grid_sources(config, config.eval.batch_size):
      programs.add(params, src, background=True)
