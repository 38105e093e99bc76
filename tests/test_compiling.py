"""The persistent compilation cache, programs compiled ahead, and how many a run compiles."""

import json
import logging
import re
import shutil
import subprocess
import sys
import threading
import time
import types
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from seq2seq.decoding import translator
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation import evaluate
from seq2seq.runtime import compiling, persistent_cache
from seq2seq.training import loop, reports, steps
from tests.helpers import ENV, fast_tiny_config

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
  for name in ("JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME", persistent_cache.CACHE_SWITCH):
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def test_the_cache_is_the_users_unless_jax_compilation_cache_dir_names_one(
    tmp_path, environ, jax_cache_options):
  environ.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert persistent_cache.enable_cache() == tmp_path / "xdg" / "seq2seq" / "jax"
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xdg" / "seq2seq" / "jax")
  assert (tmp_path / "xdg" / "seq2seq" / "jax").is_dir()

  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  assert persistent_cache.enable_cache() == tmp_path / "mine"
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")

  environ.delenv("XDG_CACHE_HOME")
  environ.delenv("JAX_COMPILATION_CACHE_DIR")
  environ.setenv("HOME", str(tmp_path / "home"))
  assert persistent_cache.enable_cache() == tmp_path / "home" / ".cache" / "seq2seq" / "jax"


def test_the_cache_switched_off(tmp_path, environ, jax_cache_options):
  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
  for off in ("off", "0", "OFF", "false"):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    environ.setenv(persistent_cache.CACHE_SWITCH, off)
    assert persistent_cache.enable_cache() is None
    assert jax.config.jax_compilation_cache_dir is None
  assert not (tmp_path / "mine").exists()


def test_a_cache_switch_neither_on_nor_off_is_refused(environ, jax_cache_options):
  environ.setenv(persistent_cache.CACHE_SWITCH, "disabled")  # Was taken as "on".
  with pytest.raises(UserError) as raised:
    persistent_cache.enable_cache()
  assert str(raised.value) == ("SEQ2SEQ_COMPILATION_CACHE=disabled is neither on nor off; set it"
                               " to off (or 0, false, no) or on, or unset it.")


def test_damaged_cache_entries_are_removed_with_one_warning(tmp_path, environ, jax_cache_options,
                                                            caplog):
  """An entry a full disk cut to nothing, or one of another format, would fail every read and
  never be written again (JAX writes only absent entries): removed, with one warning."""
  cache = tmp_path / "cache"
  cache.mkdir()
  (cache / "jit_a-1-cache").write_bytes(b"")
  (cache / "jit_a-1-atime").write_bytes(b"12345678")
  (cache / "jit_b-2-cache").write_bytes(b"not an entry")
  (cache / "jit_c-3-cache").write_bytes(zlib.compress(b"an entry as JAX writes one"))
  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(cache))
  with caplog.at_level(logging.WARNING):
    persistent_cache.enable_cache()
  assert sorted(p.name for p in cache.iterdir()) == ["jit_c-3-cache"]
  assert [r.getMessage() for r in caplog.records] == [
      f"Removed 2 damaged entries of the compilation cache {cache} (cut short by a full disk, or"
      " overwritten); their programs compile again."]


def test_cache_entries_that_fail_are_one_warning(tmp_path, environ, jax_cache_options, caplog):
  """A full disk under the cache: JAX warns once per program (34 lines for a run); the
  command says it once, naming the directory and the fix."""
  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
  persistent_cache.enable_cache()
  with caplog.at_level(logging.WARNING):
    for name in ("jit_train_step", "jit_eval_step", "jit_search"):
      warnings.warn(f"Error writing persistent compilation cache entry for '{name}':"
                    " OSError: [Errno 28] No space left on device", stacklevel=1)
  assert [r.getMessage() for r in caplog.records] == [
      f"The compilation cache {tmp_path / 'cache'} cannot be read or written (OSError: [Errno 28]"
      " No space left on device); programs compile without it. Free space there, or remove the"
      " directory, or set SEQ2SEQ_COMPILATION_CACHE=off."]


def _not_a_directory(tmp_path, monkeypatch):
  (tmp_path / "file").write_text("not a directory")
  return tmp_path / "file" / "cache", "Not a directory"


def _read_only(tmp_path, monkeypatch):
  def refused(*args, **kwargs):
    raise PermissionError(13, "Permission denied")

  (tmp_path / "cache").mkdir()
  monkeypatch.setattr(persistent_cache.tempfile, "NamedTemporaryFile", refused)
  return tmp_path / "cache", "Permission denied"


@pytest.mark.parametrize("unusable", [_not_a_directory, _read_only],
                         ids=["not a directory", "read-only"])
def test_an_unusable_cache_is_one_warning_and_no_cache(tmp_path, environ, jax_cache_options,
                                                       caplog, monkeypatch, unusable):
  path, reason = unusable(tmp_path, monkeypatch)
  environ.setenv("JAX_COMPILATION_CACHE_DIR", str(path))
  with caplog.at_level(logging.WARNING):
    assert persistent_cache.enable_cache() is None
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
  persistent_cache.enable_cache()
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
  assert (jax.config.jax_persistent_cache_enable_xla_caches
          == "xla_gpu_per_fusion_autotune_cache_dir")

  environ.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "5")
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 5.0)
  persistent_cache.enable_cache()
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 5.0  # The user's.


def test_programs_compile_ahead_then_run_without_compiling():
  programs = compiling.Programs("double", jax.jit(lambda x, y: 2 * x + y))
  for n, background in ((3, False), (5, True), (3, True)):  # Lowered here, or on the pool.
    programs.add(jax.ShapeDtypeStruct((n,), jnp.float32), jnp.float32(1.0), background=background)
  assert len(programs) == 2
  assert [(done.key, done.from_cache) for done in programs.wait()] == [
      (((3,), ()), False), (((5,), ()), False)]
  assert programs.ready()
  inputs = [(jnp.arange(n, dtype=jnp.float32), jnp.float32(1.0)) for n in (3, 5)]
  with compiling.counting() as counts:
    out = [programs(*args) for args in inputs]
  assert sum(counts.compiled.values()) == sum(counts.cached.values()) == 0
  np.testing.assert_array_equal(out[1], 2 * np.arange(5) + 1)
  with pytest.raises(KeyError, match=r"double was not compiled for \(\(4,\), \(\)\)"):
    programs(jnp.arange(4, dtype=jnp.float32), jnp.float32(1.0))


def test_a_call_compiles_its_own_program_at_once_when_the_pool_has_not_begun_it():
  # The one-thread pool is held by another task: both programs wait in its queue. A call for
  # the second compiles it on the calling thread, at once; the first stays the pool's.
  programs = compiling.Programs("triple", jax.jit(lambda x: 3 * x), threads=1)
  release = threading.Event()
  holder = compiling._pool(1).submit(release.wait, 60)
  try:
    for n in (2, 7):
      programs.add(jax.ShapeDtypeStruct((n,), jnp.float32), background=True)
    np.testing.assert_array_equal(programs(jnp.arange(7, dtype=jnp.float32)), 3 * np.arange(7))
    assert not holder.done()  # Not the pool: it was still held.
    assert len(programs) == 2 and not programs.ready()
  finally:
    release.set()
  assert [done.key for done in programs.wait()] == [((2,),), ((7,),)]
  np.testing.assert_array_equal(programs(jnp.arange(2, dtype=jnp.float32)), 3 * np.arange(2))


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


@pytest.mark.slow  # Two trainings into an empty cache: 20-30 s.
def test_a_run_compiles_each_program_once_and_a_warm_rerun_compiles_nothing(fresh_cache,
                                                                             tmp_path, caplog,
                                                                             capsys):
  c = fast_tiny_config()
  c.data.max_len, c.data.bucket_step = 32, 8  # Lengths 8..32: two chosen (data.num_buckets).
  c.eval.max_sentences, c.eval.batch_size = 40, 8  # Five batches on four grid lengths.
  c.train.num_steps, c.eval.every_steps = 6, 3
  c.eval.test_beam_size = 4  # The default (tests/helpers.py turns it off).
  # Evaluation searches for sentences as long as training's (32 tokens): grid lengths 8 to 32.
  ahead = translator.grid_sources(c, c.eval.batch_size)
  assert [src.shape for src in ahead] == [(8, 8), (8, 16), (8, 24), (8, 32)]
  with caplog.at_level(logging.INFO, "seq2seq"), compiling.counting() as cold:
    loop.train_and_evaluate(c, tmp_path / "cold")
  # Each program once: the validation searches and the four evaluation searches.
  assert (cold.compiled["jit(train_step)"], cold.compiled["jit(eval_step)"],
          cold.compiled["jit(search_fn)"]) == (2, 4, 4 + 4)
  started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiled")]
  assert len(started) == 1 and started[0].startswith("Compiled 2 programs (2 train steps) in ")
  assert started[0].endswith(" s; none from the compilation cache.")
  said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step 1:")]
  assert len(said) == 1 and said[0].endswith(
      " s after the process started; compiling 4 validation losses, 4 validation searches,"
      " 4 evaluation searches in the background.")

  caplog.clear()
  with caplog.at_level(logging.INFO, "seq2seq"), compiling.counting() as warm:
    loop.train_and_evaluate(c, tmp_path / "warm")
  assert sum(warm.compiled.values()) == 0, warm.compiled
  assert (warm.cached["jit(train_step)"], warm.cached["jit(eval_step)"],
          warm.cached["jit(search_fn)"]) == (2, 4, 4 + 4)
  started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiled")]
  assert started[0].endswith(" s; 2 of them from the compilation cache.")
  records = [json.loads(line) for line in (tmp_path / "warm" / "metrics.jsonl").open()]
  compiles = [r for r in records if r["split"] == "compile"]
  assert [r["step"] for r in compiles] == [1, 3, 6]  # First step, first validation, the end.
  assert compiles[0]["seconds_to_first_step"] > 0
  assert [(p["program"], p["from_cache"]) for r in compiles for p in r["programs"]] == (
      [("train step", True)] * 2 + [("validation loss", True)] * 4
      + [("validation search", True)] * 4 + [("evaluation search", True)] * 4)


def test_step_one_does_not_wait_for_the_validation_programs(tmp_path, monkeypatch):
  """Validation's programs are held back until step 1 has finished and validation has said
  that it waits for them: a run that compiled them before step 1 would never get there."""
  first_step, announced, waits = threading.Event(), threading.Event(), []
  eval_step, first_step_done = steps.eval_step, reports.CompileLog.first_step
  write = reports.Progress.write

  def held_back_eval_step(*args, **kwargs):  # Traced while the program compiles.
    waits.append(first_step.wait(timeout=60) and announced.wait(timeout=60))
    return eval_step(*args, **kwargs)

  def after_first_step(self, *args):
    first_step_done(self, *args)
    first_step.set()

  def noted(self, line):
    write(self, line)
    if "validation waits for its programs (1 validation loss, 1 validation search)" in line:
      announced.set()

  monkeypatch.setattr(steps, "eval_step", held_back_eval_step)
  monkeypatch.setattr(reports.CompileLog, "first_step", after_first_step)
  monkeypatch.setattr(reports.Progress, "write", noted)
  c = fast_tiny_config()
  c.train.num_steps = c.eval.every_steps = 2
  result = loop.train_and_evaluate(c, tmp_path / "run")
  assert waits == [True] and result["step"] == 2


def _dumped(directory) -> set[str]:
  """The programs XLA dumped into `directory` (by the jitted function's name)."""
  names = {"train_step", "eval_step", "search_fn"}
  return {name for path in directory.glob("*") for name in names if name in path.name}


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_each_kind_of_program_compiles_with_its_own_options(fresh_cache, tmp_path):
  """config.compile.train_options reach the train step's compiler, eval_options the
  validation programs' and every search's (the evaluation commands' too): here XLA's dump
  directory, whose files name the programs compiled with it."""
  c = fast_tiny_config()
  c.train.num_steps = c.eval.every_steps = 2
  c.compile.train_options = f"xla_dump_to={tmp_path / 'train'}"
  c.compile.eval_options = f"xla_dump_to={tmp_path / 'eval'},xla_dump_hlo_as_text=true"
  loop.train_and_evaluate(c, tmp_path / "run")
  assert _dumped(tmp_path / "train") == {"train_step"}
  assert _dumped(tmp_path / "eval") == {"eval_step", "search_fn"}

  shutil.rmtree(tmp_path / "eval")
  jax.clear_caches()
  compilation_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "another-cache"))
  Translator(tmp_path / "run", "latest", beam_size=2).translate(["a dog runs"])
  assert _dumped(tmp_path / "eval") == {"search_fn"}


def test_an_option_that_xla_flags_sets_stays_the_users(monkeypatch, caplog):
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=4 --xla_dump_to=/tmp/mine")
  monkeypatch.setattr(compiling, "_SAID_OVERRIDDEN", set())
  with caplog.at_level(logging.INFO, "seq2seq"):
    for _ in range(2):  # Said once.
      options = compiling.compiler_options("xla_gpu_autotune_level=0,"
                                           "xla_cpu_enable_fast_math=true")
  assert options == {"xla_cpu_enable_fast_math": True}
  assert [r.getMessage() for r in caplog.records] == [
      "XLA_FLAGS sets xla_gpu_autotune_level; config.compile's value is not used for it."]
  monkeypatch.delenv("XLA_FLAGS")
  assert compiling.compiler_options(" xla_gpu_autotune_level = 0 ,a=0.5,b=text") == {
      "xla_gpu_autotune_level": 0, "a": 0.5, "b": "text"}
  assert compiling.compiler_options("") == {}


@pytest.mark.slow  # A training, then three evaluations of 1,000 sentences: about a minute.
def test_after_training_its_evaluations_compile_no_search(fresh_cache, tmp_path):
  c = fast_tiny_config()
  c.data.max_len = 64  # Sentences up to 64 subwords: the whole grid of model.max_len=64.
  c.train.num_steps = c.eval.every_steps = 2
  c.eval.test_beam_size = 4  # run_evaluation's beam
  loop.train_and_evaluate(c, tmp_path / "run")
  jax.clear_caches()  # As in another process: only the persistent cache holds programs.
  words = "two young men in red shirts are playing football on a green field".split()
  lines = [" ".join(words[:1 + i % len(words)] * (1 + i % 4)) for i in range(40)]
  for name in ("third.en", "third.de"):
    (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
  for split, files in (("val", {}), ("test", {}),
                       ("", dict(src_file=tmp_path / "third.en", ref_file=tmp_path / "third.de"))):
    with compiling.counting() as counts:
      evaluate.run_evaluation(tmp_path / "run", split=split or "test", checkpoint="latest",
                              **{k: str(v) for k, v in files.items()})
    assert counts.compiled["jit(search_fn)"] == 0 and counts.cached["jit(search_fn)"] > 0, (
        split, counts.compiled, counts.cached)


def test_an_evaluation_pads_to_the_grid(run, fresh_cache):
  translator = Translator(run, "latest", beam_size=2, batch_size=4)
  words = "a man in a blue shirt is riding a bike down the street".split()
  texts = [" ".join(words[:1 + i % len(words)]) for i in range(30)]
  with compiling.counting() as counts:
    translated = translator.translate(texts)
  assert len(translated) == 30
  lengths = {len(translator.tokenizer.encode(text)) + 1 for text in texts}  # With EOS.
  assert min(lengths) <= 8 and 16 < max(lengths) <= 24
  assert counts.compiled["jit(search_fn)"] == 3  # Sorted by length: batches of 8, 16, 24.
  assert set(translator._search._futures) == {(4, 8), (4, 16), (4, 24)}


# A command whose run ended while a program was still compiling in the background (a run
# stopped by SIGTERM, patience, or an error). The program's lowering blocks for 10 minutes.
_ENDS_WHILE_COMPILING = """
import sys, time
import numpy as np
from seq2seq.commands import cli
from seq2seq.errors import UserError
from seq2seq.runtime import compiling, persistent_cache

class Slow:
  def lower(self, *args):
    time.sleep(600)

def run():
  compiling.Programs("evaluation search", Slow()).add(np.zeros(3), background=True)
  assert compiling.unfinished() == 1
  if sys.argv[1] == "error":
    raise UserError("the run failed")
  print("trained")

cli.run_main(run)
"""


@pytest.mark.parametrize("ending, status, said", [("return", 0, "trained"),
                                                  ("error", 2, "error: the run failed")])
def test_a_command_exits_without_waiting_for_background_compiles(tmp_path, ending, status,
                                                                 said):
  # On a GPU, the process of a run stopped by SIGTERM lingered 150 s after its checkpoint,
  # until XLA had compiled its evaluation searches, which nothing would run.
  done = subprocess.run([sys.executable, "-c", _ENDS_WHILE_COMPILING, ending], env={
      **ENV, "JAX_COMPILATION_CACHE_DIR": str(tmp_path)}, capture_output=True, text=True,
                        timeout=90)
  assert done.returncode == status, done.stderr[-2000:]
  assert said in done.stdout + done.stderr


def test_the_compiled_line_counts_the_seconds_until_the_programs_are_ready():
  # The line's seconds were taken before it waited for the programs: a train step that took
  # 118 s on a GPU was reported compiled "in 24.7 s", the time the checkpoints took to read.
  class Slow:
    def lower(self, *args):
      time.sleep(0.5)
      return types.SimpleNamespace(compile=lambda compiler_options=None: "executable")

  programs = compiling.Programs("train step", Slow())
  start = time.perf_counter()
  programs.add(np.zeros(3), background=True)
  line = compiling.report([programs], start)
  seconds = float(re.fullmatch(r"Compiled 1 program \(1 train step\) in ([\d.]+) s; none from"
                               r" the compilation cache\.", line)[1])
  assert programs.wait()[0].seconds - 0.05 <= seconds < programs.wait()[0].seconds + 5
