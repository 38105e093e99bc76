"""Session set-up and fixtures. Shared functions and constants are in tests/helpers.py."""

import atexit
import importlib.util
import mmap
import os
import shutil
import tempfile
from pathlib import Path

# Many tests train the same tiny run: one persistent compilation cache for the session (and the
# scripts it starts) compiles each identical program once. Set before JAX reads its config, and
# before tests/helpers.py copies the environment for the scripts.
_COMPILATION_CACHE = tempfile.mkdtemp(prefix="seq2seq-test-jax-cache-")
atexit.register(shutil.rmtree, _COMPILATION_CACHE, ignore_errors=True)
os.environ.update(JAX_COMPILATION_CACHE_DIR=_COMPILATION_CACHE,
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
# Compiling, not running, is most of the suite's time (tiny models, a few steps each). XLA's CPU
# backend compiles a train step 2-3 times faster without LLVM's optimizations and with its
# older fusion emitters: the same HLO and fusions, whose machine code is slower (tiny models
# hardly notice) and may round differently in the last bits, as another CPU would. A flag set
# in XLA_FLAGS is left as it is; one this jaxlib does not know is left out (XLA would abort).
FAST_COMPILE = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}


def _jaxlib_knows(flag: str) -> bool:
  """Whether jaxlib's libraries name `flag` (read as bytes: importing JAX would read the flags)."""
  jaxlib = importlib.util.find_spec("jaxlib")
  for library in Path(jaxlib.submodule_search_locations[0]).glob("*.so"):
    with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
      if data.find(flag.encode()) >= 0:
        return True
  return False


os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", "")] + [f"--{flag}={value}" for flag, value in FAST_COMPILE.items()
                                         if f"--{flag}" not in os.environ.get("XLA_FLAGS", "")
                                         and _jaxlib_knows(flag)]).strip()

import pytest  # noqa: E402

from tests.helpers import fast_tiny_config, shared_run_config  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
  """Drops each test module's jitted programs when it ends (a later module compiles its own
  again, mostly from the persistent cache). With FAST_COMPILE's flags, XLA:CPU (jaxlib 0.10.2)
  crashed with SIGSEGV serializing a program for the persistent cache once the ~40 RNN
  programs of tests/test_rnn.py's slow grid stayed loaded in the process (CI's slow run, and
  here twice in a row); with XLA's default flags, with either half of that grid, or with
  this, it did not."""
  yield
  import jax
  jax.clear_caches()


@pytest.fixture
def tiny_config():
  """fast_tiny_config(), the test's own to change."""
  return fast_tiny_config()


@pytest.fixture(scope="session")
def run(tmp_path_factory):
  """One tiny trained run (shared_run_config: checkpoints at steps 2 and 4) for every test that
  reads a run.

  Tests may add evaluation outputs (eval/) but change nothing else; tests/test_errors.py
  checks that failing commands leave it as it was.
  """
  from seq2seq.training import loop
  workdir = tmp_path_factory.mktemp("shared") / "run"
  loop.train_and_evaluate(shared_run_config(), workdir)
  return workdir
