"""Compilation: the persistent cache, and programs compiled ahead of use, in parallel.

Every command turns on JAX's persistent compilation cache (`enable_cache`), so
a program compiled once (by any run of the same code, shapes and devices) is
read back instead of compiled again. It lives in `JAX_COMPILATION_CACHE_DIR`
when that is set, else in the per-user cache directory
(`$XDG_CACHE_HOME/seq2seq/jax`, by default `~/.cache/seq2seq/jax`);
`SEQ2SEQ_COMPILATION_CACHE=off` turns it off. XLA's GPU autotuning results are
kept there too. JAX writes entries from process 0 only; a directory that
cannot be written is one warning, and the run goes on without the cache.

`Programs` lowers a jitted function for each argument shape it will meet on
the calling thread (tracing is Python), then compiles them on a pool of
threads (XLA compiles without the GIL), and calls the program compiled for
the arguments' shapes.
"""

import collections
import concurrent.futures
import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path

import jax
from jax import monitoring

log = logging.getLogger("seq2seq")

CACHE_SWITCH = "SEQ2SEQ_COMPILATION_CACHE"  # "off" (or 0, false, no): no persistent cache.
_OFF = ("off", "0", "false", "no")
# The JAX options we set, unless the environment sets them (JAX reads its JAX_* variables).
_CACHE_OPTIONS = {
    # Every program, not only those that took a second: a warm run compiles nothing.
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    # XLA's per-fusion GPU autotuning results; only process 0 updates them (JAX's rule).
    "jax_persistent_cache_enable_xla_caches": "xla_gpu_per_fusion_autotune_cache_dir",
}
# JAX's events: every compilation (with its function's name), and, inside one, a hit of the
# persistent cache.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def default_cache_dir() -> Path:
  """The per-user cache directory's `seq2seq/jax`."""
  base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
  return Path(base) / "seq2seq" / "jax"


def _usable(path: Path) -> str | None:
  """Why `path` cannot hold the cache, or None if it can (created, written and removed)."""
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
      pass
  except OSError as e:
    return e.strerror or str(e)
  return None


def enable_cache() -> Path | None:
  """Turns on the persistent compilation cache; returns its directory, or None if off.

  Call before the first compilation. A directory that cannot be created or
  written is one warning, and the process runs without the cache.
  """
  if os.environ.get(CACHE_SWITCH, "").strip().lower() in _OFF:
    jax.config.update("jax_compilation_cache_dir", None)
    return None
  path = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_cache_dir())
  problem = _usable(path)
  if problem:
    jax.config.update("jax_compilation_cache_dir", None)
    log.warning("The compilation cache %s cannot be used (%s); running without it. Set"
                " JAX_COMPILATION_CACHE_DIR to a writable directory, or %s=off.", path, problem,
                CACHE_SWITCH)
    return None
  for name, value in _CACHE_OPTIONS.items():
    if name.upper() not in os.environ:
      jax.config.update(name, value)
  jax.config.update("jax_compilation_cache_dir", str(path))
  return path


class Counts:
  """The programs compiled while counting, by function name: `compiled` by XLA, `cached`
  read from the persistent cache. Of every thread, or only of thread `thread` (an ident)."""

  def __init__(self, thread: int | None = None):
    self.compiled, self.cached = collections.Counter(), collections.Counter()
    self._thread = thread
    self._hits = set()  # Threads whose compilation in progress the cache answered.
    self._lock = threading.Lock()

  def _counts(self) -> bool:
    return self._thread is None or threading.get_ident() == self._thread

  def _on_event(self, event: str, **kwargs) -> None:
    del kwargs
    if event == _HIT_EVENT and self._counts():
      with self._lock:
        self._hits.add(threading.get_ident())

  def _on_duration(self, event: str, duration: float, fun_name: str = "", **kwargs) -> None:
    del duration, kwargs
    if event == _COMPILE_EVENT and self._counts():
      with self._lock:
        hit = threading.get_ident() in self._hits
        self._hits.discard(threading.get_ident())
        (self.cached if hit else self.compiled)[fun_name] += 1


@contextlib.contextmanager
def counting(this_thread_only: bool = False):
  """Counts the compilations inside the block (`Counts`): of every thread, or of this one."""
  counts = Counts(threading.get_ident() if this_thread_only else None)
  monitoring.register_event_duration_secs_listener(counts._on_duration)
  monitoring.register_event_listener(counts._on_event)
  try:
    yield counts
  finally:
    monitoring.unregister_event_duration_listener(counts._on_duration)
    monitoring.unregister_event_listener(counts._on_event)


def _compile(lowered) -> tuple:
  """(the compiled program, whether the persistent cache answered)."""
  with counting(this_thread_only=True) as counts:
    compiled = lowered.compile()
  return compiled, bool(counts.cached)


_POOL = concurrent.futures.ThreadPoolExecutor(
    max_workers=max(2, min(8, os.cpu_count() or 1)), thread_name_prefix="compile")


class Programs:
  """One jitted function, compiled ahead for each argument shape it will be called with.

  Args:
    name: what the program computes, for the start-up line ("train step").
    jitted: a `jax.jit` function.
    key: `(*args) -> a hashable` that tells the compiled programs apart, by default
      the shapes of every argument.
    plural: the name's plural (by default with an s).
  """

  def __init__(self, name: str, jitted, key: Callable[..., Hashable] | None = None, *,
               plural: str = ""):
    self.name, self.plural, self._jitted = name, plural or f"{name}s", jitted
    self._key = key or (lambda *args: tuple(x.shape for x in jax.tree.leaves(args)))
    self._futures: dict[Hashable, concurrent.futures.Future] = {}

  def add(self, *args) -> None:
    """Lowers for `args` (arrays or `jax.ShapeDtypeStruct`s) here and compiles on the pool."""
    key = self._key(*args)
    if key not in self._futures:
      self._futures[key] = _POOL.submit(_compile, self._jitted.lower(*args))

  def __len__(self) -> int:
    return len(self._futures)

  def wait(self) -> list[tuple]:
    """Blocks until every program compiled: their (program, whether from the cache)."""
    return [future.result() for future in self._futures.values()]

  def __call__(self, *args):
    future = self._futures.get(self._key(*args))
    if future is None:
      raise KeyError(f"{self.name} was not compiled for {self._key(*args)}; only for"
                     f" {list(self._futures)}")
    return future.result()[0](*args)


def report(groups: list[Programs], since: float) -> str:
  """The start-up line, once they are compiled: how many programs, of which kinds, and how
  long since `since` (a `time.perf_counter()`) that took."""
  results = [result for group in groups for result in group.wait()]
  seconds = time.perf_counter() - since
  cached = sum(from_cache for _, from_cache in results)
  kinds = ", ".join(f"{len(group)} {group.name if len(group) == 1 else group.plural}"
                    for group in groups if len(group))
  where = (f"{cached} of them from the compilation cache" if cached
           else "none from the compilation cache")
  programs = "program" if len(results) == 1 else "programs"
  return f"Compiled {len(results)} {programs} ({kinds}) in {seconds:.1f} s; {where}."
