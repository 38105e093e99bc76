"""Where a jitted function's time goes: XLA instruction times from a JAX profiler trace.

`profile_ops` traces a few calls of a compiled function with `jax.profiler`,
sums the duration of every XLA instruction the trace records, and groups them
by what they compute, read from the optimized HLO:

- `matmul`: dots, and fusions whose body holds one (XLA:CPU's YNNPACK fusions
  put a matmul together with its bias, activation or following reduction);
- `batched dot`: dots with batch dimensions (attention's scores and weighted
  sums, one small product per sentence and head);
- `random bits`: instructions made for `jax.random` (dropout masks);
- `gather`: gathers, and fusions that hold one (beam search's cache reorder);
- `top_k`, `copy`, and `other` (elementwise and reductions).

The figures are the profiler's, so they carry its overhead: compare the
shares, and time the function itself with the benchmark.

`dots_alone` re-runs every matrix product of the optimized HLO by itself, at
its shapes and dimension numbers, and reports each one's rate: the function's
matmul floor on this machine, and which products XLA runs slower than the rest
(such as a weight gradient with a transposed operand, which `models/linear.py` avoids).
"""

import collections
import functools
import gzip
import json
import math
import re
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

KINDS = ("matmul", "batched dot", "random bits", "gather", "top_k", "copy", "other")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\([^)]*\)|\S+) ([\w\-]+)\(", re.M)
_COMPUTATION = re.compile(r"^%?([\w.\-]+) .*\{\s*$", re.M)


def _computations(hlo: str) -> dict[str, str]:
  """Computation name -> its body text."""
  starts = [(m.group(1), m.end()) for m in _COMPUTATION.finditer(hlo)]
  bodies = {}
  for (name, start), nxt in zip(starts, starts[1:] + [(None, len(hlo))], strict=True):
    bodies[name] = hlo[start:nxt[1]]
  return bodies


def classify(hlo: str) -> dict[str, tuple[str, str]]:
  """Instruction name -> (kind, its shape), for every instruction of an optimized HLO text."""
  bodies = _computations(hlo)
  kinds = {}
  for match in _INSTRUCTION.finditer(hlo):
    name, shape, opcode = match.groups()
    line = hlo[match.start():hlo.find("\n", match.start())]
    called = re.search(r"calls=%?([\w.\-]+)", line)
    body = bodies.get(called.group(1), "") if called else ""
    if (opcode == "dot" or " dot(" in body) and "lhs_batch_dims" in line + body:
      kind = "batched dot"
    elif opcode == "dot" or " dot(" in body or "convolution(" in body:
      kind = "matmul"
    elif "random" in line or "bernoulli" in line or "threefry" in line:
      kind = "random bits"
    elif opcode == "gather" or " gather(" in body:
      kind = "gather"
    elif 'custom_call_target="TopK"' in line or opcode == "sort":
      kind = "top_k"
    elif opcode == "copy" or re.search(r"ROOT \S+ = \S+ copy\(", body):
      kind = "copy"
    else:
      kind = "other"
    kinds[name] = (kind, shape)
  return kinds


def _instruction_times(trace_dir: Path) -> collections.Counter:
  """Summed microseconds per traced event name, from the trace the profiler wrote."""
  times = collections.Counter()
  for path in trace_dir.rglob("*.trace.json.gz"):
    with gzip.open(path, "rt") as f:
      for event in json.load(f)["traceEvents"]:
        if event.get("ph") == "X":
          times[event["name"]] += event.get("dur", 0)
  return times


_DOT = re.compile(r"= \w+\[[\d,]*\]\S* dot\(%([\w.\-]+), %([\w.\-]+)\)(.*)")
_ARRAY = re.compile(r"%([\w.\-]+) = (\w+)\[([\d,]*)\]")
_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "f64": jnp.float64}


def _dims(text: str) -> tuple[int, ...]:
  return tuple(int(d) for d in text.split(",") if d)


def _dimension_numbers(attributes: str):
  """`dot_general`'s ((contracting), (batch)) dimension numbers from an HLO dot's attributes."""
  def named(name):
    found = re.search(rf"{name}_dims={{([\d,]*)}}", attributes)
    return _dims(found.group(1)) if found else ()
  return ((named("lhs_contracting"), named("rhs_contracting")),
          (named("lhs_batch"), named("rhs_batch")))


def dots_alone(hlo: str, repeats: int = 5, top: int = 8) -> dict:
  """Every dot of an optimized HLO text, run alone at its shapes (best of `repeats`).

  Dots inside loop bodies count once. Returns the summed milliseconds and
  GFLOP, and the `top` kinds of dot (operand shapes and dimension numbers) by
  total time, each with its count and GFLOP/s.
  """
  kinds = collections.Counter()
  for body in _computations(hlo).values():
    arrays = {name: (dtype, _dims(shape)) for name, dtype, shape in _ARRAY.findall(body)}
    for lhs, rhs, attributes in _DOT.findall(body):
      if lhs in arrays and rhs in arrays:
        kinds[(arrays[lhs], arrays[rhs], _dimension_numbers(attributes))] += 1
  rows, total_ms, total_gflop = [], 0.0, 0.0
  for ((ldt, lshape), (rdt, rshape), dims), count in kinds.items():
    if ldt not in _DTYPES or rdt not in _DTYPES:
      continue
    x, y = jnp.ones(lshape, _DTYPES[ldt]), jnp.ones(rshape, _DTYPES[rdt])
    dot = jax.jit(functools.partial(jax.lax.dot_general, dimension_numbers=dims))
    jax.block_until_ready(dot(x, y))
    best = float("inf")
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(dot(x, y))
      best = min(best, time.perf_counter() - start)
    out = math.prod(jax.eval_shape(dot, x, y).shape)
    flops = 2 * out * math.prod(lshape[d] for d in dims[0][0])
    total_ms += best * 1e3 * count
    total_gflop += flops * count / 1e9
    rows.append((best * count, {
        "lhs": f"{ldt}{list(lshape)}", "rhs": f"{rdt}{list(rshape)}",
        "contracting": [list(d) for d in dims[0]], "count": count,
        "ms_each": round(best * 1e3, 3), "gflop_s": round(flops / best / 1e9, 1)}))
  rows.sort(key=lambda row: -row[0])
  return {"ms": round(total_ms, 1), "gflop": round(total_gflop, 4),
          "top": [row for _, row in rows[:top]]}


def profile_ops(fn, *args, calls: int = 3, top: int = 12) -> dict:
  """Traces `calls` calls of `fn(*args)` (a jitted function) and sums its XLA instructions.

  `fn` must accept the same `args` again (no donated arguments). Returns the
  traced milliseconds per call, the share of each kind (`KINDS`), the `top`
  instructions by time with their kind and shape, and `dots_alone` of the
  compiled program.
  """
  compiled = fn.lower(*args).compile()  # Traced below as classified: compiled once.
  hlo = compiled.as_text()
  kinds = classify(hlo)
  alone = dots_alone(hlo)  # Before tracing: after a trace, the same dots run slower.
  jax.block_until_ready(compiled(*args))
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      for _ in range(calls):
        jax.block_until_ready(compiled(*args))
    times = _instruction_times(Path(tmp))
  ours = {name: us for name, us in times.items() if name in kinds}
  total = sum(ours.values())
  if not total:
    raise RuntimeError("The profiler recorded no XLA instruction of this function.")
  by_kind = collections.Counter()
  for name, us in ours.items():
    by_kind[kinds[name][0]] += us
  ranked = sorted(ours.items(), key=lambda item: -item[1])[:top]
  return {"traced_ms_per_call": round(total / calls / 1e3, 2),
          "dots_alone": alone,
          "share": {kind: round(by_kind[kind] / total, 3) for kind in KINDS},
          "top": [{"instruction": name, "kind": kinds[name][0], "shape": kinds[name][1],
                   "ms_per_call": round(us / calls / 1e3, 2)} for name, us in ranked]}
