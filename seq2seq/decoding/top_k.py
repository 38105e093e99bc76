"""Beam search's top-k over each hypothesis's vocabulary (`search.beam_search`)."""

import math

import jax
import jax.numpy as jnp


def chunked_top_k(x: jnp.ndarray, k: int,
                  chunk: int | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`jax.lax.top_k` of `x [rows, n]`, searching only the chunks that can hold a winner.

  Every one of the k best lies in a chunk of `chunk` neighbours whose maximum is among the k best
  chunk maxima, so one vectorised max over all of `x` and a top_k over `k * chunk` candidates
  replace XLA:CPU's TopK over all n, which is several times slower on beam search's `[hypotheses,
  vocab]`. Values and indices equal `jax.lax.top_k`'s, ties included (lower index first): the chosen
  chunks are kept in index order.

  The two top_k calls search `n / chunk` maxima and `k * chunk` candidates, so the default chunk
  is about sqrt(n / k), their sum's minimum: 25 for beam search's 8 best of 5,000, which takes
  0.7x the time of chunks of 128 (docs/performance.md, "Against CTranslate2").
  """
  rows, n = x.shape
  chunk = chunk or max(8, math.isqrt(n // k))
  if n <= 2 * k * chunk:
    return jax.lax.top_k(x, k)
  # A chunk that divides n needs no padded copy of x (8,000: 320 chunks of 25, not 31).
  chunk = next((size for size in range(chunk, chunk // 2, -1) if n % size == 0), chunk)
  x = jnp.pad(x, ((0, 0), (0, -n % chunk)), constant_values=-jnp.inf)
  chunks = x.reshape(rows, -1, chunk)
  best_chunks = jnp.sort(jax.lax.top_k(chunks.max(axis=-1), k)[1], axis=-1)  # [rows, k]
  candidates = jnp.take_along_axis(chunks, best_chunks[:, :, None], axis=1).reshape(rows, -1)
  values, index = jax.lax.top_k(candidates, k)
  return values, jnp.take_along_axis(best_chunks, index // chunk, axis=1) * chunk + index % chunk


def best_extensions(logits: jnp.ndarray, choosable: jnp.ndarray, alive_log_probs: jnp.ndarray,
                    n: int) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """The `n` best one-token extensions of each sentence's `k` live hypotheses: their
  log-probabilities `[b, n]`, beams and tokens. `logits [b * k, vocab]` (float32) normalize;
  `choosable`, the same with the tokens no search picks at a floor, choose.

  Each hypothesis's own `n` best tokens are found first, by its logits (the order of its
  log-softmax), then the `n` best of those `k * n`: no `[b, k * vocab]` array of sums is made,
  and only the tokens kept are normalized, by `jax.nn.log_softmax`'s operations.
  """
  (b, k), per = alive_log_probs.shape, min(n, logits.shape[-1])
  peak = jnp.max(logits, axis=-1, keepdims=True)
  log_total = jnp.log(jnp.sum(jnp.exp(logits - peak), axis=-1, keepdims=True))
  top_logits, tokens = chunked_top_k(choosable, per)  # [b * k, per]
  log_probs = (top_logits - peak) - log_total
  candidates = (alive_log_probs.reshape(b * k, 1) + log_probs).reshape(b, k * per)
  top_log_probs, pick = jax.lax.top_k(candidates, n)
  tokens = jnp.take_along_axis(tokens.reshape(b, k * per), pick, axis=1).astype(jnp.int32)
  return top_log_probs, pick // per, tokens
