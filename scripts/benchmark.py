"""Decoding speed at fixed shapes: sentences/s and tokens/s, greedy and beam search.

  python scripts/benchmark.py [--batch=32 --src_len=40 --beams=1,4 --repeats=3]

Each measurement is one JSON line. The model is a Transformer with the given
sizes and random weights; with random weights EOS almost never wins, so every
sentence decodes to the full length and the work per call is fixed. "ours"
projects cross-attention keys/values once per sentence in `encode`; the
"recompute" baseline does what a straightforward cache-per-step decoder does
and projects them from the encoder output again at every step. Both run in
the same process, so their ratio is meaningful even on a noisy machine.
"""

import functools
import json
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from seq2seq import decoding
from seq2seq.config import base_config
from seq2seq.models import build_model

_BATCH = flags.DEFINE_integer("batch", 32, "Sentences per call.")
_SRC_LEN = flags.DEFINE_integer("src_len", 40, "Source tokens per sentence.")
_OUT_LEN = flags.DEFINE_integer("out_len", 40, "Output tokens per sentence.")
_BEAMS = flags.DEFINE_list("beams", ["1", "4"], "Beam sizes (1: greedy).")
_LAYERS = flags.DEFINE_integer("layers", 3, "Encoder and decoder layers.")
_DIM = flags.DEFINE_integer("dim", 256, "Model width.")
_HEADS = flags.DEFINE_integer("heads", 4, "Attention heads.")
_MLP = flags.DEFINE_integer("mlp", 1024, "Feed-forward width.")
_VOCAB = flags.DEFINE_integer("vocab", 8000, "Vocabulary size.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per measurement (best is kept).")


def recompute_cross_kv(model, memory, cache, token_ids):
  """decode_step as a straightforward decoder does it: cross keys/values every step."""
  cross_kv = tuple(layer.cross_attention.project_kv(memory.encoded)
                   for layer in model.decoder_layers)
  return model.decode_step(memory._replace(cross_kv=cross_kv), cache, token_ids)


def search(model, src, *, beam, out_len, recompute):
  memory = model.encode(src)
  if beam > 1:
    memory = decoding.expand_to_beams(memory, beam)
  step = (functools.partial(recompute_cross_kv, model, memory) if recompute
          else functools.partial(model.decode_step, memory))
  cache = model.init_cache(memory, out_len)
  if beam == 1:
    return decoding.greedy_search(step, cache, src.shape[0], out_len)
  return decoding.beam_search(step, cache, src.shape[0], out_len, beam_size=beam, alpha=0.6)[0]


def main(argv):
  del argv
  c = base_config()
  c.model.emb_dim, c.model.num_heads, c.model.mlp_dim = _DIM.value, _HEADS.value, _MLP.value
  c.model.num_encoder_layers = c.model.num_decoder_layers = _LAYERS.value
  model = build_model(c, _VOCAB.value)
  # Source tokens avoid the special ids 0-3 (PAD, UNK, BOS, EOS).
  src = jax.random.randint(jax.random.key(0), (_BATCH.value, _SRC_LEN.value), 4, _VOCAB.value)
  for beam in (int(b) for b in _BEAMS.value):
    times = {}
    for name, recompute in (("ours", False), ("recompute", True)):
      fn = jax.jit(functools.partial(search, model, beam=beam, out_len=_OUT_LEN.value,
                                     recompute=recompute))
      ids = jax.block_until_ready(fn(src))  # compile
      best = float("inf")
      for _ in range(_REPEATS.value):
        start = time.perf_counter()
        ids = jax.block_until_ready(fn(src))
        best = min(best, time.perf_counter() - start)
      tokens = int(jnp.sum(ids[:, 0] != 0)) if ids.ndim == 3 else int(jnp.sum(ids != 0))
      times[name] = best
      print(json.dumps({
          "benchmark": "decode", "impl": name, "beam": beam, "batch": _BATCH.value,
          "src_len": _SRC_LEN.value, "out_len": _OUT_LEN.value, "layers": _LAYERS.value,
          "dim": _DIM.value, "vocab": _VOCAB.value, "seconds": round(best, 4),
          "sentences_per_sec": round(_BATCH.value / best, 2),
          "tokens_per_sec": round(tokens / best, 1), "device": jax.devices()[0].device_kind}))
    print(json.dumps({"benchmark": "decode", "beam": beam,
                      "speedup_vs_recompute": round(times["recompute"] / times["ours"], 3)}))


if __name__ == "__main__":
  app.run(main)
