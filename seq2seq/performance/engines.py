"""Our translation against CTranslate2's (`seq2seq-benchmark --mode=ctranslate2 --workdir=RUN`):
sentences/s of `Translator`'s beam search (in float32, and with bfloat16 products:
`--matmul_dtype=bfloat16`, `OURS_BFLOAT16`) and of the run exported to CTranslate2
(`decoding.deploy`) in float32 and int8 (its weights quantized as it loads them), on the
run's test sentences, at one sentence per batch and at the run's config.eval.batch_size.
CTranslate2 runs as `Translator` decodes (sentences of one decoding cap together) and, in
float32, also as its users run it (`ctranslate2_float32_native`: all sentences in one
`translate_batch` call, which batches them by length itself, under one cap, the largest of
theirs).

Each engine runs in a process of its own (`Worker`, running `engine_worker`), started before
the timed rounds, and times its own translations; the others wait on a pipe meanwhile, idle,
so no engine's threads share the CPU with another's (`idle_workers_cpu_s` says what the
waiting ones took). Rounds are interleaved (ours, float32, int8, native, ours, ...) so that a
busy machine slows each alike; every engine translates once before the timed rounds (ours
compiles then, and waits for every compilation to end), and the median round counts. All rank
by log-probability (alpha 0, CTranslate2's length penalty 0), so they search alike;
`equal_lines` is the share of CTranslate2's translations (float32, by cap) that are ours,
`native_equal_lines` the native engine's; `ours_bfloat16_equal_lines` and `int8_equal_lines`
are the shares of the lower-precision engines' lines that are ours in float32.
"""

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import jax

import seq2seq
from seq2seq.data import corpus
from seq2seq.decoding import deploy
from seq2seq.errors import UserError
from seq2seq.runs import workdirs

COMPUTE_TYPES = ("float32", "int8")
NATIVE = "ctranslate2_float32_native"  # CTranslate2 float32 as its users run it.
OURS_BFLOAT16 = "ours_bfloat16"  # Ours with bfloat16 products (`Translator`'s matmul_dtype).
# A worker's start, without the working directory first on sys.path (a profile.py there would
# shadow the standard library's; Python 3.11's -P, in 3.10).
_START = ("import sys; del sys.path[0]; from seq2seq.performance import engine_worker;"
          " sys.exit(engine_worker.main())")


class EngineError(RuntimeError):
  """An engine's worker failed, or ended, without its answer (a mistake of the user's, such as
  a checkpoint that cannot be read, is a `UserError` instead)."""


class Worker:
  """One engine (`engine_worker`'s setup `setup`) in a process of its own, answering one
  request at a time. A context manager: leaving it ends the process (`close`), also on an
  error or an interrupt."""

  def __init__(self, name: str, setup: dict):
    self.name, self.ready = name, None
    self.busy = True  # Loading, until it says it is ready.
    root = str(Path(seq2seq.__file__).resolve().parents[1])  # This package, wherever we run.
    path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    self.process = subprocess.Popen(
        [sys.executable, "-c", _START, json.dumps(setup)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8",
        env=dict(os.environ, PYTHONPATH=path))

  def __enter__(self) -> "Worker":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def wait_ready(self) -> dict:
    """Its `ready` reply (its process id, whether it imported JAX), once it has loaded."""
    if self.ready is None:
      self.ready = self._reply("start")
    return self.ready

  def request(self, command: str, **arguments) -> dict:
    """The worker's reply to `command`; `UserError` or `EngineError` if it failed."""
    self.wait_ready()
    self.busy = True  # Until the reply: interrupted meanwhile, `close` kills it.
    with contextlib.suppress(BrokenPipeError):  # It ended: the missing reply says so.
      self.process.stdin.write(json.dumps({"command": command, "arguments": arguments}) + "\n")
      self.process.stdin.flush()
    return self._reply(command)

  def _reply(self, command: str) -> dict:
    line = self.process.stdout.readline()
    self.busy = False  # Answered (or ended): it waits for the next request, or its end.
    reply = None
    with contextlib.suppress(ValueError):
      reply = json.loads(line)
    if isinstance(reply, dict) and "error" not in reply:
      return reply
    where = f"{self.name}'s worker (process {self.process.pid})"
    if isinstance(reply, dict) and reply.get("user_error"):
      raise UserError(reply["error"])
    if isinstance(reply, dict):
      raise EngineError(f"{where} failed at {command}: {reply['error']} (its traceback is on"
                        " stderr above).")
    if line:
      raise EngineError(f"{where} answered {command} with {line.strip()[:200]!r}, not JSON.")
    with contextlib.suppress(subprocess.TimeoutExpired):
      self.process.wait(timeout=10)
    raise EngineError(f"{where} ended (exit status {self.process.poll()}) without answering"
                      f" {command}; its stderr above says why.")

  def close(self) -> None:
    """Ends the worker: the end of its stdin, which it reads between requests; killed at once
    if it is amid one (we were interrupted), or if it has not ended 30 s later."""
    with contextlib.suppress(OSError):
      self.process.stdin.close()
    if self.busy:
      self.process.kill()
    try:
      self.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()
    self.process.stdout.close()


def worker_setups(workdir: str | Path, checkpoint: str, exported: Path, *, beam: int,
                  batches: list[int], threads: int) -> dict[str, dict]:
  """Each engine's `engine_worker` setup, by name, in the order of a round: ours (with this
  process's compilation cache) in float32 and with bfloat16 products (`OURS_BFLOAT16`),
  CTranslate2 at each compute type by decoding cap, and CTranslate2 float32 as its users run
  it (`NATIVE`)."""
  ours = {"engine": "ours", "workdir": str(workdir), "checkpoint": checkpoint, "beam": beam,
          "batches": batches, "compilation_cache": jax.config.jax_compilation_cache_dir}
  setups = {"ours": ours, OURS_BFLOAT16: {**ours, "matmul_dtype": "bfloat16"}}
  theirs = {"engine": "ctranslate2", "model": str(exported), "intra_threads": threads,
            "beam": beam}
  for compute_type in COMPUTE_TYPES:
    setups[f"ctranslate2_{compute_type}"] = {**theirs, "compute_type": compute_type,
                                             "by_cap": True}
  setups[NATIVE] = {**theirs, "compute_type": "float32", "by_cap": False}
  return setups


def _share_equal(ours: list[str], theirs: list[str]) -> float:
  return round(sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(ours), 4)


def _rounds(workers: dict[str, Worker], texts: list[str], batch: int, rounds: int) -> dict:
  """The warm-up, then `rounds` interleaved rounds at `batch`: the fields of its result."""
  warm = {name: worker.request("translate", texts=texts, batch=batch)  # Ours compiles.
          for name, worker in workers.items()}
  times, idle, compiled = {name: [] for name in workers}, 0.0, 0
  for _ in range(rounds):
    for name, worker in workers.items():
      reply = worker.request("translate", texts=texts, batch=batch)
      times[name].append(reply["seconds"])
      idle += reply["idle_cpu_s"]
      compiled += reply.get("compiled", 0)
  per_second = {name: len(texts) / statistics.median(t) for name, t in times.items()}
  result = {f"{name}_sentences_per_s": round(v, 2) for name, v in per_second.items()}
  for name in [name for name in workers if name != "ours"]:
    result[f"{name.removeprefix('ctranslate2_')}_speedup"] = round(
        per_second[name] / per_second["ours"], 2)
  ours = warm["ours"]["translations"]
  result["equal_lines"] = _share_equal(ours, warm["ctranslate2_float32"]["translations"])
  for name, short in ((OURS_BFLOAT16, OURS_BFLOAT16), ("ctranslate2_int8", "int8")):
    if name in warm:  # The share of its lines that are ours in float32.
      result[f"{short}_equal_lines"] = _share_equal(ours, warm[name]["translations"])
  if NATIVE in warm:
    result["native_equal_lines"] = _share_equal(ours, warm[NATIVE]["translations"])
    result["native_max_decoding_length"] = warm[NATIVE]["max_decoding_length"]
  # Each should be 0: ours compiled nothing while timed, the waiting workers took no CPU.
  return {**result, "compiled_while_timed": compiled, "idle_workers_cpu_s": round(idle, 3)}


def ctranslate2_benchmark(workdir: str | Path, checkpoint: str = "best", *, beam: int = 4,
                          sentences: int = 200, rounds: int = 3, threads: int = 2) -> list[dict]:
  """One result per batch size (1, config.eval.batch_size): each engine's sentences/s (the
  median of `rounds` interleaved rounds over the first `sentences` non-empty test sentences),
  CTranslate2's speedups over ours, and how many of its lines are ours. `threads`:
  CTranslate2's intra_threads (ours uses the threads XLA takes). Every engine runs in a
  process of its own (`Worker`); all have ended when this returns or raises."""
  config = workdirs.read_run_config(Path(workdir))
  texts = [s for s in corpus.read_split(config.data, "test").src if s.strip()][:sentences]
  batches = sorted({1, config.eval.batch_size})
  results = []
  with (tempfile.TemporaryDirectory(prefix="seq2seq-ctranslate2-") as directory,
        contextlib.ExitStack() as stack):  # The workers end before their model is removed.
    exported = deploy.export(workdir, checkpoint, Path(directory) / "model")
    setups = worker_setups(workdir, checkpoint, exported, beam=beam, batches=batches,
                           threads=threads)
    workers = {name: stack.enter_context(Worker(name, setup)) for name, setup in setups.items()}
    for worker in workers.values():  # They load at once; none is timed before all are ready.
      worker.wait_ready()
    for batch in batches:
      results.append({"mode": "ctranslate2", "batch": batch, "beam": beam,
                      "sentences": len(texts), "rounds": rounds, "intra_threads": threads,
                      "separate_processes": True, **_rounds(workers, texts, batch, rounds)})
  return results
