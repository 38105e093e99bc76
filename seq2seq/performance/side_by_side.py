"""This project against flax `examples/wmt` at equal shapes: the speed anchor.

Both sides build the same Transformer (3+3 layers, d=256, 4 heads, MLP 1024,
vocabulary 8,000, tied embeddings, dropout and attention dropout 0.1) and run
in one process, interleaved round by round so that a noisy machine slows both
alike: a train step on 64 x 32 random tokens (label smoothing 0.1, Adam), then
beam 4 over 32 sentences with 40 tokens out, from random weights (EOS almost
never wins, so both run every step). The figures are ratios of medians,
anchor over ours: above 1, this project is faster.

The anchor's `models.py` and `decode.py` are read from `$FLAX_WMT_DIR`, or
unpacked at run time from the source distribution of the installed flax
(`pip download`) into a temporary folder; nothing of them is kept in this
repository.
"""

import contextlib
import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from seq2seq.decoding import search
from seq2seq.errors import UserError
from seq2seq.models import build_model
from seq2seq.performance.benchmark import random_batch, timed, transformer_config
from seq2seq.runs.train_state import make_optimizer, new_train_state
from seq2seq.training import steps

ANCHOR_FILES = ("models.py", "decode.py")


@dataclasses.dataclass(frozen=True)
class Shapes:
  layers: int = 3
  dim: int = 256
  heads: int = 4
  mlp: int = 1024
  vocab: int = 8000
  batch: int = 64
  length: int = 32
  decode_batch: int = 32
  decode_len: int = 40
  beam: int = 4


@contextlib.contextmanager
def anchor_files(folder: Path | None = None):
  """Within: the folder holding the anchor's files: `folder`, `$FLAX_WMT_DIR`, or flax's
  source distribution unpacked into a temporary folder, removed again on the way out."""
  if folder is not None:
    yield folder
    return
  if os.environ.get("FLAX_WMT_DIR"):
    folder = Path(os.environ["FLAX_WMT_DIR"])
    missing = [name for name in ANCHOR_FILES if not (folder / name).is_file()]
    if missing:
      raise UserError(f"FLAX_WMT_DIR={folder} lacks {', '.join(missing)}; point it at a copy of"
                      " flax's examples/wmt, or unset it to download flax's source.")
    yield folder
    return
  version = importlib.metadata.version("flax")
  with tempfile.TemporaryDirectory(prefix="flax_wmt_") as scratch:
    folder = Path(scratch)
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         f"flax=={version}", "-d", str(folder)], capture_output=True, text=True)
    if download.returncode:
      reason = (download.stderr.strip().splitlines() or ["pip failed"])[-1]
      raise UserError(f"Could not download flax=={version}'s source distribution ({reason});"
                      " set FLAX_WMT_DIR to a"
                      " folder holding flax's examples/wmt/models.py and decode.py.")
    with tarfile.open(folder / f"flax-{version}.tar.gz") as tar:
      for name in ANCHOR_FILES:
        source = tar.extractfile(f"flax-{version}/examples/wmt/{name}")
        (folder / name).write_bytes(source.read())
    yield folder


def _import_anchor(folder: Path):
  """The anchor's `models` and `decode` modules (decode imports nothing of models)."""
  modules = []
  for name in ("models", "decode"):
    spec = importlib.util.spec_from_file_location(f"flax_wmt_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    modules.append(module)
  return modules


def anchor_side(folder: Path, s: Shapes, src, tgt):
  """(train step `() -> loss`, beam search `() -> ids`) of flax examples/wmt, as its own
  train.py and decode.py run them (its loss: label-smoothed one-hot targets)."""
  models, decode = _import_anchor(folder)
  cfg = models.TransformerConfig(
      vocab_size=s.vocab, output_vocab_size=s.vocab, share_embeddings=True,
      logits_via_embedding=True, emb_dim=s.dim, num_heads=s.heads, num_layers=s.layers,
      qkv_dim=s.dim, mlp_dim=s.mlp, max_len=256, dropout_rate=0.1, attention_dropout_rate=0.1,
      deterministic=False)
  params = models.Transformer(cfg).init(jax.random.key(0), src, tgt)["params"]
  optimizer = optax.adamw(1e-3, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0)
  confidence, low = 0.9, 0.1 / (s.vocab - 1)

  @functools.partial(jax.jit, donate_argnums=0)
  def train(state, key):
    def loss_fn(p):
      logits = models.Transformer(cfg).apply({"params": p}, src, tgt, rngs={"dropout": key})
      soft = jax.nn.one_hot(tgt, s.vocab) * (confidence - low) + low
      return -jnp.sum(soft * jax.nn.log_softmax(logits)) / tgt.size
    loss, grads = jax.value_and_grad(loss_fn)(state[0])
    updates, opt_state = optimizer.update(grads, state[1], state[0])
    return (optax.apply_updates(state[0], updates), opt_state), loss

  search = _anchor_search(models, decode, cfg, s, src)
  state = [(params, optimizer.init(params))]
  key = jax.random.key(1)

  def train_once():
    state[0], loss = train(state[0], key)
    return loss
  return train_once, lambda: search(state[0][0])


def _anchor_search(models, decode, cfg, s: Shapes, src):
  """`params -> ids`: flax examples/wmt's beam search of the first `s.decode_batch` sources,
  as its decode.py runs it (`cfg`: its training model's config)."""
  decode_cfg = cfg.replace(deterministic=True, decode=True)
  inputs = src[:s.decode_batch]
  cache = models.Transformer(decode_cfg).init(
      jax.random.key(0), jnp.ones(inputs.shape, jnp.float32),
      jnp.ones((s.decode_batch, s.decode_len), jnp.float32))["cache"]

  @jax.jit
  def search(params, inputs, cache):
    model = models.Transformer(decode_cfg)
    encoded = decode.flat_batch_beam_expand(
        model.apply({"params": params}, inputs, method=models.Transformer.encode), s.beam)
    raw = decode.flat_batch_beam_expand(inputs, s.beam)

    def tokens_to_logits(ids, cache):
      logits, variables = model.apply({"params": params, "cache": cache}, encoded, raw, ids,
                                      mutable=["cache"], method=models.Transformer.decode)
      return logits.squeeze(1), variables["cache"]
    sequences, _ = decode.beam_search(inputs, cache, tokens_to_logits, beam_size=s.beam,
                                      alpha=0.6, eos_id=2, max_decode_len=s.decode_len)
    return sequences[:, -1, 1:]

  return lambda params: search(params, inputs, cache)


def project_side(s: Shapes, src, tgt, tgt_in):
  """(train step `() -> metrics`, beam search `() -> ids`) of this project."""
  c = transformer_config(s.layers, s.dim, s.heads, s.mlp)
  c.model.dropout_rate, c.model.attention_dropout_rate = 0.1, 0.1
  graphdef, params = nnx.split(build_model(c, s.vocab), nnx.Param)
  optimizer = make_optimizer(c.train)
  train = jax.jit(functools.partial(steps.train_step, graphdef=graphdef, optimizer=optimizer,
                                    train=c.train), donate_argnums=0)
  batch = {"src": src, "tgt_in": tgt_in, "tgt_out": tgt}
  model = build_model(c, s.vocab)
  model.eval()
  strategy = search.Beam(beam_size=s.beam, alpha=0.6)
  decode = jax.jit(lambda inputs: search.generate(model, inputs, strategy,
                                                    max_len=s.decode_len)[0])
  inputs = src[:s.decode_batch]
  state = [new_train_state(params, optimizer)]
  key = jax.random.key(1)

  def train_once():
    state[0], metrics = train(state[0], batch, key)
    return metrics
  return train_once, lambda: decode(inputs)


def compare(rounds: int = 7, shapes: Shapes = Shapes(), folder: Path | None = None) -> dict:
  """Times both sides, interleaved, `rounds` times; returns the JSON record."""
  s = shapes
  batch = random_batch(s.batch, s.length, s.vocab)
  src, tgt, tgt_in = batch["src"], batch["tgt_out"], batch["tgt_in"]
  with anchor_files(folder) as files:  # Imported, the anchor's files are not needed again.
    sides = {"anchor": anchor_side(files, s, src, tgt),
             "project": project_side(s, src, tgt, tgt_in)}
  compile_s = {f"{name}_{kind}": round(timed(fn), 1) for name, fns in sides.items()
               for kind, fn in zip(("train", "decode"), fns, strict=True)}
  train_s = {name: [] for name in sides}
  decode_s = {name: [] for name in sides}
  for _ in range(rounds):
    for name, (train, decode) in sides.items():
      train_s[name] += [timed(train), timed(train)]
      decode_s[name].append(timed(decode))
  train_med = {name: statistics.median(t) for name, t in train_s.items()}
  decode_med = {name: statistics.median(t) for name, t in decode_s.items()}
  tokens = s.batch * s.length
  return {
      "backend": jax.default_backend(), "rounds": rounds,
      "train_step_s": {k: round(v, 4) for k, v in train_med.items()},
      "train_tgt_tok_s": {k: round(tokens / v) for k, v in train_med.items()},
      "train_ratio": round(train_med["anchor"] / train_med["project"], 3),
      "compile_s": compile_s, "beam": s.beam,
      "decode_s": {k: round(v, 4) for k, v in decode_med.items()},
      "decode_sent_s": {k: round(s.decode_batch / v, 1) for k, v in decode_med.items()},
      "decode_ratio": round(decode_med["anchor"] / decode_med["project"], 3),
  }
