"""Translating with a run: `Translator` loads what a workdir holds (config, vocabulary, a
checkpoint, an average of several, or an ensemble) and translates text with greedy search,
beam search or sampling, compiled once per source shape."""

import copy
import functools
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seq2seq.data import batching
from seq2seq.data.special_ids import EOS_ID, PAD_ID, UNK_ID
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.tokenizer import fingerprint as tokenizer_fingerprint
from seq2seq.decoding import search
from seq2seq.decoding.ensemble import Ensemble, stack
from seq2seq.decoding.members import ensemble_members
from seq2seq.errors import UserError
from seq2seq.models import build_model, cast_kernels, check_matmul_dtype
from seq2seq.runs import workdirs
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.selection import restore_params, selected_checkpoint
from seq2seq.runtime import compiling

log = logging.getLogger("seq2seq")


def translate_batches(search: Callable[[dict], np.ndarray], batches: Sequence[dict],
                      decode_ids: Callable[[np.ndarray], str], num_sentences: int) -> list[str]:
  """Decodes every batch and returns detokenized hypotheses in the split's order.

  Args:
    search: `batch -> [batch_size, max_len]` output ids (host numpy).
    batches: from `batching.eval_batches`; each has an `index` row map.
    decode_ids: ids -> detokenized text (stops at EOS).
    num_sentences: size of the split.
  """
  hypotheses: list[str | None] = [None] * num_sentences
  for batch in batches:
    ids = search(batch)
    for row, index in enumerate(batch["index"]):
      if index >= 0:
        hypotheses[index] = decode_ids(ids[row])
  missing = [i for i, h in enumerate(hypotheses) if h is None]
  assert not missing, f"sentences {missing[:5]} were not translated"
  return hypotheses


def search_strategy(beam_size: int, alpha: float, nbest: int = 1, *,
                    sample_seed: int | None = None, temperature: float = 1.0,
                    top_k: int = 0) -> search.Strategy:
  """The strategy the search flags (and config.eval's beam_size and alpha) name: sampling
  when a seed is given, greedy for one beam and one hypothesis, beam search otherwise."""
  if sample_seed is not None:
    return search.Sampling(sample_seed, temperature, top_k, alpha)
  if beam_size == 1 and nbest == 1:
    return search.Greedy(alpha)
  return search.Beam(beam_size, alpha, nbest)


def search_fn(params, src, seed=None, *, graphdef, strategy: search.Strategy, max_len_a: float,
              max_len_b: int, max_len_limit: int):
  """The search of a model given as `nnx.split` state: `src [batch, src_len]` ->
  (ids `[batch, nbest, max_len]`, scores `[batch, nbest]`), max_len from the source length;
  `seed`: sampling's (`search_arguments`), in place of `strategy.seed`."""
  # An ensemble's graphdef is a tuple, one per architecture (`ensemble.Ensemble`).
  model = (Ensemble(graphdef, params) if isinstance(graphdef, tuple)
           else nnx.merge(graphdef, params))
  max_len = search.max_decode_len(src.shape[1], max_len_a, max_len_b, max_len_limit)
  caps = jnp.minimum(search.decode_caps(src, max_len_a, max_len_b, max_len_limit), max_len)
  return search.generate(model, src, strategy, max_len=max_len, caps=caps, seed=seed)


def search_arguments(strategy: search.Strategy) -> tuple:
  """What a search program takes after `(params, src)`: sampling's seed, as a uint32 (which keys
  the draws as the seed itself would, any int), so that one compiled program samples with
  every seed (a seed baked in compiled a program per --seed: 14-16 s, against 4 from the
  persistent cache); nothing for the other strategies."""
  if isinstance(strategy, search.Sampling):
    return (np.uint32(strategy.seed % 2**32),)
  return ()


def search_programs(graphdef, config, strategy: search.Strategy, *, name: str = "search",
                    jit: dict | None = None) -> compiling.Programs:
  """`search_fn` of `strategy` for a run's model and config.eval's decoding lengths, jitted
  (with `jit`'s options) and compiled per source shape with config.compile's evaluation
  options: `(params, src, *search_arguments(strategy)) -> (ids, scores)`."""
  e = config.eval
  fn = functools.partial(search_fn, graphdef=graphdef, strategy=strategy,
                         max_len_a=e.max_decode_len_a, max_len_b=e.max_decode_len_b,
                         max_len_limit=config.model.max_len)
  return compiling.Programs(name, jax.jit(fn, **(jit or {})), lambda params, src, *_: src.shape,
                            plural=name.replace("search", "searches"),
                            options=compiling.compiler_options(config.compile.eval_options),
                            threads=config.compile.threads)


def grid_sources(config, rows: int, longest: int | None = None) -> list[jax.ShapeDtypeStruct]:
  """The source shapes of the searches that translate sentences up to `longest` tokens, EOS
  included (by default as long as the run's training pairs, config.data.max_len): `rows` by
  each grid length that holds them."""
  lengths = batching.grid_lengths_up_to(longest or config.data.max_len, config.model.max_len)
  return [jax.ShapeDtypeStruct((rows, n), np.int32) for n in lengths]


def check_search(beam_size: int, alpha: float, batch_size: int | None = None,
                 nbest: int = 1) -> None:
  """Raises `UserError` for search settings out of range, named as the flags give them."""
  if beam_size < 1:
    raise UserError(f"--beam_size={beam_size} must be at least 1 (1: greedy search).")
  if search.nbest_problem(nbest, beam_size) is not None:
    raise UserError(f"--nbest={nbest} must be between 1 and --beam_size={beam_size}.")
  if not 0 <= alpha < math.inf:  # NaN fails this too.
    raise UserError(f"--alpha={alpha} must be a number, not negative (0: no length penalty;"
                    " 0.6 is usual).")
  if batch_size is not None and batch_size < 1:
    raise UserError(f"--batch_size={batch_size} must be at least 1 (sentences per batch).")


def _check_vocabulary(workdir: Path) -> Path:
  """The run's vocabulary file; `UserError` if it is missing."""
  vocab = workdir / workdirs.VOCAB
  if not vocab.is_file():
    raise UserError(f"{vocab} is missing: the run's checkpoints only work with the vocabulary"
                    " they were trained with; put it back from a copy of the run.")
  return vocab


def check_is_run(workdir: Path) -> None:
  if not (workdir / workdirs.CONFIG).exists():
    raise UserError(f"{workdir} is not a training run (no config.json); pass the --workdir"
                    " that seq2seq-train wrote.")


def check_candidates(workdir: Path, candidates: Sequence[str]) -> None:
  """Raises `UserError` unless every checkpoint spec of a list to choose from names
  checkpoints that `workdir` holds, each once: all are checked before any is decoded."""
  check_is_run(workdir)
  if any(not spec.strip() for spec in candidates) or len(set(candidates)) < len(candidates):
    raise UserError(f"--checkpoint={','.join(candidates)} has an empty or repeated entry; list"
                    " each candidate once, e.g. --checkpoint=best,avg:5,avg:10.")
  if "selected" in candidates:
    raise UserError("--checkpoint=selected is the choice among candidates, not one of them;"
                    " list the candidates, e.g. --checkpoint=best,avg:5,avg:10.")
  keep = workdirs.read_run_config(workdir).checkpoint.keep
  checkpoints = Checkpoints(workdir, keep)
  try:
    for spec in candidates:
      if spec.startswith("ensemble:"):
        ensemble_members(workdir, spec, (), keep)
      else:
        checkpoints.resolve(spec)
  finally:
    checkpoints.close()


class Hypothesis(NamedTuple):
  """A translation: its detokenized text, its score, and its output ids."""
  text: str
  score: float
  ids: np.ndarray


def _through_eos(ids: np.ndarray) -> np.ndarray:
  """Output ids up to and including EOS; where the search reached the sentence's cap first,
  up to the PAD that fills the rest of the batch's length (no search picks PAD)."""
  ends = np.flatnonzero((ids == EOS_ID) | (ids == PAD_ID))
  return ids[:ends[0] + int(ids[ends[0]] == EOS_ID)] if len(ends) else ids


class Translator:
  """A run's model and vocabulary, ready to translate.

  Args:
    workdir: a training run's directory.
    checkpoint: "best" (validation BLEU), "latest", a step, "avg:N", "selected", or
      "ensemble:N" (the last N checkpoints as an ensemble).
    beam_size, alpha, nbest: the search (beam 1 and nbest 1: greedy).
    batch_size: sentences per compiled batch (None: the run's config.eval.batch_size, the
      rows of every program the run compiled ahead).
    sample_seed, temperature, top_k: sample instead of searching when a seed is given.
      `search_strategy` turns these search arguments into `self.strategy`.
    ensemble: other runs decoding with `workdir`'s as one model (`seq2seq.decoding.ensemble`), each
      at the checkpoint `checkpoint` names for it; they must share its vocabulary.
    matmul_dtype: the inputs' dtype of the model's dense products (`models.build_model`).
  """

  def __init__(self, workdir: str | Path, checkpoint: str = "best", *, beam_size: int = 4,
               alpha: float = 0.6, nbest: int = 1, batch_size: int | None = None,
               sample_seed: int | None = None, temperature: float = 1.0, top_k: int = 0,
               ensemble: Sequence[str | Path] = (), matmul_dtype: str = "float32"):
    workdir = Path(workdir)
    check_is_run(workdir)
    check_search(beam_size, alpha, batch_size, nbest)
    if sample_seed is not None and (nbest > 1 or not 0 < temperature < math.inf or top_k < 0):
      raise UserError("Sampling takes --nbest=1, --temperature > 0 and --top_k >= 0"
                      f" (got {nbest}, {temperature}, {top_k}).")
    self.config = workdirs.read_run_config(workdir)
    compiling.check_options(self.config, ("eval_options",))  # Its searches compile with them.
    self.strategy = search_strategy(beam_size, alpha, nbest, sample_seed=sample_seed,
                                    temperature=temperature, top_k=top_k)
    self.batch_size = batch_size or self.config.eval.batch_size
    self.workdir, self.nbest, self.matmul_dtype = workdir, nbest, matmul_dtype
    self.beam_size, self.alpha = beam_size, alpha
    members = ensemble_members(workdir, checkpoint, ensemble, self.config.checkpoint.keep)
    if members is not None:
      self._init_ensemble(checkpoint, members)
      return
    if checkpoint == "selected":
      checkpoint = selected_checkpoint(workdir)
    checkpoints = Checkpoints(workdir, self.config.checkpoint.keep)
    try:
      checkpoints.resolve(checkpoint)  # No checkpoint: say so before anything else.
    finally:
      checkpoints.close()
    self.tokenizer = Tokenizer.load(_check_vocabulary(workdir))
    # Shapes only: the checkpoint's parameters are the first values (nothing to initialize).
    model = nnx.eval_shape(lambda: build_model(self.config, self.tokenizer.vocab_size,
                                               matmul_dtype=matmul_dtype))
    self.graphdef, self._params_like = nnx.split(model, nnx.Param)
    self.load_checkpoint(checkpoint)
    self._search = search_programs(self.graphdef, self.config, self.strategy)

  def _init_ensemble(self, checkpoint: str, members: list[tuple[Path, str]]) -> None:
    """`__init__` for several members: checks them all (runs, one vocabulary) before any
    checkpoint is read, then loads and stacks their parameters by architecture."""
    workdir = self.workdir
    vocab = _check_vocabulary(workdir)
    fingerprint = tokenizer_fingerprint(vocab)
    configs = []
    for member, _ in members:
      if not (member / workdirs.CONFIG).is_file():
        raise UserError(f"--ensemble: {member} is not a training run (no config.json); pass the"
                        " --workdir of runs that seq2seq-train wrote.")
      if tokenizer_fingerprint(member / workdirs.VOCAB) != fingerprint:
        raise UserError(f"--ensemble: {member / workdirs.VOCAB} is not the vocabulary of {workdir}"
                        " (an ensemble averages the members' probabilities of the same tokens);"
                        " ensemble runs of one vocabulary, such as runs that differ only in"
                        " config.train.seed.")
      configs.append(workdirs.read_run_config(member))
      check_matmul_dtype(configs[-1], self.matmul_dtype)
      direction = lambda c: f"{c.data.src_lang}->{c.data.tgt_lang}"  # noqa: E731
      if direction(configs[-1]) != direction(self.config):
        raise UserError(f"--ensemble: {member} translates {direction(configs[-1])} but {workdir}"
                        f" translates {direction(self.config)}; ensemble runs of one direction.")
    self.tokenizer = Tokenizer.load(vocab)
    self.checkpoint = checkpoint
    groups: dict[str, tuple] = {}  # Architecture -> (graphdef, member params).
    self.steps = []
    for (member, spec), config in zip(members, configs, strict=True):
      if spec == "selected":
        spec = selected_checkpoint(member)
      graphdef, like = nnx.split(nnx.eval_shape(lambda c=config: build_model(
          c, self.tokenizer.vocab_size, matmul_dtype=self.matmul_dtype)), nnx.Param)
      steps, params = restore_params(member, spec, config, like)
      self.steps.append({"workdir": str(member), "checkpoint": spec, "steps": steps})
      architecture = json.dumps(config.model.to_dict(), sort_keys=True)
      groups.setdefault(architecture, (graphdef, []))[1].append(params)
    self.graphdef = tuple(graphdef for graphdef, _ in groups.values())
    self.params = tuple(cast_kernels(g, stack(p), self.matmul_dtype) for g, p in groups.values())
    self._search = search_programs(self.graphdef, self.config, self.strategy)

  def load_checkpoint(self, checkpoint: str, params_like=None) -> None:
    """Swaps in the parameters of `checkpoint` (the compiled search is kept; `cast_kernels`)."""
    self.steps, params = restore_params(self.workdir, checkpoint, self.config,
                                        self._params_like if params_like is None else params_like)
    self.params = cast_kernels(self.graphdef, params, self.matmul_dtype)
    self.checkpoint = checkpoint

  def search_ids(self, src_ids: list[np.ndarray]) -> list[list[tuple[np.ndarray, float]]]:
    """Searches every sentence (ids without EOS) in batches of `batch_size`, one compiled
    program per batch shape: per sentence, its n-best (output ids, score)."""
    results: list = [None] * len(src_ids)
    empty = [np.zeros(0, np.int32)] * len(src_ids)
    # Sentences of every length share a batch, each decoded to its own `search.decode_caps`.
    batches = batching.eval_batches(src_ids, empty, batch_size=self.batch_size,
                                    max_len=self.config.model.max_len)
    params = compiling.shapes(self.params)  # As the trainer compiled them ahead.
    arguments = search_arguments(self.strategy)
    for batch in batches:  # Every shape compiles at once, in parallel.
      self._search.add(params, jax.ShapeDtypeStruct(batch["src"].shape, np.int32),
                       *compiling.shapes(arguments))
    for batch in batches:
      ids, best = jax.device_get(self._search(self.params, jnp.asarray(batch["src"]),
                                              *arguments))
      for row, index in enumerate(batch["index"]):
        if index >= 0:
          results[index] = [(ids[row, n], float(best[row, n])) for n in range(self.nbest)]
    return results

  def translate(self, texts: Sequence[str]) -> list[list[tuple[str, float]]]:
    """Per input text, its n-best detokenized translations with scores.

    An empty (or whitespace-only) input is not fed to the model: its
    translation is the empty string.
    """
    return [[(h.text, h.score) for h in nbest] for nbest in self.hypotheses(texts)]

  def hypotheses(self, texts: Sequence[str]) -> list[list[Hypothesis]]:
    """`translate`, with the output ids of each hypothesis (up to EOS, which they include
    where the search reached it)."""
    todo = [i for i, text in enumerate(texts) if text.strip()]
    src_ids = [self.source_ids(texts[i]) for i in todo]
    longest = self.config.model.max_len - 1  # With EOS, a source fills model.max_len.
    cut = sum(len(ids) > longest for ids in src_ids)
    if cut:
      log.warning("%d of %d source lines are longer than %d subwords (config.model.max_len=%d"
                  " with EOS) and were cut to fit; their translations cover only the start.",
                  cut, len(texts), longest, self.config.model.max_len)
    unknown = [i for i, ids in zip(todo, src_ids, strict=True) if UNK_ID in ids]
    if unknown:
      text = texts[unknown[0]]
      example = next((c for c in text if UNK_ID in self.tokenizer.encode(c)), text)
      log.warning("%d of %d source lines hold characters the vocabulary does not know (such as"
                  " %r in line %d); the model reads them as unknown words, and its output"
                  " shows them as ⁇.", len(unknown), len(texts), example, unknown[0] + 1)
    translated = self.search_ids(src_ids)
    empty = Hypothesis("", 0.0, np.zeros(0, np.int32))
    results = [[empty] * self.nbest for _ in texts]
    for i, nbest in zip(todo, translated, strict=True):
      results[i] = [Hypothesis(self.tokenizer.decode(ids), score, _through_eos(ids))
                    for ids, score in nbest]
    return results

  def source_ids(self, text: str) -> np.ndarray:
    """The source subword ids of `text`, without EOS."""
    return np.asarray(self.tokenizer.encode(text), np.int32)

  def with_search(self, beam_size: int, nbest: int = 1, *,
                  alpha: float | None = None) -> "Translator":
    """This translator with another beam, n-best (and `alpha`, if given): the same parameters
    and vocabulary (not copied), its own search, compiled per source shape as this one's."""
    alpha = self.alpha if alpha is None else alpha
    check_search(beam_size, alpha, nbest=nbest)
    other = copy.copy(self)
    other.beam_size, other.nbest, other.alpha = beam_size, nbest, alpha
    other.strategy = search_strategy(beam_size, alpha, nbest)
    other._search = search_programs(self.graphdef, self.config, other.strategy)
    return other

  def compile_ahead(self, longest: int, *, background: bool = False) -> int:
    """Compiles the search for every batch of sources up to `longest` subwords (EOS included)
    at once, so that no translation of such sources compiles; returns the programs' count.
    With `background`, returns at once: the pool compiles them, shortest sources first, and a
    translation waits only for its own (`compiling.Programs`)."""
    params, arguments = compiling.shapes(self.params), search_arguments(self.strategy)
    for src in grid_sources(self.config, self.batch_size, longest):
      self._search.add(params, src, *compiling.shapes(arguments), background=background)
    if not background:
      self._search.wait()
    return len(self._search)

  def compiled(self) -> list[compiling.Compiled]:
    """Waits for every search program added so far; what each took."""
    return self._search.wait()
