"""Every user mistake ends in one line naming the problem and the fix, and changes nothing.

Each case runs a real entry point (the flag parser the scripts use, or the library
function a script calls) and checks the exact message the command prints after
`error: `, and that no file of an existing run was touched. A few cases also run
the scripts themselves, to see the single line and exit status 2.
"""

import functools
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from absl import flags as absl_flags

from seq2seq.commands import cli
from seq2seq.compare import comparison, evaluations, sweep
from seq2seq.data import corpus, textio, tokenizer
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation import evaluate, plots
from seq2seq.runs.workdirs import WorkdirLock
from seq2seq.training import loop
from tests.helpers import (
  ENV,
  ROOT,
  fast_tiny_config,
  metrics_copy,
  rescore_one_piece,
  small_run,
  snapshot,
)


@pytest.fixture(scope="module")
def foreign_vocab(tmp_path_factory):
  """A SentencePiece model trained on the run's text, but smaller: not the run's vocabulary."""
  c = fast_tiny_config()
  text = corpus.read_split(c.data, "train")
  prefix = tmp_path_factory.mktemp("foreign") / "spm"
  tokenizer.train_tokenizer(text.src + text.tgt, prefix, vocab_size=400, seed=1)
  return prefix.with_suffix(".model")


def plain_sentencepiece(tmp_path):
  """A SentencePiece model trained with SentencePiece's own special ids (no PAD, UNK at 0)."""
  import sentencepiece as spm
  text = tmp_path / "plain.txt"
  text.write_text("\n".join(corpus.read_split(fast_tiny_config().data, "train").src[:500]) + "\n")
  spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "plain"),
                                 vocab_size=100, minloglevel=2)
  return tmp_path / "plain.model"


IMAGE_FORMATS = ", ".join("." + f for f in sorted(
    plots.plt.figure().canvas.get_supported_filetypes()))
plots.plt.close("all")


# --- What a case runs: the function behind each command --------------------------------------


def flags(*args):
  """scripts/train.py's flag parsing (cli.parse_flags) of `args`."""
  train_flags(f"--config={ROOT / 'configs' / 'tiny.py'}", *args)


def train_flags(*args):
  """scripts/train.py's flags (--config, --workdir) parsed from `args` by cli.parse_flags."""
  values = absl_flags.FlagValues()
  cli.define_config_flag(values)
  absl_flags.DEFINE_string("workdir", None, "", flag_values=values)
  cli.parse_flags(["train.py", *args], values)


def config_file(tmp, source: str):
  """scripts/train.py's flag parsing of --config=<a file holding `source`>."""
  path = tmp / "bad_config.py"
  path.write_text(source)
  train_flags(f"--config={path}", f"--workdir={tmp / 'new'}")


def read_only(fn):
  """Runs `fn` as if every directory were on a read-only filesystem (os.access says so)."""
  with mock.patch("os.access", return_value=False):
    fn()


def while_locked(workdir, fn):
  """Runs `fn` while this test holds the workdir's lock, as another training would."""
  with WorkdirLock(workdir):
    fn()


def train_with(workdir, **fields):
  """scripts/train.py: train_and_evaluate of the tiny config with `section__field=value`."""
  c = fast_tiny_config()
  for name, value in fields.items():
    section, field = name.split("__")
    c[section][field] = value
  loop.train_and_evaluate(c, workdir)


def own_file(tmp, code: str) -> str:
  """A run's own Python file (config.train.extensions) holding `code`: its path."""
  (tmp / "mine.py").write_text(code, encoding="utf-8")
  return str(tmp / "mine.py")


def corpus_dir(tmp, files: dict[str, bytes]):
  """A local corpus directory holding `files` (name -> bytes), with valid val/test splits."""
  directory = tmp / "corpus"
  directory.mkdir()
  for split in ("val", "test"):
    for lang in ("en", "de"):
      (directory / f"{split}.{lang}").write_bytes(b"a b\nc d\n")
  for name, data in files.items():
    (directory / name).write_bytes(data)
  return str(directory)


def state(directory) -> tuple[dict, list[str]]:
  """What a failed command must leave as it was: every file (snapshot) and every path, so
  that an empty directory made counts too."""
  return snapshot(directory), sorted(str(p.relative_to(directory))
                                     for p in Path(directory).rglob("*"))


PREPARED = {}  # A directory a case made -> its state(): the command must not change it.


def prepared(directory):
  """`directory`, made for the case: the test checks that the command leaves it as it is."""
  PREPARED[directory] = state(directory)
  return directory


def copy_run(run, tmp, alter=lambda copy: None):
  """A copy of the trained run, altered by `alter(copy)` before the command runs."""
  copy = tmp / "copy"
  shutil.copytree(run, copy)
  alter(copy)
  return prepared(copy)


def edited_config(run, tmp, **model):
  def edit(copy):
    saved = json.loads((copy / "config.json").read_text())
    saved["model"].update(model)
    (copy / "config.json").write_text(json.dumps(saved))
  return copy_run(run, tmp, edit)


def edited_field(run, tmp, section, key, value):
  """A copy of the run whose config.json holds `value` for `section.key`, as edited by hand."""
  def edit(copy):
    saved = json.loads((copy / "config.json").read_text())
    saved[section][key] = value
    (copy / "config.json").write_text(json.dumps(saved))
  return copy_run(run, tmp, edit)


def linked(run, tmp):
  """A symbolic link to the run: the same run by another name."""
  (tmp / "link").symlink_to(run)
  return tmp / "link"


def drop_field(section, key, copy):
  """Removes `section.key` from a copied run's config.json, as a run saved before it had."""
  saved = json.loads((copy / "config.json").read_text())
  del saved[section][key]
  (copy / "config.json").write_text(json.dumps(saved))


def with_vocab(run, tmp, vocab):
  return copy_run(run, tmp, lambda copy: shutil.copy(vocab, copy / "vocab" / "spm.model"))


def reversed_run(run, tmp):
  """A copy of the run whose config.json says it translates the other way."""
  def reverse(copy):
    config = json.loads((copy / "config.json").read_text())
    config["data"]["src_lang"], config["data"]["tgt_lang"] = "de", "en"
    (copy / "config.json").write_text(json.dumps(config))
  return copy_run(run, tmp, reverse)


def without_vocab(run, tmp):
  return copy_run(run, tmp, lambda copy: (copy / "vocab" / "spm.model").unlink())


def with_rescored_vocab(run, tmp):
  """A copy of the run whose vocabulary has its size and pieces but one score changed."""
  return copy_run(run, tmp, lambda copy: rescore_one_piece(copy / "vocab" / "spm.model"))


def config_file_trained(tmp, source: str):
  """scripts/train.py with --config=<a file holding `source`>: flags, then training."""
  path = tmp / "bad_config.py"
  path.write_text(source)
  values = absl_flags.FlagValues()
  config = cli.define_config_flag(values)
  cli.parse_flags(["train.py", f"--config={path}"], values)
  loop.train_and_evaluate(config.value, tmp / "new")


def without_tfds(fn):
  """Runs `fn` as if the [tfds] extra were not installed."""
  with mock.patch.dict(sys.modules, {"tensorflow_datasets": None}):
    fn()


def not_runs(tmp) -> list:
  """Paths that are not training runs: a typo, a directory without config.json, a file."""
  (tmp / "notes").mkdir()
  (tmp / "notes.md").write_text("")
  return [tmp / "tpyo", tmp / "notes", tmp / "notes.md"]


def runs_of_two_corpora(run, tmp) -> list:
  """Two small copies of the run (three sentences each) whose val references differ."""
  a, b = small_run(run, tmp / "a"), small_run(run, tmp / "b")
  (tmp / "b-corpus" / "val.de").write_text("Anders.\nAnders.\nAnders.\n", encoding="utf-8")
  return [prepared(a), prepared(b)]


def with_broken_metrics_line(run, tmp):
  """A copy of the run whose metrics.jsonl has a cut-off record as its second line."""
  return copy_run(run, tmp, lambda copy: metrics_copy(run, copy, '{"step": 3, "split": "tr\n',
                                                      at=2))


def earlier_comparison(directory, sets=("val", "test"), search="beam 4, alpha 0.6"):
  """A comparison's --out directory with one run scored on `sets`, as `search` says."""
  directory.mkdir(parents=True)
  columns = ["run", "train.seed", *comparison.FIXED_COLUMNS] + [
      f"{s}_{c}" for s in sets for c in ("bleu", "bleu_lc", "chrf", "bleu_ci95", "p_value")]
  values = ["seed-0", "0", "1000", "4", "0.5", "100.0"] + ["20.0"] * (len(columns) - 6)
  (directory / "comparison.csv").write_text(",".join(columns) + "\n" + ",".join(values) + "\n",
                                            encoding="utf-8")
  (directory / "comparison.md").write_text(f"Baseline: `seed-0`. Best checkpoints, {search}.\n",
                                           encoding="utf-8")
  return directory


def config_only(run, tmp):
  """A workdir with the run's config.json and nothing else."""
  shutil.copy(run / "config.json", tmp)
  return tmp


def not_a_run(tmp):
  """A directory of the user's files (a corpus folder, say): not a run."""
  (tmp / "data").mkdir()
  (tmp / "data" / "train.en").write_text("A dog.\n")
  return prepared(tmp / "data")


def text_file(tmp, name, data: bytes):
  path = tmp / name
  path.write_bytes(data)
  return str(path)


# Each case: (id, what runs given (run, tmp, foreign_vocab), the exact message). In messages,
# {run} is the trained run, {tmp} the case's own directory.
CASES = [
    # Config fields and values, as flags and as values in a config.
    ("unknown field", lambda r, t, v: flags("--config.model.emb_dimm=64"),
     "--config.model.emb_dimm is not a config field; did you mean --config.model.emb_dim?"),
    ("unknown section", lambda r, t, v: flags("--config.modle.emb_dim=64"),
     "--config.modle.emb_dim is not a config field; did you mean --config.model.emb_dim?"),
    ("field in the wrong section", lambda r, t, v: flags("--config.model.vocab_size=100"),
     "--config.model.vocab_size is not a config field; did you mean --config.data.vocab_size?"),
    ("not a whole number", lambda r, t, v: flags("--config.train.num_steps=1.5"),
     "--config.train.num_steps=1.5 is not a whole number; pass one such as"
     " --config.train.num_steps=10000."),
    ("not a number, value as the next argument",
     lambda r, t, v: flags("--config.train.learning_rate", "fast"),
     "--config.train.learning_rate=fast is not a number; pass one such as"
     " --config.train.learning_rate=0.001."),
    ("not a bool", lambda r, t, v: flags("--config.model.bridge=maybe"),
     "--config.model.bridge=maybe is not true or false; pass --config.model.bridge=true or"
     " --config.model.bridge=false."),
    ("no such config file",
     lambda r, t, v: train_flags("--config=configs/nope.py"),
     "--config=configs/nope.py is not a file; pass an experiment config such as"
     " --config=configs/tiny.py."),
    ("heads do not divide the width",
     lambda r, t, v: train_with(t / "new", model__num_heads=3),
     "config.model.emb_dim=32 is not divisible by config.model.num_heads=3; choose sizes where it"
     " is."),
    ("negative size", lambda r, t, v: train_with(t / "new", model__num_encoder_layers=-1),
     "config.model.num_encoder_layers=-1 must be positive."),
    ("zero batch", lambda r, t, v: train_with(t / "new", data__tokens_per_batch=0),
     "config.data.tokens_per_batch=0 must be positive."),
    ("dropout of 1.5", lambda r, t, v: train_with(t / "new", model__dropout_rate=1.5),
     "config.model.dropout_rate=1.5 must be in [0, 1)."),
    ("Adam beta of 1", lambda r, t, v: train_with(t / "new", train__adam_b2=1.0),
     "config.train.adam_b2=1.0 must be in [0, 1)."),
    ("negative warmup", lambda r, t, v: train_with(t / "new", train__warmup_steps=-5),
     "config.train.warmup_steps=-5 must not be negative."),
    ("unknown split", lambda r, t, v: train_with(t / "new", eval__split="dev"),
     "config.eval.split='dev' is not a split; use one of: train, val, test."),
    ("compiler option without a value",
     lambda r, t, v: train_with(t / "new", compile__eval_options="xla_gpu_autotune_level"),
     "config.compile.eval_options='xla_gpu_autotune_level': 'xla_gpu_autotune_level' is not"
     " name=value; pass XLA options such as config.compile.eval_options=xla_gpu_autotune_level=0"
     " (several separated by commas)."),
    ("compiler option with a bad value",
     lambda r, t, v: train_with(t / "new", compile__eval_options="xla_cpu_enable_fast_math=maybe"),
     "config.compile.eval_options='xla_cpu_enable_fast_math=maybe': XLA refuses it (While setting"
     " option xla_cpu_enable_fast_math, 'maybe' is not a valid bool value.); pass options XLA"
     " knows, with values of their type, such as"
     " config.compile.eval_options=xla_gpu_autotune_level=0."),
    ("unknown compiler option",
     lambda r, t, v: train_with(t / "new", compile__train_options="xla_no_such_option=1"),
     "config.compile.train_options='xla_no_such_option=1': XLA refuses it (No such compile"
     " option: 'xla_no_such_option'); pass options XLA knows, with values of their type, such"
     " as config.compile.train_options=xla_gpu_autotune_level=0."),
    ("empty compiler option",
     lambda r, t, v: train_with(t / "new", compile__train_options="xla_cpu_enable_fast_math=false,,"
                                "xla_gpu_autotune_level=0"),
     "config.compile.train_options='xla_cpu_enable_fast_math=false,,xla_gpu_autotune_level=0'"
     " has an empty item (two commas in a row, or one at an end); separate its name=value"
     " options by single commas."),
    ("unknown loss term", lambda r, t, v: train_with(t / "new", train__loss_terms="zloss:1e-4"),
     "config.train.loss_terms='zloss:1e-4': 'zloss' is not a registered loss term; the"
     " registered ones are: z_loss (docs/extending.md adds one)."),
    ("loss term without its weight",
     lambda r, t, v: train_with(t / "new", train__loss_terms="z_loss"),
     "config.train.loss_terms='z_loss': 'z_loss' is not name:weight; pass items such as"
     " config.train.loss_terms=z_loss:1e-4 (several separated by commas)."),
    ("unknown loop action",
     lambda r, t, v: train_with(t / "new", train__actions="param_norm,lr_finder"),
     "config.train.actions='param_norm,lr_finder': 'lr_finder' is not a registered loop action;"
     " the registered ones are: param_norm (docs/extending.md adds one)."),
    ("missing extension file",
     lambda r, t, v: train_with(t / "new", train__extensions=f"{t}/mine.py"),
     "config.train.extensions='{tmp}/mine.py': {tmp}/mine.py is not a file (a relative path is"
     " read from the directory the command runs in); give the path of the Python file that"
     " registers the run's entries, or run the command from the directory it is relative to."),
    ("extension that raises",
     lambda r, t, v: train_with(t / "new", train__extensions=own_file(t, "import os\nundefined\n")),
     "{tmp}/mine.py:2: NameError: name 'undefined' is not defined (raised while importing"
     " config.train.extensions's {tmp}/mine.py); fix the file."),
    ("unexpanded tilde", lambda r, t, v: train_with("~/seq2seq-test-new"),
     "--workdir=~/seq2seq-test-new starts with '~', which the shell does not expand after '=';"
     " write the path out, e.g. --workdir=" + str(Path("~/seq2seq-test-new").expanduser())
     + "."),
    ("negative test beam", lambda r, t, v: train_with(t / "new", eval__test_beam_size=-1),
     "config.eval.test_beam_size=-1 must not be negative."),
    ("subword sampling of NaN",
     lambda r, t, v: train_with(t / "new", data__subword_sampling=float("nan")),
     "config.data.subword_sampling=nan is not a number; give one of 0 or more."),
    ("attention not of the family",
     lambda r, t, v: train_with(t / "new", model__family="rnn", model__attention="linear"),
     "config.model.attention='linear' is not available for the rnn; use one of: none,"
     " scaled_dot, dot, general, concat, location, local_m, local_p."),
    ("positions beside an attention they do not compose with", lambda r, t, v: train_with(
        t / "new", model__positions="relative", model__attention="linear"),
     "config.model.positions='relative' works inside scaled_dot attention, not 'linear'; change"
     " config.model.attention or positions."),
    ("a normalizer for attention without one", lambda r, t, v: train_with(
        t / "new", model__family="rnn", model__attention="none",
        model__attention_normalizer="entmax15"),
     "config.model.attention_normalizer='entmax15': the rnn's 'none' attention takes no"
     " normalizer; use softmax, or one of: scaled_dot, dot, general, concat, location, local_m,"
     " local_p."),
    ("attention of the other family", lambda r, t, v: train_with(
        t / "new", model__attention="location"),
     "config.model.attention='location' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local, local_global, differential."),
    ("no attention in a Transformer",
     lambda r, t, v: train_with(t / "new", model__attention="none"),
     "config.model.attention='none' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local, local_global, differential."),
    ("an attention by its paper's name", lambda r, t, v: train_with(
        t / "new", model__family="rnn", model__attention="bahdanau"),
     "config.model.attention='bahdanau' is not available for the rnn; use one of:"
     " none, scaled_dot, dot, general, concat, location, local_m, local_p. (Bahdanau et al.'s"
     " additive attention is 'concat' here.)"),
    ("an attention by its paper's name, capitalized", lambda r, t, v: train_with(
        t / "new", model__attention="Luong"),
     "config.model.attention='Luong' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local, local_global, differential. (Luong et"
     " al.'s bilinear (general) attention is 'general' here.)"),
    ("a paper's name for what the family lacks", lambda r, t, v: train_with(
        t / "new", model__attention="sutskever"),  # 'none', which no Transformer takes: no hint.
     "config.model.attention='sutskever' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local, local_global, differential."),
    ("unknown family", lambda r, t, v: train_with(t / "new", model__family="lstm"),
     "config.model.family='lstm' is not a model family; use one of: transformer, rnn."),
    ("unknown cell", lambda r, t, v: train_with(t / "new", model__rnn_cell="rnn"),
     "config.model.rnn_cell='rnn' is not a cell; use one of: lstm, gru."),
    ("zero steps", lambda r, t, v: train_with(t / "new", train__num_steps=0),
     "config.train.num_steps=0 must be positive."),
    ("unknown schedule", lambda r, t, v: train_with(t / "new", train__schedule="cos"),
     "config.train.schedule='cos' is not a schedule; use one of: inverse_sqrt, linear, cosine."),
    ("dropout of 1", lambda r, t, v: train_with(t / "new", model__dropout_rate=1.0),
     "config.model.dropout_rate=1.0 must be in [0, 1)."),
    ("one language on both sides", lambda r, t, v: train_with(t / "new", data__tgt_lang="en"),
     "config.data.src_lang and tgt_lang are both 'en'; choose two different languages."),
    ("data longer than the model's positions", lambda r, t, v: train_with(
        t / "new", data__max_len=300),
     "config.data.max_len=300 pads to 304 tokens, more than config.model.max_len=64; raise"
     " model.max_len."),
    ("subword sampling over the whole lattice", lambda r, t, v: train_with(
        t / "new", data__subword_sampling=0.1, data__subword_nbest=-1),
     "config.data.subword_nbest=-1 is out of range; sample among the 2 to 512 best"
     " segmentations."),
    # Corpus files.
    ("no corpus directory", lambda r, t, v: train_with(t / "new", data__corpus=str(t / "none")),
     "config.data.corpus='{tmp}/none' is not \"multi30k\", \"tfds:<name>\" or an existing"
     " directory; use one of those."),
    ("missing target file",
     lambda r, t, v: train_with(t / "new", data__corpus=corpus_dir(t, {"train.en": b"a\n"})),
     "Missing train file {tmp}/corpus/train.de (or train.de.gz); add it or check"
     " config.data.corpus, src_lang and tgt_lang."),
    ("misaligned sides", lambda r, t, v: train_with(t / "new", data__corpus=corpus_dir(
        t, {"train.en": b"a\nb\nc\n", "train.de": b"x\ny\n"})),
     "{tmp}/corpus/train.en has 3 lines but {tmp}/corpus/train.de has 2; the two sides of a"
     " parallel corpus must have one line per sentence pair."),
    ("undecodable text", lambda r, t, v: train_with(t / "new", data__corpus=corpus_dir(
        t, {"train.en": b"a\nb\nc\n", "train.de": b"x\ny\n\xff z\n"})),
     "{tmp}/corpus/train.de line 3 is not valid UTF-8; re-encode the file as UTF-8."),
    ("empty split", lambda r, t, v: train_with(t / "new", data__corpus=corpus_dir(
        t, {"train.en": b"a\n", "train.de": b"x\n", "val.en": b"", "val.de": b""})),
     "{tmp}/corpus/val.en and {tmp}/corpus/val.de are empty; the val split needs sentence pairs,"
     " one per line."),
    ("misaligned sides, one gzipped", lambda r, t, v: train_with(t / "new", data__corpus=corpus_dir(
        t, {"train.en": b"one\ntwo\nthree\n", "train.de.gz": gzip.compress(b"eins\nzwei\n")})),
     "{tmp}/corpus/train.en has 3 lines but {tmp}/corpus/train.de.gz has 2; the two sides of a"
     " parallel corpus must have one line per sentence pair."),
    ("undecodable validation text", lambda r, t, v: train_with(t / "new", data__corpus=corpus_dir(
        t, {"train.en": b"a\nb\n", "train.de": b"x\ny\n", "val.en": b"ok\nfine\n\xff\xfe bad\n",
            "val.de": b"a\nb\nc\n"})),
     "{tmp}/corpus/val.en line 3 is not valid UTF-8; re-encode the file as UTF-8."),
    ("a language Multi30k lacks", lambda r, t, v: train_with(t / "new", data__tgt_lang="xx"),
     "Multi30k has no language 'xx'; set config.data.src_lang/tgt_lang to one of: cs, de, en,"
     " fr."),
    ("TFDS without its extra", lambda r, t, v: without_tfds(lambda: train_with(
        t / "new", data__corpus="tfds:wmt14_translate/de-en")),
     "config.data.corpus='tfds:wmt14_translate/de-en' needs TensorFlow Datasets, an optional"
     " extra; install it with pip install -e \".[tfds]\"."),
    ("empty after length filtering", lambda r, t, v: train_with(t / "new", data__max_len=2),
     "The training corpus is empty after length filtering (config.data.max_len=2); raise"
     " config.data.max_len."),
    # Resuming or evaluating a run with something that is not the run's.
    ("resume with another model", lambda r, t, v: train_with(
        r, model__family="rnn", model__attention="general", model__num_decoder_layers=2),
     "{run} holds a run trained with config.model.attention='scaled_dot' (not 'general'),"
     " config.model.family='transformer' (not 'rnn'), config.model.num_decoder_layers=1 (not 2);"
     " resume it with the run's values (--config.model.attention=scaled_dot"
     " --config.model.family=transformer --config.model.num_decoder_layers=1), or pass a new"
     " --workdir."),
    ("resume with other data", lambda r, t, v: train_with(r, data__vocab_size=300),
     "{run} holds a run trained with config.data.vocab_size=500 (not 300); resume it with the"
     " run's values (--config.data.vocab_size=500), or pass a new --workdir."),
    ("resume a run from before length buckets", lambda r, t, v: train_with(
        copy_run(r, t, functools.partial(drop_field, "data", "num_buckets"))),
     "{tmp}/copy holds a run trained with config.data.num_buckets=0 (not 2); resume it with the"
     " run's values (--config.data.num_buckets=0), or pass a new --workdir."),
    ("resume with an edited config.json", lambda r, t, v: train_with(
        edited_config(r, t, emb_dim=48, num_heads=3), model__emb_dim=48, model__num_heads=3),
     "The checkpoint at step 4 in {tmp}/copy does not fit the model of its config.json"
     " (decoder_layers.0.cross_attention.key.kernel is of shape (32, 32) in the checkpoint but of"
     " shape (48, 48) in the model, and 32 more parameters differ); was config.json edited? Put"
     " back the run's config.json or train in a new --workdir."),
    ("evaluate with an edited config.json",
     lambda r, t, v: evaluate.run_evaluation(edited_config(r, t, num_encoder_layers=2)),
     "The checkpoint at step 4 in {tmp}/copy does not fit the model of its config.json"
     " (encoder_layers.1.mlp.wi.bias is missing in the checkpoint but of shape (64,) in the"
     " model, and 11 more parameters differ); was config.json edited? Put back the run's"
     " config.json or train in a new --workdir."),
    ("resume with another vocabulary", lambda r, t, v: train_with(with_vocab(r, t, v)),
     "{tmp}/copy/vocab/spm.model has 400 subwords but the checkpoint at step 4 was trained with"
     " 500 (src_embed.embedding): the vocabulary is not this run's; put back the run's vocab/ or"
     " train in a new --workdir."),
    ("translate with another vocabulary",
     lambda r, t, v: Translator(with_vocab(r, t, v), "latest"),
     "{tmp}/copy/vocab/spm.model has 400 subwords but the checkpoint at step 4 was trained with"
     " 500 (src_embed.embedding): the vocabulary is not this run's; put back the run's vocab/ or"
     " train in a new --workdir."),
    ("vocabulary missing", lambda r, t, v: Translator(without_vocab(r, t)),
     "{tmp}/copy/vocab/spm.model is missing: the run's checkpoints only work with the vocabulary"
     " they were trained with; put it back from a copy of the run."),
    ("resume with the vocabulary missing", lambda r, t, v: train_with(without_vocab(r, t)),
     "{tmp}/copy/vocab/spm.model is missing but {tmp}/copy holds checkpoints trained with it; put"
     " it back from a copy of the run, or train in a new --workdir."),
    # Same size, same pieces, one score changed: told apart by the fingerprint of the content.
    ("translate with a rescored vocabulary",
     lambda r, t, v: Translator(with_rescored_vocab(r, t), "latest"),
     "{tmp}/copy/vocab/spm.model is not the vocabulary the checkpoint at step 4 was trained with"
     " (sha256 {copy_vocab}..., recorded {run_vocab}...); put back the run's vocab/ or train in a"
     " new --workdir."),
    ("resume with a rescored vocabulary", lambda r, t, v: train_with(with_rescored_vocab(r, t)),
     "{tmp}/copy/vocab/spm.model is not the vocabulary the checkpoint at step 4 was trained with"
     " (sha256 {copy_vocab}..., recorded {run_vocab}...); put back the run's vocab/ or train in a"
     " new --workdir."),
    ("no vocabulary file", lambda r, t, v: tokenizer.Tokenizer.load(t / "nope.model"),
     "SentencePiece model {tmp}/nope.model does not exist; train one with load_or_train() or"
     " point to an existing .model file."),
    ("vocab_from a run without a vocabulary",
     lambda r, t, v: train_with(t / "new", data__vocab_from=str(t / "missing")),
     "config.data.vocab_from={tmp}/missing: {tmp}/missing/vocab/spm.model does not exist; pass"
     " the workdir of a run that has trained its vocabulary."),
    ("an ensemble member of another vocabulary", lambda r, t, v: evaluate.run_evaluation(
        r, split="val", ensemble=[str(with_vocab(r, t, v))]),
     "--ensemble: {tmp}/copy/vocab/spm.model is not the vocabulary of {run} (an ensemble averages"
     " the members' probabilities of the same tokens); ensemble runs of one vocabulary, such as"
     " runs that differ only in config.train.seed."),
    ("vocab_from a run of another vocabulary size",
     lambda r, t, v: train_with(t / "new", data__vocab_from=str(r), data__vocab_size=300),
     "config.data.vocab_from={run} holds a vocabulary of config.data.vocab_size=500, not this"
     " run's 300; pass --config.data.vocab_size=500, or drop vocab_from to train one of 300."),
    ("an empty workdir", lambda r, t, v: loop.train_and_evaluate(fast_tiny_config(), ""),
     "--workdir is empty; pass the directory of the run, e.g. --workdir=runs/m30k_transformer."),
    ("a workdir that is not a run",
     lambda r, t, v: train_with(not_a_run(t)),
     "--workdir={tmp}/data holds files (train.en, ...) but no run (no config.json, checkpoints/"
     " or vocab/); pass a new directory for the run, or a run's workdir."),
    ("a config.json cut short", lambda r, t, v: evaluate.run_evaluation(
        copy_run(r, t, lambda copy: (copy / "config.json").write_text("{"))),
     "{tmp}/copy/config.json is not valid JSON (Expecting property name enclosed in double"
     " quotes); seq2seq writes it whole, so it was cut or edited since; put it back from a copy"
     " of the run."),
    ("an empty selected.json", lambda r, t, v: Translator(copy_run(
        r, t, lambda copy: (copy / "eval").mkdir() or (copy / "eval" / "selected.json")
        .write_text("")), "selected"),
     "{tmp}/copy/eval/selected.json is not valid JSON (Expecting value); choose again on"
     " validation data: seq2seq-evaluate --split=val --checkpoint=best,avg:5,avg:10."),
    ("a candidate the run does not hold, after others", lambda r, t, v: evaluate.select_checkpoint(
        copy_run(r, t), ["best", "avg:2", "avg:5"]),
     "--checkpoint=avg:5 averages 5 checkpoints but {tmp}/copy/checkpoints holds 2 (steps 2, 4);"
     " use --checkpoint=avg:2 or fewer."),
    ("a repeated candidate", lambda r, t, v: evaluate.select_checkpoint(r, ["best", "best"]),
     "--checkpoint=best,best has an empty or repeated entry; list each candidate once, e.g."
     " --checkpoint=best,avg:5,avg:10."),
    ("a test set of unequal line counts", lambda r, t, v: evaluations.parse_test_set(
        "mine=" + text_file(t, "a.en", b"one\ntwo\n") + "," + text_file(t, "a.de", b"eins\n")),
     "--test_set=mine={tmp}/a.en,{tmp}/a.de: {tmp}/a.en has 2 lines but {tmp}/a.de has 1; pass a"
     " reference line for every source line."),
    ("an ensemble member named twice", lambda r, t, v: evaluate.run_evaluation(
        r, split="val", ensemble=[str(r)]),
     "--ensemble: {run} is a run already listed (as {run}, by --workdir or --ensemble); name"
     " each run once: an ensemble counts each member once."),
    ("an empty ensemble entry", lambda r, t, v: Translator(r, ensemble=[str(t), ""]),
     "--ensemble={tmp}, has an empty entry (a stray comma); list the other runs' workdirs, e.g."
     " --ensemble=runs/b,runs/c."),
    ("an ensemble member of the other direction", lambda r, t, v: evaluate.run_evaluation(
        r, split="val", ensemble=[str(reversed_run(r, t))]),
     "--ensemble: {tmp}/copy translates de->en but {run} translates en->de; ensemble runs of one"
     " direction."),
    # A config.json edited by hand: refused where a run is read, as a training's start would.
    ("evaluate with a config.json edited to a negative value",
     lambda r, t, v: evaluate.run_evaluation(edited_field(r, t, "compile", "threads", -1)),
     "{tmp}/copy/config.json: config.compile.threads=-1 must not be negative; was it edited? Put"
     " back the run's value, or the file from a copy of the run."),
    ("translate with a config.json edited to a word for a number",
     lambda r, t, v: Translator(edited_field(r, t, "compile", "threads", "four")),
     "{tmp}/copy/config.json: config.compile.threads='four' is a str; it takes a whole number"
     " (default 0); was it edited? Put back the run's value, or the file from a copy of the"
     " run."),
    ("translate with a config.json edited to a negative decoding length",
     lambda r, t, v: Translator(edited_field(r, t, "eval", "max_decode_len_b", -50)),
     "{tmp}/copy/config.json: config.eval.max_decode_len_b=-50 must not be negative; was it"
     " edited? Put back the run's value, or the file from a copy of the run."),
    ("compare a run whose config.json names an attention its family lacks",
     lambda r, t, v: comparison.compare_runs(
         [edited_field(r, t, "model", "attention", "location")], t / "new"),
     "{tmp}/copy/config.json: config.model.attention='location' is not available for the"
     " transformer; use one of: scaled_dot, dot, general, concat, linear, local, local_global,"
     " differential; was it edited? Put back the run's value, or the file from a copy of the"
     " run."),
    # Checkpoints.
    ("not a run", lambda r, t, v: evaluate.run_evaluation(t),
     "{tmp} is not a training run (no config.json); pass the --workdir that seq2seq-train"
     " wrote."),
    ("run without checkpoints", lambda r, t, v: evaluate.run_evaluation(config_only(r, t)),
     "{tmp}/checkpoints holds no checkpoint; train the run first."),
    ("no such step", lambda r, t, v: evaluate.run_evaluation(r, checkpoint="12345"),
     "--checkpoint=12345 names no checkpoint of {run}/checkpoints; use latest, best, avg:N or one"
     " of the steps 2, 4."),
    ("ensemble:N above the checkpoints", lambda r, t, v: Translator(r, "ensemble:3"),
     "--checkpoint=ensemble:3: N of ensemble:N must be 1 to 2, the checkpoints {run}/checkpoints"
     " holds (steps 2, 4)."),
    ("too few to average", lambda r, t, v: evaluate.run_evaluation(r, checkpoint="avg:5"),
     "--checkpoint=avg:5 averages 5 checkpoints but {run}/checkpoints holds 2 (steps 2, 4); use"
     " --checkpoint=avg:2 or fewer."),
    # Files given to evaluate.py / translate.py.
    ("missing --src_file", lambda r, t, v: evaluate.run_evaluation(
        r, src_file=str(t / "test.en"), ref_file=text_file(t, "test.de", b"x\n")),
     "--src_file={tmp}/test.en does not exist; pass an existing text file."),
    ("--ref_file of another length", lambda r, t, v: evaluate.run_evaluation(
        r, src_file=text_file(t, "test.en", b"a\nb\n"), ref_file=text_file(t, "test.de", b"x\n")),
     "--src_file={tmp}/test.en has 2 lines but --ref_file={tmp}/test.de has 1; pass a reference"
     " line for every source line."),
    ("--src_file without --ref_file", lambda r, t, v: evaluate.run_evaluation(
        r, src_file=text_file(t, "test.en", b"a\n")),
     "Pass both --src_file and --ref_file, or neither (to use --split)."),
    ("missing --input", lambda r, t, v: textio.read_lines(str(t / "in.en"), "--input"),
     "--input={tmp}/in.en does not exist; pass an existing text file."),
    ("undecodable --input", lambda r, t, v: textio.read_lines(
        text_file(t, "in.en", b"ok\n\xe4 latin-1\n"), "--input"),
     "{tmp}/in.en line 2 is not UTF-8 (invalid continuation byte); convert the file to UTF-8."),
    ("negative --plot_attention",
     lambda r, t, v: evaluate.run_evaluation(r, split="val", plot_attention=-1),
     "--plot_attention=-1 must not be negative; pass the number of sentences to draw (0: none)."),
    ("--nbest above --beam_size",
     lambda r, t, v: Translator(r, "latest", beam_size=2, nbest=3),
     "--nbest=3 must be between 1 and --beam_size=2."),
    ("packing an RNN", lambda r, t, v: train_with(t / "new", data__pack=True,
                                                  model__family="rnn",
                                                  model__attention="general"),
     "config.data.pack=True packs several sentences per row, which the rnn family cannot keep"
     " apart; it needs --config.data.pack=False."),
    ("packing linear attention", lambda r, t, v: train_with(t / "new", data__pack=True,
                                                            model__attention="linear"),
     "config.data.pack=True needs attention that can be masked per sentence; `linear` cannot:"
     " use another config.model.attention or pack=False."),
    ("--beam_size=0", lambda r, t, v: Translator(r, "latest", beam_size=0),
     "--beam_size=0 must be at least 1 (1: greedy search)."),
    ("negative --alpha", lambda r, t, v: evaluate.run_evaluation(r, alpha=-1.0),
     "--alpha=-1.0 must be a number, not negative (0: no length penalty; 0.6 is usual)."),
    ("--alpha=nan", lambda r, t, v: Translator(r, "latest", alpha=float("nan")),
     "--alpha=nan must be a number, not negative (0: no length penalty; 0.6 is usual)."),
    ("--batch_size=0", lambda r, t, v: evaluate.run_evaluation(r, batch_size=0),
     "--batch_size=0 must be at least 1 (sentences per batch)."),
    ("sampling at --temperature=nan",
     lambda r, t, v: Translator(r, "latest", sample_seed=0, temperature=float("nan")),
     "Sampling takes --nbest=1, --temperature > 0 and --top_k >= 0 (got 1, nan, 0)."),
    ("avg:0", lambda r, t, v: evaluate.run_evaluation(r, checkpoint="avg:0"),
     "--checkpoint=avg:0 averages no checkpoint; N of avg:N must be 1 to 2, the checkpoints"
     " {run}/checkpoints holds."),
    ("--baseline not a run", lambda r, t, v: comparison.compare_runs([r], t / "out",
                                                                  baseline=t / "missing"),
     "--baseline={tmp}/missing is not a training run (no config.json); pass one of the compared"
     " workdirs."),
    # compare.py: its --test_set values and the runs it is given.
    ("--test_set named twice", lambda r, t, v: comparison.compare_runs(
        [r], t / "new", test_sets=[evaluations.TestSet("t", "a.en", "a.de"),
                                     evaluations.TestSet("t", "b.en", "b.de")]),
     "--test_set names 't' twice, for different files; give each set its own NAME."),
    ("--test_set not NAME=SRC,REF", lambda r, t, v: evaluations.parse_test_set("test2017"),
     "--test_set=test2017 is not NAME=SRC,REF; e.g."
     " --test_set=test2017=data/test_2017.en,data/test_2017.de."),
    ("--test_set named like a split", lambda r, t, v: evaluations.parse_test_set("val=a.en,a.de"),
     "--test_set=val=a.en,a.de: 'val' is a split of the runs' corpus; give the files another"
     " name."),
    ("--test_set of a missing file",
     lambda r, t, v: evaluations.parse_test_set("t=missing.en,missing.de"),
     "--test_set=t=missing.en,missing.de: missing.en is not a file; pass an existing text"
     " file."),
    ("compare paths that are not runs", lambda r, t, v: comparison.compare_runs(
        [r, *not_runs(t)], t / "new"),
     "Not training runs: {tmp}/tpyo (does not exist), {tmp}/notes (no config.json),"
     " {tmp}/notes.md (not a directory); pass only the workdirs that seq2seq-train wrote (each"
     " holds config.json), e.g. runs/rnn_attention/*."),
    ("compare runs scored on other sentences", lambda r, t, v: comparison.compare_runs(
        runs_of_two_corpora(r, t), t / "new", split="val"),
     "{tmp}/b has other val sentences than the baseline {tmp}/a (their config.data differs);"
     " compare runs of one corpus."),
    ("compare runs of two directions", lambda r, t, v: comparison.compare_runs(
        [r, reversed_run(r, t)], t / "new"),
     "{tmp}/copy translates de->en but the baseline {run} translates en->de; compare runs of one"
     " direction."),
    ("compare a trained run whose metrics.jsonl is gone", lambda r, t, v: comparison.compare_runs(
        [copy_run(r, t, lambda copy: (copy / "metrics.jsonl").unlink())], t / "new"),
     "{tmp}/copy/metrics.jsonl is missing, though {tmp}/copy holds checkpoints (the run"
     " trained); put metrics.jsonl back from a copy of the run: the comparison reads its steps,"
     " training time and validation curve from it."),
    ("--welch_against naming no row", lambda r, t, v: comparison.compare_runs(
        [copy_run(r, t, lambda copy: None)], t / "new", welch_against="nope"),
     "--welch_against=nope names no compared run; pass a row's name as the table shows it, one"
     " of: copy."),
    ("compare one run named twice", lambda r, t, v: comparison.compare_runs([r, r], t / "new"),
     "The runs to compare list one run twice ({run} and {run}); name each run once: the table"
     " and its tests count each run once."),
    ("compare one run and a link to it", lambda r, t, v: comparison.compare_runs(
        [r, linked(r, t)], t / "new"),
     "The runs to compare list one run twice ({run} and {tmp}/link); name each run once: the"
     " table and its tests count each run once."),
    ("compare into a file", lambda r, t, v: comparison.compare_runs(
        [r], text_file(t, "notes.md", b"mine")),
     "--out={tmp}/notes.md is a file, not a directory; pass a directory for the comparison."),
    ("compare a run with a broken metrics line", lambda r, t, v: comparison.compare_runs(
        [with_broken_metrics_line(r, t)], t / "new"),
     "{tmp}/copy/metrics.jsonl line 2 is not a JSON record (Unterminated string starting at);"
     " repair or delete that line."),
    ("a vocabulary seq2seq did not write",
     lambda r, t, v: tokenizer.Tokenizer.load(plain_sentencepiece(t)),
     "{tmp}/plain.model has special ids (pad, unk, bos, eos) = (-1, 0, 1, 2), not (0, 1, 2, 3):"
     " seq2seq did not write it. Put back the run's own vocabulary, or train in a new"
     " --workdir."),
    ("--earlier not a comparison", lambda r, t, v: comparison.compare_runs(
        [r], t / "new", earlier=[not_runs(t)[1]]),
     "--earlier={tmp}/notes holds no comparison.csv and comparison.md; pass a directory that"
     " seq2seq-compare wrote (its --out)."),
    ("--earlier scored on other sets", lambda r, t, v: comparison.compare_runs(
        [r], t / "new", earlier=[earlier_comparison(t / "earlier", sets=("val",))]),
     "--earlier={tmp}/earlier: its comparison.csv has no test_bleu, test_bleu_lc, test_chrf,"
     " test_bleu_ci95; compare on the sets it was scored on (--split, --test_set)."),
    ("--earlier at another beam size", lambda r, t, v: comparison.compare_runs(
        [r], t / "new", earlier=[earlier_comparison(t / "earlier", search="beam 5, alpha 0.6")]),
     "--earlier={tmp}/earlier was scored with beam 5, alpha 0.6, these runs with beam 4, alpha"
     " 0.6; pass its --beam_size and --alpha."),
    ("two --earlier of one name", lambda r, t, v: comparison.compare_runs(
        [r], t / "new", earlier=[earlier_comparison(t / "a" / "earlier"),
                                 earlier_comparison(t / "b" / "earlier")]),
     "--earlier names two comparisons in directories called earlier; rename one, since its"
     " name prefixes its rows."),
    ("two --earlier holding one run", lambda r, t, v: comparison.compare_runs(
        [r], t / "new", earlier=[earlier_comparison(t / "one"), earlier_comparison(t / "two")]),
     "one:seed-0 and two:seed-0 are one run (the same config and scores); pass each run, and"
     " each --earlier comparison holding it, once."),
    ("compare at --beam_size=0", lambda r, t, v: comparison.compare_runs([r], t / "new",
                                                                     beam_size=0),
     "--beam_size=0 must be at least 1 (1: greedy search)."),  # And --out is not created.
    ("sweep at --parallel=0", lambda r, t, v: sweep.run_sweep(
        fast_tiny_config(), ["train.seed=0,1"], t / "new", parallel=0),
     "--parallel=0 must be at least 1 (runs trained at once)."),
    ("--output in a missing directory",
     lambda r, t, v: textio.check_output(t / "nodir" / "out.de", "--output"),
     "--output={tmp}/nodir/out.de: the directory {tmp}/nodir does not exist; create it or pass"
     " another path."),
    ("sweep of a field the config lacks", lambda r, t, v: sweep.run_sweep(
        fast_tiny_config(), ["model.atention=dot"], t / "new"),
     "--sweep=model.atention=dot: config has no field model.atention; see seq2seq/config.py."),
    ("sweep of a field with a value of another type", lambda r, t, v: sweep.run_sweep(
        fast_tiny_config(), ["train.seed=a,b"], t / "new"),
     "--sweep=train.seed=a,b: 'a' is not a whole number; give values of config.train.seed's"
     " type, e.g. --sweep=train.seed=0,1."),
    ("sweep of a boolean with another word", lambda r, t, v: sweep.run_sweep(
        fast_tiny_config(), ["data.pack=yes,no"], t / "new"),
     "--sweep=data.pack=yes,no: 'yes' is not true or false; give values of config.data.pack's"
     " type, e.g. --sweep=data.pack=true,false."),
    ("sweep of a field named twice", lambda r, t, v: sweep.run_sweep(
        fast_tiny_config(), ["train.seed=0,1", "train.seed=2"], t / "new"),
     "--sweep=train.seed=0,1 and --sweep=train.seed=2 both sweep train.seed; give its values in"
     " one --sweep, e.g. --sweep=train.seed=0,1,2."),
    ("sweep of a value listed twice", lambda r, t, v: sweep.run_sweep(
        fast_tiny_config(), ["train.seed=0,0"], t / "new"),
     "--sweep=train.seed=0,0 lists 0 twice (as a value of config.train.seed); list each value"
     " once: each is a run of its own."),
    ("a picture format matplotlib cannot write",
     lambda r, t, v: plots.image_path(t / "att.txt", "--out"),
     "--out={tmp}/att.txt: matplotlib cannot write .txt files; use one of " + IMAGE_FORMATS
     + " (e.g. att.png)."),
    # Config files: the user's file and line, not a traceback through config_flags.
    ("an argument get_config does not take", lambda r, t, v: train_flags(
        f"--config={ROOT / 'configs' / 'tiny.py'}:rnn", f"--workdir={t / 'new'}"),
     "--config=" + str(ROOT / "configs" / "tiny.py") + ":rnn passes 'rnn' to get_config(), which"
     " takes no argument in " + str(ROOT / "configs" / "tiny.py") + "; drop ':rnn' and set"
     " fields with --config.<field>=VALUE instead."),
    ("no argument where get_config needs one", lambda r, t, v: config_file(
        t, "def get_config(family):\n  pass\n"),
     "get_config() in {tmp}/bad_config.py needs an argument; pass it as"
     " --config={tmp}/bad_config.py:ARG."),
    ("config syntax error", lambda r, t, v: config_file(t, "def get_config(:\n  pass\n"),
     "{tmp}/bad_config.py:1: invalid syntax; fix the config file's syntax."),
    ("config without get_config", lambda r, t, v: config_file(t, "X = 1\n"),
     "{tmp}/bad_config.py defines no get_config(); an experiment config returns its ConfigDict"
     " from get_config() (see configs/tiny.py)."),
    ("get_config raises", lambda r, t, v: config_file(
        t, "def get_config():\n  raise ValueError('boom')\n"),
     "{tmp}/bad_config.py:2: ValueError: boom (raised while loading the config); fix the config"
     " file."),
    ("config lacks a field", lambda r, t, v: config_file(
        t, "from seq2seq import config\ndef get_config():\n  c = config.base_config()\n"
        "  del c.train.seed\n  return c\n"),
     "{tmp}/bad_config.py's get_config() lacks config.train.seed; start get_config() from"
     " seq2seq.config.base_config() and change what you need."),
    ("config with a field base_config lacks", lambda r, t, v: config_file_trained(
        t, "from seq2seq.config import base_config\ndef get_config():\n  c = base_config()\n"
        "  c.model['attenton'] = 'dot'\n  return c\n"),
     "Unknown config field model.attenton. Did you mean 'attention'?"),
    ("config not a ConfigDict", lambda r, t, v: config_file(
        t, "def get_config():\n  return {'model': {}}\n"),
     "{tmp}/bad_config.py's get_config() is of type 'dict', not an ml_collections.ConfigDict;"
     " start get_config() from seq2seq.config.base_config() and change what you need."),
    ("seed out of range", lambda r, t, v: train_with(t / "new", train__seed=-1),
     "config.train.seed=-1 is out of range; use 0 to 4294967295."),
    # Workdirs.
    ("workdir is a file", lambda r, t, v: train_with(text_file(t, "file", b"x")),
     "--workdir={tmp}/file: {tmp}/file is a file, not a directory; pass another --workdir."),
    ("workdir under a file", lambda r, t, v: train_with(text_file(t, "file", b"x") + "/run"),
     "--workdir={tmp}/file/run: {tmp}/file is a file, not a directory; pass another --workdir."),
    ("workdir not writable", lambda r, t, v: read_only(lambda: train_with(t / "new")),
     "--workdir={tmp}/new: {tmp} is not writable (permissions or a read-only filesystem); pass a"
     " --workdir on a writable disk."),
    ("a second training in a workdir", lambda r, t, v: while_locked(
        r, lambda: train_with(r, train__num_steps=6)),
     "{run} is in use by another training (host " + socket.gethostname() + ", pid "
     + str(os.getpid()) + ", holding {run}/.lock); wait for it to finish or stop it, or pass"
     " another --workdir."),
]


@pytest.mark.parametrize("case,expected", [(c[1], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_user_error_is_one_exact_line_and_changes_nothing(run, foreign_vocab, tmp_path, capsys,
                                                          case, expected):
  before = state(run)
  with pytest.raises((UserError, SystemExit)) as raised:
    case(run, tmp_path, foreign_vocab)
  if raised.type is SystemExit:  # The flag parser prints the line itself, as the CLI does.
    assert raised.value.code == 2
    printed = capsys.readouterr().err
  else:
    printed = f"error: {raised.value}\n"  # What cli.run_main prints.
  fingerprints = {name: (tokenizer.fingerprint(workdir / "vocab" / "spm.model") or "")[:12]
                  for name, workdir in (("run_vocab", run), ("copy_vocab", tmp_path / "copy"))}
  assert printed == "error: " + expected.format(run=run, tmp=tmp_path, **fingerprints) + "\n"
  assert state(run) == before
  assert not (tmp_path / "new").exists()  # A failed start leaves no workdir (or --out) behind.
  for directory in [d for d in PREPARED if d.is_relative_to(tmp_path)]:
    # A copied run's checkpoints are never mistaken for damaged ones and moved, nor is anything
    # written beside them.
    assert state(directory) == PREPARED.pop(directory), directory


def test_case_names_are_unique():
  assert len({c[0] for c in CASES}) == len(CASES)
  assert len({c[0] for c in COMMANDS}) == len(COMMANDS)


# The commands themselves: (id, scripts/<name> and its arguments, the exact line it prints with
# status 2). {run}: the trained run; {tmp}: the command's own directory, holding FILES[id].
COMMANDS = [
    ("train.py, a misspelt field",
     ["train.py", "--config={tiny}", "--workdir={run}", "--config.model.atention=dot"],
     "--config.model.atention is not a config field; did you mean --config.model.attention?"),
    ("train.py, a size the model cannot take",
     ["train.py", "--config={tiny}", "--workdir={tmp}/new", "--config.model.num_heads=5"],
     "config.model.emb_dim=32 is not divisible by config.model.num_heads=5; choose sizes where it"
     " is."),
    ("evaluate.py, too few to average", ["evaluate.py", "--workdir={run}", "--checkpoint=avg:3"],
     "--checkpoint=avg:3 averages 3 checkpoints but {run}/checkpoints holds 2 (steps 2, 4); use"
     " --checkpoint=avg:2 or fewer."),
    ("translate.py, undecodable input",
     ["translate.py", "--workdir={run}", "--input={tmp}/bad.en", "--output={tmp}/new"],
     "{tmp}/bad.en line 2 is not UTF-8 (invalid start byte); convert the file to UTF-8."),
    ("compare.py, not a run", ["compare.py", "{run}", "{tmp}/tpyo", "--out={tmp}/new"],
     "Not a training run: {tmp}/tpyo (does not exist); pass only the workdirs that"
     " seq2seq-train wrote (each holds config.json), e.g. runs/rnn_attention/*."),
    ("compare.py, --alpha reaches the comparison",
     ["compare.py", "{run}", "--alpha=-1", "--out={tmp}/new"],
     "--alpha=-1.0 must be a number, not negative (0: no length penalty; 0.6 is usual)."),
    ("benchmark.py, a width the heads cannot split", ["benchmark.py", "--dim=30", "--heads=4"],
     "flags dim=30, heads=4: --dim must be divisible by --heads (each head gets dim / heads);"
     " choose sizes where it is"),
    ("evaluate.py, a config.json edited by hand", ["evaluate.py", "--workdir={tmp}"],
     "{tmp}/config.json: config.compile.threads='four' is a str; it takes a whole number"
     " (default 0); was it edited? Put back the run's value, or the file from a copy of the"
     " run."),
    ("compare.py, one run twice", ["compare.py", "{run}", "{run}", "--out={tmp}/new"],
     "The runs to compare list one run twice ({run} and {run}); name each run once: the table"
     " and its tests count each run once."),
    ("sweep.py, one field twice",
     ["sweep.py", "--config={tiny}", "--sweep=train.seed=0,1", "--sweep=train.seed=2",
      "--root={tmp}/new"],
     "--sweep=train.seed=0,1 and --sweep=train.seed=2 both sweep train.seed; give its values in"
     " one --sweep, e.g. --sweep=train.seed=0,1,2."),
    ("serve.py, not a run", ["serve.py", "--workdir={tmp}/nope"],
     "{tmp}/nope is not a training run (no config.json); pass the --workdir that seq2seq-train"
     " wrote."),
    ("serve.py, a beam of none", ["serve.py", "--workdir={run}", "--beams=4,0"],
     "--beams=4,0 must list beam sizes of at least 1, each once, e.g. --beams=1,4."),
    ("serve.py, a port out of range", ["serve.py", "--workdir={run}", "--port=70000"],
     "--port=70000 must be between 1 and 65535."),
    ("serve.py, one run twice", ["serve.py", "--workdir={run},{run}", "--port=1"],
     "--workdir lists one run twice ({run} and {run}); list each run once (--checkpoint picks"
     " the same checkpoint of every run)."),
    ("benchmark.py, an unknown mode", ["benchmark.py", "--mode=nope"],
     "flag --mode=['nope']: --mode takes some of train, decode, kv_heads, padding, compile, calls,"
     " seeds, saves, recurrence, buckets, serve, ctranslate2 (comma-separated)"),
    ("benchmark.py, no rows", ["benchmark.py", "--batch=0"],
     "flag --batch=0: 0 is not a positive integer"),
    ("evaluate.py, a stray argument", ["evaluate.py", "--workdir={run}", "val"],
     "unexpected argument 'val': this command takes flags only (--name=value); see evaluate.py"
     " --help."),
    ("translate.py, --top_k without --sample",
     ["translate.py", "--workdir={run}", "--input={tmp}/in.en", "--output={tmp}/new",
      "--top_k=5"],
     "--top_k applies to sampling only; add --sample, or drop --top_k."),
    ("translate.py, the output is the input",
     ["translate.py", "--workdir={run}", "--input={tmp}/in.en", "--output={tmp}/in.en"],
     "--output={tmp}/in.en is --input={tmp}/in.en: writing it would replace the input; pass"
     " another output file."),
    ("translate.py, --alignment_layer without --alignment",
     ["translate.py", "--workdir={run}", "--input={tmp}/in.en", "--output={tmp}/new",
      "--alignment_layer=0"],
     "--alignment_layer applies to --alignment only; add --alignment, or drop"
     " --alignment_layer."),
    ("translate.py, --alignment of an ensemble",
     ["translate.py", "--workdir={run}", "--input={tmp}/in.en", "--output={tmp}/new",
      "--alignment", "--checkpoint=ensemble:2"],
     "--alignment reads one model's attention, not an ensemble's; drop one of them."),
    ("translate.py, --alignment of a layer the model lacks",
     ["translate.py", "--workdir={run}", "--input={tmp}/in.en", "--output={tmp}/new",
      "--alignment", "--alignment_layer=3"],
     "--alignment_layer=3 is not a layer of this model, which has 1 cross-attention layer; pass"
     " one from -1 to 0 (-2: the penultimate)."),
    ("evaluate.py, --gold_alignment of several checkpoints",
     ["evaluate.py", "--workdir={run}", "--split=val", "--checkpoint=2,4",
      "--gold_alignment={tmp}/gold.txt"],
     "--gold_alignment scores one choice, not several checkpoints or searches; choose on"
     " validation first, then score it with --checkpoint=selected."),
    ("serve.py, without the [serve] extra", ["serve.py", "--workdir={run}"],
     "seq2seq-serve needs the [serve] extra (fastapi is not installed); install it with pip"
     " install -e \".[serve]\"."),
    ("benchmark.py --mode=serve, without the [serve] extra",
     ["benchmark.py", "--mode=train,serve", "--workdir={run}"],
     "seq2seq-benchmark --mode=serve needs the [serve] extra (httpx is not installed); install"
     " it with pip install -e \".[serve]\"."),
    ("benchmark.py --mode=ctranslate2, no run", ["benchmark.py", "--mode=ctranslate2"],
     "--mode=ctranslate2 measures a trained run; pass --workdir=RUN."),
    ("export.py, without the [export] extra",
     ["export.py", "--workdir={run}", "--output={tmp}/new"],
     "seq2seq-export needs the [export] extra (ctranslate2 is not installed); install it with"
     " pip install -e \".[export]\"."),
    ("export.py, an RNN run", ["export.py", "--workdir={tmp}", "--output={tmp}/new"],
     "{tmp} does not convert to CTranslate2: config.model.family='rnn': CTranslate2 runs"
     " Transformers only; export a Transformer run."),
    ("export.py, an ensemble",
     ["export.py", "--workdir={run}", "--checkpoint=ensemble:2", "--output={tmp}/new"],
     "--checkpoint=ensemble:2 is an ensemble; CTranslate2 runs one model: export one checkpoint,"
     " or --checkpoint=avg:N (their average)."),
]
# Modules made missing for a command (`sitecustomize` below): an optional extra not installed.
MISSING = {"serve.py, without the [serve] extra": "fastapi",
           "benchmark.py --mode=serve, without the [serve] extra": "httpx",
           "export.py, without the [export] extra": "ctranslate2"}
FILES = {"translate.py, undecodable input": {"bad.en": b"fine\n\xff\xfe broken\n"},
         "evaluate.py, a config.json edited by hand": {
             "config.json": b'{"compile": {"threads": "four"}}'},
         "export.py, an RNN run": {
             "config.json": b'{"model": {"family": "rnn", "attention": "general"}}'},
         "translate.py, --top_k without --sample": {"in.en": b"A dog.\n"},
         "translate.py, the output is the input": {"in.en": b"A dog.\n"},
         **{name: {"in.en": b"A dog.\n"} for name in (
             "translate.py, --alignment_layer without --alignment",
             "translate.py, --alignment of an ensemble",
             "translate.py, --alignment of a layer the model lacks")}}


@pytest.fixture(scope="module")
def commands(run, tmp_path_factory):
  """The state of the run, and every command of COMMANDS, started at once (each spends its
  time importing): {id: (its process, its directory)}."""
  before = state(run)
  hide = tmp_path_factory.mktemp("hide")  # Python imports its sitecustomize at start-up.
  (hide / "sitecustomize.py").write_text(
      "import os, sys\nsys.modules[os.environ['HIDE']] = None  # import raises\n")
  started = {}
  for name, (script, *args), _ in COMMANDS:
    tmp = tmp_path_factory.mktemp("command")
    for file, data in FILES.get(name, {}).items():
      (tmp / file).write_bytes(data)
    args = [a.format(run=run, tmp=tmp, tiny=ROOT / "configs" / "tiny.py") for a in args]
    env = (dict(ENV, PYTHONPATH=f"{hide}{os.pathsep}{ENV['PYTHONPATH']}", HIDE=MISSING[name])
           if name in MISSING else ENV)
    started[name] = subprocess.Popen([sys.executable, str(ROOT / "scripts" / script), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env), tmp
  yield before, started
  for process, _ in started.values():
    process.kill()


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
@pytest.mark.parametrize("name,expected", [(c[0], c[2]) for c in COMMANDS],
                         ids=[c[0] for c in COMMANDS])
def test_the_command_prints_one_line_and_exits_with_status_2(run, commands, name, expected):
  before, started = commands
  process, tmp = started[name]
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 2, stderr[-3000:]
  assert stderr.splitlines() == ["error: " + expected.format(run=run, tmp=tmp)]
  assert state(run) == before
  assert not (tmp / "new").exists()


def test_no_pickle_anywhere():
  """Loading a checkpoint, vocabulary or config never runs code from the file."""
  unsafe = re.compile(r"\bimport (c?pickle|dill|shelve|marshal)\b|\bfrom (c?pickle|dill|shelve)\b"
                      r"|allow_pickle\s*=\s*True|\btorch\.load\(|\byaml\.(unsafe_)?load\(")
  sources = sorted((ROOT / "seq2seq").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
  assert len(sources) > 20
  found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in sources
           for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
           if unsafe.search(line)]
  assert not found, found
