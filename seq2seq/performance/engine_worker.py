"""One engine of `seq2seq-benchmark --mode=ctranslate2` in a process of its own (`engines`
starts one per engine), so that no other engine's threads share the CPU while it is timed.

  python -m seq2seq.performance.engine_worker SETUP_JSON  (`engines.Worker` starts it so)

SETUP_JSON names the engine and how to load it: `{"engine": "ours", "workdir", "checkpoint",
"beam", "batches", "compilation_cache"[, "matmul_dtype"]}` (our `Translator`, alpha 0, one per
batch size; float32 products unless `matmul_dtype` says otherwise) or
`{"engine": "ctranslate2", "model", "compute_type", "intra_threads", "beam", "by_cap"}`
(`deployed.CTranslate2Translator`; `by_cap` false: CTranslate2's own batching under one cap).
The worker loads it, then says `{"ready": ...}` on stdout. Each line on stdin is then a
request, `{"command": ..., "arguments": {...}}`, answered by one JSON line on stdout, or
`{"error": "Type: message", "user_error": bool}` (the traceback goes to stderr):

- `translate` (`texts`, `batch`): `seconds` (of the translation alone, timed here),
  `translations`; ours also `compiled`, the programs it compiled meanwhile, and it answers
  only once no program compiles, in the background either (`compiling.unfinished`): the
  first translation at a batch size is the warm-up, and after it nothing compiles.
- `status`: this process's id, whether it imported JAX and its threads.

Every reply says in `idle_cpu_s` the CPU seconds this process took since its last reply:
waiting on stdin, it should take none from the engine being timed. stdout carries nothing else
(what the engines print goes to stderr). The end of stdin ends the worker; SIGINT is ignored
(Ctrl-C reaches the benchmark, which ends its workers). A worker running CTranslate2 imports
nothing of JAX: this module imports only the engine it runs.
"""

import json
import os
import signal
import sys
import threading
import time
import traceback

from seq2seq.errors import UserError, describe


class Ours:
  """Our `Translator` (beam search, alpha 0), one per batch size of the setup's `batches`."""

  def __init__(self, setup: dict):
    from seq2seq.runtime import compiling, persistent_cache

    # As the benchmark's command: its persistent compilation cache, or none.
    if setup.get("compilation_cache"):
      os.environ["JAX_COMPILATION_CACHE_DIR"] = setup["compilation_cache"]
      persistent_cache.enable_cache()
    else:
      import jax

      jax.config.update("jax_compilation_cache_dir", None)
    from seq2seq.decoding.translator import Translator

    self.compiling = compiling
    self.translators = {batch: Translator(setup["workdir"], setup["checkpoint"],
                                          beam_size=setup["beam"], alpha=0.0, batch_size=batch,
                                          matmul_dtype=setup.get("matmul_dtype", "float32"))
                        for batch in setup["batches"]}

  def translate(self, texts: list[str], batch: int) -> dict:
    translator = self.translators[batch]
    with self.compiling.counting() as counts:
      start = time.perf_counter()
      translations = [nbest[0][0] for nbest in translator.translate(texts)]
      seconds = time.perf_counter() - start
    while self.compiling.unfinished():  # Programs compiling in the background too.
      time.sleep(0.01)
    return {"seconds": seconds, "translations": translations,
            "compiled": sum(counts.compiled.values()) + sum(counts.cached.values())}


class CTranslate2:
  """The exported run in CTranslate2 at one compute type: by decoding cap, as `Translator`
  decodes (`by_cap`), or as CTranslate2's users run it."""

  def __init__(self, setup: dict):
    from seq2seq.decoding.deployed import CTranslate2Translator

    self.setup = setup
    self.translator = CTranslate2Translator(setup["model"], compute_type=setup["compute_type"],
                                            intra_threads=setup["intra_threads"])

  def translate(self, texts: list[str], batch: int) -> dict:
    by_cap = self.setup["by_cap"]
    start = time.perf_counter()
    translations = [text for text, _ in self.translator.translate(
        texts, beam_size=self.setup["beam"], batch_size=batch, by_cap=by_cap)]
    seconds = time.perf_counter() - start
    reply = {"seconds": seconds, "translations": translations}
    if not by_cap:
      reply["max_decoding_length"] = self.translator.one_cap(texts)
    return reply


ENGINES = {"ours": Ours, "ctranslate2": CTranslate2}


def status() -> dict:
  """This process: its id, whether it imported JAX (and initialized a backend), its threads."""
  jax = sys.modules.get("jax")
  backends = []
  if jax is not None:
    from jax._src import xla_bridge  # Only where JAX is imported already.

    backends = sorted(getattr(xla_bridge, "_backends", {}))
  return {"pid": os.getpid(), "jax_imported": jax is not None, "jax_backends": backends,
          "threads": threading.active_count()}


def error_reply(error: Exception) -> dict:
  traceback.print_exc(file=sys.stderr)
  return {"error": describe(error) if not isinstance(error, UserError) else str(error),
          "user_error": isinstance(error, UserError)}


def serve(engine, requests, replies) -> None:
  """Answers each JSON request line of `requests` with one JSON line on `replies`, until the
  end of `requests`; an exception becomes an `error` reply, not the end."""
  replied = time.process_time()
  for line in requests:
    if not line.strip():
      continue
    idle = time.process_time() - replied
    try:
      request = json.loads(line)
      command, arguments = request["command"], request.get("arguments", {})
      reply = status() if command == "status" else {"translate": engine.translate}[command](
          **arguments)
    except Exception as e:  # Every failure is the benchmark's to report, in one line.
      reply = error_reply(e)
    replies.write(json.dumps({**reply, "idle_cpu_s": idle}) + "\n")
    replies.flush()
    replied = time.process_time()


def main(argv: list[str] | None = None) -> int:
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # The benchmark ends us (stdin's end).
  setup = json.loads((argv or sys.argv)[1])
  # Replies on a copy of stdout; the descriptor 1 itself, which libraries print to, is stderr.
  replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  try:
    engine = ENGINES[setup["engine"]](setup)
  except Exception as e:  # Reported, then the end: there is nothing to serve.
    replies.write(json.dumps(error_reply(e)) + "\n")
    replies.flush()
    return 1
  replies.write(json.dumps({"ready": True, **status()}) + "\n")
  replies.flush()
  serve(engine, sys.stdin, replies)
  return 0


if __name__ == "__main__":
  sys.exit(main())
