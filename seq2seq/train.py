"""Training: optimizer, schedule, pure step functions and the run driver.

`train_and_evaluate(config, workdir)` creates or resumes the run in `workdir`.
The model crosses the jit boundary as `nnx.split` state; step functions are
pure, jitted once per batch shape over a device mesh with `data` and `fsdp`
axes, and the train state is donated. Batches and dropout keys are functions of
the step, so a resumed run sees exactly what the uninterrupted run would have.
Across hosts (`config.distributed`), every process runs this same program on
its own rows of each global batch; only process 0 writes logs and metrics.
"""

import collections
import functools
import json
import logging
import math
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from seq2seq import compiling, layout, metrics, models, signals, translator
from seq2seq import config as config_lib
from seq2seq.checkpoint import (
  Checkpoints,
  check_run_config,
  full_disk_error,
  full_disk_is_user_error,
  save_run_config,
)
from seq2seq.data import batching, corpus, tokenizer
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.models.attention import VARIANTS
from seq2seq.train_state import (  # noqa: F401 (re-exported: the trainer's layout)
  TrainState,
  learning_rate_schedule,
  make_optimizer,
  new_train_state,
)

log = logging.getLogger("seq2seq")
# What an interrupted start-up leaves: the end of `cli.run_main`'s one line.
INTERRUPTED = ("nothing half-written was kept (a new run's workdir is removed until its first"
               " checkpoint)")


def cross_entropy(logits, targets, label_smoothing: float):
  """Summed label-smoothed loss and NLL over non-PAD targets, from one log-normalizer.

  Smoothing mixes the one-hot target with the uniform distribution, so the
  smoothed cross-entropy of a token is `(1 - eps) * nll + eps * mean_v(-log p_v)`.
  With `log p_v = z_v - lse(z)` both terms need only `lse(z)`, the target's logit
  and the mean logit: no `[tokens, vocab]` one-hot and no second softmax.

  Args:
    logits: `[batch, t, vocab]` (computed in float32).
    targets: `[batch, t]` ids, PAD_ID where there is no target.

  Returns:
    dict of sums: `loss` (smoothed), `nll` (unsmoothed), `tokens` (count).
  """
  logits = logits.astype(jnp.float32)
  weights = (targets != tokenizer.PAD_ID).astype(jnp.float32)
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # [batch, t]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = log_normalizer - target_logit
  loss = nll
  if label_smoothing:
    uniform = log_normalizer - jnp.mean(logits, axis=-1)  # mean_v(-log p_v)
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  return {"loss": jnp.sum(loss * weights), "nll": jnp.sum(nll * weights),
          "tokens": jnp.sum(weights)}


def _packing(batch: dict, side: str) -> dict:
  """The segment ids and positions of a packed batch's `side` ("src" or "tgt"), if any."""
  return {name: batch[f"{side}_{name}"] for name in ("segments", "positions")
          if f"{side}_{name}" in batch}


def train_step(state: TrainState, batch: dict, dropout_key, *, graphdef, optimizer,
               label_smoothing: float, accum_steps: int = 1):
  """One optimizer step on a global batch: `(state, batch, key) -> (state, metrics)`.

  The gradient is that of the token-summed loss divided by the batch's token
  count. With `accum_steps` k > 1, rows i, i + k, i + 2k, ... form micro-batch
  i (so every device holds a share of each); their summed gradients give the
  same update as the whole batch at once, in about 1/k of the activation memory.
  """
  # Folding in the step makes dropout a function of the step: resume is exact.
  step_key = jax.random.fold_in(dropout_key, state.step)

  def summed_grads(micro_batch, key):
    def loss_fn(params):
      model = nnx.merge(graphdef, params)
      rngs = nnx.Rngs(dropout=key)
      memory = model.encode(micro_batch["src"], **_packing(micro_batch, "src"), rngs=rngs)
      logits = model.decode(memory, micro_batch["tgt_in"], **_packing(micro_batch, "tgt"),
                            rngs=rngs)
      sums = cross_entropy(logits, micro_batch["tgt_out"], label_smoothing)
      return sums["loss"], sums

    (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return grads, sums

  if accum_steps == 1:
    grads, sums = summed_grads(batch, step_key)
  else:
    # [rows, ...] -> [k, rows / k, ...] with micro-batch i = rows i::k.
    micro = jax.tree.map(lambda x: x.reshape(-1, accum_steps, *x.shape[1:]).swapaxes(0, 1),
                         batch)

    def accumulate(total, xs):
      i, micro_batch = xs
      part = summed_grads(micro_batch, jax.random.fold_in(step_key, i))
      return jax.tree.map(jnp.add, total, part), None

    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                         jax.eval_shape(summed_grads, first, step_key))
    (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro))
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums, grad_norm=optax.tree.norm(grads))
  return TrainState(state.step + 1, params, opt_state), metrics


def eval_step(params, batch, *, graphdef):
  """Summed NLL and token count of a batch, without dropout or smoothing."""
  model = nnx.merge(graphdef, params)
  memory = model.encode(batch["src"], **_packing(batch, "src"))
  logits = model.decode(memory, batch["tgt_in"], **_packing(batch, "tgt"))
  return cross_entropy(logits, batch["tgt_out"], 0.0)


def initialize_distributed(d: ml_collections.ConfigDict) -> None:
  """Joins a multi-process run (`config.distributed`) before JAX touches any device.

  With `num_processes == 1` and no `coordinator_address` (the defaults) this
  does nothing. Otherwise every process calls `jax.distributed.initialize`;
  fields left empty (address "", process_id -1, num_processes 0) come from the
  environment: JAX_COORDINATOR_ADDRESS or the Slurm / Open MPI / Cloud TPU /
  Kubernetes detection of `jax.distributed`.
  """
  if jax.distributed.is_initialized():
    return
  if d.num_processes == 1 and not d.coordinator_address:
    return
  # JAX's preemption service would take SIGTERM from our handlers (it catches the signal in
  # C++ for `reached_preemption_sync_point`): `StopSignals` agrees on stops itself.
  jax.config.update("jax_enable_preemption_service", False)
  jax.distributed.initialize(coordinator_address=d.coordinator_address or None,
                             num_processes=d.num_processes or None,
                             process_id=None if d.process_id < 0 else d.process_id)


def fsdp_sharding(mesh: jax.sharding.Mesh, x) -> NamedSharding:
  """Where one leaf of the train state lives on a mesh with an `fsdp` axis.

  A matrix (or larger) is split along its largest dimension that the `fsdp`
  axis divides; XLA gathers it for the forward/backward pass and scatters the
  gradient (ZeRO-3 / FSDP). Scalars, biases and norms stay replicated.
  """
  shards = mesh.shape["fsdp"]
  dims = [i for i in range(x.ndim) if x.shape[i] % shards == 0]
  if shards == 1 or x.ndim < 2 or not dims:
    return NamedSharding(mesh, P())
  spec = [None] * x.ndim
  spec[max(dims, key=lambda i: x.shape[i])] = "fsdp"
  return NamedSharding(mesh, P(*spec))


def _truncate_jsonl(path: Path, last_step: int) -> None:
  """Keeps the records of `path` with `step <= last_step` (atomically: a kill leaves either)."""
  if not path.is_file():
    return
  def step_of(line: str) -> float:
    try:
      return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
      return math.inf  # A line torn by a kill: dropped with the steps after the checkpoint.

  lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
  kept = [line for line in lines if step_of(line) <= last_step]
  if len(kept) == len(lines):
    return
  layout.write_atomically(path, "".join(kept))


class MetricsWriter:
  """`metrics.jsonl` and TensorBoard events; silent on all but process 0."""

  def __init__(self, workdir: Path, start_step: int = 0):
    """Appends to the run's metrics; records after `start_step` (written before a resume from
    an earlier checkpoint) are dropped first, so that every step appears once."""
    self.enabled = jax.process_index() == 0
    if self.enabled:
      _truncate_jsonl(workdir / layout.METRICS, start_step)
      import tensorboardX  # Only the writing process needs it.
      self.jsonl = open(workdir / layout.METRICS, "a", encoding="utf-8")  # noqa: SIM115
      self.tensorboard = tensorboardX.SummaryWriter(str(workdir / layout.TENSORBOARD))

  def write(self, step: int, split: str, metrics: dict) -> None:
    if not self.enabled:
      return
    self.jsonl.write(json.dumps({"step": step, "split": split, **metrics}) + "\n")
    self.jsonl.flush()
    for name, value in metrics.items():
      if isinstance(value, (int, float)):
        self.tensorboard.add_scalar(f"{split}/{name}", value, step)
    self.tensorboard.flush()

  def close(self) -> None:
    if self.enabled:
      self.jsonl.close()
      self.tensorboard.close()


VOCAB_SEED = 0  # Seeds SentencePiece: runs that differ in train.seed share a vocabulary.


def _load_tokenizer(workdir: Path, train_text: corpus.ParallelText, config):
  """Trains the run's SentencePiece model once (process 0), or copies the one of
  `config.data.vocab_from`; then every process loads it."""
  if jax.process_index() == 0:
    if config.data.vocab_from and not (workdir / layout.VOCAB).is_file():
      tokenizer.copy_vocabulary(Path(config.data.vocab_from), workdir)
    tok = tokenizer.load_or_train(workdir, lambda: train_text.src + train_text.tgt,
                                  config.data.vocab_size, seed=VOCAB_SEED)
  multihost_utils.sync_global_devices("tokenizer")
  return tok if jax.process_index() == 0 else tokenizer.Tokenizer.load(workdir / layout.VOCAB)


class Trainer:
  """Everything a run needs, built once: data, model, compiled steps, mesh."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: Path):
    self.config = config
    d = config.data
    train_text = corpus.read_split(d, "train")  # First data.max_train_examples pairs if set.
    self.val_text = corpus.read_split(d, config.eval.split)
    if config.eval.max_sentences:
      n = config.eval.max_sentences
      self.val_text = corpus.ParallelText(self.val_text.src[:n], self.val_text.tgt[:n])
    self.tokenizer = _load_tokenizer(workdir, train_text, config)

    fsdp = config.train.fsdp
    if fsdp < 1 or jax.device_count() % fsdp:
      raise UserError(f"config.train.fsdp={fsdp} does not divide the {jax.device_count()}"
                      " devices; use a divisor of the device count (1 = no sharding).")
    # Batches are split over both axes; parameters only over `fsdp`. Auto axes: XLA
    # propagates the shardings and inserts the all-reduces / all-gathers.
    self.mesh = jax.make_mesh((jax.device_count() // fsdp, fsdp), ("data", "fsdp"),
                              axis_types=(jax.sharding.AxisType.Auto,) * 2)
    self.replicated = NamedSharding(self.mesh, P())
    self.data_sharding = NamedSharding(self.mesh, P(("data", "fsdp")))
    src, tgt = batching.encode_pairs(self.tokenizer, train_text)
    self.train_batches = batching.TrainBatches(
        src, tgt, tokens_per_batch=d.tokens_per_batch, max_len=d.max_len,
        bucket_step=d.bucket_step, seed=config.train.seed,
        row_multiple=jax.device_count() * config.train.grad_accum_steps,
        process_index=jax.process_index(), process_count=jax.process_count(), pack=d.pack,
        num_buckets=d.num_buckets)
    if config.eval.batch_size % jax.device_count():
      raise UserError(f"config.eval.batch_size={config.eval.batch_size} is not divisible by the"
                      f" {jax.device_count()} devices; use a multiple of {jax.device_count()}.")
    val_src, val_tgt = batching.encode_pairs(self.tokenizer, self.val_text)
    self.val_batches = batching.eval_batches(
        val_src, val_tgt, batch_size=config.eval.batch_size, bucket_step=d.bucket_step,
        max_len=config.model.max_len)

    self.optimizer = make_optimizer(config.train)
    vocab_size = self.tokenizer.vocab_size

    def init() -> TrainState:
      return new_train_state(nnx.split(build_model(config, vocab_size), nnx.Param)[1],
                             self.optimizer)

    # Initialized inside jit, straight into its shardings: every process computes the
    # same values, and no host ever holds an unsharded copy.
    abstract = jax.eval_shape(init)
    self.graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(config, vocab_size)),
                                 nnx.Param)
    state_sharding = jax.tree.map(functools.partial(fsdp_sharding, self.mesh), abstract)
    params_sharding = state_sharding.params
    self.num_params = sum(x.size for x in jax.tree.leaves(abstract.params))
    self.num_sharded_params = sum(
        x.size for x, sharding in zip(jax.tree.leaves(abstract.params),
                                      jax.tree.leaves(params_sharding), strict=True)
        if sharding.spec != P())
    self.dropout_key = jax.jit(lambda: jax.random.key(config.train.seed),
                               out_shardings=self.replicated)()
    self.init_state = jax.jit(init, out_shardings=state_sharding)
    self.abstract_state = jax.tree.map(
        lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
        abstract, state_sharding)
    # Compiled ahead (`compile`) for the shapes of the run's batches: told apart by them.
    by_batch_shape = lambda params_or_state, batch, *_: batch["src"].shape  # noqa: E731
    self.train_step = compiling.Programs("train step", jax.jit(
        functools.partial(train_step, graphdef=self.graphdef, optimizer=self.optimizer,
                          label_smoothing=config.train.label_smoothing,
                          accum_steps=config.train.grad_accum_steps),
        in_shardings=(state_sharding, self.data_sharding, self.replicated),
        out_shardings=(state_sharding, self.replicated), donate_argnums=0), by_batch_shape)
    self.eval_step = compiling.Programs("validation loss", jax.jit(
        functools.partial(eval_step, graphdef=self.graphdef),
        in_shardings=(params_sharding, self.data_sharding), out_shardings=self.replicated),
        by_batch_shape, plural="validation losses")
    self.translate_step = translator.search_programs(
        self.graphdef, config, config.eval.beam_size, config.eval.alpha,
        name="validation search", jit=dict(in_shardings=(params_sharding, self.data_sharding),
                                           out_shardings=self.data_sharding))

  def compile(self) -> None:
    """Lowers every program the run will call and compiles them in parallel (`compiling`):
    the train step for each batch shape, validation loss and search for each of the
    split's. `compiling.report` waits for them."""
    def spec(shape):
      return jax.ShapeDtypeStruct(shape, np.int32, sharding=self.data_sharding)

    processes = jax.process_count()
    for rows, length in self.train_batches.shapes:  # This process's rows of each batch.
      batch = {k: spec((rows * processes, length)) for k in self.train_batches.keys}
      self.train_step.add(self.abstract_state, batch, self.dropout_key)
    for batch in self.val_batches:
      batch = {k: spec(v.shape) for k, v in batch.items() if k != "index"}
      self.eval_step.add(self.abstract_state.params, batch)
      self.translate_step.add(self.abstract_state.params, batch["src"])

  def new_state(self) -> TrainState:
    return self.init_state()

  def to_device(self, local_batch: dict) -> dict:
    """Process-local numpy rows -> global arrays sharded along the `data` axis."""
    return {k: jax.make_array_from_process_local_data(self.data_sharding, v)
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
            **metrics.bleu(hypotheses, self.val_text.tgt),
            "example": hypotheses[0]}


MAX_STEPS_AHEAD = 2  # Train steps dispatched but not finished, at most.




def _diverged(what: str, step: int, last_checkpoint: int | None) -> UserError:
  where = (f"the last good checkpoint is step {last_checkpoint}" if last_checkpoint is not None
           else "no checkpoint was saved yet")
  return UserError(f"The {what} at step {step}; {where}. Lower config.train.learning_rate or"
                   " raise config.train.warmup_steps.")


def _check_finite(metrics: list[dict], done: int, last_checkpoint: int | None) -> None:
  """Stops training at the first of the last `len(metrics)` steps (ending at `done`, metrics
  on the host) whose loss or gradient norm is not finite: its update spoiled the parameters."""
  for i, m in enumerate(metrics):
    loss, grad_norm = float(m["loss"]), float(m["grad_norm"])
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
      raise _diverged(f"training loss is {loss} (gradient norm {grad_norm})",
                      done - len(metrics) + i + 1, last_checkpoint)


def evaluations_without_improvement(checkpoints: Checkpoints, step: int,
                                    every_steps: int) -> int:
  """Evaluations in (best step, `step`]: evaluations happen at multiples of `every_steps`,
  so this is a function of the checkpoints alone and a resumed run counts as it would have."""
  best = checkpoints.best_step()
  return 0 if best is None else step // every_steps - best // every_steps


def _early_stop_message(checkpoints: Checkpoints, step: int, patience: int) -> str:
  best = checkpoints.best_step()
  bleu = checkpoints.manager.metrics(best)["bleu"]
  return (f"Stopped early at step {step}: validation BLEU has not improved for {patience}"
          f" evaluations (config.train.patience); the best is {bleu:.2f} at step {best}.")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """Trains `config` in `workdir`, resuming if it already holds a run.

  Returns:
    The last validation metrics (with `step`), or the saved ones if the run
    was already complete.
  """
  config_lib.validate(config)
  if config.data.pack and not models.PACKS[config.model.family]:
    raise UserError(f"config.data.pack=True packs several sentences per row, which the"
                    f" {config.model.family} family cannot keep apart; it needs"
                    " --config.data.pack=False.")
  if config.data.pack and not VARIANTS[config.model.attention].packs:
    raise UserError("config.data.pack=True needs attention that can be masked per sentence;"
                    f" `{config.model.attention}` cannot: use another config.model.attention or"
                    " pack=False.")
  initialize_distributed(config.distributed)  # Before anything touches a device.
  with signals.defer_interrupts(jax.process_count() > 1):  # Processes start and stop together.
    return _train_in(config, Path(workdir))


def _train_in(config: ml_collections.ConfigDict, workdir: Path) -> dict:
  """`train_and_evaluate` once the run's processes have joined.

  A new workdir is removed again when its start fails before the first checkpoint, but only
  by the start whose `mkdir` made it, and while it holds the run's lock: of two simultaneous
  first starts, the one refused the lock removes nothing. A full disk at any write ends in one
  `UserError` line naming the last good checkpoint, which the same command resumes from.
  """
  if jax.process_index() != 0:
    log.setLevel(logging.WARNING)  # Process 0 reports for the run.
  layout.check_writable(workdir)
  checkpoints = None
  with full_disk_is_user_error(workdir, lambda: checkpoints and checkpoints.latest_step()):
    created = jax.process_index() == 0 and layout.create_workdir(workdir)
    check_run_config(workdir, config)
    num_steps = config.train.num_steps
    checkpoints = Checkpoints(workdir, config.checkpoint.keep)
    latest = checkpoints.latest_step()
    if latest is not None and latest >= num_steps:
      message = (f"The run in {workdir} is complete: its checkpoint is at step {latest} and"
                 f" config.train.num_steps={num_steps}. Nothing to do; pass a larger"
                 " --config.train.num_steps to train further.")
      log.info(message)
      checkpoints.close()
      return {"step": latest, "complete": True, **(checkpoints.manager.metrics(latest) or {})}
    patience = config.train.patience
    if latest is not None and patience and evaluations_without_improvement(
        checkpoints, latest, config.eval.every_steps) >= patience:
      log.info("The run in %s is complete. %s", workdir,
               _early_stop_message(checkpoints, latest, patience))
      checkpoints.close()
      return {"step": latest, "complete": True, "early_stopped": True}

    if latest is not None and not (workdir / layout.VOCAB).is_file():
      checkpoints.close()  # Retraining it would give the checkpoints a vocabulary of chance.
      raise UserError(f"{workdir / layout.VOCAB} is missing but {workdir} holds checkpoints"
                      " trained with it; put it back from a copy of the run, or train in a new"
                      " --workdir.")
    try:
      with layout.WorkdirLock(workdir, enabled=jax.process_index() == 0):
        finished = False
        try:
          result = _train(config, workdir, checkpoints)
          finished = True
        finally:
          if created and not finished:  # This start made the workdir and holds its lock.
            saved = checkpoints.latest_step() is not None
            checkpoints.close()  # Waits for orbax's threads, which may still create directories.
            if not saved:
              # A start that failed (or was interrupted) before its first checkpoint leaves
              # nothing; removed before the lock is released, so no other start trains in it.
              shutil.rmtree(workdir, ignore_errors=True)
      return result
    finally:
      checkpoints.close()


def _report_start(trainer) -> None:
  """What the run is about to train."""
  config = trainer.config
  log.info("Model: %s, %.2fM parameters; %d training pairs (%d dropped by length), %d batches"
           " per epoch; devices: %d.", config.model.family, trainer.num_params / 1e6,
           trainer.train_batches.num_examples, trainer.train_batches.num_dropped,
           trainer.train_batches.batches_per_epoch, jax.device_count())
  if config.train.fsdp > 1:
    log.info("FSDP: %.0f%% of the parameters (every matrix) and their optimizer state are split"
             " over %d devices.", 100 * trainer.num_sharded_params / trainer.num_params,
             config.train.fsdp)


def _train_record(pending: list[dict], elapsed: float, learning_rate: float) -> dict:
  """The log record of an interval's steps (their metrics on the host)."""
  summed = jax.tree.map(lambda *xs: float(sum(xs)), *pending)
  tokens = max(summed["tokens"], 1.0)
  return {"loss": summed["loss"] / tokens, "nll": summed["nll"] / tokens,
          "grad_norm": summed["grad_norm"] / len(pending), "learning_rate": learning_rate,
          "tokens_per_sec": summed["tokens"] / elapsed,
          "tokens_per_step": summed["tokens"] / len(pending)}  # Real target tokens.


def _evaluate_and_save(trainer, state, done: int, checkpoints: Checkpoints, writer, progress,
                       train_wall_seconds: float) -> dict:
  """Validation at step `done`: a diverged loss stops the run; otherwise the result is
  logged and the checkpoint saved with its metrics (for `best`)."""
  split = trainer.config.eval.split
  result = {"step": done, **trainer.evaluate(state.params)}
  if not math.isfinite(result["loss"]):  # Finite training losses, diverged parameters.
    raise _diverged(f"{split} loss is {result['loss']}", done, checkpoints.latest_step())
  result["train_wall_seconds"] = train_wall_seconds
  try:
    writer.write(done, split, result)
  except OSError as e:  # The checkpoint below would not fit either.
    workdir = checkpoints.directory.parent
    error = full_disk_error(e, f"writing the {split} metrics of step {done} in {workdir}",
                            checkpoints.latest_step())
    if error is None:
      raise
    raise error from e
  checkpoints.save(done, state, metrics={"bleu": result["bleu"], "loss": result["loss"]})
  if writer.enabled:  # tqdm.write prints even where the bar is disabled.
    progress.write(f"step {done}: {split} loss {result['loss']:.3f} BLEU {result['bleu']:.2f}"
                   f" ({result['bleu_signature']})")
  return result


def _train(config: ml_collections.ConfigDict, workdir: Path, checkpoints: Checkpoints) -> dict:
  """The run itself, from building the trainer to the last step (see `train_and_evaluate`)."""
  num_steps, patience = config.train.num_steps, config.train.patience
  trainer = Trainer(config, workdir)
  _report_start(trainer)
  compile_start = time.perf_counter()
  trainer.compile()  # Compiles while the checkpoint is read.
  restored, state = checkpoints.restore_latest_good(trainer.new_state())
  if jax.process_index() == 0:
    save_run_config(workdir, config)  # Only once the run fits its workdir.
  if restored is not None:
    log.info("Resumed %s at step %d.", workdir, restored)
  start = int(state.step)
  log.info(compiling.report([trainer.train_step, trainer.eval_step, trainer.translate_step],
                            compile_start))
  writer = MetricsWriter(workdir, start)
  progress = tqdm.tqdm(total=num_steps, initial=start, unit="step", dynamic_ncols=True,
                       mininterval=2.0, disable=jax.process_index() != 0)
  pending, checked, last_eval = [], 0, {}  # pending[:checked]: on the host, known finite.
  unshown = collections.deque()  # Dispatched steps not yet counted by the progress bar.
  interval_start, train_start = time.perf_counter(), time.perf_counter()
  stop = signals.StopSignals()
  try:
    if early := stop.agreed(start, boundary=True):  # A signal during start-up, on any process.
      raise signals.Interrupted(early)
    for step in range(start, num_steps):
      batch = trainer.to_device(trainer.train_batches(step))
      state, metrics = trainer.train_step(state, batch, trainer.dropout_key)
      pending.append(metrics)
      done = step + 1
      # The bar counts finished steps, asking without waiting: no host sync per step.
      unshown.append(metrics["tokens"])
      while unshown and unshown[0].is_ready():
        unshown.popleft()
        progress.update(1)
      if len(unshown) > MAX_STEPS_AHEAD:
        # Dispatch runs at most this far ahead of the device: a signal stops within a few
        # steps, the bar stays current, and queued batches do not pile up in memory.
        unshown.popleft().block_until_ready()
        progress.update(1)
      log_now = done % config.train.log_every_steps == 0 or done == num_steps
      evaluate_now = done % config.eval.every_steps == 0 or done == num_steps
      save_now = bool(config.checkpoint.every_steps) and done % config.checkpoint.every_steps == 0
      # Read once: a signal arriving after this stops a later step.
      stopping = stop.agreed(done, log_now or evaluate_now or save_now)
      if log_now or evaluate_now or save_now or stopping:
        # Before anything is saved: no checkpoint holds a diverged state. Fetched once: the
        # steps' metrics stay on the host for the log.
        pending[checked:] = jax.device_get(pending[checked:])
        _check_finite(pending[checked:], done, checkpoints.latest_step())
        checked = len(pending)
      if log_now:
        record = _train_record(pending, time.perf_counter() - interval_start,
                               float(learning_rate_schedule(config.train)(step)))
        writer.write(done, "train", record)
        progress.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_sec']:.0f}")
        progress.update(done - progress.n)
        unshown.clear()
        pending, checked, interval_start = [], 0, time.perf_counter()
      if evaluate_now:
        last_eval = _evaluate_and_save(trainer, state, done, checkpoints, writer, progress,
                                       train_wall_seconds=time.perf_counter() - train_start)
        interval_start = time.perf_counter()  # Evaluation time is not training throughput.
        if patience and evaluations_without_improvement(
            checkpoints, done, config.eval.every_steps) >= patience and done < num_steps:
          log.info(_early_stop_message(checkpoints, done, patience))
          return {**last_eval, "early_stopped": True}
      elif save_now:
        checkpoints.save(done, state)  # Kept by LatestN only: e.g. for --checkpoint=avg:N.
      if stopping and done < num_steps:
        if checkpoints.latest_step() != done:
          checkpoints.save(done, state)
        log.info("Received %s: saved a checkpoint at step %d in %s; run the same command to"
                 " resume.", stopping, done, workdir)
        return {**last_eval, "step": done, "interrupted": stopping}
  finally:
    stop.restore()
    progress.close()
    writer.close()
  return last_eval
