"""The trainer: what a run needs, built once from its config, job by job (the text, the
vocabulary, the device mesh, the batches, the initial train state and the jitted programs),
and its validation."""

import functools
from pathlib import Path

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from seq2seq.data import batching, corpus
from seq2seq.data.subword_sampling import SubwordSampler
from seq2seq.decoding import translator
from seq2seq.errors import UserError
from seq2seq.evaluation import validation
from seq2seq.models import build_model
from seq2seq.runs import vocabulary
from seq2seq.runs.train_state import TrainState, initial_state, make_optimizer
from seq2seq.runtime import compiling, distributed
from seq2seq.training import steps


class Trainer:
  """Everything a run needs, built once: data, model, compiled steps, mesh. The train
  programs' inputs are one run's; `seeds.SeedGroup` stacks several through the methods that
  make them (`_input_sharding`, `_input_shape`, `_local_input`, `_vectorized`,
  `_new_dropout_key`, `_make_state`)."""

  label = ""  # After the train programs' names: what they train, where that is not one run.
  # The step a new run starts at: 0, or its parent's where it keeps it (`parents.start`).
  start_step = 0

  def __init__(self, config: ml_collections.ConfigDict, workdir: Path):
    self.config = config
    # The training and validation pairs: the first data.max_train_examples, eval.max_sentences.
    train_text = corpus.read_split(config.data, "train")
    self.val_text = corpus.read_split(config.data, config.eval.split).first(
        config.eval.max_sentences)
    self.tokenizer = vocabulary.load(
        workdir, lambda: corpus.vocabulary_text(config.data, train_text), config)
    self.mesh = distributed.make_mesh(config.train.fsdp)
    self.replicated = NamedSharding(self.mesh, P())
    self.data_sharding = distributed.batch_sharding(self.mesh)
    # One step's batch (`[rows, L]`) and k stacked (`steps_per_call`): rows split as one's.
    self.step_sharding = self._input_sharding(*self.data_sharding.spec)
    self.stacked_sharding = self._input_sharding(None, *self.data_sharding.spec)
    self._make_batches(train_text)
    self._make_state()
    self._make_programs()

  def _input_sharding(self, *spec) -> NamedSharding:
    """How a train program's batch input, of arrays split as `spec`, lies on the mesh."""
    return NamedSharding(self.mesh, P(*spec))

  def _input_shape(self, *shape: int) -> tuple[int, ...]:
    """The global shape of a train program's batch input whose arrays are `shape`."""
    return shape

  def _local_input(self, step: int, size: int) -> dict:
    """This process's rows of the batch input of the call of `size` steps from `step`."""
    return self.train_batches.steps(step, size)

  def _vectorized(self, step_function):
    """The train step as the train programs run it."""
    return step_function

  def _make_batches(self, train_text: corpus.ParallelText) -> None:
    """The training batches (this process's rows of each) and the validation batches."""
    config, d = self.config, self.config.data
    src, tgt = batching.encode_pairs(self.tokenizer, train_text)
    self.train_batches = batching.TrainBatches(
        src, tgt, tokens_per_batch=d.tokens_per_batch, max_len=d.max_len,
        bucket_step=d.bucket_step, seed=config.train.seed,
        row_multiple=config.train.grad_accum_steps,
        pad_rows_to=jax.device_count() * config.train.grad_accum_steps,
        process_index=jax.process_index(), process_count=jax.process_count(), pack=d.pack,
        num_buckets=d.num_buckets,
        sampler=SubwordSampler.from_config(self.tokenizer, train_text, d))
    if config.eval.batch_size % jax.device_count():
      raise UserError(f"config.eval.batch_size={config.eval.batch_size} is not divisible by the"
                      f" {jax.device_count()} devices; use a multiple of {jax.device_count()}.")
    val_src, val_tgt = batching.encode_pairs(self.tokenizer, self.val_text)
    self.val_batches = batching.eval_batches(val_src, val_tgt, batch_size=config.eval.batch_size,
                                             max_len=config.model.max_len)

  def _make_state(self) -> None:
    """The initial train state's program, shapes and shardings (parameters split by
    `distributed.fsdp_sharding`), and the dropout key."""
    config, vocab_size = self.config, self.tokenizer.vocab_size
    self.optimizer = make_optimizer(config.train)
    # Initialized inside jit, straight into its shardings: every process computes the
    # same values, and no host ever holds an unsharded copy.
    abstract = jax.eval_shape(lambda: self._init(config.train.seed))
    self.graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(config, vocab_size)),
                                 nnx.Param)
    self.run_sharding = jax.tree.map(functools.partial(distributed.fsdp_sharding, self.mesh),
                                     abstract)
    self.num_params = sum(x.size for x in jax.tree.leaves(abstract.params))
    self.num_sharded_params = distributed.sharded_size(abstract.params, self.run_sharding.params)
    # One run's state: what validation and the checkpoints read (and, for one run, train).
    self.run_abstract = distributed.with_shardings(abstract, self.run_sharding)
    self.state_sharding, self.abstract_state = self.run_sharding, self.run_abstract
    self.dropout_key = jax.jit(self._new_dropout_key, out_shardings=self.replicated)()
    self.init_state = jax.jit(lambda: self._init(config.train.seed),
                              out_shardings=self.run_sharding)

  def _new_dropout_key(self):  # The train programs' (folded with each step inside them).
    return jax.random.key(self.config.train.seed)

  def _init(self, seed) -> TrainState:
    """A new train state: the model initialized from `seed` (an int, or a key)."""
    return initial_state(self.config, self.tokenizer.vocab_size, seed, self.optimizer)

  def _make_programs(self) -> None:
    """The jitted train step, validation loss and validation search, and the evaluation
    commands' search (`translator.search_programs`), compiled by `compile`."""
    config, params_sharding = self.config, self.run_sharding.params  # Validation's: one run's.
    train_options = compiling.compiler_options(config.compile.train_options)
    eval_options = compiling.compiler_options(config.compile.eval_options)
    threads = config.compile.threads
    # Compiled ahead (`compile`) for the shapes of the run's batches: told apart by them.
    by_batch_shape = lambda params_or_state, batch, *_: batch["src"].shape  # noqa: E731
    step_args = dict(graphdef=self.graphdef, optimizer=self.optimizer, train=config.train)

    def train_program(what: str, function, batch_sharding) -> compiling.Programs:
      return compiling.Programs(f"{what}{self.label}", jax.jit(
          self._vectorized(functools.partial(function, **step_args)),
          in_shardings=(self.state_sharding, batch_sharding, self.replicated),
          out_shardings=(self.state_sharding, self.replicated), donate_argnums=0),
          by_batch_shape, plural=f"{what}s{self.label}", options=train_options, threads=threads)

    self.train_step = train_program("train step", steps.train_step, self.step_sharding)
    k = config.train.steps_per_call  # k stacked batches: a call of k steps.
    self.train_call = train_program(f"{k}-step train call", steps.train_steps,
                                    self.stacked_sharding)
    self.eval_step = compiling.Programs("validation loss", jax.jit(
        functools.partial(steps.eval_step, graphdef=self.graphdef),
        in_shardings=(params_sharding, self.data_sharding), out_shardings=self.replicated),
        by_batch_shape, plural="validation losses", options=eval_options, threads=threads)
    self.translate_step = translator.search_programs(
        self.graphdef, config, translator.search_strategy(config.eval.beam_size, config.eval.alpha),
        name="validation search", jit=dict(in_shardings=(params_sharding, self.data_sharding),
                                           out_shardings=self.data_sharding))
    # Compiled here only to fill the persistent cache (`validation.compile_for_cache`).
    self.evaluation_search = validation.evaluation_search(self.graphdef, config)

  def compile(self) -> None:
    """Compiles the train step for each batch shape (`compiling`), or with
    config.train.steps_per_call k > 1 the call of k steps (and, in the background, the single
    step, for the steps before an action that a call of k would pass); `compile_background`
    compiles the rest."""
    processes, k = jax.process_count(), self.config.train.steps_per_call

    def batch(shape, sharding):
      return {key: jax.ShapeDtypeStruct(self._input_shape(*shape), np.int32, sharding=sharding)
              for key in self.train_batches.keys}

    for rows, length in self.train_batches.shapes:  # This process's rows of each batch.
      shape = (rows * processes, length)
      self.train_step.add(self.abstract_state, batch(shape, self.step_sharding),
                          self.dropout_key, background=k > 1)
      if k > 1:
        self.train_call.add(self.abstract_state, batch((k, *shape), self.stacked_sharding),
                            self.dropout_key)

  def call_size(self, step: int, boundary: int) -> int:
    """How many steps the call from `step` runs: config.train.steps_per_call if they stay
    within `boundary` (`LoopActions.next_boundary`) and their batches share one shape, else 1."""
    k = self.config.train.steps_per_call
    if k == 1 or step + k > boundary:
      return 1
    return k if len({self.train_batches.length(step + i) for i in range(k)}) == 1 else 1

  def train(self, state: TrainState, step: int, size: int):
    """Dispatches the call of `size` steps from `step` (`call_size`): (state, metrics)."""
    program, sharding = ((self.train_step, self.step_sharding) if size == 1
                         else (self.train_call, self.stacked_sharding))
    return program(state, self.to_device(self._local_input(step, size), sharding),
                   self.dropout_key)

  @property
  def train_programs(self) -> list[compiling.Programs]:
    """The programs step 1 may need: the train steps, or the calls of several."""
    return [self.train_call] if self.config.train.steps_per_call > 1 else [self.train_step]

  def compile_background(self) -> None:
    """Starts compiling, in the background, the validation loss and search for each of the
    split's shapes, and the evaluation commands' searches on the grid (where a persistent
    cache keeps them, and config.eval.test_beam_size asks for them)."""
    for batch in self.val_batches:
      batch = {k: jax.ShapeDtypeStruct(v.shape, np.int32, sharding=self.data_sharding)
               for k, v in batch.items() if k != "index"}
      self.eval_step.add(self.run_abstract.params, batch, background=True)
      self.translate_step.add(self.run_abstract.params, batch["src"], background=True)
    validation.compile_for_cache(self.evaluation_search, self.config, self.run_abstract.params)

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

  def evaluate(self, params) -> dict:
    """Validation loss/perplexity and sacreBLEU of the configured search (`validation.scores`)."""
    def on_device(batch):  # Each process's rows of an (every-process-identical) batch.
      return self.to_device(distributed.local_rows(batch))

    def translate(batch):
      ids, _ = self.translate_step(params, on_device(batch)["src"])
      return np.asarray(multihost_utils.process_allgather(ids[:, 0], tiled=True))

    return validation.scores(self.val_batches, lambda batch: self.eval_step(
        params, on_device(batch)), translate, self.tokenizer.decode, self.val_text.tgt)
