"""Speed at fixed shapes: training throughput with FLOPs and MFU, and decoding speed.

Every function returns plain dicts (one per measurement) for JSON lines;
`seq2seq-benchmark` (seq2seq/commands/benchmark.py) prints them. Timings keep the best
of several calls after a compiling one, so a noisy machine shows its fastest steady state.
"""

import functools
import time

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from seq2seq.config import base_config
from seq2seq.decoding import beams, search
from seq2seq.models import build_model
from seq2seq.performance import profile
from seq2seq.runs import train_state
from seq2seq.training.steps import train_step

# Dense peak FLOP/s of known accelerators (vendor data sheets, without sparsity). Under JAX's
# default matmul precision, float32 matmuls on Ampere and Hopper run on the TF32 tensor cores,
# so the float32 entry is the TF32 peak (jax_default_matmul_precision="highest" would bound
# them by the plain FP32 peak instead: 67 TFLOP/s on H100/H200, 19.5 on A100).
PEAK_FLOPS = {
    "NVIDIA H100": {"bfloat16": 989e12, "float32": 495e12},  # SXM
    "NVIDIA H200": {"bfloat16": 989e12, "float32": 495e12},
    "NVIDIA A100": {"bfloat16": 312e12, "float32": 156e12},
}


def transformer_config(layers: int, dim: int, heads: int, mlp: int) -> ml_collections.ConfigDict:
  c = base_config()
  c.model.emb_dim, c.model.num_heads, c.model.mlp_dim = dim, heads, mlp
  c.model.num_encoder_layers = c.model.num_decoder_layers = layers
  return c


def transformer_flops(m: ml_collections.ConfigDict, vocab: int, batch: int, src_len: int,
                      tgt_len: int, training: bool = True) -> float:
  """FLOPs of one step counted from the matmuls (2 per multiply-add).

  Weights are counted for every token; attention scores and weighted sums in
  full (neither the encoder's nor the causal decoder's is halved). Training
  counts the forward pass three times (forward + backward).
  """
  d, f = m.emb_dim, m.mlp_dim
  s, t = batch * src_len, batch * tgt_len
  encoder = m.num_encoder_layers * (
      4 * s * d * d  # query, key, value, output projections
      + 2 * batch * src_len * src_len * d  # scores and weighted sum
      + 2 * s * d * f)  # feed-forward
  decoder = m.num_decoder_layers * (
      4 * t * d * d + 2 * batch * tgt_len * tgt_len * d  # self-attention
      + 2 * t * d * d + 2 * s * d * d  # cross-attention: query/output; key/value of the source
      + 2 * batch * tgt_len * src_len * d  # cross-attention scores and weighted sum
      + 2 * t * d * f)
  logits = t * d * vocab
  macs = encoder + decoder + logits
  return 2.0 * macs * (3 if training else 1)


def matmul_flops_per_sec(size: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
  """The FLOP/s of a square matrix multiply on this device, measured now."""
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  jax.block_until_ready(matmul(a, a))
  best = min(timed(lambda: matmul(a, a)) for _ in range(repeats))
  return 2.0 * size**3 / best


def timed(fn) -> float:
  """Seconds `fn()` takes, its results ready."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def random_batch(batch: int, length: int, vocab: int) -> dict:
  """Full-length sentences of random non-special tokens (ids 0-3 are PAD/UNK/BOS/EOS)."""
  keys = jax.random.split(jax.random.key(1), 2)
  src = jax.random.randint(keys[0], (batch, length), 4, vocab)
  tgt = jax.random.randint(keys[1], (batch, length), 4, vocab)
  tgt_in = jnp.concatenate([jnp.full((batch, 1), 2), tgt[:, :-1]], axis=1)
  return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt}


def _train_setup(layers, dim, heads, mlp, vocab, batch, length, dtype):
  """The config, the (unjitted) train step and its arguments at these shapes."""
  c = transformer_config(layers, dim, heads, mlp)
  c.train.dtype = dtype
  graphdef, params = nnx.split(build_model(c, vocab), nnx.Param)
  optimizer = train_state.make_optimizer(c.train)
  step = functools.partial(train_step, graphdef=graphdef, optimizer=optimizer, train=c.train)
  state = train_state.new_train_state(params, optimizer)
  return c, step, state, random_batch(batch, length, vocab), jax.random.key(0)


def train_benchmark(*, layers=3, dim=256, heads=4, mlp=1024, vocab=8000, batch=64, length=32,
                    steps=10, dtype="float32") -> dict:
  """Step time, target tokens/s, FLOPs and MFU of the jitted train step at fixed shapes.

  `dtype` is the computation's (`config.train.dtype`: parameters and optimizer
  state stay float32); the reference matmul and the vendor peak use the same.
  """
  c, step, state, data, key = _train_setup(layers, dim, heads, mlp, vocab, batch, length, dtype)
  step = jax.jit(step, donate_argnums=0)
  state, _ = jax.block_until_ready(step(state, data, key))  # compile
  best = float("inf")
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(step(state, data, key))
    best = min(best, time.perf_counter() - start)
  flops = transformer_flops(c.model, vocab, batch, length, length)
  matmul = matmul_flops_per_sec(dtype=jnp.dtype(dtype))
  device = jax.devices()[0]
  peak = PEAK_FLOPS.get(next((k for k in PEAK_FLOPS if device.device_kind.startswith(k)), ""),
                        {}).get(dtype)
  return {"benchmark": "train", "layers": layers, "dim": dim, "heads": heads, "mlp": mlp,
          "vocab": vocab, "batch": batch, "length": length, "dtype": dtype,
          "step_seconds": float(f"{best:.6g}"),
          "target_tokens_per_sec": round(float(metrics["tokens"]) / best, 1),
          "model_tflops_per_step": round(flops / 1e12, 4),
          "achieved_tflops": round(flops / best / 1e12, 4),
          "matmul_tflops": round(matmul / 1e12, 4),
          "mfu_vs_matmul": round(flops / best / matmul, 4),
          "mfu_vs_peak": round(flops / best / peak, 4) if peak else None,
          "device": device.device_kind}


def recompute_cross_kv(model, memory, cache, token_ids, *, per_step: bool = False):
  """decode_step as a straightforward decoder does it: cross keys/values every step.

  Written plainly, the projection of the encoder output is loop-invariant and
  XLA hoists most of it out of the decoding loop. `per_step=True` ties the
  encoder output to the step index through an optimization barrier, so the
  projections really run at every step, as in a decoder whose compiler cannot
  prove them invariant.
  """
  encoded = memory.encoded
  if per_step:
    encoded, _ = jax.lax.optimization_barrier((encoded, cache.index))
  cross_kv = tuple(layer.cross_attention.project_kv(encoded) for layer in model.decoder_layers)
  return model.decode_step(memory._replace(cross_kv=cross_kv), cache, token_ids)


# The decoders compared: ours (cross keys/values computed once per sentence) and two baselines.
DECODERS = {
    "ours": None,
    "recompute": functools.partial(recompute_cross_kv, per_step=False),
    "recompute_per_step": functools.partial(recompute_cross_kv, per_step=True),
}


def _search(model, src, *, beam, out_len, impl):
  memory = model.encode(src)
  baseline = DECODERS[impl]
  if beam > 1:
    memory = beams.expand_to_beams(memory, beam, copy_all=baseline is not None)
  step = (functools.partial(model.decode_step, memory) if baseline is None
          else functools.partial(baseline, model, memory))
  cache = model.init_cache(memory, out_len)
  if beam == 1:
    return search.greedy_search(step, cache, src.shape[0], out_len)
  return search.beam_search(step, cache, src.shape[0], out_len, beam_size=beam, alpha=0.6)[0]


def decode_benchmark(*, layers=3, dim=256, heads=4, mlp=1024, vocab=8000, batch=32, src_len=40,
                     out_len=40, beams=(1, 4), repeats=5) -> list[dict]:
  """Sentences/s and tokens/s of greedy and beam search, ours vs the `DECODERS` baselines.

  With random weights EOS almost never wins, so every sentence decodes to
  `out_len` tokens and the work per call is fixed. The decoders are timed in
  turn, `repeats` rounds, keeping each one's fastest call, so that a slow
  spell of a noisy machine does not fall on one decoder only.
  """
  model = build_model(transformer_config(layers, dim, heads, mlp), vocab)
  src = random_batch(batch, src_len, vocab)["src"]
  results = []
  for beam in beams:
    fns, tokens = {}, {}
    for impl in DECODERS:
      fns[impl] = jax.jit(functools.partial(_search, model, beam=beam, out_len=out_len, impl=impl))
      ids = jax.block_until_ready(fns[impl](src))  # compile
      tokens[impl] = int(jnp.sum((ids[:, 0] if ids.ndim == 3 else ids) != 0))
    seconds = {impl: float("inf") for impl in DECODERS}
    for _ in range(repeats):
      for impl, fn in fns.items():
        seconds[impl] = min(seconds[impl], timed(lambda fn=fn: fn(src)))
    for impl in DECODERS:
      results.append({
          "benchmark": "decode", "impl": impl, "beam": beam, "batch": batch,
          "src_len": src_len, "out_len": out_len, "layers": layers, "dim": dim, "vocab": vocab,
          "seconds": float(f"{seconds[impl]:.6g}"),
          "sentences_per_sec": round(batch / seconds[impl], 2),
          "tokens_per_sec": round(tokens[impl] / seconds[impl], 1),
          "device": jax.devices()[0].device_kind})
    results.append({"benchmark": "decode", "beam": beam, **{
        f"speedup_vs_{impl}": round(seconds[impl] / seconds["ours"], 3)
        for impl in DECODERS if impl != "ours"}})
  return results


def kv_heads_benchmark(*, layers=3, dim=256, heads=4, mlp=1024, vocab=8000, batch=32, src_len=40,
                       out_len=40, beam=4, kv_heads=(0, 2, 1), repeats=5) -> list[dict]:
  """Beam search's sentences/s and the decoder's state in bytes, for each number of key/value
  heads (`config.model.num_kv_heads`; 0: one per query head, the first is the reference).

  The models share every size but the key/value projections, and decode the same random
  sources to `out_len` tokens (random weights: EOS almost never wins); they are timed in
  turn, `repeats` rounds, keeping each one's fastest call. `cache_bytes` is the self-attention
  cache of `batch * beam` hypotheses at `out_len` tokens; `cross_kv_bytes` the encoder keys
  and values that the beams of a sentence share.
  """
  src = random_batch(batch, src_len, vocab)["src"]
  fns, sizes = {}, {}
  for kv in kv_heads:
    config = transformer_config(layers, dim, heads, mlp)
    config.model.num_kv_heads = kv
    model = build_model(config, vocab)
    fns[kv] = jax.jit(functools.partial(_search, model, beam=beam, out_len=out_len, impl="ours"))
    jax.block_until_ready(fns[kv](src))  # compile
    memory = beams.expand_to_beams(model.encode(src), beam)
    nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
    sizes[kv] = (nbytes(model.init_cache(memory, out_len).self_kv), nbytes(memory.cross_kv))
  seconds = {kv: float("inf") for kv in kv_heads}
  for _ in range(repeats):
    for kv, fn in fns.items():
      seconds[kv] = min(seconds[kv], timed(lambda fn=fn: fn(src)))
  first = kv_heads[0]
  return [{"benchmark": "kv_heads", "num_kv_heads": kv or heads, "heads": heads, "beam": beam,
           "batch": batch, "src_len": src_len, "out_len": out_len, "layers": layers, "dim": dim,
           "vocab": vocab, "seconds": float(f"{seconds[kv]:.6g}"),
           "sentences_per_sec": round(batch / seconds[kv], 2),
           "speedup": round(seconds[first] / seconds[kv], 3),
           "cache_bytes": sizes[kv][0], "cross_kv_bytes": sizes[kv][1],
           "cache_share": round(sizes[kv][0] / sizes[first][0], 4),
           "device": jax.devices()[0].device_kind} for kv in kv_heads]


def profile_benchmarks(*, layers=3, dim=256, heads=4, mlp=1024, vocab=8000, batch=64, length=32,
                       dtype="float32", decode_batch=32, src_len=40, out_len=40,
                       beams=(1, 4), modes=("train", "decode")) -> list[dict]:
  """`profile.profile_ops` of the train step and of our decoders at the benchmark's shapes."""
  results = []
  if "train" in modes:
    _, step, state, data, key = _train_setup(layers, dim, heads, mlp, vocab, batch, length,
                                             dtype)
    results.append({"profile": "train", "batch": batch, "length": length, "dtype": dtype,
                    **profile.profile_ops(jax.jit(step), state, data, key)})
  if "decode" in modes:
    model = build_model(transformer_config(layers, dim, heads, mlp), vocab)
    src = random_batch(decode_batch, src_len, vocab)["src"]
    for beam in beams:
      search = jax.jit(functools.partial(_search, model, beam=beam, out_len=out_len, impl="ours"))
      results.append({"profile": "decode", "beam": beam, "batch": decode_batch,
                      "out_len": out_len, **profile.profile_ops(search, src)})
  return results
