"""How long a translation may grow, without JAX: the cap of a source's length
(`max_decode_len`, `search.decode_caps` per row), here so that a process that only runs
CTranslate2 (`deployed`) computes the caps ours decodes to without importing JAX.
"""

from seq2seq.data import batching


def max_decode_len(src_len: int, a: float, b: int, limit: int) -> int:
  """Longest hypothesis for a padded source length: `a * src_len + b`, at most `limit`."""
  return max(1, min(int(a * src_len + b), limit))


def source_cap(length: int, a: float, b: int, max_len: int) -> int:
  """The most tokens (EOS included) ours outputs for a source of `length` tokens with EOS:
  the cap of its length padded to the evaluation grid, as if it were translated alone."""
  return max_decode_len(batching.grid_length(min(length, max_len), max_len), a, b, max_len)
