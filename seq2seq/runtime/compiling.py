"""Compilation: programs compiled ahead of use, in parallel (the persistent cache they are read
from and written to: `persistent_cache`).

`Programs` compiles a jitted function ahead for each argument shape it will meet, on a pool
of threads (XLA compiles without the GIL), and calls the program compiled for the arguments'
shapes. A program wanted at once is lowered on the calling thread (tracing is Python); one
wanted later (a run's validation and evaluation programs) is lowered on the pool too, so that
the caller goes on while it compiles. Each kind of program takes its own XLA compiler options
(`config.compile`), never overriding the user's XLA_FLAGS.
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
from jax import monitoring

import seq2seq
from seq2seq import config as config_lib
from seq2seq.errors import UserError

log = logging.getLogger("seq2seq")

# JAX's events: every compilation (with its function's name), and, inside one, a hit of the
# persistent cache.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


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


@dataclasses.dataclass(frozen=True)
class Compiled:
  """One program, ready: the argument shapes it was compiled for (`key`), the seconds its
  lowering and compiling took, and whether the persistent cache answered."""
  executable: Any
  key: Hashable
  seconds: float
  from_cache: bool


def xla_flags_set() -> set[str]:
  """The names of the options the user's XLA_FLAGS sets (without dashes)."""
  return {flag.lstrip("-").split("=", 1)[0] for flag in os.environ.get("XLA_FLAGS", "").split()}


def _typed(value: str) -> bool | int | float | str:
  """An option's text as XLA takes it: true/false as a bool, numbers as numbers."""
  if value.lower() in ("true", "false"):
    return value.lower() == "true"
  for kind in (int, float):
    try:
      return kind(value)
    except ValueError:
      pass
  return value


_SAID_OVERRIDDEN: set[str] = set()  # The options whose line was logged: once a process.


def compiler_options(text: str) -> dict[str, bool | int | float | str]:
  """The options of a config.compile field (`config.parse_compiler_options`), less those the
  user's XLA_FLAGS sets: the user's setting wins (and one line says so)."""
  options = config_lib.parse_compiler_options(text)
  overridden = sorted(xla_flags_set() & set(options))
  if set(overridden) - _SAID_OVERRIDDEN:
    _SAID_OVERRIDDEN.update(overridden)
    log.info("XLA_FLAGS sets %s; config.compile's value is not used for it.",
             ", ".join(overridden))
  return {name: _typed(value) for name, value in options.items() if name not in overridden}


def check_options(config, fields: tuple[str, ...] = ("train_options", "eval_options")) -> None:
  """Has XLA check each config.compile field's options in `fields` (`_check_options`): an
  option it does not know, or a value it refuses, is one `UserError` naming the field, before
  any work (no workdir created, no step taken). Call once the devices are set up."""
  for name in fields:
    _check_options(name, config.compile[name])


@functools.cache  # Once a process per setting: every Translator of a comparison asks.
def _check_options(name: str, text: str) -> None:
  """Compiles a trivial program with config.compile.`name`=`text`'s options."""
  options = compiler_options(text)
  if not options:
    return
  program = jax.jit(lambda x: x + 1).lower(jnp.zeros((), jnp.float32))
  try:
    program.compile(compiler_options=options)
  except jax.errors.JaxRuntimeError as e:
    reason = str(e).strip().splitlines()[0].removeprefix("INVALID_ARGUMENT: ")
    raise UserError(f"config.compile.{name}={text!r}: XLA refuses it ({reason}); pass options"
                    " XLA knows, with values of their type, such as"
                    f" config.compile.{name}=xla_gpu_autotune_level=0.") from None


def _compile(key: Hashable, lower: Callable[[], Any], options: dict,
             lowering: float = 0.0) -> Compiled:
  """Lowers (`lower()`) and compiles one program with XLA options `options`; `lowering`:
  seconds spent lowering it before."""
  start = time.perf_counter() - lowering
  lowered = lower()
  with counting(this_thread_only=True) as counts:
    executable = lowered.compile(compiler_options=options or None)
  return Compiled(executable, key, time.perf_counter() - start, bool(counts.cached))


def default_threads() -> int:
  """Programs compiled at once unless config.compile.threads says: one per core, up to 8; one
  where there are 2 cores or fewer, which XLA's compiling of one program already keeps busy
  (docs/performance.md, "Compile time": all of the default recipe's programs were ready 0.83x
  and 0.89x as late with one thread as with two, on a 2-core host)."""
  cores = os.cpu_count() or 1
  return 1 if cores <= 2 else min(8, cores)


_POOLS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_UNFINISHED: set[concurrent.futures.Future] = set()  # Submitted, neither done nor cancelled.


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
  """The compiling threads (`threads` of them; 0: `default_threads()`), made once."""
  threads = threads or default_threads()
  if threads not in _POOLS:
    _POOLS[threads] = concurrent.futures.ThreadPoolExecutor(
        max_workers=threads, thread_name_prefix=f"compile{threads}")
  return _POOLS[threads]


def shapes(tree):
  """`tree`'s arrays as `jax.ShapeDtypeStruct`s without a sharding: lowered with these, a
  program is the same whether its arguments come from a training run's devices or from a
  checkpoint read onto one (committed arrays would lower to another program)."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


class Programs:
  """One jitted function, compiled ahead for each argument shape it will be called with.

  Programs added in the foreground are lowered on the calling thread (tracing is Python) and
  compiled on a pool of threads (XLA compiles without the GIL); those added in the background
  are lowered there too, so that the caller goes on at once. A call waits for its program;
  one still queued behind others is compiled on the calling thread at once instead.

  Args:
    name: what the program computes, for the start-up line ("train step").
    jitted: a `jax.jit` function.
    key: `(*args) -> a hashable` that tells the compiled programs apart, by default
      the shapes of every argument.
    plural: the name's plural (by default with an s).
    options: XLA's compiler options for these programs (`compiler_options`).
    threads: programs compiled at once (0: `default_threads()`; 1: one after another).
  """

  def __init__(self, name: str, jitted, key: Callable[..., Hashable] | None = None, *,
               plural: str = "", options: dict | None = None, threads: int = 0):
    self.name, self.plural, self._jitted = name, plural or f"{name}s", jitted
    self._key = key or (lambda *args: tuple(x.shape for x in jax.tree.leaves(args)))
    self.options, self._threads = dict(options or {}), threads
    self._futures: dict[Hashable, concurrent.futures.Future] = {}
    # What each future compiles, to compile it on a caller's thread instead.
    self._tasks: dict[Hashable, Callable[[], Compiled]] = {}
    self._lock = threading.Lock()

  def add(self, *args, background: bool = False) -> None:
    """Compiles for `args` (arrays or `jax.ShapeDtypeStruct`s) on the pool, lowered here, or
    there too with `background`."""
    key = self._key(*args)
    if key in self._futures:
      return
    if background:  # Lowered on the pool too.
      task = (_compile, key, functools.partial(self._jitted.lower, *args), self.options)
    else:
      start = time.perf_counter()
      lowered = self._jitted.lower(*args)
      task = (_compile, key, lambda: lowered, self.options, time.perf_counter() - start)
    self._tasks[key] = functools.partial(*task)
    self._futures[key] = future = _pool(self._threads).submit(*task)
    _UNFINISHED.add(future)
    future.add_done_callback(lambda _: self._tasks.pop(key, None))  # Its lowering, freed.
    future.add_done_callback(_UNFINISHED.discard)

  def __len__(self) -> int:
    return len(self._futures)

  def ready(self) -> bool:
    """Whether every program added so far is compiled (or failed)."""
    return all(future.done() for future in self._futures.values())

  def wait(self) -> list[Compiled]:
    """Blocks until every program compiled."""
    return [future.result() for future in self._futures.values()]

  def cancel(self) -> None:
    """Drops the programs whose compiling has not begun (a run that ends early)."""
    for key, future in list(self._futures.items()):
      if future.cancel():
        del self._futures[key]

  def __call__(self, *args):
    key = self._key(*args)
    with self._lock:
      future = self._futures.get(key)
      if future is None:
        raise KeyError(f"{self.name} was not compiled for {key}; only for"
                       f" {list(self._futures)}")
      # Still queued behind other programs on the pool: compiled here, now, so that a call
      # (a server's first request) waits for its own program only.
      task = self._tasks.get(key)
      here = future.cancel()  # False once it runs (here too: `set_running_or_notify_cancel`).
      if here:
        self._futures[key] = future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
    if here:
      try:
        future.set_result(task())
      except BaseException as e:
        future.set_exception(e)
    return future.result().executable(*args)


def unfinished() -> int:  # At exit, Python would wait for them.
  """Programs still compiling, or waiting to, on the pools."""
  return len(_UNFINISHED)


def kinds(groups: list[Programs]) -> str:
  """'1 train step, 2 validation losses': how many programs of each group."""
  return ", ".join(f"{len(group)} {group.name if len(group) == 1 else group.plural}"
                   for group in groups if len(group))


def records(groups: list[Programs]) -> list[dict]:
  """One record per program of `groups` (compiled: `wait` first), for metrics.jsonl."""
  return [{"program": group.name, "shape": str(done.key), "seconds": round(done.seconds, 3),
           "from_cache": done.from_cache} for group in groups for done in group.wait()]


def report(groups: list[Programs], start: float) -> str:
  """The line for `groups` once compiled: how many, of which kinds, in how many seconds since
  `start` (`time.perf_counter()`), and how many the persistent cache held."""
  results = [done for group in groups for done in group.wait()]
  seconds = time.perf_counter() - start
  cached = sum(done.from_cache for done in results)
  where = (f"{cached} of them from the compilation cache" if cached
           else "none from the compilation cache")
  programs = "program" if len(results) == 1 else "programs"
  return f"Compiled {len(results)} {programs} ({kinds(groups)}) in {seconds:.1f} s; {where}."


def process_seconds() -> float:
  """Seconds since this process started (Linux's /proc), else since seq2seq was imported."""
  try:
    with open("/proc/self/stat", encoding="ascii") as f:
      started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime", encoding="ascii") as f:
      uptime = float(f.read().split()[0])
    return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return time.perf_counter() - seq2seq.IMPORTED
