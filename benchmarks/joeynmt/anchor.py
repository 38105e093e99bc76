"""This project against JoeyNMT 2.3.0 on a recipe's own data: the speed anchor researchers would
pick instead (benchmarks/joeynmt/side_by_side.py).

JoeyNMT lives in a virtualenv of its own (torch is no dependency of this package), whose Python
runs `worker.py` as a subprocess; this process drives it one request at a time, so that
the two sides take turns on the same cores, round by round, and a noisy machine slows both alike.

What is the same on both sides, per config (configs/multi30k_transformer_sinusoidal.py,
multi30k_rnn.py):
- the corpus files (the config's train split, and its test split to decode), read by our
  reader and written out as plain text for JoeyNMT;
- the SentencePiece model (trained as a run trains it, or a run's, `vocab_from`): JoeyNMT
  segments with it through its own `sentencepiece` tokenizer, over a vocabulary file of the
  same pieces (its PAD and UNK ids swap places; every other id is ours);
- the architecture, built from the config parameter for parameter (`spec`); what
  cannot match is listed, with the parameters it adds on JoeyNMT's side, in `unmatched`;
- the real target tokens per batch: JoeyNMT's token budget is set so that its batches hold, on
  average over an epoch, the real target tokens ours hold (each pads as it does: ours in
  length buckets or packed rows, JoeyNMT's sampler in random order);
- the threads: this process's cores, which XLA takes, and `torch.set_num_threads` the same;
- decoding: beam search on the test split with the config's alpha, over the same groups of
  sentences, each group capped at the same output length (ours, from its padded length), with
  the initial (random) weights kept aside before training, so that every round searches as
  long as the first: random weights rarely end a hypothesis, and the record's output tokens
  show how far each side went. Ours searches as `Translator` does, in batches of the config's
  eval.batch_size rows of every length, each sentence to its own cap, the last batch filled up
  with PAD rows (`decode_rows`); JoeyNMT's batches are the groups' sentences only.

Each round trains `steps` optimizer steps on each side (real target tokens over seconds,
host-side batching included; `train_padded_tgt_tok_s` counts the padding too, which tells
arithmetic from batching) and decodes the sentences once on each side. Compiling and
JoeyNMT's start-up happen before the rounds; one untimed step of each shape and one untimed
search warm both. Ratios are of medians over the rounds, ours over JoeyNMT's: above 1, this
project is faster.
"""

import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks.joeynmt.files import joeynmt_config, write_corpus, write_vocabulary
from benchmarks.joeynmt.spec import VERSION, joeynmt_model, joeynmt_parameters, unmatched
from seq2seq.data import batching, corpus
from seq2seq.data.special_ids import EOS_ID, PAD_ID
from seq2seq.decoding import search, translator
from seq2seq.errors import UserError
from seq2seq.runs import workdirs

WORKER = Path(__file__).with_name("worker.py")
# Makes the virtualenv that --joeynmt_python points at, in the checkout (.anchors/ is ignored).
# PyPI's `torch` brings CUDA libraries a CPU never loads; a CPU-only wheel (2.13.0+cpu, measured
# here) does as well, where pip can find one. JoeyNMT 2.3.0 asks for torch>=1.12, imports
# importlib_metadata without declaring it, and calls SentencePieceProcessor.SetVocabulary,
# which sentencepiece 0.2.2 dropped.
SETUP_COMMAND = ("python3 -m venv .anchors/joeynmt && .anchors/joeynmt/bin/pip install"
                 f" torch joeynmt=={VERSION} importlib_metadata sentencepiece==0.2.1")
FIX = (f"make JoeyNMT's virtualenv with `{SETUP_COMMAND}` and pass"
       " --joeynmt_python=.anchors/joeynmt/bin/python (or set $JOEYNMT_PYTHON)")


# What the worker imports, and the method of sentencepiece that JoeyNMT calls: a virtualenv
# that lacks any of them is refused before our side spends its minutes compiling.
_PROBE = ("import json, sentencepiece, torch, joeynmt, joeynmt.prediction, joeynmt.training;"
         " print(json.dumps([joeynmt.__version__,"
         " hasattr(sentencepiece.SentencePieceProcessor, 'SetVocabulary')]))")


def check_python(python: str) -> Path:
  """The virtualenv's Python that `--joeynmt_python` names, checked to import JoeyNMT
  as the worker does; `UserError` naming the setup command otherwise."""
  if not python:
    raise UserError(f"The JoeyNMT comparison needs JoeyNMT {VERSION} in a virtualenv of its own;"
                    f" {FIX}.")
  path = Path(os.path.abspath(Path(python).expanduser()))  # The worker runs elsewhere; links kept.
  if not (path.is_file() and os.access(path, os.X_OK)):
    raise UserError(f"--joeynmt_python={python} is not an executable file; {FIX}.")
  probe = subprocess.run([str(path), "-I", "-c", _PROBE], capture_output=True, text=True)
  if probe.returncode:
    reason = (probe.stderr.strip().splitlines() or [f"status {probe.returncode}"])[-1]
    raise UserError(f"--joeynmt_python={python} cannot import JoeyNMT ({reason}); {FIX}.")
  version, vocabulary = json.loads(probe.stdout.strip().splitlines()[-1])
  if version != VERSION:
    raise UserError(f"--joeynmt_python={python} has JoeyNMT {version}, not {VERSION}, the version"
                    f" this comparison drives; {FIX}.")
  if not vocabulary:
    raise UserError(f"--joeynmt_python={python} has a sentencepiece without"
                    f" SetVocabulary, which JoeyNMT calls (0.2.2 dropped it); {FIX}.")
  return path


def parse_reply(line: str, request: str, log: str = "", kept: Path | None = None) -> dict:
  """The worker's reply to `request`, or `UserError` with its error (or, if it ended or
  answered no JSON, the last line of `log`, what it wrote to stderr, which `kept` holds)."""
  reply = None
  with contextlib.suppress(ValueError):
    reply = json.loads(line)
  if isinstance(reply, dict) and "error" not in reply:
    return reply
  if isinstance(reply, dict):
    reason = reply["error"]
  else:
    tail = log.strip().splitlines()
    reason = tail[-1].strip() if tail else (line.strip() or "it ended without a reply")
  if "No module named" in reason:
    raise UserError(f"JoeyNMT's worker cannot start ({reason}); {FIX}.")
  where = f" (its log: {kept})" if kept else ""
  raise UserError(f"JoeyNMT's worker failed at `{request}`: {reason}{where}.")


class Worker:
  """JoeyNMT's side, a subprocess of `python` (in `env`; None: ours), answering one request at
  a time. `keep_log`: its log is appended to (a resumed run's), and it runs in a session of
  its own, so that a signal reaches it once, from `close`, not also from the terminal."""

  def __init__(self, python: Path, setup: dict, directory: Path, keep_log: bool = False,
               env: dict | None = None):
    setup_file, self.log = directory / "setup.json", directory / "worker.log"
    setup_file.write_text(json.dumps(setup), encoding="utf-8")
    self.busy = False
    with open(self.log, "a" if keep_log else "w", encoding="utf-8") as log:
      self.process = subprocess.Popen(
          # -I: not this folder first on sys.path, where a module of ours could shadow one
          # that torch imports; nor $PYTHONPATH, which may name ours.
          [str(python), "-I", str(WORKER), str(setup_file)], stdin=subprocess.PIPE,
          stdout=subprocess.PIPE, stderr=log, text=True, encoding="utf-8",
          start_new_session=keep_log, env=env)

  def request(self, command: str, **arguments) -> dict:
    self.busy = True  # Until the reply: a signal that ends us meanwhile leaves it working.
    try:
      self.process.stdin.write(json.dumps({"command": command, "arguments": arguments}) + "\n")
      self.process.stdin.flush()
    except BrokenPipeError:
      pass  # It ended: the empty reply says why.
    line = self.process.stdout.readline()
    self.busy = False
    try:
      return parse_reply(line, command)
    except UserError:  # Its folder goes with the comparison: the traceback is kept outside.
      log = self.log.read_text(encoding="utf-8", errors="replace")
      kept = Path(tempfile.gettempdir()) / "seq2seq-joeynmt-worker.log"
      kept.write_text(log, encoding="utf-8")
      return parse_reply(line, command, log, kept)

  def close(self) -> None:
    """Ends the worker: `quit`, or, amid a request (we were interrupted), SIGINT, on which
    JoeyNMT's trainer saves a checkpoint before the worker ends."""
    timeout = 30
    if self.process.poll() is None and self.busy:
      self.process.send_signal(signal.SIGINT)
      with contextlib.suppress(OSError):
        self.process.stdin.close()  # The worker's next read ends it.
      timeout = 600
    elif self.process.poll() is None:
      with contextlib.suppress(BrokenPipeError, UserError):
        self.request("quit")
    try:
      self.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()


@dataclasses.dataclass
class Project:
  """Our side: the trainer of the config, its initial parameters kept for decoding, and the
  decoding batches."""
  trainer: object
  state: object
  search_params: object
  search: object
  decode_batches: list
  step: int = 0

  def train(self, steps: int) -> dict:
    """`steps` steps as the training loop dispatches them (batching included)."""
    trainer = self.trainer
    padded = sum(trainer.train_batches(self.step + i)["tgt_out"].size for i in range(steps))
    start, metrics = time.perf_counter(), []
    for _ in range(steps):
      self.state, out = trainer.train(self.state, self.step, 1)
      metrics.append(out)
      self.step += 1
    tokens = sum(float(m["tokens"]) for m in jax.device_get(metrics))
    return {"seconds": time.perf_counter() - start, "steps": steps, "tokens": tokens,
            "padded_tokens": padded}

  def decode(self, limit: int = 0) -> dict:
    """Beam search over the decoding batches (the first `limit`; 0: all), as `Translator`
    runs it: seconds, sentences, and output tokens up to EOS."""
    sentences = tokens = rows = 0
    start = time.perf_counter()
    for batch in self.decode_batches[:limit or None]:
      ids, _ = jax.device_get(self.search(self.search_params, jnp.asarray(batch["src"])))
      rows += len(batch["src"])  # With the last batch's filler rows.
      for row in np.flatnonzero(batch["index"] >= 0):
        sentences += 1
        tokens += output_length(ids[row, 0])
    return {"seconds": time.perf_counter() - start, "sentences": sentences, "rows": rows,
            "output_tokens": tokens}


def output_length(ids: np.ndarray) -> int:
  """Tokens of a hypothesis up to and including EOS (all of them where the search stopped at
  its cap before EOS)."""
  ends = np.flatnonzero(ids == EOS_ID)
  return int(ends[0]) + 1 if len(ends) else int((ids != PAD_ID).sum())


def _project(config: ml_collections.ConfigDict, workdir: Path, test_src: list[str],
             beam: int) -> tuple[Project, float, list, list]:
  """Our side, compiled, with the mean real target tokens of its first epoch's batches and
  the decoding groups (test sentence indices) and caps that JoeyNMT takes too."""
  from seq2seq.training.trainer import Trainer  # Imports the models: not before the checks.

  trainer = Trainer(config, workdir)
  src_ids = [np.asarray(ids, np.int32) for ids in trainer.tokenizer.encode_batch(test_src)]
  empty = [np.zeros(0, np.int32)] * len(src_ids)
  batches = batching.eval_batches(src_ids, empty, batch_size=config.eval.batch_size,
                                  max_len=config.model.max_len)  # As `Translator` batches.
  programs = translator.search_programs(trainer.graphdef, config,
                                        search.Beam(beam, config.eval.alpha))
  state = trainer.new_state()
  params = jax.tree.map(jnp.copy, state.params)  # The train step donates the state's.
  trainer.compile()
  for batch in batches:
    programs.add(params, jax.ShapeDtypeStruct(batch["src"].shape, np.int32))
  trainer.train_step.wait()
  programs.wait()
  project = Project(trainer, state, params, programs, batches)
  return project, real_tokens_per_batch(trainer), *decode_groups(config, src_ids)


def real_tokens_per_batch(trainer) -> float:
  """The mean real (not PAD) target tokens of the trainer's batches over its first epoch."""
  plan = trainer.train_batches
  real = [int((plan(step)["tgt_out"] != PAD_ID).sum()) for step in range(plan.batches_per_epoch)]
  return sum(real) / len(real)


def decode_groups(config: ml_collections.ConfigDict,
                  src_ids: list[np.ndarray]) -> tuple[list[list[int]], list[int]]:
  """JoeyNMT's decoding batches of the sentences of `src_ids` (without EOS): their indices
  in groups of one grid length, at most config.eval.batch_size each, and each group's cap,
  which is the one ours gives each of its sentences (`search.decode_caps`): JoeyNMT's search
  takes one cap per batch."""
  e, empty = config.eval, [np.zeros(0, np.int32)] * len(src_ids)
  grouped = batching.eval_batches(src_ids, empty, batch_size=e.batch_size,
                                  max_len=config.model.max_len, one_length=True)
  caps = [search.max_decode_len(b["src"].shape[1], e.max_decode_len_a, e.max_decode_len_b,
                                config.model.max_len) for b in grouped]
  return [[int(i) for i in b["index"] if i >= 0] for b in grouped], caps


def _joeynmt_files(config: ml_collections.ConfigDict, scratch: Path, test_src: list[str],
                   groups: list[list[int]]) -> tuple[dict, int]:
  """JoeyNMT's files in `scratch`/joeynmt (vocabulary, corpus, model folder) for the run in
  `scratch`/run: its config, and the pieces of the vocabulary."""
  spm_model, joey = scratch / "run" / workdirs.VOCAB, scratch / "joeynmt"
  (joey / "model").mkdir(parents=True)  # JoeyNMT writes its vocabulary files there.
  vocab = write_vocabulary(spm_model, joey / "vocab.txt")
  # The test file holds the decoded sentences in the groups' order: each group is a run of
  # consecutive lines.
  write_corpus(corpus.read_split(config.data, "train"),
               [test_src[i] for group in groups for i in group], joey, config.data.src_lang,
               config.data.tgt_lang)
  return joeynmt_config(config, spm_model=spm_model, vocab_file=joey / "vocab.txt",
                        data_dir=joey, model_dir=joey / "model"), vocab


def _rounds(project: Project, worker: Worker, rounds: int, steps: int) -> tuple[dict, dict]:
  """Warms both sides (a step of each of our shapes, compiled already, and a search), then
  times `rounds` rounds, each side in turn: the train and decode results of each side."""
  shapes = len(project.trainer.train_batches.shapes)
  project.train(shapes)
  worker.request("train", steps=shapes)
  project.decode(limit=1)
  worker.request("decode", limit=1)
  train, decode = {"project": [], "anchor": []}, {"project": [], "anchor": []}

  def anchor(command: str, **arguments) -> dict:  # With our CPU seconds while it ran.
    cpu = time.process_time()
    reply = worker.request(command, **arguments)
    return {**reply, "other_cpu_s": time.process_time() - cpu}

  for _ in range(rounds):
    train["project"].append(project.train(steps))
    train["anchor"].append(anchor("train", steps=steps))
    decode["project"].append(project.decode())
    decode["anchor"].append(anchor("decode"))
  return train, decode


def _median_rate(results: list[dict], amount: str) -> float:
  return statistics.median(r[amount] / r["seconds"] for r in results)


def summary(train: dict, decode: dict) -> dict:
  """The record's figures from each side's round results (`project` and `anchor`): medians of
  the rounds' rates, and their ratios, ours over JoeyNMT's."""
  tok_s = {side: _median_rate(r, "tokens") for side, r in train.items()}
  padded_s = {side: _median_rate(r, "padded_tokens") for side, r in train.items()}
  sent_s = {side: _median_rate(r, "sentences") for side, r in decode.items()}
  return {
      "train_target_padding": {side: round(1 - sum(x["tokens"] for x in r)
                                           / sum(x["padded_tokens"] for x in r), 3)
                               for side, r in train.items()},
      "train_tgt_tok_s": {side: round(v, 1) for side, v in tok_s.items()},
      "train_padded_tgt_tok_s": {side: round(v, 1) for side, v in padded_s.items()},
      "train_ratio": round(tok_s["project"] / tok_s["anchor"], 3),
      "decode_sent_s": {side: round(v, 2) for side, v in sent_s.items()},
      "decode_rows": {side: r[-1]["rows"] for side, r in decode.items()},
      "decode_output_tokens": {side: r[-1]["output_tokens"] for side, r in decode.items()},
      "decode_ratio": round(sent_s["project"] / sent_s["anchor"], 3),
      # CPU seconds each side took while the other was timed: both near 0, or the turns
      # overlapped (our compiler threads, say, or JoeyNMT's spinning threads).
      "idle_cpu_s": {"project": round(sum(r["other_cpu_s"] for r in (*train["anchor"],
                                                                      *decode["anchor"])), 2),
                     "anchor": round(sum(r["idle_cpu_s"] for r in (*train["anchor"],
                                                                   *decode["anchor"])), 2)},
  }


def compare(config: ml_collections.ConfigDict, python: Path, *, rounds: int, steps: int,
            beam: int, sentences: int = 0, name: str = "") -> dict:
  """Both sides of `config`, interleaved `rounds` times; returns the JSON record."""
  model = joeynmt_model(config.model)  # What JoeyNMT cannot build stops here, before any work.
  threads = len(os.sched_getaffinity(0))
  test_src = [s for s in corpus.read_split(config.data, "test").src if s.strip()]
  test_src = test_src[:sentences or None]
  with tempfile.TemporaryDirectory(prefix="seq2seq-joeynmt-") as scratch:
    scratch = Path(scratch)
    begin = time.perf_counter()
    project, tokens_per_batch, groups, caps = _project(config, scratch / "run", test_src, beam)
    project_setup = time.perf_counter() - begin
    joey_config, vocab = _joeynmt_files(config, scratch, test_src, groups)
    lines = iter(range(len(test_src)))
    worker = Worker(python, {
        "config": joey_config, "threads": threads, "target_tokens_per_batch": tokens_per_batch,
        "decode": {"groups": [[next(lines) for _ in group] for group in groups], "caps": caps,
                   "beam": beam, "alpha": config.eval.alpha}}, scratch)
    try:
      joey = worker.request("start")
      train, decode = _rounds(project, worker, rounds, steps)
    finally:
      worker.close()
  return {
      "anchor": "joeynmt", "config": name, "family": config.model.family,
      "backend": jax.default_backend(), "threads": {"project": threads, "anchor": joey["threads"]},
      "joeynmt": joey["joeynmt"], "torch": joey["torch"],
      # How torch's OpenMP threads wait: spinning (the default) collapses when another process
      # takes a core from them (a beam search 60x slower on a busy 2-core machine); PASSIVE
      # does not.
      "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
      "rounds": rounds, "train_steps": steps,
      "params": {"project": project.trainer.num_params, "anchor": joey["params"],
                 "anchor_expected": joeynmt_parameters(model, vocab)},
      "unmatched": [{"what": what, "params": params}
                    for what, params in unmatched(config.model, vocab)],
      "target_tokens_per_batch": {"project": round(tokens_per_batch, 1),
                                  "anchor": joey["target_tokens_per_batch"]},
      "anchor_batch_size": joey["batch_size"], "beam": beam, "decode_sentences": len(test_src),
      **summary(train, decode),
      "setup_s": {"project": round(project_setup, 1), "anchor": joey["setup_s"]},
  }
