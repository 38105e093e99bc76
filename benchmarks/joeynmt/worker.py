"""JoeyNMT's side of the JoeyNMT comparison (benchmarks/joeynmt/side_by_side.py), run by the
Python of JoeyNMT's own virtualenv: it imports torch and joeynmt, and nothing of seq2seq or of
benchmarks/ (which that virtualenv lacks).

  JOEYNMT_PYTHON -I benchmarks/joeynmt/worker.py SETUP.json

SETUP.json holds JoeyNMT's config (`files.joeynmt_config`), the threads, the real target
tokens per batch to match and the decoding batches; with `"budget"`, the worker is `Budget`,
JoeyNMT's training at a recipe's full budget (`budget`), not the timing.
Each line on stdin is a request, `{"command": ..., "arguments": {...}}`; each gets one JSON
line on stdout, the reply, or `{"error": "Type: message"}` (the traceback goes to stderr).
stdout carries nothing else: what JoeyNMT or torch print goes to stderr. The worker waits on
stdin between requests, so it takes no CPU while the other side is timed (each reply's
`idle_cpu_s` shows it).

It drives JoeyNMT through its own API, as `joeynmt train` and `joeynmt test` run it:
`prediction.prepare` (data, vocabulary, model, loss), `training.TrainManager` for the optimizer,
scheduler and gradient clipping, `TrainManager._train_step` and the update that
`train_and_validate` makes after it, and `search.search` for beam search. Timing a fixed number
of steps here, rather than parsing JoeyNMT's log, leaves its start-up and validation out.
`Budget` runs `TrainManager.train_and_validate` itself, validation and checkpoints included, as
`joeynmt train` does, resumed from JoeyNMT's latest checkpoint.
"""

import copy
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path


def describe(error: BaseException) -> str:
  """`Type: first line` of an exception, for the reply."""
  first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
  return f"{type(error).__name__}: {first[:300]}" if first else type(error).__name__


def serve(handlers: dict, requests, replies) -> None:
  """Answers each JSON request line of `requests` with one JSON line on `replies`, until
  `quit` or the end of `requests`; an exception becomes an `error` reply, not the end. Each
  reply says in `idle_cpu_s` the CPU seconds this process took between the last reply and the
  request: waiting, it should take none from the other side's timing."""
  replied = time.process_time()
  for line in requests:
    if not line.strip():
      continue
    idle = time.process_time() - replied
    try:
      request = json.loads(line)
      command = request["command"]
      if command == "quit":
        replies.write(json.dumps({"quit": True, "idle_cpu_s": idle}) + "\n")
        replies.flush()
        return
      reply = handlers[command](**request.get("arguments", {}))
    except Exception as e:  # Every failure is the caller's to report, in one line.
      traceback.print_exc(file=sys.stderr)
      reply = {"error": describe(e)}
    replies.write(json.dumps({**reply, "idle_cpu_s": idle}) + "\n")
    replies.flush()
    replied = time.process_time()


class Joey:
  """JoeyNMT's model, data and trainer, built from the setup by `start`."""

  def __init__(self, setup: dict):
    self.setup = setup

  def start(self) -> dict:
    """Builds everything and matches the real target tokens per batch; returns what the
    record reports of this side."""
    begin = time.perf_counter()
    import torch  # The virtualenv's: not importable where seq2seq runs.

    torch.set_num_threads(self.setup["threads"])
    import joeynmt
    from joeynmt.config import parse_global_args, set_validation_args
    from joeynmt.prediction import prepare
    from joeynmt.training import TrainManager

    self.torch = torch
    cfg = self.setup["config"]
    args = parse_global_args(copy.deepcopy(cfg), rank=0, mode="train")
    model, self.train_data, _, self.test_data = prepare(args, rank=0, mode="train")
    # Decoding uses the initial weights throughout, whatever training does to the other copy:
    # every round searches as long as the first (random weights rarely end a hypothesis).
    self.search_model = copy.deepcopy(model)
    self.search_model.eval()
    self.model = model
    batch_size, per_batch = self._match_tokens(self.setup["target_tokens_per_batch"])
    args = args._replace(train=args.train._replace(batch_size=batch_size))
    self.trainer = TrainManager(
        model=model, model_dir=args.model_dir, device=args.device, n_gpu=args.n_gpu, rank=0,
        num_workers=args.num_workers, autocast=args.autocast, seed=args.seed,
        train_args=args.train, dev_args=set_validation_args(args.test))
    self.epoch, self.batches = 0, iter(())
    self.decode_batches = self._decode_batches()
    return {
        "joeynmt": joeynmt.__version__, "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),  # Shared tensors once.
        "vocab": len(model.trg_vocab), "batch_size": batch_size,
        "target_tokens_per_batch": round(per_batch, 1),
        "setup_s": round(time.perf_counter() - begin, 1),
    }

  def _iterator(self, batch_size: int, epoch: int):
    """JoeyNMT's training iterator of one epoch, as `train_and_validate` makes and seeds it."""
    model, seed = self.model, self.setup["config"].get("random_seed", 42)
    iterator = self.train_data.make_iter(
        batch_size=batch_size, batch_type="token", seed=seed, shuffle=True, num_workers=0,
        device=self.torch.device("cpu"), eos_index=model.eos_index, pad_index=model.pad_index)
    self.train_data.seed = seed + epoch
    iterator.batch_sampler.set_seed(seed + epoch)
    return iterator

  def _real_tokens_per_batch(self, batch_size: int) -> float:
    """The mean real target tokens (EOS counted, as `Batch.ntokens` counts them) of the
    batches that JoeyNMT's token sampler forms at `batch_size` over one epoch."""
    sampler = self._iterator(batch_size, 1).batch_sampler
    data, sizes = self.train_data, []
    for indices in sampler:
      sizes.append(sum(len(data[i][2]) + 1 for i in indices))
    return sum(sizes) / len(sizes)

  def _match_tokens(self, target: float) -> tuple[int, int]:
    """JoeyNMT's `batch_size` (its sampler's budget: the longer side plus one, times the
    sentences, in random order) whose batches hold `target` real target tokens on average.
    Real tokens grow in proportion to the budget, so two corrections reach it."""
    batch_size = int(2 * target)
    for _ in range(2):
      batch_size = max(1, round(batch_size * target / self._real_tokens_per_batch(batch_size)))
    return batch_size, self._real_tokens_per_batch(batch_size)

  def _next_batch(self):
    """The next training batch, a new epoch (reshuffled) when one ends."""
    for _ in range(2):
      batch = next(self.batches, None)
      if batch is not None:
        return batch
      self.epoch += 1
      self.batches = iter(self._iterator(self.trainer.args.batch_size, self.epoch))
    raise RuntimeError("JoeyNMT's training iterator yields no batches.")

  def train(self, steps: int) -> dict:
    """`steps` optimizer steps, each as `train_and_validate` makes it (one batch, no
    accumulation): their seconds and real and padded target tokens."""
    trainer, tokens, padded = self.trainer, 0, 0
    start = time.perf_counter()
    for _ in range(steps):
      batch = self._next_batch()
      trainer._train_step(batch)  # Forward, loss and backward (JoeyNMT's own step).
      if trainer.clip_grad_fun is not None:
        trainer.clip_grad_fun(parameters=trainer.model.parameters())
      trainer.optimizer.step()
      if trainer.scheduler_step_at == "step":
        trainer.scheduler.step(trainer.stats.steps)
      trainer.model.zero_grad()
      trainer.stats.steps += 1
      tokens += batch.ntokens
      padded += batch.trg.numel()
    return {"seconds": time.perf_counter() - start, "steps": steps, "tokens": tokens,
            "padded_tokens": padded}

  def _decode_batches(self) -> list:
    """The decoding batches: the test sentences in the groups of the setup (the project's,
    so that both sides search the same sentences together), each sorted by length as
    `prediction.predict` sorts it (`batch.indices` keeps each row's line)."""
    data, model, batches = self.test_data, self.search_model, []
    for indices in self.setup["decode"]["groups"]:
      batch = data.collate_fn([data[i] for i in indices], pad_index=model.pad_index,
                              eos_index=model.eos_index, device=self.torch.device("cpu"))
      batch.sort_by_src_length()
      batches.append(batch)
    return batches

  def decode(self, limit: int = 0) -> dict:
    """Beam search over the decoding batches (the first `limit`; 0: all), each capped at the
    setup's length for it: seconds, sentences (JoeyNMT's batches hold no filler rows), and
    output tokens up to EOS."""
    from joeynmt.search import search

    d, model = self.setup["decode"], self.search_model
    pairs = list(zip(self.decode_batches, d["caps"], strict=True))[:limit or None]
    sentences = tokens = 0
    start = time.perf_counter()
    for batch, cap in pairs:
      # The rest at JoeyNMT's defaults, as its `testing` section leaves them: no scores or
      # attention returned, no repetition penalty.
      output, _, _ = search(model=model, batch=batch, max_output_length=cap,
                            beam_size=d["beam"], beam_alpha=d["alpha"], n_best=1)
      sentences += batch.nseqs
      for row in output.tolist():
        end = row.index(model.eos_index) + 1 if model.eos_index in row else len(row)
        tokens += sum(1 for i in row[:end] if i != model.pad_index)
    return {"seconds": time.perf_counter() - start, "sentences": sentences, "rows": sentences,
            "output_tokens": tokens}


def _interrupt_once(signum, frame) -> None:
  """SIGINT's handler: the first raises KeyboardInterrupt, on which JoeyNMT's trainer saves a
  checkpoint; later ones are ignored, so that nothing interrupts that save."""
  del signum, frame
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  raise KeyboardInterrupt


def watch_parent(every: float = 5.0) -> None:
  """Interrupts this process once its parent has gone (killed outright), as Ctrl-C would: no
  training is left behind, and JoeyNMT saves its checkpoint first."""
  parent = os.getppid()

  def watch() -> None:
    while os.getppid() == parent:
      time.sleep(every)
    os.kill(os.getpid(), signal.SIGINT)

  threading.Thread(target=watch, daemon=True).start()


class Budget(Joey):
  """JoeyNMT's own training at a recipe's full budget (`train_to_end`: the loop of `joeynmt
  train`), resumed from its latest checkpoint, and the translation of the test split from its
  best checkpoint by validation BLEU (`translate`)."""

  def start(self) -> dict:
    """Builds the data and model as `joeynmt train` does, and the token budget: the setup's
    (a resumed run's), or the one whose batches hold the setup's real target tokens."""
    begin = time.perf_counter()
    signal.signal(signal.SIGINT, _interrupt_once)
    watch_parent()
    import torch

    torch.set_num_threads(self.setup["threads"])
    import joeynmt
    from joeynmt.config import parse_global_args
    from joeynmt.helpers import set_seed
    from joeynmt.prediction import prepare

    self.torch, cfg = torch, copy.deepcopy(self.setup["config"])
    set_seed(cfg["random_seed"])  # `prepare` seeds after building the model: its weights too.
    args = parse_global_args(cfg, rank=0, mode="train")
    self.model, self.train_data, self.dev_data, self.test_data = prepare(args, rank=0,
                                                                         mode="train")
    batch_size = (self.setup.get("batch_size")
                  or self._match_tokens(self.setup["target_tokens_per_batch"])[0])
    self.args = args._replace(train=args.train._replace(batch_size=batch_size))
    return {
        "joeynmt": joeynmt.__version__, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "params": sum(p.numel() for p in
                                                          self.model.parameters()),
        "batch_size": batch_size,
        "target_tokens_per_batch": round(self._real_tokens_per_batch(batch_size), 1),
        "steps": self._steps_done(), "setup_s": round(time.perf_counter() - begin, 1),
    }

  def _checkpoint(self, name: str) -> dict | None:
    from joeynmt.helpers import load_checkpoint

    path = Path(self.args.model_dir) / name
    return load_checkpoint(path, map_location=self.torch.device("cpu")) if path.is_file() else None

  def _steps_done(self) -> int:
    """The steps of JoeyNMT's latest checkpoint (0: none)."""
    latest = self._checkpoint("latest.ckpt")
    return latest["stats_state"]["steps"] if latest else 0

  def train_to_end(self) -> dict:
    """Trains to the config's `updates` as `joeynmt train` does (validating, and saving a
    checkpoint at each validation and at the end), from the latest checkpoint where there is
    one (`load_model`, every reset off: the weights, optimizer, scheduler, statistics and
    sampler state). A finished training is not trained again."""
    from joeynmt.config import set_validation_args
    from joeynmt.training import TrainManager

    args, steps, before = self.args, self.args.train.max_updates, self._steps_done()
    if before >= steps:
      return {"steps": before, "trained": 0, "seconds": 0.0}
    if before:
      latest = Path(args.model_dir) / "latest.ckpt"
      args = args._replace(train=args.train._replace(load_model=latest))
    start = time.perf_counter()
    trainer = TrainManager(
        model=self.model, model_dir=args.model_dir, device=args.device, n_gpu=args.n_gpu,
        rank=0, num_workers=args.num_workers, autocast=args.autocast, seed=args.seed,
        train_args=args.train, dev_args=set_validation_args(args.test))
    trainer.train_and_validate(train_data=self.train_data, valid_data=self.dev_data)
    done = trainer.stats.steps
    if done < steps:  # It caught an interrupt, and saved a checkpoint.
      raise RuntimeError(f"JoeyNMT's training stopped at step {done} of {steps}, its checkpoint"
                         " saved; the same command resumes it")
    return {"steps": done, "trained": done - before,
            "seconds": round(time.perf_counter() - start, 1)}

  def translate(self) -> dict:
    """The test sentences, in the setup's groups, each searched to its group's cap from the
    best checkpoint by validation BLEU: their detokenized hypotheses, in the test file's
    order, as `prediction.predict` makes them."""
    from joeynmt.search import search

    best = self._checkpoint("best.ckpt")
    if best is None:
      raise RuntimeError(f"{self.args.model_dir} has no best.ckpt: no validation has run")
    self.model.load_state_dict(best["model_state"])
    self.model.eval()
    self.search_model, d, data = self.model, self.setup["decode"], self.test_data
    hypotheses, start = [""] * len(data), time.perf_counter()
    for batch, cap in zip(self._decode_batches(), d["caps"], strict=True):
      output, _, _ = search(model=self.model, batch=batch, max_output_length=cap,
                            beam_size=d["beam"], beam_alpha=d["alpha"], n_best=1)
      pieces = self.model.trg_vocab.arrays_to_sentences(arrays=output, cut_at_eos=True)
      for line, sentence in zip(batch.indices.tolist(), pieces, strict=True):
        hypotheses[line] = data.tokenizer[data.trg_lang].post_process(
            sentence, generate_unk=True, cut_at_sep=True)
    stats = best["stats_state"]
    return {"hypotheses": hypotheses, "seconds": round(time.perf_counter() - start, 1),
            "best_step": stats["steps"], "best_val_bleu": stats["best_ckpt_score"]}


def main(argv: list[str]) -> None:
  # Run by path, Python puts this folder first on sys.path, where a module of ours could shadow
  # one that torch imports (the parent starts it with -I, which leaves it out; this is for a
  # run by hand).
  here = os.path.dirname(os.path.abspath(__file__))
  sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
  replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # Whatever else prints goes to stderr.
  sys.stdout = sys.stderr
  with open(argv[1], encoding="utf-8") as f:
    setup = json.load(f)
  if setup.get("budget"):
    joey = Budget(setup)
    handlers = {"start": joey.start, "train_to_end": joey.train_to_end,
                "translate": joey.translate}
  else:
    joey = Joey(setup)
    handlers = {"start": joey.start, "train": joey.train, "decode": joey.decode}
  try:
    serve(handlers, sys.stdin, replies)
  except BrokenPipeError:  # The parent has gone (`watch_parent`): no one reads the reply.
    os._exit(1)


if __name__ == "__main__":
  main(sys.argv)
