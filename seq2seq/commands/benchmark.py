r"""Training and decoding speed at fixed shapes, one JSON line per measurement.

  seq2seq-benchmark [--mode=train,decode] [--layers=3 --dim=256 --heads=4 --mlp=1024] \
      [--vocab=8000] [--batch=64 --length=32 --dtype=float32|bfloat16] \
      [--decode_batch=32 --src_len=40 --out_len=40]

train: step time, target tokens/s, model FLOPs per step (matmuls, x3 for the
backward pass) and MFU against a matrix multiply measured in the same run (and
the vendor's dense peak on known GPUs). decode: greedy and beam-4 sentences/s
and tokens/s, against decoders that recompute cross-attention keys and values
every step (as written, which XLA partly hoists out of the loop, and forced to
run per step), measured in the same process. kv_heads (--kv_heads=0,2,1): beam search's
sentences/s (at the last of --beams) and the decoder's cache in bytes for each number of
key/value heads, against one per query head. --profile: where the time of each goes
(seq2seq/performance/profile.py), one more JSON line per mode and beam.

  seq2seq-benchmark --mode=padding,compile,calls,seeds,saves \
      --config=configs/multi30k_transformer_wu2021.py [--threads=1,0] [--steps_per_call=1,4,8] \
      [--seeds=1,2,3]
  seq2seq-benchmark --mode=recurrence --config=configs/multi30k_rnn.py
  seq2seq-benchmark --mode=buckets --config=configs/multi30k_rnn.py --buckets=2:5504,4:4176

padding: the evaluation grid's padded tokens on the config's validation and test
splits, against the two lengths per split chosen before it. compile: seconds to
compile every program a run of the config compiles at start-up, into an empty
cache, one after another (--threads=1) and in parallel (0: the default pool),
then the compiled train step's and validation search's times; compare compiler
options with --config.compile.train_options=... and eval_options=.... calls:
steps/s at each --steps_per_call (config.train.steps_per_call), metrics read
back once per call as in training. seeds: steps/s of S seeds trained as one
program, for each S of --seeds (1: the run alone), and each one's wall time per
step against the first's. saves: seconds per checkpoint save of the run's train
state, waited for and written in the background (the loop's stall, the write). recurrence: an RNN
config's train step on its first batches, as the model runs it (input products before the
loop, gates side by side, logits after it) against the cells as written, step by step, in
turn in one run (speedup_vs_stepwise). buckets: real target tokens/s, padding and compiled
shapes of training at each --buckets setting, NUM_BUCKETS:TOKENS_PER_BATCH (unpacked), each
shape's step timed in turn and weighed by its share of an epoch (speedup_vs_first).

  seq2seq-benchmark --mode=serve --workdir=runs/m30k_transformer [--checkpoint=best] \
      [--clients=32 --requests=500 --serve_batch=8 --beams=4]

serve: seq2seq-serve's latency (p50/p99) for single sentences from one client,
its sentences/s and latency under --clients concurrent clients sending --requests
one-sentence requests of the run's test split, and seq2seq-translate's batch
throughput on the same sentences (server_share: the server's fraction of it).

  seq2seq-benchmark --mode=ctranslate2 --workdir=runs/m30k_transformer [--checkpoint=best] \
      [--sentences=200 --rounds=3 --intra_threads=2 --beams=4]

ctranslate2 (the [export] extra): beam-search sentences/s of the run against the run
exported to CTranslate2 (seq2seq-export) in float32 and int8 on --intra_threads threads, at
batch 1 and at the run's config.eval.batch_size, on its first --sentences test sentences, in
--rounds interleaved rounds (seq2seq/performance/engines.py); the speedups are CTranslate2's.
Each engine runs in a process of its own, the others idle while it is timed; one more,
ctranslate2_float32_native, runs CTranslate2 as its users do (one call, its own batching by
length, one decoding cap), and ours_bfloat16 runs ours with --matmul_dtype=bfloat16 products;
ours_bfloat16_equal_lines and int8_equal_lines are the shares of its and CTranslate2 int8's
lines that are ours in float32.
"""

import functools
import json

from absl import flags

from seq2seq.commands.cli import define_config_flag, run_main
from seq2seq.errors import UserError, require_extra
from seq2seq.performance import benchmark, startup
from seq2seq.serve import EXTRA as SERVE_EXTRA

_MODE = flags.DEFINE_list("mode", ["train", "decode"], "What to measure: train, decode, kv_heads,"
                          " padding, compile, calls, seeds, saves, recurrence, buckets (these"
                          " seven of --config's run), serve, ctranslate2 (of --workdir's run).")
_WORKDIR = flags.DEFINE_string("workdir", None, "serve, ctranslate2: the run to measure.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "serve, ctranslate2: its checkpoint (as"
                                  " seq2seq-serve takes it).")
_SENTENCES = flags.DEFINE_integer("sentences", 200, "ctranslate2: test sentences per round.",
                                  lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "ctranslate2: timed rounds of each engine.",
                               lower_bound=1)
_INTRA_THREADS = flags.DEFINE_integer("intra_threads", 2, "ctranslate2: CTranslate2's threads"
                                      " per translation.", lower_bound=1)
_CLIENTS = flags.DEFINE_integer("clients", 32, "serve: concurrent clients.", lower_bound=1)
_REQUESTS = flags.DEFINE_integer("requests", 500, "serve: requests in all, one sentence each.",
                                 lower_bound=1)
_SERVE_BATCH = flags.DEFINE_integer("serve_batch", 8, "serve: the server's --batch_size.",
                                    lower_bound=1)
_CONFIG = define_config_flag()
_CALLS = flags.DEFINE_list("steps_per_call", ["1", "4", "8"], "calls: steps per call to compare.")
_SEEDS = flags.DEFINE_list("seeds", ["1", "2", "3"], "seeds: seeds per program to compare.")
_BUCKETS = flags.DEFINE_list("buckets", ["2:5504", "4:4176"], "buckets: settings to compare,"
                             " NUM_BUCKETS:TOKENS_PER_BATCH, the first the baseline.")
_THREADS = flags.DEFINE_list("threads", ["1", "0"], "compile: compiling threads to compare (1: one"
                             " after another; 0: the default pool).")
_LAYERS = flags.DEFINE_integer("layers", 3, "Encoder and decoder layers.", lower_bound=1)
_DIM = flags.DEFINE_integer("dim", 256, "Model width.", lower_bound=1)
_HEADS = flags.DEFINE_integer("heads", 4, "Attention heads.", lower_bound=1)
_MLP = flags.DEFINE_integer("mlp", 1024, "Feed-forward width.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab", 8000, "Vocabulary size.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch", 64, "Training sentences per step.", lower_bound=1)
_LENGTH = flags.DEFINE_integer("length", 32, "Training source and target tokens per sentence.",
                               lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 10, "Timed training steps (the fastest is kept).",
                              lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Training computation dtype (parameters stay float32).")
_DECODE_BATCH = flags.DEFINE_integer("decode_batch", 32, "Sentences per decoding call.",
                                     lower_bound=1)
_SRC_LEN = flags.DEFINE_integer("src_len", 40, "Decoding: source tokens per sentence.",
                                lower_bound=1)
_OUT_LEN = flags.DEFINE_integer("out_len", 40, "Decoding: output tokens per sentence.",
                                lower_bound=1)
_BEAMS = flags.DEFINE_list("beams", ["1", "4"], "Decoding: beam sizes (1: greedy).")
_KV_HEADS = flags.DEFINE_list("kv_heads", ["0", "2", "1"], "kv_heads: key/value heads to compare"
                              " (config.model.num_kv_heads; 0: one per head, the reference).")
_PROFILE = flags.DEFINE_bool("profile", False, "Also trace each measured mode with the JAX "
                             "profiler: the share of matmuls, random bits, gathers, top_k, "
                             "copies and the rest, and the slowest XLA instructions.")


# Of --config's run.
STARTUP_MODES = ("padding", "compile", "calls", "seeds", "saves", "recurrence", "buckets")
MODES = ("train", "decode", "kv_heads", *STARTUP_MODES, "serve", "ctranslate2")


def _whole_numbers(values: list[str], low: int) -> bool:
  return all(v.strip().isdigit() and int(v) >= low for v in values)


flags.register_validator("mode", lambda modes: bool(modes) and set(modes) <= set(MODES),
                         f"--mode takes some of {', '.join(MODES)} (comma-separated)")
for _flag, _low in (("steps_per_call", 1), ("seeds", 1), ("threads", 0), ("beams", 1),
                    ("kv_heads", 0)):
  flags.register_validator(_flag, functools.partial(_whole_numbers, low=_low),
                           f"--{_flag} takes whole numbers of at least {_low}, comma-separated")
flags.register_multi_flags_validator(
    ["dim", "heads"], lambda f: f["dim"] % f["heads"] == 0,
    "--dim must be divisible by --heads (each head gets dim / heads); choose sizes where it is")


def main(argv):
  del argv
  run_main(_measure)  # Turns on the cache: timings are of compiled programs, it changes start-up.


def _measure() -> None:
  if "serve" in _MODE.value:  # Before the other modes spend their minutes.
    if _WORKDIR.value is None:
      raise UserError("--mode=serve measures a trained run's server; pass --workdir=RUN.")
    require_extra("serve", "seq2seq-benchmark --mode=serve", (*SERVE_EXTRA, "httpx"))
  if "ctranslate2" in _MODE.value:
    if _WORKDIR.value is None:
      raise UserError("--mode=ctranslate2 measures a trained run; pass --workdir=RUN.")
    require_extra("export", "seq2seq-benchmark --mode=ctranslate2", ("ctranslate2",))
  sizes = dict(layers=_LAYERS.value, dim=_DIM.value, heads=_HEADS.value, mlp=_MLP.value,
               vocab=_VOCAB.value)
  if "train" in _MODE.value:
    print(json.dumps(benchmark.train_benchmark(**sizes, batch=_BATCH.value, length=_LENGTH.value,
                                               steps=_STEPS.value, dtype=_DTYPE.value)),
          flush=True)
  if "decode" in _MODE.value:
    for result in benchmark.decode_benchmark(
        **sizes, batch=_DECODE_BATCH.value, src_len=_SRC_LEN.value, out_len=_OUT_LEN.value,
        beams=[int(b) for b in _BEAMS.value]):
      print(json.dumps(result), flush=True)
  if "kv_heads" in _MODE.value:
    kv_heads = [int(k) for k in _KV_HEADS.value]
    if any(k and _HEADS.value % k for k in kv_heads):
      raise UserError(f"--kv_heads={','.join(_KV_HEADS.value)}: each must divide --heads="
                      f"{_HEADS.value} (or be 0, one per head).")
    for result in benchmark.kv_heads_benchmark(
        **sizes, batch=_DECODE_BATCH.value, src_len=_SRC_LEN.value, out_len=_OUT_LEN.value,
        beam=int(_BEAMS.value[-1]), kv_heads=kv_heads):
      print(json.dumps(result), flush=True)
  if set(STARTUP_MODES) & set(_MODE.value):
    _startup(_MODE.value)
  if "serve" in _MODE.value:
    _serve()
  if "ctranslate2" in _MODE.value:
    _ctranslate2()
  if _PROFILE.value:
    for result in benchmark.profile_benchmarks(
        **sizes, batch=_BATCH.value, length=_LENGTH.value, dtype=_DTYPE.value,
        decode_batch=_DECODE_BATCH.value, src_len=_SRC_LEN.value, out_len=_OUT_LEN.value,
        beams=[int(b) for b in _BEAMS.value], modes=_MODE.value):
      print(json.dumps(result), flush=True)


def _startup(modes: list[str]) -> None:
  """The modes that measure --config's run, in this order."""
  if _CONFIG.value is None:
    raise UserError("--mode=padding, compile, calls, seeds, saves, recurrence and buckets"
                    " measure a run's config; pass --config=configs/<name>.py.")
  ints = lambda values: [int(v) for v in values]  # noqa: E731
  measures = {
      "padding": lambda config: startup.padding_benchmark(config),
      "compile": lambda config: startup.compile_benchmark(config, ints(_THREADS.value)),
      "calls": lambda config: startup.calls_benchmark(config, ints(_CALLS.value)),
      "saves": lambda config: startup.saves_benchmark(config),
      "seeds": lambda config: startup.seeds_benchmark(config, ints(_SEEDS.value)),
      "recurrence": lambda config: startup.recurrence_benchmark(config),
      "buckets": lambda config: startup.buckets_benchmark(config, _bucket_settings()),
  }
  for mode, measure in measures.items():
    if mode in modes:
      for result in measure(_CONFIG.value):
        print(json.dumps(result), flush=True)


def _bucket_settings() -> list[tuple[int, int]]:
  """--buckets as (data.num_buckets, data.tokens_per_batch) pairs."""
  settings = []
  for spec in _BUCKETS.value:
    buckets, _, tokens = spec.partition(":")
    if not (buckets.isdigit() and tokens.isdigit() and int(tokens) > 0):
      raise UserError(f"--buckets={spec} is not NUM_BUCKETS:TOKENS_PER_BATCH; e.g."
                      " --buckets=2:5504,4:4176 (0 buckets: one per length step).")
    settings.append((int(buckets), int(tokens)))
  return settings


def _serve() -> None:
  from seq2seq.performance import serving  # The [serve] extra.

  for result in serving.serve_benchmark(_WORKDIR.value, _CHECKPOINT.value,
                                        beam=int(_BEAMS.value[-1]), batch_size=_SERVE_BATCH.value,
                                        clients=_CLIENTS.value, requests=_REQUESTS.value):
    print(json.dumps(result), flush=True)


def _ctranslate2() -> None:
  from seq2seq.performance import engines  # The [export] extra.

  for result in engines.ctranslate2_benchmark(
      _WORKDIR.value, _CHECKPOINT.value, beam=int(_BEAMS.value[-1]), sentences=_SENTENCES.value,
      rounds=_ROUNDS.value, threads=_INTRA_THREADS.value):
    print(json.dumps(result), flush=True)
