"""The scripts' malloc settings: freed blocks are reused, not faulted in again."""

import os
import platform
import subprocess
import sys

import pytest

from tests.helpers import ROOT

# Allocates, fills and frees a 64 MiB block ten times with malloc (as XLA:CPU does a step's
# buffers) and prints the page faults of the last nine, after `keep_freed_memory()` or not.
CODE = """
import ctypes, resource, sys
from seq2seq.runtime import allocator
applied = allocator.keep_freed_memory() if sys.argv[1] == "tuned" else False
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
faults = []
for _ in range(10):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  block = libc.malloc(64 * 2**20)
  ctypes.memset(block, 1, 64 * 2**20)
  libc.free(block)
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, sum(faults[1:]))
"""


def _faults(mode: str, **env) -> tuple[str, int]:
  out = subprocess.run([sys.executable, "-c", CODE, mode], cwd=ROOT, capture_output=True,
                       text=True, check=True, env=dict(os.environ, **env)).stdout.split()
  return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
  pages = 64 * 2**20 // 4096  # of one block
  applied, tuned = _faults("tuned")
  untouched, default = _faults("default")
  assert (applied, untouched) == ("True", "False")
  assert default >= 9 * pages * 0.9  # every block faulted in afresh: mmap, then munmap
  assert tuned < pages  # the first block's pages are reused by the nine others
  opted_out, faults = _faults("tuned", SEQ2SEQ_SYSTEM_MALLOC="1")
  assert opted_out == "False" and faults >= 9 * pages * 0.9
