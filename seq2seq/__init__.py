"""seq2seq: neural machine translation in JAX/Flax (see README.md)."""

import time

IMPORTED = time.perf_counter()  # When the package was first imported: a process's start.
