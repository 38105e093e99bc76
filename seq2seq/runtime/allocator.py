"""Host memory: keep freed buffers for reuse instead of handing them back to the system.

XLA's CPU runtime allocates every step's buffers (activations, gradients,
logits) with malloc and frees them at the end of the step. glibc serves large
blocks with mmap and unmaps them when freed, and trims the heap tops it frees,
so each step faults its memory in again, page by page, with the kernel zeroing
every page: a training step on a CPU then spends much of its time in the kernel
(docs/performance.md, "Host memory", has the measurements).
`keep_freed_memory()` sets glibc's `mallopt` so that blocks come from one heap
that is never trimmed (no mmap, no trim threshold, one arena that every thread
reuses): the first step faults the memory in, later steps reuse it. The price
is memory: the process keeps its peak until it exits, and the heap fragments,
so it holds several times the memory it would with glibc's defaults.

Every command calls it first (`seq2seq.commands.main.prepare_process`), before XLA starts its
threads. It does nothing where the C library is not glibc, or where the environment
sets SEQ2SEQ_SYSTEM_MALLOC=1 (to compare, or where memory is tighter than time).
"""

import ctypes
import os
import platform

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8


def keep_freed_memory() -> bool:
  """Makes glibc keep freed memory for reuse; returns whether it applied."""
  if os.environ.get("SEQ2SEQ_SYSTEM_MALLOC") == "1":
    return False
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  libc = ctypes.CDLL(None)  # The process' own symbols: glibc is loaded (no library search).
  # A trim threshold of -1 never trims (mallopt(3)); any finite one is crossed by a process
  # whose steps free more than it at once.
  settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1), (M_ARENA_MAX, 1))
  return all(libc.mallopt(parameter, value) == 1 for parameter, value in settings)
