"""The trainer: what a run needs, built once from its config, and its validation.

Construction goes job by job: the text, the tokenizer, the device mesh and shardings, the
batches, the initial train state (its shapes and shardings) and the jitted programs.
Batches and dropout keys are functions of the step, so a resumed run sees exactly what the
uninterrupted run would have.
"""

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from seq2seq.data import batching, corpus, tokenizer
from seq2seq.decoding import translator
from seq2seq.errors import UserError
from seq2seq.evaluation import scores
from seq2seq.models import build_model
from seq2seq.runs import workdirs
from seq2seq.runs.train_state import TrainState, make_optimizer, new_train_state
from seq2seq.runtime import compiling
from seq2seq.training import distributed, steps

VOCAB_SEED = 0  # Seeds SentencePiece: runs that differ in train.seed share a vocabulary.


def _read_text(config: ml_collections.ConfigDict) -> tuple[corpus.ParallelText,
                                                           corpus.ParallelText]:
  """The training pairs (the first data.max_train_examples if set) and the validation pairs
  (the first eval.max_sentences if set)."""
  train_text = corpus.read_split(config.data, "train")
  val_text = corpus.read_split(config.data, config.eval.split)
  if config.eval.max_sentences:
    n = config.eval.max_sentences
    val_text = corpus.ParallelText(val_text.src[:n], val_text.tgt[:n])
  return train_text, val_text


def _load_tokenizer(workdir: Path, train_text: corpus.ParallelText, config):
  """Trains the run's SentencePiece model once (process 0), or copies the one of
  `config.data.vocab_from`; then every process loads it."""
  if jax.process_index() == 0:
    if config.data.vocab_from and not (workdir / workdirs.VOCAB).is_file():
      _check_vocab_from(Path(config.data.vocab_from), config.data.vocab_size)
      workdirs.copy_vocabulary(Path(config.data.vocab_from), workdir)
    tok = tokenizer.load_or_train(workdir / workdirs.VOCAB, lambda: train_text.src + train_text.tgt,
                                  config.data.vocab_size, seed=VOCAB_SEED)
  multihost_utils.sync_global_devices("tokenizer")
  return tok if jax.process_index() == 0 else tokenizer.Tokenizer.load(workdir / workdirs.VOCAB)


def _check_vocab_from(source: Path, vocab_size: int) -> None:
  """Raises `UserError` if the run `source` (config.data.vocab_from) trained its vocabulary at
  another config.data.vocab_size than this run's, which config.json would then misstate."""
  if not (source / workdirs.CONFIG).is_file():
    return  # workdirs.copy_vocabulary says what is missing.
  size = workdirs.read_run_config(source).data.vocab_size
  if size != vocab_size:
    raise UserError(f"config.data.vocab_from={source} holds a vocabulary of"
                    f" config.data.vocab_size={size}, not this run's {vocab_size}; pass"
                    f" --config.data.vocab_size={size}, or drop vocab_from to train one of"
                    f" {vocab_size}.")


def _sharded_size(abstract_params, params_sharding) -> int:
  """How many parameters FSDP splits (those not replicated)."""
  return sum(x.size for x, sharding in zip(jax.tree.leaves(abstract_params),
                                           jax.tree.leaves(params_sharding), strict=True)
             if sharding.spec != P())


def _with_shardings(abstract, shardings):
  """`abstract`'s ShapeDtypeStructs, placed by `shardings`."""
  return jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                               sharding=sharding),
                      abstract, shardings)


def _stacked(*trees):
  """Pytrees of one structure (a seed group's members' states) stacked on a new leading
  axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _stack(batches: list[dict]) -> dict:
  """Batches (dicts of equal-shaped arrays) stacked on a new leading axis."""
  return {key: np.stack([b[key] for b in batches]) for key in batches[0]}


class Trainer:
  """Everything a run needs, built once: data, model, compiled steps, mesh.

  With `seeds`, one program trains a run per seed (a seed group): the train state, the
  batches and the dropout keys gain a leading axis of members (`jax.vmap`), and member i
  has the initialization, dropout and batches of the run whose config.train.seed is
  seeds[i] (`member_state` reads its state out). Validation and the evaluation commands'
  programs are those of one member.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: Path,
               seeds: Sequence[int] | None = None):
    self.config = config
    self.seeds = tuple(seeds) if seeds is not None else None
    train_text, self.val_text = _read_text(config)
    self.tokenizer = _load_tokenizer(workdir, train_text, config)
    self.mesh = distributed.make_mesh(config.train.fsdp)
    self.replicated = NamedSharding(self.mesh, P())
    self.data_sharding = distributed.batch_sharding(self.mesh)
    members = (None,) if self.seeds else ()  # The leading axis of a seed group's arrays.
    # One step's batch (`[rows, L]`, a group's `[members, rows, L]`), and k stacked
    # (`steps_per_call`): each batch's rows split as one's.
    self.step_sharding = NamedSharding(self.mesh, P(*members, *self.data_sharding.spec))
    self.stacked_sharding = NamedSharding(self.mesh, P(*members, None,
                                                       *self.data_sharding.spec))
    self._make_batches(train_text)
    self._make_programs(*self._make_state())

  def _make_batches(self, train_text: corpus.ParallelText) -> None:
    """The training batches (this process's rows of each) and the validation batches."""
    config, d = self.config, self.config.data
    src, tgt = batching.encode_pairs(self.tokenizer, train_text)
    first, *others = self.seeds or [config.train.seed]
    self.train_batches = batching.TrainBatches(
        src, tgt, tokens_per_batch=d.tokens_per_batch, max_len=d.max_len,
        bucket_step=d.bucket_step, seed=first,
        row_multiple=config.train.grad_accum_steps,
        pad_rows_to=jax.device_count() * config.train.grad_accum_steps,
        process_index=jax.process_index(), process_count=jax.process_count(), pack=d.pack,
        num_buckets=d.num_buckets)
    # A seed group's members: batches of one shape at every step (`TrainBatches._plan`).
    self.member_batches = [self.train_batches, *map(self.train_batches.reseeded, others)]
    if config.eval.batch_size % jax.device_count():
      raise UserError(f"config.eval.batch_size={config.eval.batch_size} is not divisible by the"
                      f" {jax.device_count()} devices; use a multiple of {jax.device_count()}.")
    val_src, val_tgt = batching.encode_pairs(self.tokenizer, self.val_text)
    self.val_batches = batching.eval_batches(val_src, val_tgt, batch_size=config.eval.batch_size,
                                             max_len=config.model.max_len)

  def _make_state(self):
    """The initial train state's program, shapes and shardings (parameters split by
    `distributed.fsdp_sharding`); returns the shardings of the train state (a seed group's:
    stacked) and of one run's."""
    config, vocab_size = self.config, self.tokenizer.vocab_size
    self.optimizer = make_optimizer(config.train)

    def init(seed=config.train.seed) -> TrainState:  # A seed group's: its key.
      return new_train_state(nnx.split(build_model(config, vocab_size, seed=seed),
                                       nnx.Param)[1], self.optimizer)

    # Initialized inside jit, straight into its shardings: every process computes the
    # same values, and no host ever holds an unsharded copy.
    abstract = jax.eval_shape(init)
    self.graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(config, vocab_size)),
                                 nnx.Param)
    member_sharding = jax.tree.map(functools.partial(distributed.fsdp_sharding, self.mesh),
                                   abstract)
    self.num_params = sum(x.size for x in jax.tree.leaves(abstract.params))
    self.num_sharded_params = _sharded_size(abstract.params, member_sharding.params)
    self.member_abstract = _with_shardings(abstract, member_sharding)  # One run's.
    if self.seeds is None:
      self.dropout_key = jax.jit(lambda: jax.random.key(config.train.seed),
                                 out_shardings=self.replicated)()
      self.init_state = jax.jit(init, out_shardings=member_sharding)
      self.abstract_state = self.member_abstract
      return member_sharding, member_sharding
    # A seed group: every array gains the members' axis, first and never split.
    seeds = jnp.asarray(self.seeds, jnp.int32)
    state_sharding = jax.tree.map(
        lambda s: NamedSharding(self.mesh, P(None, *s.spec)), member_sharding)
    self.dropout_key = jax.jit(lambda: jax.vmap(jax.random.key)(seeds),
                               out_shardings=self.replicated)()
    # The members one after another inside the program, not vmapped: XLA:CPU (jaxlib 0.10.2)
    # never finished the vmapped initialization of the RNN recipe's group (it waited forever).
    self.init_state = jax.jit(
        lambda: _stacked(*[init(jax.random.key(seed)) for seed in self.seeds]),
        out_shardings=state_sharding)
    self.abstract_state = _with_shardings(jax.eval_shape(self.init_state), state_sharding)
    self._member = jax.jit(lambda state, i: jax.tree.map(lambda x: x[i], state),
                           out_shardings=member_sharding)
    self._stack = jax.jit(_stacked, out_shardings=state_sharding)
    return state_sharding, member_sharding

  def _make_programs(self, state_sharding, member_sharding) -> None:
    """The jitted train step, validation loss and validation search, and the evaluation
    commands' search (`translator.search_programs`), compiled by `compile`."""
    config, params_sharding = self.config, member_sharding.params  # Validation's: one run's.
    train_options = compiling.compiler_options(config.compile.train_options)
    eval_options = compiling.compiler_options(config.compile.eval_options)
    threads = config.compile.threads
    # Compiled ahead (`compile`) for the shapes of the run's batches: told apart by them.
    by_batch_shape = lambda params_or_state, batch, *_: batch["src"].shape  # noqa: E731
    step_args = dict(graphdef=self.graphdef, optimizer=self.optimizer, train=config.train)
    # A seed group's members train side by side: the same step, vmapped over them.
    members = jax.vmap if self.seeds else lambda f: f
    of_seeds = f" of {len(self.seeds)} seeds" if self.seeds else ""
    self.train_step = compiling.Programs(f"train step{of_seeds}", jax.jit(
        members(functools.partial(steps.train_step, **step_args)),
        in_shardings=(state_sharding, self.step_sharding, self.replicated),
        out_shardings=(state_sharding, self.replicated), donate_argnums=0), by_batch_shape,
        plural=f"train steps{of_seeds}", options=train_options, threads=threads)
    k = config.train.steps_per_call  # k stacked batches: a call of k steps.
    self.train_call = compiling.Programs(f"{k}-step train call{of_seeds}", jax.jit(
        members(functools.partial(steps.train_steps, **step_args)),
        in_shardings=(state_sharding, self.stacked_sharding, self.replicated),
        out_shardings=(state_sharding, self.replicated), donate_argnums=0),
        lambda state, batches, *_: batches["src"].shape,
        plural=f"{k}-step train calls{of_seeds}", options=train_options, threads=threads)
    self.eval_step = compiling.Programs("validation loss", jax.jit(
        functools.partial(steps.eval_step, graphdef=self.graphdef),
        in_shardings=(params_sharding, self.data_sharding), out_shardings=self.replicated),
        by_batch_shape, plural="validation losses", options=eval_options, threads=threads)
    self.translate_step = translator.search_programs(
        self.graphdef, config, translator.search_strategy(config.eval.beam_size, config.eval.alpha),
        name="validation search", jit=dict(in_shardings=(params_sharding, self.data_sharding),
                                           out_shardings=self.data_sharding))
    # The programs seq2seq-evaluate and -translate compile for this run at its test beam:
    # compiled here only to fill the persistent cache (written by process 0).
    self.evaluation_search = translator.search_programs(
        self.graphdef, config, translator.search_strategy(max(config.eval.test_beam_size, 1),
                                                          config.eval.alpha),
        name="evaluation search")  # Compiles nothing where test_beam_size is 0.

  def compile(self) -> None:
    """Compiles the train step for each batch shape (`compiling`), or with
    config.train.steps_per_call k > 1 the call of k steps (and, in the background, the single
    step, for the steps before an action that a call of k would pass); `compile_background`
    compiles the rest."""
    processes, k = jax.process_count(), self.config.train.steps_per_call
    members = (len(self.seeds),) if self.seeds else ()
    for rows, length in self.train_batches.shapes:  # This process's rows of each batch.
      shape = (*members, rows * processes, length)
      batch = {key: jax.ShapeDtypeStruct(shape, np.int32, sharding=self.step_sharding)
               for key in self.train_batches.keys}
      self.train_step.add(self.abstract_state, batch, self.dropout_key, background=k > 1)
      if k > 1:
        stacked = {key: jax.ShapeDtypeStruct((*members, k, *shape[len(members):]), np.int32,
                                             sharding=self.stacked_sharding)
                   for key in batch}
        self.train_call.add(self.abstract_state, stacked, self.dropout_key)

  def call_size(self, step: int, boundary: int) -> int:
    """How many steps the call from `step` runs: config.train.steps_per_call if they stay
    within `boundary` (`LoopActions.next_boundary`) and their batches share one shape, else 1."""
    k = self.config.train.steps_per_call
    if k == 1 or step + k > boundary:
      return 1
    return k if len({self.train_batches.length(step + i) for i in range(k)}) == 1 else 1

  def train(self, state: TrainState, step: int, size: int):
    """Dispatches the call of `size` steps from `step` (`call_size`): (state, metrics)."""
    def batches(member: batching.TrainBatches) -> dict:
      return member(step) if size == 1 else _stack([member(step + i) for i in range(size)])

    local = [batches(member) for member in self.member_batches]
    local = _stack(local) if self.seeds else local[0]
    if size == 1:
      return self.train_step(state, self.to_device(local, self.step_sharding), self.dropout_key)
    return self.train_call(state, self.to_device(local, self.stacked_sharding),
                           self.dropout_key)

  def member_state(self, state: TrainState, i: int) -> TrainState:
    """Member i's train state (a seed group's), or the run's `state` itself."""
    return self._member(state, i) if self.seeds else state

  def group_state(self, states: Sequence[TrainState]) -> TrainState:
    """A seed group's state from its members' (`member_state`'s inverse)."""
    return self._stack(*states)

  @property
  def train_programs(self) -> list[compiling.Programs]:
    """The programs step 1 may need: the train steps, or the calls of several."""
    return [self.train_call] if self.config.train.steps_per_call > 1 else [self.train_step]

  def compile_background(self) -> None:
    """Starts compiling, in the background, the validation loss and search for each of the
    split's shapes, and the evaluation commands' searches on the grid (where a persistent
    cache keeps them, and config.eval.test_beam_size asks for them)."""
    for batch in self.val_batches:
      batch = {k: self._spec(v.shape) for k, v in batch.items() if k != "index"}
      self.eval_step.add(self.member_abstract.params, batch, background=True)
      self.translate_step.add(self.member_abstract.params, batch["src"], background=True)
    if (self.config.eval.test_beam_size and jax.process_index() == 0
        and jax.config.jax_compilation_cache_dir):
      params = compiling.shapes(self.member_abstract.params)
      for src in translator.grid_sources(self.config, self.config.eval.batch_size):
        self.evaluation_search.add(params, src, background=True)

  def _spec(self, shape) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, np.int32, sharding=self.data_sharding)

  @property
  def validation_programs(self) -> list[compiling.Programs]:
    return [self.eval_step, self.translate_step]

  @property
  def background_programs(self) -> list[compiling.Programs]:
    single = [self.train_step] if self.config.train.steps_per_call > 1 else []
    return [*single, *self.validation_programs, self.evaluation_search]

  def new_state(self) -> TrainState:
    return self.init_state()

  def to_device(self, local_batch: dict, sharding: NamedSharding | None = None) -> dict:
    """Process-local numpy rows -> global arrays sharded along the `data` axis (or as
    `sharding` says: `stacked_sharding` for k stacked batches)."""
    return {k: jax.make_array_from_process_local_data(sharding or self.data_sharding, v)
            for k, v in local_batch.items() if k != "index"}

  def _local_rows(self, batch: dict) -> dict:
    """This process's contiguous share of a global (every-process-identical) batch."""
    p, n = jax.process_index(), jax.process_count()
    rows = len(batch["src"]) // n
    return {k: v[p * rows:(p + 1) * rows] for k, v in batch.items()}

  def evaluate(self, params) -> dict:
    """Validation loss/perplexity and sacreBLEU of the configured search."""
    sums = {"nll": 0.0, "tokens": 0.0}
    for batch in self.val_batches:
      out = self.eval_step(params, self.to_device(self._local_rows(batch)))
      sums = {k: sums[k] + float(out[k]) for k in sums}
    loss = sums["nll"] / max(sums["tokens"], 1.0)

    def translate(batch):
      ids, _ = self.translate_step(params, self.to_device(self._local_rows(batch))["src"])
      return np.asarray(multihost_utils.process_allgather(ids[:, 0], tiled=True))

    hypotheses = translator.translate_batches(translate, self.val_batches, self.tokenizer.decode,
                                            len(self.val_text))
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
            **scores.bleu(hypotheses, self.val_text.tgt),
            "example": hypotheses[0]}
