"""What a run of a config costs beyond its arithmetic: the padding of the shape grid on its
real data, the wall time of compiling its programs one after another or in parallel, and its
steps/s at several steps per call. `seq2seq-benchmark --mode=padding,compile,calls
--config=FILE` prints them as JSON lines.
"""

import functools
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from jax.experimental.compilation_cache import compilation_cache

from seq2seq.data import batching, corpus, tokenizer
from seq2seq.errors import UserError
from seq2seq.models import MODEL_CLASSES
from seq2seq.models.rnn import RNN
from seq2seq.performance.rnn_reference import StepwiseRNN
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.vocabulary import VOCAB_SEED
from seq2seq.runtime import compiling
from seq2seq.training import steps as train_steps
from seq2seq.training.seeds import SeedGroup
from seq2seq.training.trainer import Trainer

PADDING_SPLITS = ("val", "test")


def _padded(lengths: np.ndarray, rows: int, pad_to) -> tuple[int, list[int]]:
  """Padded tokens and the padded lengths (each once) of `lengths` sorted into batches of
  `rows`, each batch padded (over all `rows`) to `pad_to(longest of each batch)`."""
  ordered = np.sort(lengths)
  longest = np.array([ordered[i:i + rows].max() for i in range(0, len(ordered), rows)])
  padded = np.asarray(pad_to(longest))
  return int(padded.sum() * rows), sorted(set(padded.tolist()))


def padding_benchmark(config: ml_collections.ConfigDict) -> list[dict]:
  """The padding of the evaluation grid (`batching.eval_batches`) on the config's validation
  and test splits, per split and for sources alone (a search) and pairs (a validation loss),
  against the 2 padded lengths per split (multiples of data.bucket_step) that evaluation
  chose before the grid (`_padded` of the same sorted batches)."""
  cap, rows = config.model.max_len, config.eval.batch_size

  def two_lengths(longest):
    chosen = np.array(batching.bucket_lengths(longest, config.data.bucket_step, 2))
    return chosen[np.searchsorted(chosen, longest)]

  with tempfile.TemporaryDirectory() as workdir:
    text = corpus.read_split(config.data, "train")
    tok = tokenizer.load_or_train(Path(workdir) / "spm.model", lambda: text.src + text.tgt,
                                  config.data.vocab_size, seed=VOCAB_SEED)
    results = []
    for split in PADDING_SPLITS:
      src, tgt = batching.encode_pairs(tok, corpus.read_split(config.data, split))
      no_tgt = [np.zeros(0, np.int32)] * len(src)
      for what, targets in (("sources", no_tgt), ("pairs", tgt)):
        batches = batching.eval_batches(src, targets, batch_size=rows, max_len=cap)
        on_grid = sum(batch["src"].size for batch in batches)
        lengths = np.array([max(min(len(s), cap - 1), min(len(t), cap - 1)) + 1
                            for s, t in zip(src, targets, strict=True)])
        before, before_lengths = _padded(lengths, rows, two_lengths)
        real = int(lengths.sum())
        results.append({
            "benchmark": "padding", "split": split, "of": what, "rows": rows,
            "sentences": len(lengths), "tokens": real, "grid_padded": on_grid,
            "grid_padding": round(on_grid / real - 1, 4),
            "grid_lengths": sorted({batch["src"].shape[1] for batch in batches}),
            "two_lengths_padded": before, "two_lengths_padding": round(before / real - 1, 4),
            "two_lengths_lengths": before_lengths})
  return results


def compile_benchmark(config: ml_collections.ConfigDict, threads: list[int]) -> list[dict]:
  """Seconds to compile every program a run of `config` compiles at start-up (train steps,
  validation losses and searches, evaluation searches), into an empty persistent cache, with
  each number of compiling threads in `threads` (1: one after another; 0: the default); then
  what the programs so compiled (with config.compile's options) run at: the train step and
  a validation search (`_run_times`)."""
  results = []
  saved = jax.config.jax_compilation_cache_dir
  try:
    for n in threads:
      with tempfile.TemporaryDirectory() as scratch:
        jax.config.update("jax_compilation_cache_dir", str(Path(scratch) / "cache"))
        compilation_cache.reset_cache()
        jax.clear_caches()
        config = ml_collections.ConfigDict(config.to_dict())
        config.compile.threads = n
        trainer = Trainer(config, Path(scratch))
        start = time.perf_counter()
        trainer.compile()
        trainer.compile_background()  # All at once: the pool's threads decide the order.
        train_ready = _ready(trainer.train_programs, start)
        groups = [*trainer.train_programs, *trainer.background_programs]
        all_ready = _ready(groups, start)
        results.append({
            "benchmark": "compile", "threads": n or compiling.default_threads(),
            "programs": compiling.kinds(groups), "train_step_seconds": round(train_ready, 2),
            "all_seconds": round(all_ready, 2),
            "program_seconds": round(sum(r["seconds"] for r in compiling.records(groups)), 2),
            **_run_times(trainer), "train_options": config.compile.train_options,
            "eval_options": config.compile.eval_options,
            "device": jax.devices()[0].device_kind, "cores": os.cpu_count()})
  finally:
    jax.config.update("jax_compilation_cache_dir", saved)
    compilation_cache.reset_cache()
  return results


def _ready(groups: list[compiling.Programs], start: float) -> float:
  for group in groups:
    group.wait()
  return time.perf_counter() - start


def _run_times(trainer: Trainer, steps: int = 10) -> dict:
  """The compiled train step's seconds per step (the mean of `steps` after 3 unmeasured ones,
  on the run's first batches) and the validation search's on the split's longest batch (the
  fastest of 3 calls after one unmeasured)."""
  state = trainer.new_state()
  for step in range(3):
    state, metrics = trainer.train_step(state, trainer.to_device(trainer.train_batches(step)),
                                        trainer.dropout_key)
  batches = [trainer.to_device(trainer.train_batches(3 + step)) for step in range(steps)]
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for batch in batches:
    state, metrics = trainer.train_step(state, batch, trainer.dropout_key)
  jax.block_until_ready(metrics)
  step_seconds = (time.perf_counter() - start) / steps
  src = trainer.to_device(trainer.val_batches[-1])["src"]
  jax.block_until_ready(trainer.translate_step(state.params, src))
  search = []
  for _ in range(3):
    start = time.perf_counter()
    jax.block_until_ready(trainer.translate_step(state.params, src))
    search.append(time.perf_counter() - start)
  return {"step_seconds": round(step_seconds, 5), "search_shape": list(src.shape),
          "search_seconds": round(min(search), 5)}


def calls_benchmark(config: ml_collections.ConfigDict, steps_per_call: list[int],
                    steps: int = 32) -> list[dict]:
  """Steps/s of a run of `config` at each config.train.steps_per_call: `steps` steps
  dispatched as the training loop does (calls of k where their batches share a shape, single
  steps elsewhere), on its batches from step k, with their metrics read back once per call,
  after one unmeasured call and with every program compiled."""
  results = []
  with tempfile.TemporaryDirectory() as scratch:
    for k in steps_per_call:
      config = ml_collections.ConfigDict(config.to_dict())
      config.train.steps_per_call = k
      seconds, calls = _train_seconds(Trainer(config, Path(scratch)), steps)
      results.append({"benchmark": "calls", "steps_per_call": k, "steps": steps, "calls": calls,
                      "steps_per_second": round(steps / seconds, 3),
                      "device": jax.devices()[0].device_kind, "cores": os.cpu_count()})
  return results


def seeds_benchmark(config: ml_collections.ConfigDict, counts: list[int],
                    steps: int = 32) -> list[dict]:
  """Steps/s of `config` trained as a seed group of each size S in `counts` (S=1: the run
  alone, not a group), measured as `calls_benchmark` measures, and the wall time of a step
  of the group relative to the first count's."""
  results = []
  with tempfile.TemporaryDirectory() as scratch:
    for count in counts:
      trainer = (SeedGroup(config, Path(scratch), list(range(count))) if count > 1
                 else Trainer(config, Path(scratch)))
      seconds, _ = _train_seconds(trainer, steps)
      results.append({"benchmark": "seeds", "seeds": count, "steps": steps,
                      "steps_per_second": round(steps / seconds, 3),
                      "run_steps_per_second": round(count * steps / seconds, 3),
                      "time_vs_first": round(seconds / (results[0]["steps"] /
                                                        results[0]["steps_per_second"]), 3)
                      if results else 1.0,
                      "device": jax.devices()[0].device_kind, "cores": os.cpu_count()})
  return results


def saves_benchmark(config: ml_collections.ConfigDict, saves: int = 6) -> list[dict]:
  """Seconds per checkpoint save of a new train state of `config` (orbax, into a scratch
  directory on the runs' disk): waited for to the end (validation's checkpoints), and
  written in the background (periodic ones: how long the loop stalls, and the whole write).
  The first save of each is not counted."""
  results = []
  with tempfile.TemporaryDirectory() as scratch:
    trainer = Trainer(config, Path(scratch) / "run")
    state = jax.block_until_ready(trainer.new_state())
    for wait in (True, False):
      checkpoints = Checkpoints(Path(scratch) / f"wait-{wait}", keep=3)
      stalled, written = [], []
      for step in range(saves):
        start = time.perf_counter()
        checkpoints.save(step, state, wait=wait)
        stalled.append(time.perf_counter() - start)
        checkpoints.latest_step()  # Waits for the write.
        written.append(time.perf_counter() - start)
      checkpoints.close()
      results.append({"benchmark": "saves", "in_background": not wait, "saves": saves - 1,
                      "megabytes": round(sum(x.nbytes for x in jax.tree.leaves(state)) / 1e6, 1),
                      "stall_seconds": round(float(np.median(stalled[1:])), 3),
                      "write_seconds": round(float(np.median(written[1:])), 3),
                      "device": jax.devices()[0].device_kind, "cores": os.cpu_count()})
  return results


def _train_seconds(trainer: Trainer, steps: int) -> tuple[float, int]:
  """Seconds for `steps` steps from step k (config.train.steps_per_call), dispatched as the
  training loop does, their metrics read back once per call, after one unmeasured call and
  with every program compiled; and how many calls they took."""
  k = trainer.config.train.steps_per_call
  trainer.compile()
  state, metrics = trainer.train(trainer.new_state(), 0, trainer.call_size(0, k))
  jax.device_get(metrics)
  trainer.train_step.wait()  # With k > 1, compiled in the background.
  start, step, calls = time.perf_counter(), k, 0
  while step < k + steps:
    size = trainer.call_size(step, k + steps)
    state, metrics = trainer.train(state, step, size)
    jax.device_get(metrics)
    step, calls = step + size, calls + 1
  return time.perf_counter() - start, calls


def recurrence_benchmark(config: ml_collections.ConfigDict, steps: int = 8,
                  rounds: int = 5) -> list[dict]:
  """The train step of an RNN config as the model runs it (`RNN`: input products before the
  loop, gates side by side, logits after it) against the same step with the cells as written
  (`rnn_reference.StepwiseRNN`), same parameters, on the run's first `steps` batches: each
  compiled for every shape first, then timed in turn for `rounds` rounds, keeping each one's
  fastest, so that a slow spell of a noisy machine does not fall on one version only."""
  if not issubclass(MODEL_CLASSES[config.model.family], RNN):
    raise UserError(f"--mode=recurrence times an RNN's train step; --config's model is the"
                    f" {config.model.family}: pass an RNN config, e.g."
                    " --config=configs/multi30k_rnn.py.")
  with tempfile.TemporaryDirectory() as scratch:
    trainer = Trainer(config, Path(scratch))
    vocab = trainer.tokenizer.vocab_size
    reference, _ = nnx.split(nnx.eval_shape(lambda: StepwiseRNN(
        config.model, vocab, rngs=nnx.Rngs(params=0), dtype=jnp.dtype(config.train.dtype))),
        nnx.Param)
    state = trainer.new_state()
    batches = [trainer.to_device(trainer.train_batches(step)) for step in range(steps)]
    versions = {
        impl: jax.jit(functools.partial(
            train_steps.train_step, graphdef=graphdef, optimizer=trainer.optimizer,
            train=config.train))
        for impl, graphdef in (("ours", trainer.graphdef), ("stepwise", reference))}

    def run(step_fn):
      return [step_fn(state, batch, trainer.dropout_key)[1] for batch in batches]

    tokens = {}
    for impl, step_fn in versions.items():
      tokens[impl] = sum(float(m["tokens"]) for m in jax.device_get(run(step_fn)))  # compile
    best = dict.fromkeys(versions, float("inf"))
    for _ in range(rounds):
      for impl, step_fn in versions.items():
        start = time.perf_counter()
        jax.block_until_ready(run(step_fn))
        best[impl] = min(best[impl], time.perf_counter() - start)
  results = [{"benchmark": "recurrence", "impl": impl, "steps": steps, "rounds": rounds,
              "step_seconds": round(best[impl] / steps, 5),
              "target_tokens_per_sec": round(tokens[impl] / best[impl], 1),
              "shapes": sorted({tuple(b["src"].shape) for b in batches}),
              "device": jax.devices()[0].device_kind, "cores": os.cpu_count()}
             for impl in versions]
  results.append({"benchmark": "recurrence", "speedup_vs_stepwise": round(best["stepwise"] /
                                                                   best["ours"], 3)})
  return results


def buckets_benchmark(config: ml_collections.ConfigDict, settings: list[tuple[int, int]],
                      steps: int = 3, rounds: int = 5) -> list[dict]:
  """Real target tokens/s of the config's training at each (data.num_buckets,
  data.tokens_per_batch) of `settings`, the padding each leaves, and what it compiles.

  Each setting's train step is compiled for each of its shapes (the first call's seconds, as a
  run's start pays them), then timed on `steps` batches of every shape, the settings in turn
  for `rounds` rounds, keeping each shape's fastest. An epoch's time is then the sum over its
  batches of their shape's step time, and the setting's figure is the epoch's real target
  tokens (EOS counted) over that time: what a run of the setting trains per second, over the
  epoch's mix of shapes, without timing every batch of it."""
  with tempfile.TemporaryDirectory() as scratch:
    measured = [_bucket_setting(config, Path(scratch) / str(i), *setting, steps)
                for i, setting in enumerate(settings)]
    best = [dict.fromkeys(m[3], float("inf")) for m in measured]
    for _ in range(rounds):
      for fastest, (*_, timed, step_fn, state, key, _first) in zip(best, measured, strict=True):
        for shape, batches in timed.items():
          start = time.perf_counter()
          jax.block_until_ready([step_fn(state, b, key)[1] for b in batches])
          fastest[shape] = min(fastest[shape], (time.perf_counter() - start) / len(batches))
  results = []
  for fastest, (num_buckets, tokens_per_batch, real, count, *_, first) in zip(best, measured,
                                                                              strict=True):
    epoch = sum(count[s] * fastest[s] for s in count)
    padded = sum(count[s] * s[0] * s[1] for s in count)
    results.append({
        "benchmark": "buckets", "num_buckets": num_buckets, "tokens_per_batch": tokens_per_batch,
        "shapes": sorted(count), "batches_per_epoch": sum(count.values()),
        "real_target_tokens": real, "real_target_tokens_per_batch": round(
            real / sum(count.values()), 1),
        "target_padding": round(1 - real / padded, 4), "epoch_seconds": round(epoch, 2),
        "target_tokens_per_sec": round(real / epoch, 1),
        "first_call_seconds": round(sum(first.values()), 2), "programs": len(count),
        "steps": steps, "rounds": rounds, "cores": os.cpu_count()})
  for result in results[1:]:
    result["speedup_vs_first"] = round(result["target_tokens_per_sec"]
                                       / results[0]["target_tokens_per_sec"], 3)
  return results


def _bucket_setting(config: ml_collections.ConfigDict, workdir: Path, num_buckets: int,
                    tokens_per_batch: int, steps: int) -> tuple:
  """One setting of `buckets_benchmark`: (num_buckets, tokens_per_batch, its first epoch's
  real target tokens, its batches per shape, `steps` device batches per shape, its compiled
  step, a train state, the dropout key, each shape's first call in seconds)."""
  setting = ml_collections.ConfigDict(config.to_dict())
  setting.data.num_buckets, setting.data.tokens_per_batch = num_buckets, tokens_per_batch
  trainer = Trainer(setting, workdir)
  plan = trainer.train_batches
  real, count, timed = 0, {}, {}
  for step in range(plan.batches_per_epoch):  # The first epoch: its real tokens and mix.
    batch = plan(step)
    shape = tuple(batch["tgt_out"].shape)
    real += int((batch["tgt_out"] != 0).sum())
    count[shape] = count.get(shape, 0) + 1
    if len(timed.setdefault(shape, [])) < steps:
      timed[shape].append(trainer.to_device(batch))
  step_fn = jax.jit(functools.partial(train_steps.train_step, graphdef=trainer.graphdef,
                                      optimizer=trainer.optimizer, train=setting.train))
  state = trainer.new_state()
  first = {}
  for shape, batches in timed.items():  # Compiles: a run's start pays this.
    start = time.perf_counter()
    jax.block_until_ready(step_fn(state, batches[0], trainer.dropout_key))
    first[shape] = time.perf_counter() - start
  return (num_buckets, tokens_per_batch, real, count, timed, step_fn, state,
          trainer.dropout_key, first)
