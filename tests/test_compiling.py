"""The persistent compilation cache, programs compiled ahead, and how many a run compiles."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from seq2seq import compiling, train
from seq2seq.translator import Translator
from tests.helpers import fast_tiny_config

OPTIONS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_enable_xla_caches")


@pytest.fixture
def jax_cache_options():
  """Puts JAX's cache options back as the session had them (tests/conftest.py) afterwards."""
  saved = {name: getattr(jax.config, name) for name in OPTIONS}
  yield
  for name, value in saved.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()


@pytest.fixture
def fresh_cache(tmp_path, jax_cache_options):
  """An empty persistent compilation cache for the test."""
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax-cache"))
  compilation_cache.reset_cache()
  return tmp_path / "jax-cache"


@pytest.fixture
def environ(monkeypatch):
  """No cache variable set, whatever the session set."""
  for name in ("JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME", compiling.CACHE_SWITCH):
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def test_the_cache_is_the_users_unless_jax_compilation_cache_dir_names_one(
    tmp_path, environ, jax_cache_options):
  environ.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compiling.enable_cache() == tmp_path / "xdg" / "seq2seq" / "jax"
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xdg" / "seq2seq" / "jax")
  assert (tmp_path / "xdg" / "seq2seq" / "jax").is_dir()

  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  assert compiling.enable_cache() == tmp_path / "mine"
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")

  environ.delenv("XDG_CACHE_HOME")
  environ.delenv("JAX_COMPILATION_CACHE_DIR")
  environ.setenv("HOME", str(tmp_path / "home"))
  assert compiling.enable_cache() == tmp_path / "home" / ".cache" / "seq2seq" / "jax"


def test_the_cache_switched_off(tmp_path, environ, jax_cache_options):
  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  for off in ("off", "0", "OFF", "false"):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    environ.setenv(compiling.CACHE_SWITCH, off)
    assert compiling.enable_cache() is None
    assert jax.config.jax_compilation_cache_dir is None
  assert not (tmp_path / "mine").exists()


def _not_a_directory(tmp_path, monkeypatch):
  (tmp_path / "file").write_text("not a directory")
  return tmp_path / "file" / "cache", "Not a directory"


def _read_only(tmp_path, monkeypatch):
  def refused(*args, **kwargs):
    raise PermissionError(13, "Permission denied")

  (tmp_path / "cache").mkdir()
  monkeypatch.setattr(compiling.tempfile, "NamedTemporaryFile", refused)
  return tmp_path / "cache", "Permission denied"


@pytest.mark.parametrize("unusable", [_not_a_directory, _read_only],
                         ids=["not a directory", "read-only"])
def test_an_unusable_cache_is_one_warning_and_no_cache(tmp_path, environ, jax_cache_options,
                                                       caplog, monkeypatch, unusable):
  path, reason = unusable(tmp_path, monkeypatch)
  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(path))
  with caplog.at_level(logging.WARNING):
    assert compiling.enable_cache() is None
  assert jax.config.jax_compilation_cache_dir is None
  assert [r.getMessage() for r in caplog.records] == [
      f"The compilation cache {path} cannot be used ({reason}); running without it. Set"
      " JAX_COMPILATION_CACHE_DIR to a writable directory, or SEQ2SEQ_COMPILATION_CACHE=off."]
  assert jnp.add(jnp.ones(3), 1.0).sum() == 6.0  # And JAX computes without it.


def test_the_cache_options_set_unless_the_environment_sets_them(tmp_path, environ,
                                                                jax_cache_options):
  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  environ.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
  compiling.enable_cache()
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
  assert (jax.config.jax_persistent_cache_enable_xla_caches
          == "xla_gpu_per_fusion_autotune_cache_dir")

  environ.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "5")
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 5.0)
  compiling.enable_cache()
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 5.0  # The user's.


def test_programs_compile_ahead_then_run_without_compiling():
  programs = compiling.Programs("double", jax.jit(lambda x, y: 2 * x + y))
  for n in (3, 5, 3):
    programs.add(jax.ShapeDtypeStruct((n,), jnp.float32), jnp.float32(1.0))
  assert len(programs) == 2
  assert [from_cache for _, from_cache in programs.wait()] == [False, False]
  inputs = [(jnp.arange(n, dtype=jnp.float32), jnp.float32(1.0)) for n in (3, 5)]
  with compiling.counting() as counts:
    out = [programs(*args) for args in inputs]
  assert sum(counts.compiled.values()) == sum(counts.cached.values()) == 0
  np.testing.assert_array_equal(out[1], 2 * np.arange(5) + 1)
  with pytest.raises(KeyError, match=r"double was not compiled for \(\(4,\), \(\)\)"):
    programs(jnp.arange(4, dtype=jnp.float32), jnp.float32(1.0))


def test_counting_tells_compiled_from_cached(fresh_cache):
  def fn(x):
    return jnp.sin(x) * 3

  x = jnp.ones(7)
  with compiling.counting() as first:
    jax.jit(fn)(x).block_until_ready()
  jax.clear_caches()  # Of this process: the program comes from the persistent cache next.
  with compiling.counting() as second:
    jax.jit(fn)(x).block_until_ready()
  assert first.compiled == {"jit(fn)": 1} and not first.cached
  assert second.cached == {"jit(fn)": 1} and not second.compiled


@pytest.mark.slow  # Two trainings, each compiling six programs into an empty cache: 20-30 s.
def test_a_run_compiles_each_program_once_and_a_warm_rerun_compiles_nothing(fresh_cache,
                                                                             tmp_path, caplog):
  c = fast_tiny_config()
  c.data.max_len, c.data.bucket_step = 32, 8  # Lengths 8..32: two chosen (data.num_buckets).
  c.eval.max_sentences = 40  # Five batches of 8: two lengths.
  c.train.num_steps, c.eval.every_steps = 6, 3
  with caplog.at_level(logging.INFO, "seq2seq"), compiling.counting() as cold:
    train.train_and_evaluate(c, tmp_path / "cold")
  # Each program once, at start-up, and nothing compiled for them later.
  assert (cold.compiled["jit(train_step)"], cold.compiled["jit(eval_step)"],
          cold.compiled["jit(search_fn)"]) == (2, 2, 2)
  started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiled")]
  assert len(started) == 1 and started[0].startswith(
      "Compiled 6 programs (2 train steps, 2 validation losses, 2 validation searches) in ")
  assert started[0].endswith(" s; none from the compilation cache.")

  caplog.clear()
  with caplog.at_level(logging.INFO, "seq2seq"), compiling.counting() as warm:
    train.train_and_evaluate(c, tmp_path / "warm")
  assert sum(warm.compiled.values()) == 0, warm.compiled
  assert (warm.cached["jit(train_step)"], warm.cached["jit(eval_step)"],
          warm.cached["jit(search_fn)"]) == (2, 2, 2)
  started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiled")]
  assert started[0].endswith(" s; 6 of them from the compilation cache.")


def test_an_evaluation_compiles_at_most_two_searches(run, fresh_cache):
  translator = Translator(run, "latest", beam_size=2, batch_size=4)
  words = "a man in a blue shirt is riding a bike down the street".split()
  texts = [" ".join(words[:1 + i % len(words)]) for i in range(30)]
  with compiling.counting() as counts:
    translated = translator.translate(texts)
  assert len(translated) == 30
  assert counts.compiled["jit(search_fn)"] == 2
