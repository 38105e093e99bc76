"""JAX's persistent compilation cache, as every command uses it.

Every command turns on JAX's persistent compilation cache (`enable_cache`), so
a program compiled once (by any run of the same code, shapes and devices) is
read back instead of compiled again. It lives in `JAX_COMPILATION_CACHE_DIR`
when that is set, else in the per-user cache directory
(`$XDG_CACHE_HOME/seq2seq/jax`, by default `~/.cache/seq2seq/jax`);
`SEQ2SEQ_COMPILATION_CACHE=off` turns it off. XLA's GPU autotuning results are
kept there too. JAX writes entries from process 0 only; a directory that
cannot be written is one warning, and the run goes on without the cache.
"""

import logging
import os
import re
import tempfile
import warnings
from pathlib import Path

import jax

from seq2seq.errors import UserError

log = logging.getLogger("seq2seq")

CACHE_SWITCH = "SEQ2SEQ_COMPILATION_CACHE"  # "off" (or 0, false, no): no persistent cache.
_OFF = ("off", "0", "false", "no")
_ON = ("", "on", "1", "true", "yes")
# The first bytes of a cache entry JAX wrote whole: zstandard's frame, or zlib's header.
_ENTRY_STARTS = (b"\x28\xb5\x2f\xfd", b"\x78")
# JAX's warning for each entry it cannot read or write (one per program).
_CACHE_FAULT = re.compile(r"^Error (reading|writing) persistent compilation cache entry")
# The JAX options we set, unless the environment sets them (JAX reads its JAX_* variables).
_CACHE_OPTIONS = {
    # Every program, not only those that took a second: a warm run compiles nothing.
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    # XLA's per-fusion GPU autotuning results; only process 0 updates them (JAX's rule).
    "jax_persistent_cache_enable_xla_caches": "xla_gpu_per_fusion_autotune_cache_dir",
}


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
  written is one warning, and the process runs without the cache. Damaged entries (empty,
  as a full disk leaves them, or not of JAX's format) are removed, to be compiled again;
  entries that still cannot be read or written are one warning (`_warn_once_of_faults`).
  """
  switch = os.environ.get(CACHE_SWITCH, "").strip().lower()
  if switch not in _OFF + _ON:
    raise UserError(f"{CACHE_SWITCH}={os.environ[CACHE_SWITCH]} is neither on nor off; set it"
                    " to off (or 0, false, no) or on, or unset it.")
  if switch in _OFF:
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
  _remove_damaged_entries(path)
  _warn_once_of_faults(path)
  jax.config.update("jax_compilation_cache_dir", str(path))
  return path


def _remove_damaged_entries(path: Path) -> None:
  """Removes the cache entries that cannot be JAX's (which would fail every later read and
  never be written again): empty ones and ones of another format. One warning says so."""
  damaged = []
  for entry in path.glob("*-cache"):
    try:
      with open(entry, "rb") as f:
        start = f.read(4)
      if not start.startswith(_ENTRY_STARTS):
        damaged.append(entry)
        entry.unlink()
        entry.with_name(entry.name[:-len("cache")] + "atime").unlink(missing_ok=True)
    except OSError:
      continue  # Removed meanwhile by another process, or unreadable: JAX will say.
  if damaged:
    log.warning("Removed %d damaged entries of the compilation cache %s (cut short by a full"
                " disk, or overwritten); their programs compile again.", len(damaged), path)


def _warn_once_of_faults(path: Path) -> None:
  """JAX's warning for each cache entry it fails to read or write (a full disk: one per
  program) becomes one warning, which names the directory and the fix."""
  if getattr(warnings.showwarning, "cache_faults_once", False):
    return
  shown, previous = [], warnings.showwarning

  def show(message, category, filename, lineno, file=None, line=None):
    if not _CACHE_FAULT.match(str(message)):
      previous(message, category, filename, lineno, file, line)
    elif not shown:
      shown.append(message)
      log.warning("The compilation cache %s cannot be read or written (%s); programs compile"
                  " without it. Free space there, or remove the directory, or set %s=off.",
                  path, str(message).split(": ", 1)[-1], CACHE_SWITCH)

  show.cache_faults_once = True
  warnings.showwarning = show
