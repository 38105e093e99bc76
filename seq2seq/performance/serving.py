"""The translation server's speed (`seq2seq-benchmark --mode=serve --workdir=RUN`): latency
of single sentences sent one after another, then sentences/s and latency under concurrent
clients, against `Translator.translate`'s batch throughput on the same sentences.

The server runs in this process (`serving_in_background`), as `seq2seq-serve` runs it; the
clients are threads, each with its own HTTP connection, and each request holds one sentence
of the run's test split.
"""

import concurrent.futures
import contextlib
import statistics
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from seq2seq.data import corpus
from seq2seq.decoding.translator import Translator
from seq2seq.serve.app import create_app, serving_in_background
from seq2seq.serve.engine import Engine, Limits
from seq2seq.serve.runs import ServedRun


def _percentiles(seconds: list[float]) -> dict:
  return {"latency_p50_ms": round(1000 * float(np.percentile(seconds, 50)), 2),
          "latency_p99_ms": round(1000 * float(np.percentile(seconds, 99)), 2)}


def _sentences(run: ServedRun, count: int) -> list[str]:
  """`count` sentences of the run's test split that the server takes (cycled if fewer)."""
  fits = [s for s in corpus.read_split(run.config.data, "test").src
          if s.strip() and len(run.tokenizer.encode(s)) < run.longest]
  return [fits[i % len(fits)] for i in range(count)]


@contextlib.contextmanager
def clients_per_thread(url: str, timeout: float):
  """Yields a function that returns the calling thread's own `httpx.Client` for `url`, and
  closes them all after: each thread one client with one connection, as separate clients
  have (one Client shared by threads can close a connection another thread was just handed:
  EBADF)."""
  local, made = threading.local(), []

  def client() -> httpx.Client:
    if not hasattr(local, "http"):
      local.http = httpx.Client(base_url=url, timeout=timeout)
      made.append(local.http)
    return local.http

  try:
    yield client
  finally:
    for http in made:
      http.close()


def _timed_post(http: httpx.Client, sentence: str) -> tuple[float, bool]:
  start = time.perf_counter()
  answer = http.post("/translate", json={"text": [sentence]})
  return time.perf_counter() - start, answer.status_code == 200


def serve_benchmark(workdir: str | Path, checkpoint: str = "best", *, beam: int = 4,
                    batch_size: int = 8, clients: int = 32, requests: int = 500,
                    single: int = 50) -> list[dict]:
  """Three records: `single` requests one after another (latency), `requests` requests from
  `clients` threads at once (sentences/s, latency, errors), and `seq2seq-translate`'s batch
  throughput on the same sentences with the run's config.eval.batch_size."""
  run = ServedRun(Path(workdir).name, Path(workdir), checkpoint, [beam], 0.6, batch_size)
  programs = run.compile_ahead()
  sentences = _sentences(run, requests)
  engine = Engine([run], Limits(max_lines=1)).start()
  base = {"mode": "serve", "workdir": str(workdir), "beam": beam, "batch_size": batch_size}
  try:
    with serving_in_background(create_app(engine)) as url:
      with httpx.Client(base_url=url, timeout=600) as http:
        _timed_post(http, sentences[0])  # The first request sets up the connection.
        alone = [_timed_post(http, s) for s in sentences[:single]]
      with clients_per_thread(url, timeout=600) as client:
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
          loaded = list(pool.map(lambda sentence: _timed_post(client(), sentence), sentences))
        seconds = time.perf_counter() - start
  finally:
    engine.close()
  translator = Translator(workdir, checkpoint, beam_size=beam)
  translator.translate(sentences)  # Compiles its batch shapes.
  start = time.perf_counter()
  translator.translate(sentences)
  batch_seconds = time.perf_counter() - start
  return [
      {**base, "measure": "single sentence, one client", "requests": len(alone),
       "programs": programs, "errors": sum(not ok for _, ok in alone),
       **_percentiles([t for t, _ in alone])},
      {**base, "measure": "concurrent clients", "clients": clients, "requests": len(loaded),
       "errors": sum(not ok for _, ok in loaded),
       "sentences_per_s": round(len(loaded) / seconds, 2),
       "mean_latency_ms": round(1000 * statistics.mean(t for t, _ in loaded), 2),
       **_percentiles([t for t, _ in loaded])},
      {**base, "measure": "seq2seq-translate, one batch call", "sentences": len(sentences),
       "batch_size": translator.batch_size,
       "sentences_per_s": round(len(sentences) / batch_seconds, 2),
       "server_share": round(len(loaded) / seconds / (len(sentences) / batch_seconds), 3)},
  ]
