"""The JoeyNMT comparison, benchmarks/joeynmt (a reproduction outside the package): JoeyNMT's
config written from ours, its parameters counted against ours, the worker's protocol and the
errors of a missing virtualenv, all without JoeyNMT; and --full_budget's config for each recipe.
The tests that run JoeyNMT itself need its virtualenv ($JOEYNMT_PYTHON, made by the command in
benchmarks/joeynmt/anchor.py) and skip without it."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest
from flax import nnx

from benchmarks.joeynmt import anchor as anchor_joeynmt
from benchmarks.joeynmt import budget as joeynmt_budget
from benchmarks.joeynmt import files as joeynmt_files
from benchmarks.joeynmt import worker as joeynmt_worker
from benchmarks.joeynmt.spec import joeynmt_model, joeynmt_parameters, unmatched
from seq2seq.data import corpus, tokenizer
from seq2seq.errors import UserError
from seq2seq.models import build_model
from tests.helpers import ENV, FAST, ROOT, fast_tiny_config, imported_modules, load_config

COMMAND = [sys.executable, str(ROOT / "benchmarks" / "joeynmt" / "side_by_side.py")]

JOEYNMT_PYTHON = os.environ.get("JOEYNMT_PYTHON", "")
JOEYNMT_PYTHON = JOEYNMT_PYTHON and os.path.abspath(JOEYNMT_PYTHON)  # Tests run in other folders.
needs_joeynmt = pytest.mark.skipif(
    not JOEYNMT_PYTHON, reason="needs JoeyNMT's virtualenv: set $JOEYNMT_PYTHON to its python")


def _ours(config, vocab: int) -> int:
  model = nnx.eval_shape(lambda: build_model(config, vocab))
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _variant(name: str, **model):
  config = load_config(name)
  for field, value in model.items():
    config.model[field] = value
  return config


# Our recipes and variants of them that JoeyNMT builds too.
VARIANTS = {
    "transformer": _variant("multi30k_transformer_sinusoidal"),
    "transformer, post-LN, untied": _variant("multi30k_transformer_sinusoidal", pre_ln=False,
                                             share_embeddings=False),
    "transformer, attention dropout": _variant("multi30k_transformer_sinusoidal",
                                               attention_dropout_rate=0.1),
    "rnn": _variant("multi30k_rnn"),
    "rnn, gru, one direction, no bridge": _variant("multi30k_rnn", rnn_cell="gru",
                                                   bidirectional=False, bridge=False),
    "rnn, 2+2 layers, no input feeding, untied": _variant(
        "multi30k_rnn", num_encoder_layers=2, num_decoder_layers=2, input_feeding=False,
        share_embeddings=False),
}


def test_the_recipes_map_onto_joeynmt_layer_for_layer():
  transformer = joeynmt_model(VARIANTS["transformer"].model)
  assert transformer["tied_embeddings"] and transformer["tied_softmax"]
  for side in ("encoder", "decoder"):
    assert {k: transformer[side][k] for k in ("type", "num_layers", "num_heads", "hidden_size",
                                              "ff_size", "dropout", "layer_norm")} == {
        "type": "transformer", "num_layers": 4, "num_heads": 4, "hidden_size": 128,
        "ff_size": 512, "dropout": 0.1, "layer_norm": "pre"}
    assert transformer[side]["embeddings"] == {"embedding_dim": 128, "scale": True,
                                               "dropout": 0.1}
  rnn = joeynmt_model(VARIANTS["rnn"].model)
  assert rnn["encoder"] | {"embeddings": None} == {
      "type": "recurrent", "rnn_type": "lstm", "hidden_size": 256, "num_layers": 1,
      "bidirectional": True, "dropout": 0.3, "embeddings": None}
  assert {k: rnn["decoder"][k] for k in ("attention", "input_feeding", "init_hidden",
                                         "hidden_dropout")} == {
      "attention": "luong", "input_feeding": True, "init_hidden": "bridge",
      "hidden_dropout": 0.3}


# JoeyNMT's own counts of VARIANTS' models (joeynmt.model.build_model, summed over its torch
# parameters), recorded from JoeyNMT 2.3.0 by test_joeynmt_builds_the_parameters_we_count's
# script: what our count of its parameters is checked against where JoeyNMT is not installed.
RECORDED = json.loads((Path(__file__).parent / "joeynmt_parameters.json").read_text())


@pytest.mark.parametrize("vocab", ["700", "5000"])
def test_our_count_of_joeynmts_parameters_is_joeynmts_own(vocab):
  assert {name: joeynmt_parameters(joeynmt_model(c.model), int(vocab))
          for name, c in VARIANTS.items()} == RECORDED["counts"][vocab]


def test_the_recipes_parameters_on_both_sides():
  """The figures the report gives: JoeyNMT's Transformer has 6,144 attention biases more; its
  RNN lacks our unused context_proj (131,328) and has torch's second LSTM biases (3,072)."""
  joeynmt = RECORDED["counts"]["5000"]
  assert _ours(VARIANTS["transformer"], 5000) == 2_485_760 == joeynmt["transformer"] - 6_144
  assert _ours(VARIANTS["rnn"], 5000) == 3_708_672 == joeynmt["rnn"] + 131_328 - 3_072
  assert [n for _, n in unmatched(VARIANTS["rnn"].model, 5000)] == [3072, -131_328, 0, 0]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_what_differs_accounts_for_every_parameter(name):
  """Ours plus the parameters each `unmatched` item adds on JoeyNMT's side is the count of
  JoeyNMT's model: nothing differs that the record does not list."""
  config, vocab = VARIANTS[name], 700
  added = sum(n for _, n in unmatched(config.model, vocab))
  assert _ours(config, vocab) + added == joeynmt_parameters(joeynmt_model(config.model), vocab)


@pytest.mark.parametrize("model, expected", [
    (dict(positions="rope"), "JoeyNMT adds sinusoidal positions only, not"
     " config.model.positions='rope'"),
    (dict(attention="linear"), "scaled_dot attention only, not config.model.attention='linear'"),
    (dict(num_kv_heads=1), "one key/value head per query head"),
    (dict(family="rnn", attention="concat"), "config.model.attention='concat' has no"
     " counterpart"),
    (dict(family="rnn", attention="general", emb_dim=64), "emb_dim equals rnn_hidden_dim"),
    (dict(family="rnn", attention="general", reverse_source=True), "backwards"),
])
def test_what_joeynmt_cannot_build_is_refused_in_one_line(model, expected):
  config = load_config("multi30k_transformer_sinusoidal")
  config.model.rnn_hidden_dim = config.model.emb_dim
  for field, value in model.items():
    config.model[field] = value
  with pytest.raises(UserError, match="configs/multi30k_rnn.py") as error:
    joeynmt_model(config.model)
  assert expected in str(error.value) and "\n" not in str(error.value)


def test_joeynmt_config_reads_our_files_with_our_special_pieces(tmp_path):
  config = VARIANTS["rnn"]
  cfg = joeynmt_files.joeynmt_config(config, spm_model=tmp_path / "spm.model",
                                      vocab_file=tmp_path / "vocab.txt", data_dir=tmp_path,
                                      model_dir=tmp_path / "model")
  data = cfg["data"]
  assert (data["train"], data["test"]) == (str(tmp_path / "train"), str(tmp_path / "test"))
  assert data["src"]["lang"] == "en" and data["trg"]["lang"] == "de"
  # Ours keeps pairs of at most max_len subwords with BOS/EOS; JoeyNMT counts them without.
  assert data["src"]["max_length"] == config.data.max_len - 1
  assert data["src"]["tokenizer_cfg"] == {"model_file": str(tmp_path / "spm.model")}
  # JoeyNMT's ids: UNK 0 and PAD 1 (ours the other way round), BOS 2 and EOS 3 as ours.
  assert data["special_symbols"] == {"unk_token": "<unk>", "unk_id": 0, "pad_token": "<pad>",
                                     "pad_id": 1, "bos_token": "<s>", "bos_id": 2,
                                     "eos_token": "</s>", "eos_id": 3}
  assert (cfg["training"]["label_smoothing"], cfg["training"]["clip_grad_norm"]) == (0.1, 1.0)
  assert cfg["model"] == joeynmt_model(config.model)
  json.dumps(cfg)  # The worker reads it as JSON.


def test_the_vocabulary_file_lists_our_pieces_in_id_order(tmp_path):
  train = corpus.read_split(fast_tiny_config().data, "train")
  tok = tokenizer.train_tokenizer(train.src[:300] + train.tgt[:300], tmp_path / "spm", 200)
  count = joeynmt_files.write_vocabulary(tmp_path / "spm.model", tmp_path / "vocab.txt")
  pieces = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
  assert count == len(pieces) == tok.vocab_size
  assert pieces[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
  assert pieces[10] == tok.pieces([10])[0]


def test_the_corpus_files_keep_one_sentence_a_line(tmp_path):
  train = corpus.ParallelText(["a b", "", "c\u2028d"], ["x", "y", "z"])
  assert joeynmt_files.write_corpus(train, ["t\x0cu"], tmp_path, "en", "de") == 2
  assert (tmp_path / "train.en").read_text(encoding="utf-8") == "a b\nc d\n"
  assert (tmp_path / "train.de").read_text(encoding="utf-8") == "x\nz\n"
  assert (tmp_path / "test.en").read_text(encoding="utf-8") == "t u\n"
  assert not (tmp_path / "dev.en").exists()
  dev = corpus.ParallelText(["d", "e", " "], ["v", "", "w"])  # JoeyNMT refuses empty lines.
  assert joeynmt_files.write_corpus(train, ["t"], tmp_path, "en", "de", dev=dev) == 2
  assert (tmp_path / "dev.en").read_text(encoding="utf-8") == "d\n"
  assert (tmp_path / "dev.de").read_text(encoding="utf-8") == "v\n"


def test_replies_are_parsed_and_failures_named_in_one_line(tmp_path):
  assert anchor_joeynmt.parse_reply('{"seconds": 1.5}\n', "train") == {"seconds": 1.5}
  with pytest.raises(UserError, match=r"failed at `train`: ValueError: bad\.$"):
    anchor_joeynmt.parse_reply('{"error": "ValueError: bad"}\n', "train")
  log = "Traceback (most recent call last):\n  ...\nRuntimeError: killed\n"
  with pytest.raises(UserError, match=r"failed at `decode`: RuntimeError: killed \(its log:"):
    anchor_joeynmt.parse_reply("", "decode", log, tmp_path / "worker.log")
  with pytest.raises(UserError, match="cannot start .*No module named 'torch'.*pip install"):
    anchor_joeynmt.parse_reply('{"error": "ModuleNotFoundError: No module named \'torch\'"}',
                               "start")


def test_the_worker_imports_nothing_of_ours():
  """It runs in JoeyNMT's virtualenv, which has neither seq2seq nor benchmarks/."""
  worker = Path(joeynmt_worker.__file__)
  assert imported_modules(worker, "seq2seq") | imported_modules(worker, "benchmarks") == set()
  assert "torch" in imported_modules(worker, "torch")


def test_the_worker_answers_each_request_and_survives_errors():
  def fail():
    raise ValueError("no\nsecond line")

  requests = io.StringIO('{"command": "add", "arguments": {"a": 1, "b": 2}}\n\n'
                         '{"command": "fail"}\n{"command": "quit"}\n{"command": "add"}\n')
  replies = io.StringIO()
  joeynmt_worker.serve({"add": lambda a, b: {"sum": a + b}, "fail": fail}, requests, replies)
  answers = [json.loads(line) for line in replies.getvalue().splitlines()]
  assert [{k: v for k, v in a.items() if k != "idle_cpu_s"} for a in answers] == [
      {"sum": 3}, {"error": "ValueError: no"}, {"quit": True}]
  assert all(0 <= a["idle_cpu_s"] < 1 for a in answers)


def test_a_python_without_joeynmt_is_refused_naming_the_setup(tmp_path, monkeypatch):
  with pytest.raises(UserError, match="The JoeyNMT comparison needs JoeyNMT 2.3.0 in a"
                     " virtualenv of its own"):
    anchor_joeynmt.check_python("")
  with pytest.raises(UserError, match="is not an executable file; make JoeyNMT's virtualenv"):
    anchor_joeynmt.check_python(str(tmp_path / "missing" / "python"))
  with pytest.raises(UserError, match=r"cannot import JoeyNMT \(ModuleNotFoundError: No module"
                     r" named '(sentencepiece|torch|joeynmt)'\); make JoeyNMT's virtualenv"):
    anchor_joeynmt.check_python(sys.executable)  # This Python has no torch.
  monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
  worker = anchor_joeynmt.Worker(sys.executable, {"threads": 1}, tmp_path)
  try:
    with pytest.raises(UserError) as error:
      worker.request("start")  # This Python has no torch.
  finally:
    worker.close()
  assert str(error.value).startswith("JoeyNMT's worker cannot start (ModuleNotFoundError: No"
                                     " module named 'torch'); make JoeyNMT's virtualenv with")
  assert anchor_joeynmt.SETUP_COMMAND in str(error.value)
  assert worker.process.returncode == 0


def test_the_command_without_a_virtualenv_says_how_to_make_one():
  env = {k: v for k, v in ENV.items() if k not in ("JOEYNMT_PYTHON", "PYTHONPATH")}
  result = subprocess.run(COMMAND, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
      f"error: The JoeyNMT comparison needs JoeyNMT 2.3.0 in a virtualenv of its own; make"
      f" JoeyNMT's virtualenv with `{anchor_joeynmt.SETUP_COMMAND}` and pass"
      " --joeynmt_python=.anchors/joeynmt/bin/python (or set $JOEYNMT_PYTHON)."]


def test_the_packages_command_points_at_the_joeynmt_comparison():
  """seq2seq-side-by-side times flax's examples/wmt only; --anchor=joeynmt, with the flags it
  once took, names the command in benchmarks/ in one line."""
  result = subprocess.run([sys.executable, "-c", "from seq2seq.commands import main;"
                           " main.side_by_side()", "--joeynmt_python=python", "--anchor=joeynmt",
                           "--steps=2"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
      "error: flag --anchor=joeynmt: JoeyNMT's comparison is a reproduction outside the package:"
      " from a checkout, run `python benchmarks/joeynmt/side_by_side.py --joeynmt_python=...`"
      " (benchmarks/joeynmt/README.md)."]


def test_the_summary_is_of_medians_ours_over_joeynmts():
  def train(seconds):
    return [{"seconds": s, "tokens": 100, "padded_tokens": 200, "idle_cpu_s": 0.01,
             "other_cpu_s": 0.02} for s in seconds]

  def decode(seconds):
    return [{"seconds": s, "sentences": 10, "rows": 16, "output_tokens": 40, "idle_cpu_s": 0.01,
             "other_cpu_s": 0.02} for s in seconds]

  record = anchor_joeynmt.summary({"project": train([1, 2, 9]), "anchor": train([4, 4, 1])},
                                  {"project": decode([1, 1, 1]), "anchor": decode([2, 5, 2])})
  assert record["train_tgt_tok_s"] == {"project": 50.0, "anchor": 25.0}
  assert record["train_ratio"] == 2.0 and record["decode_ratio"] == 2.0
  assert record["train_target_padding"] == {"project": 0.5, "anchor": 0.5}
  assert record["idle_cpu_s"] == {"project": 0.12, "anchor": 0.06}


@needs_joeynmt
def test_joeynmt_builds_the_parameters_we_count(tmp_path):
  models = {name: joeynmt_model(c.model) for name, c in VARIANTS.items()}
  script = (
      "import json, sys\nfrom types import SimpleNamespace\n"
      "from joeynmt.model import build_model\nfrom joeynmt.vocabulary import Vocabulary\n"
      "s = SimpleNamespace(unk_token='<unk>', pad_token='<pad>', bos_token='<s>',"
      " eos_token='</s>', unk_id=0, pad_id=1, bos_id=2, eos_id=3, sep_token=None, sep_id=None,"
      " lang_tags=[])\n"
      "v = Vocabulary([f't{i}' for i in range(696)], s)\n"
      "print(json.dumps({n: sum(p.numel() for p in build_model(m, v, v).parameters())"
      " for n, m in json.load(sys.stdin).items()}))\n")
  result = subprocess.run([JOEYNMT_PYTHON, "-I", "-c", script], input=json.dumps(models),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  assert json.loads(result.stdout) == {n: joeynmt_parameters(m, 700) for n, m in models.items()}
  assert json.loads(result.stdout) == RECORDED["counts"]["700"]  # The record still holds.


@needs_joeynmt
@pytest.mark.slow
def test_a_tiny_comparison_runs_both_sides_end_to_end():
  config = fast_tiny_config()
  record = anchor_joeynmt.compare(config, anchor_joeynmt.check_python(JOEYNMT_PYTHON), rounds=1,
                                  steps=2, beam=2, sentences=4, name="tiny")
  assert record["params"]["anchor"] == record["params"]["anchor_expected"]
  assert record["params"]["project"] + sum(u["params"] for u in record["unmatched"]) == (
      record["params"]["anchor"])
  assert record["threads"]["project"] == record["threads"]["anchor"]
  assert record["decode_sentences"] == 4 and record["train_ratio"] > 0
  assert record["decode_ratio"] > 0
  print(json.dumps(record))
  tokens = record["target_tokens_per_batch"]
  assert abs(tokens["anchor"] / tokens["project"] - 1) < 0.1


# --- --full_budget ------------------------------------------------------------------------------

# Per recipe: steps, peak rate, warmup, validation every, JoeyNMT's logging every (it must divide
# the validation's), dropout, and the real target tokens of our batches (an epoch's mean) that
# JoeyNMT's token budget is set to hold.
RECIPES = {
    "multi30k_transformer_sinusoidal": (4000, 2e-3, 400, 1000, 50, 0.1, 3808.3),
    "multi30k_rnn": (3400, 2e-3, 300, 850, 50, 0.3, 3177.6),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_full_budget_gives_joeynmt_each_recipes_schedule(tmp_path, name):
  steps, rate, warmup, every, logging, dropout, tokens = RECIPES[name]
  config = load_config(name)
  test_src = corpus.read_split(config.data, "test").src[:5]
  setup = joeynmt_budget.prepare_files(config, tmp_path, test_src)
  training = setup["config"]["training"]
  assert {k: training[k] for k in (
      "updates", "learning_rate", "learning_rate_warmup", "scheduling", "learning_rate_min",
      "validation_freq", "logging_freq", "optimizer", "adam_betas", "weight_decay",
      "clip_grad_norm", "label_smoothing", "normalization", "batch_type", "keep_best_ckpts",
      "early_stopping_metric", "shuffle")} == {
      "updates": steps, "learning_rate": rate, "learning_rate_warmup": warmup,
      "scheduling": "warmupinversesquareroot", "learning_rate_min": 0.0,
      "validation_freq": every, "logging_freq": logging, "optimizer": "adam",
      "adam_betas": [0.9, 0.98], "weight_decay": 0.0, "clip_grad_norm": 1.0,
      "label_smoothing": 0.1, "normalization": "tokens", "batch_type": "token",
      "keep_best_ckpts": -1, "early_stopping_metric": "bleu", "shuffle": True}
  assert setup["config"]["random_seed"] == 0
  assert setup["config"]["model"]["encoder"]["dropout"] == dropout
  assert round(setup["target_tokens_per_batch"], 1) == tokens
  joey = tmp_path / "joeynmt"
  assert setup["config"]["data"]["dev"] == str(joey / "dev")
  assert len((joey / "dev.en").read_text(encoding="utf-8").splitlines()) == 1014  # val.
  # JoeyNMT's test file holds the sentences in its decoding groups' order, one run each.
  lines = (joey / "test.en").read_text(encoding="utf-8").splitlines()
  assert lines == [test_src[i] for i in setup["order"]]
  assert sorted(setup["order"]) == list(range(5))
  assert [i for group in setup["decode"]["groups"] for i in group] == list(range(5))
  json.dumps(setup)  # The worker reads it as JSON.


def test_what_the_full_budget_cannot_match_names_the_recipes_figures():
  transformer = joeynmt_budget.unmatched_training(load_config("multi30k_transformer_sinusoidal"))
  rnn = joeynmt_budget.unmatched_training(load_config("multi30k_rnn"))
  # After the same warmup, JoeyNMT's rate falls as 1/sqrt(step): not to 0 at the last step.
  assert "0.002 * sqrt(400 / step), 0.00063 at step 4000" in transformer[0]
  assert "0.002 * sqrt(300 / step), 0.00059 at step 3400" in rnn[0]
  assert "ours 1e-09" in transformer[2]  # Adam's epsilon.
  assert transformer[4].endswith("ours packed rows") and rnn[4].endswith("ours length buckets")
  assert "every 1000 steps" in transformer[5] and "every 850 steps" in rnn[5]
  assert not any("does not validate after the last step" in note for note in transformer + rnn)
  assert "xavier_uniform" in transformer[-1] and "fairseq" not in rnn[-1]  # Initial weights.
  tiny = fast_tiny_config()
  tiny.train.num_steps, tiny.eval.every_steps = 5, 2
  assert any("does not validate after the last step (5)" in note
             for note in joeynmt_budget.unmatched_training(tiny))


def test_a_workdir_of_another_recipe_is_refused(tmp_path):
  config = load_config("multi30k_transformer_sinusoidal")
  other = json.loads(config.to_json_best_effort())
  other["train"]["num_steps"] = 10
  (tmp_path / joeynmt_budget.PLAN).write_text(json.dumps({"recipe": other}))
  with pytest.raises(UserError, match=r"holds JoeyNMT's run of another recipe \(it differs in"
                     r" train\.num_steps\); pass its config again, or another --workdir\."):
    joeynmt_budget.run(config, tmp_path / "python", tmp_path, beam=4, name="x", score=None)


def test_config_and_workdir_go_with_full_budget():
  result = subprocess.run([*COMMAND, "--config=configs/multi30k_transformer_sinusoidal.py"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
      "error: --config and --workdir go with --full_budget, which needs both: pass"
      " --full_budget --config=configs/multi30k_transformer_sinusoidal.py"
      " --workdir=runs/joeynmt/transformer."]


def _full_budget(workdir) -> list[str]:
  """The --full_budget command on a tiny recipe: 6 steps decaying linearly, validation every
  2, 8 test sentences with beam 2."""
  return [*COMMAND, "--full_budget", f"--config={ROOT / 'configs' / 'tiny.py'}", *FAST,
          "--config.train.num_steps=6", "--config.train.schedule=linear",
          "--config.eval.every_steps=2",
          f"--joeynmt_python={JOEYNMT_PYTHON}", f"--workdir={workdir}", "--beam=2",
          "--sentences=8"]


@needs_joeynmt
@pytest.mark.slow
def test_the_full_budget_resumes_after_a_signal_and_trains_a_finished_run_no_further(tmp_path):
  """Stopped once JoeyNMT has a checkpoint, the command resumes from it; run again once
  finished, it trains nothing and scores the same translation."""
  env = dict(ENV, OMP_WAIT_POLICY="PASSIVE")  # torch's threads on a busy machine (the suite).
  workdir = tmp_path / "joeynmt"
  latest = workdir / "joeynmt" / "model" / "latest.ckpt"
  process = subprocess.Popen(_full_budget(workdir), cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 600
  while not latest.exists() and process.poll() is None and time.monotonic() < deadline:
    time.sleep(0.1)
  process.terminate()
  _, stderr = process.communicate(timeout=600)
  assert process.returncode == 130, stderr[-3000:]
  assert stderr.splitlines()[-1] == (f"stopped by SIGTERM; {joeynmt_budget.INTERRUPTED}: the"
                                     " same command starts again.")
  runs = [subprocess.run(_full_budget(workdir), cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900) for _ in range(2)]
  assert all(r.returncode == 0 for r in runs), runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
  resumed, again = (json.loads(r.stdout.splitlines()[-1]) for r in runs)
  print(json.dumps(resumed), (workdir / joeynmt_budget.SESSIONS).read_text())
  assert resumed["steps"] == again["steps"] == 6 and resumed["joeynmt"] == "2.3.0"
  assert 0 <= resumed["trained_steps_now"] <= 4  # From its checkpoint at step 2 or later.
  assert again["trained_steps_now"] == 0
  assert isinstance(resumed["bleu"], float) and resumed["sentences"] == 8
  assert resumed["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
  assert {k: again[k] for k in ("bleu", "bleu_lowercase", "chrf", "checkpoint_step")} == {
      k: resumed[k] for k in ("bleu", "bleu_lowercase", "chrf", "checkpoint_step")}
  assert json.loads((workdir / "result.json").read_text()) == again
  assert len((workdir / "test.hyp").read_text(encoding="utf-8").splitlines()) == 8
  log = (workdir / "joeynmt" / "worker.log").read_text(encoding="utf-8")
  assert "Loading model from" in log  # JoeyNMT's own resumption (load_model).
  plan = json.loads((workdir / "plan.json").read_text())
  assert plan["recipe"]["train"]["num_steps"] == 6 and plan["batch_size"] == again["batch_size"]
  assert "0 at step 6;" in plan["unmatched"]["training"][0]
