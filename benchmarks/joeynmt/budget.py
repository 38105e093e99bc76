"""JoeyNMT 2.3.0 trained at a recipe's full budget and scored on its test split, for the BLEU
each side reaches (benchmarks/joeynmt/side_by_side.py --full_budget):

  python benchmarks/joeynmt/side_by_side.py --full_budget \
      --config=configs/multi30k_transformer_sinusoidal.py \
      --joeynmt_python=.anchors/joeynmt/bin/python \
      --workdir=runs/joeynmt/transformer

In --workdir: `run/` holds our SentencePiece model (trained as a run trains it, or
config.data.vocab_from's); `joeynmt/` JoeyNMT's files (the corpus with the validation split as
`dev`, the vocabulary, `setup.json` with its config, `worker.log`) and its run, `joeynmt/model/`
(checkpoints, `validations.txt`); `plan.json` what was matched and what cannot be; and, once it
has translated, `test.hyp` and `result.json`, the JSON line it prints.

The recipe's schedule in JoeyNMT's config (`budget_config`): `updates` = train.num_steps; Adam
(AdamW where train.weight_decay is set, which decays apart from the gradient as ours does) with
train.adam_b1 and adam_b2, the weight decay, label smoothing, gradient-norm clipping at
train.clip_norm and the model's dropout; a linear warmup to train.learning_rate over
train.warmup_steps; validation (greedy, BLEU) every eval.every_steps on the same validation
pairs, its best checkpoint the one decoded; the real target tokens per batch of the timing
mode (`anchor`); the seed train.seed. The test split is then searched with beam --beam
(4) and eval.alpha, each sentence to the cap ours gives it (`anchor.decode_groups`),
and scored by sacreBLEU as ours is.

JoeyNMT's training resumes when the command runs again: `worker.Budget` gives its
TrainManager `load_model` = its latest checkpoint with every reset off (weights, optimizer,
scheduler, statistics, sampler state); a training at `updates` already is not trained again.
A signal to this command reaches JoeyNMT as Ctrl-C, on which it saves a checkpoint, and so
does this command's end if it is killed outright (the worker watches it); JoeyNMT killed too,
it resumes from its last validation's checkpoint. `train_wall_s` adds up the training sessions
that this command saw end (a killed one's seconds are lost). torch's threads wait passively
(OMP_WAIT_POLICY=PASSIVE unless set), so that another job on the machine does not stall them:
the wall time is reported, not compared.

What cannot match (`unmatched_training` writes the figures of each recipe into plan.json, with
the architecture's differences, `spec.unmatched`):
- The decay. Ours decays linearly (train.schedule="linear") to 0 at num_steps. JoeyNMT 2.3.0
  has no such scheduler (its `warmupexponentialdecay`, which could end near 0, fails to build:
  `build_scheduler` leaves out its optimizer), so it takes `warmupinversesquareroot`: the
  same warmup, then train.learning_rate * sqrt(warmup / step), 6.3e-4 at the Transformer's
  last step and 5.9e-4 at the RNN's, not 0. Its rate never stops training
  (`learning_rate_min` 0).
- The first update: JoeyNMT's scheduler sets the rate after each update, so its first takes
  train.learning_rate itself, ours 0. Adam's epsilon is torch's 1e-8 (no setting), ours
  train.adam_eps (1e-9).
- Label smoothing: JoeyNMT spreads it over the vocabulary but PAD and the gold piece, ours
  over every piece.
- Batches: JoeyNMT's token sampler fills each batch in random order up to its budget (the
  longer side plus one, times the sentences), set so that its batches hold our real target
  tokens on average over an epoch; ours are length buckets or packed rows (the Transformer
  recipe packs), so the spread of batch sizes and the padding differ.
- Checkpoints: JoeyNMT saves one at each validation and at the end, ours every
  checkpoint.every_steps (100). No checkpoint averaging: JoeyNMT's best by greedy validation
  BLEU is decoded, where our evaluation may choose `avg:3` or `avg:5` on validation.
- Validation: JoeyNMT's greedy search stops at 1.5 times the longest source of its batch,
  ours at eval.max_decode_len_a * length + b per sentence; JoeyNMT validates at multiples of
  eval.every_steps only, ours after the last step too.
- A resumed JoeyNMT run re-seeds its sampler at the start of the epoch it stopped in (over
  the state it saved), so it sees that epoch's first batches again; ours resumes at the step.
- Random draws (initial weights, dropout, batch order) come from torch's and JoeyNMT's
  generators seeded with train.seed: one seed each, not the same draws.
- Initial weights: JoeyNMT draws every matrix and embedding table from xavier_uniform, biases
  0 (an LSTM's forget gates 1); ours takes flax nnx's defaults, the Transformer's embeddings
  normal at std emb_dim ** -0.5 (fairseq's); both sides scale those by sqrt(emb_dim).
"""

import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import ml_collections
import numpy as np

from benchmarks.joeynmt import anchor
from benchmarks.joeynmt.files import joeynmt_config, write_corpus, write_vocabulary
from benchmarks.joeynmt.spec import initialization, joeynmt_model, unmatched
from seq2seq.data import corpus
from seq2seq.data.textio import write_atomically, write_lines
from seq2seq.errors import UserError
from seq2seq.runs import workdirs

log = logging.getLogger(__name__)
PLAN, RESULT, HYPOTHESES, SESSIONS = "plan.json", "result.json", "test.hyp", "sessions.jsonl"
INTERRUPTED = "JoeyNMT's training keeps its latest checkpoint (--workdir/joeynmt/model)"


def validation_every(config: ml_collections.ConfigDict) -> int:
  """JoeyNMT's `validation_freq`: eval.every_steps, or the whole budget where that is
  shorter (a best checkpoint needs a validation)."""
  return max(1, min(config.eval.every_steps, config.train.num_steps))


def budget_config(config: ml_collections.ConfigDict, *, spm_model: Path, vocab_file: Path,
                  data_dir: Path, model_dir: Path) -> dict:
  """JoeyNMT's config for training `config`'s recipe at its full budget: the timing mode's
  (`files.joeynmt_config`: data, model, optimizer), with the validation split and the
  recipe's schedule, validation and checkpoints. The token budget is set by the worker."""
  cfg = joeynmt_config(config, spm_model=spm_model, vocab_file=vocab_file, data_dir=data_dir,
                       model_dir=model_dir)
  cfg["name"] = "seq2seq-side-by-side --full_budget"
  cfg["data"]["dev"] = str(data_dir / "dev")
  every, t = validation_every(config), config.train
  cfg["training"] |= {
      "updates": t.num_steps, "learning_rate_warmup": max(t.warmup_steps, 1),
      "scheduling": "warmupinversesquareroot", "learning_rate_min": 0.0,
      "validation_freq": every, "logging_freq": math.gcd(t.log_every_steps, every),
      "early_stopping_metric": "bleu",
      "keep_best_ckpts": -1}  # Each validation saves one: the latest is the last validation's.
  cfg["testing"] |= {"eval_metrics": ["bleu"]}  # Validation's BLEU, by sacreBLEU as ours.
  return cfg


def unmatched_training(config: ml_collections.ConfigDict) -> list[str]:
  """What of `config`'s training JoeyNMT cannot do as ours does, with this recipe's figures."""
  t, e = config.train, config.eval
  every, warmup = validation_every(config), max(t.warmup_steps, 1)
  notes = []
  if t.schedule != "inverse_sqrt":
    end = t.learning_rate * min(t.num_steps / warmup, math.sqrt(warmup / t.num_steps))
    notes.append(f"learning rate after the warmup: ours decays ({t.schedule}) to 0 at step"
                 f" {t.num_steps}; JoeyNMT 2.3.0 has no such scheduler (warmupexponentialdecay"
                 f" fails to build), so warmupinversesquareroot: {t.learning_rate:.2g} *"
                 f" sqrt({warmup} / step), {end:.2g} at step {t.num_steps}")
  notes.append(f"the first update: JoeyNMT's at the peak rate {t.learning_rate} (its scheduler"
               " sets the rate after each update), ours at 0")
  if t.adam_eps != 1e-8:
    notes.append(f"Adam's epsilon: JoeyNMT's torch default 1e-8, ours {t.adam_eps}")
  if t.label_smoothing:
    notes.append("label smoothing: JoeyNMT spreads it over the vocabulary but PAD and the gold"
                 " piece, ours over every piece")
  notes.append("batches: JoeyNMT's token sampler in random order, its budget set to hold our"
               " real target tokens on average; ours "
               + ("packed rows" if config.data.pack else "length buckets"))
  notes.append(f"checkpoints: JoeyNMT's at each validation (every {every} steps) and at the"
               f" end, ours every {config.checkpoint.every_steps or every}; no averaging:"
               " JoeyNMT's best by validation BLEU is decoded")
  notes.append(f"validation: JoeyNMT's greedy search stops at 1.5 times the batch's longest"
               f" source, ours at {e.max_decode_len_a} * length + {e.max_decode_len_b}"
               + ("" if e.beam_size == 1 else f"; ours searches with beam {e.beam_size}"))
  if t.num_steps % every:
    notes.append(f"JoeyNMT does not validate after the last step ({t.num_steps}), ours does")
  if t.patience:
    notes.append(f"early stopping (train.patience={t.patience}): JoeyNMT trains on")
  if config.data.subword_sampling:
    notes.append("subword sampling: JoeyNMT segments with the best segmentation only")
  if t.dtype != "float32" or t.loss_terms:
    notes.append(f"JoeyNMT computes in float32 with the cross-entropy alone; ours in {t.dtype}"
                 + (f" with {t.loss_terms}" if t.loss_terms else ""))
  notes.append("a resumed JoeyNMT run replays the start of the epoch it stopped in; ours"
               " resumes at the step")
  notes.append(initialization(config.model))
  return notes


def _recipe(config: ml_collections.ConfigDict) -> dict:
  return json.loads(config.to_json_best_effort())


def _previous_plan(workdir: Path, config: ml_collections.ConfigDict) -> dict:
  """The plan of the run in `workdir` ({} for none); `UserError` if it is another recipe's."""
  path = workdir / PLAN
  if not path.is_file():
    return {}
  plan = workdirs.read_json(path, f"remove {workdir} to start over")
  if plan.get("recipe") != _recipe(config):
    changed = sorted(f"{section}.{key}" for section, fields in _recipe(config).items()
                     for key, value in fields.items()
                     if plan.get("recipe", {}).get(section, {}).get(key) != value)
    raise UserError(f"{workdir} holds JoeyNMT's run of another recipe (it differs in"
                    f" {', '.join(changed) or 'its fields'}); pass its config again, or"
                    " another --workdir.")
  return plan


def prepare_files(config: ml_collections.ConfigDict, workdir: Path, test_src: list[str]) -> dict:
  """Our vocabulary and tokens per batch (a trainer of the recipe in `workdir`/run, nothing
  compiled), and JoeyNMT's files in `workdir`/joeynmt: the worker's setup, less the threads,
  the token budget of a resumed run and the search; `order`: the sentence of `test_src` on
  each line of JoeyNMT's test file."""
  from seq2seq.training.trainer import Trainer  # Imports the models: not before the checks.

  trainer = Trainer(config, workdir / "run")
  src_ids = [np.asarray(ids, np.int32) for ids in trainer.tokenizer.encode_batch(test_src)]
  groups, caps = anchor.decode_groups(config, src_ids)
  joey = workdir / "joeynmt"
  (joey / "model").mkdir(parents=True, exist_ok=True)
  spm_model = workdir / "run" / workdirs.VOCAB
  write_vocabulary(spm_model, joey / "vocab.txt")
  # The test file holds the sentences in the groups' order: each group is a run of lines.
  order = [i for group in groups for i in group]
  write_corpus(corpus.read_split(config.data, "train"), [test_src[i] for i in order], joey,
               config.data.src_lang, config.data.tgt_lang, dev=trainer.val_text)
  lines = iter(range(len(order)))
  return {
      "budget": True, "order": order, "params": trainer.num_params,
      "target_tokens_per_batch": anchor.real_tokens_per_batch(trainer),
      "config": budget_config(config, spm_model=spm_model, vocab_file=joey / "vocab.txt",
                              data_dir=joey, model_dir=joey / "model"),
      "decode": {"groups": [[next(lines) for _ in group] for group in groups], "caps": caps},
  }


def _write_plan(workdir: Path, config: ml_collections.ConfigDict, name: str, setup: dict,
                joey: dict) -> None:
  vocab = len((workdir / "joeynmt" / "vocab.txt").read_text(encoding="utf-8").splitlines())
  joeynmt_cfg = json.loads(json.dumps(setup["config"]))
  joeynmt_cfg["training"]["batch_size"] = joey["batch_size"]  # The worker's, not the placeholder.
  write_atomically(workdir / PLAN, json.dumps({
      "anchor": "joeynmt", "config": name, "recipe": _recipe(config),
      "batch_size": joey["batch_size"],
      "target_tokens_per_batch": {"project": round(setup["target_tokens_per_batch"], 1),
                                  "anchor": joey["target_tokens_per_batch"]},
      "params": {"project": setup["params"], "anchor": joey["params"]},
      "unmatched": {"model": [{"what": what, "params": params}
                              for what, params in unmatched(config.model, vocab)],
                    "training": unmatched_training(config)},
      "joeynmt_config": joeynmt_cfg}, indent=2) + "\n")


def _train(worker: anchor.Worker, workdir: Path, before: int) -> tuple[dict, float]:
  """JoeyNMT's training to its end, each session's seconds appended to `SESSIONS` (an
  interrupted one's too): its reply, and the seconds of every session so far."""
  start, reply = time.perf_counter(), None
  try:
    reply = worker.request("train_to_end")
  finally:
    if reply is None or reply["trained"]:
      session = {"from": before, "to": reply and reply["steps"],
                 "seconds": round(time.perf_counter() - start, 1)}
      with open(workdir / SESSIONS, "a", encoding="utf-8") as f:
        f.write(json.dumps(session) + "\n")
  sessions = workdir / SESSIONS
  lines = sessions.read_text(encoding="utf-8").splitlines() if sessions.is_file() else []
  return reply, sum(json.loads(line)["seconds"] for line in lines if line.strip())


def _drive(worker: anchor.Worker, workdir: Path, config: ml_collections.ConfigDict,
           name: str, setup: dict) -> tuple[dict, dict, float, dict]:
  """JoeyNMT's start, training to the end and translation: their replies, and the seconds of
  every training session so far."""
  joey = worker.request("start")
  _write_plan(workdir, config, name, setup, joey)
  where = (workdir / "joeynmt" / "model", worker.log)
  if joey["steps"] >= config.train.num_steps:
    log.info("JoeyNMT's training in %s has ended (step %d); it translates (its log: %s).",
             where[0], joey["steps"], where[1])
  else:
    log.info("JoeyNMT trains %s from step %d to %d in %s (its log: %s).", name, joey["steps"],
             config.train.num_steps, *where)
  trained, train_s = _train(worker, workdir, joey["steps"])
  return joey, trained, train_s, worker.request("translate")


def run(config: ml_collections.ConfigDict, python: Path, workdir: Path, *, beam: int,
        name: str, score: Callable[[list[str], list[str]], dict], sentences: int = 0) -> dict:
  """Trains JoeyNMT on `config`'s recipe at its full budget in `workdir` (resumed there), and
  scores the translation of the test split (its first `sentences`; 0: all) from its best
  checkpoint with `score` (`evaluation.scores.scores`: hypotheses and references to
  sacreBLEU's scores and signatures). Returns the record, which `workdir`/result.json holds
  too."""
  joeynmt_model(config.model)  # What JoeyNMT cannot build stops here, before any work.
  begin = time.perf_counter()
  workdirs.check_no_tilde(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  test = corpus.read_split(config.data, "test")
  test = corpus.ParallelText(test.src[:sentences or None], test.tgt[:sentences or None])
  test_src = [s for s in test.src if s.strip()]
  env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
  with workdirs.WorkdirLock(workdir):
    plan = _previous_plan(workdir, config)
    setup = prepare_files(config, workdir, test_src)
    setup |= {"threads": len(os.sched_getaffinity(0)), "batch_size": plan.get("batch_size")}
    setup["decode"] |= {"beam": beam, "alpha": config.eval.alpha}
    worker = anchor.Worker(python, setup, workdir / "joeynmt", keep_log=True, env=env)
    try:
      joey, trained, train_s, translated = _drive(worker, workdir, config, name, setup)
    finally:
      worker.close()
  # Line k of JoeyNMT's test file is sentence order[k] of the non-empty ones.
  by_sentence = dict(zip(setup["order"], translated["hypotheses"], strict=True))
  sentence = iter(range(len(test_src)))
  hypotheses = [by_sentence[next(sentence)] if s.strip() else "" for s in test.src]
  record = {
      "anchor": "joeynmt", "mode": "full_budget", "config": name, "family": config.model.family,
      "joeynmt": joey["joeynmt"], "torch": joey["torch"], "threads": joey["threads"],
      "omp_wait_policy": env["OMP_WAIT_POLICY"],
      "steps": trained["steps"], "num_steps": config.train.num_steps,
      "trained_steps_now": trained["trained"], "checkpoint": "best",
      "checkpoint_step": translated["best_step"],
      "val_bleu_greedy": round(translated["best_val_bleu"], 2), "split": "test",
      "sentences": len(test.src), "beam": beam, "alpha": config.eval.alpha,
      **score(hypotheses, test.tgt),
      "train_wall_s": round(train_s, 1), "translate_s": translated["seconds"],
      "wall_s": round(time.perf_counter() - begin, 1), "batch_size": joey["batch_size"],
      "workdir": str(workdir),
  }
  write_lines(workdir / HYPOTHESES, hypotheses)
  write_atomically(workdir / RESULT, json.dumps(record) + "\n")
  return record
