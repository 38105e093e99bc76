"""Shared fixtures: the tiny config, shrunk further so each run compiles few shapes."""

import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

# Many tests train the same tiny run: one persistent compilation cache for the session (and the
# scripts it starts) compiles each identical program once. Set before JAX reads its config.
_COMPILATION_CACHE = tempfile.mkdtemp(prefix="seq2seq-test-jax-cache-")
atexit.register(shutil.rmtree, _COMPILATION_CACHE, ignore_errors=True)
os.environ.update(JAX_COMPILATION_CACHE_DIR=_COMPILATION_CACHE,
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TFDS_EXTRA = "TFDS tests need the optional extra: pip install -e '.[tfds]'"


def load_config(name: str):
  """`get_config()` of `configs/<name>.py`, loaded the way config_flags does."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def fast_tiny_config():
  """configs/tiny.py shrunk so that a run compiles one train shape and decodes 8 sentences."""
  c = load_config("tiny")
  c.data.max_train_examples = 300
  c.data.max_len = 16
  c.data.bucket_step = 16  # One padded length: one compiled train step.
  c.data.tokens_per_batch = 256
  c.eval.max_sentences = 8
  c.eval.batch_size = 8
  c.eval.max_decode_len_a = 1.0
  c.eval.max_decode_len_b = 0
  return c


def damage_checkpoint(workdir, step: int, damage: str) -> None:
  """Damages checkpoint `step` of `workdir`: its biggest file "truncated" to half, or its
  OCDBT manifest "missing"."""
  saved = Path(workdir) / "checkpoints" / str(step) / "default"
  if damage == "truncated":
    biggest = max((p for p in saved.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
  else:
    (saved / "manifest.ocdbt").unlink()


@pytest.fixture
def tiny_config():
  return fast_tiny_config()


def assert_stepping_matches_decode(model, src, tgt, *, all_positions: bool = False):
  """Feeding `tgt [batch, t]` through decode_step gives decode's teacher-forced logits.

  Only real (non-PAD) target positions are compared unless `all_positions`.
  Returns the cache after the last step.
  """
  memory = model.encode(src)
  full = np.asarray(model.decode(memory, tgt))
  cache = model.init_cache(memory, tgt.shape[1])
  stepped = []
  for t in range(tgt.shape[1]):
    logits, cache = model.decode_step(memory, cache, tgt[:, t])
    stepped.append(logits)
  stepped = np.asarray(jnp.stack(stepped, axis=1))
  compared = np.ones(tgt.shape, bool) if all_positions else np.asarray(tgt != 0)
  np.testing.assert_allclose(stepped[compared], full[compared], atol=1e-5)
  return cache


@pytest.fixture(scope="session")
def run(tmp_path_factory):
  """One tiny trained run (checkpoints at steps 2 and 4) for every test that reads a run.

  Tests may add evaluation outputs (eval/) but change nothing else; tests/test_errors.py
  checks that failing commands leave it as it was.
  """
  from seq2seq import train
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = 4, 2
  workdir = tmp_path_factory.mktemp("shared") / "run"
  train.train_and_evaluate(c, workdir)
  return workdir
