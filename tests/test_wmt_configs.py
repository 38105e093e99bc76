"""The WMT14 en->de configs: paper settings, loadable from the command line, and trainable end
to end on mock TFDS data with the model shrunk."""

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from seq2seq import config as config_lib
from seq2seq import models
from seq2seq.evaluation.evaluate import run_evaluation
from seq2seq.runs import train_state
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.training import loop
from tests.helpers import ROOT, TFDS_EXTRA, load_config, read_metrics

CONFIGS = {"wmt14_ende_transformer_base": (512, 8, 2048, 0.1, 5),
           "wmt14_ende_transformer_big": (1024, 16, 4096, 0.3, 20)}


def _parse(name: str):
  """The config as scripts/train.py gets it from `--config=configs/<name>.py`."""
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
  values(["train.py", f"--config={ROOT / 'configs' / f'{name}.py'}"])
  return values.config


@pytest.mark.parametrize("name", CONFIGS)
def test_config_follows_the_paper_and_validates(name):
  c = _parse(name)
  config_lib.validate(c)
  models.check_config(c)
  dim, heads, mlp, dropout, keep = CONFIGS[name]
  m, t = c.model, c.train
  assert (m.emb_dim, m.num_heads, m.mlp_dim, m.dropout_rate) == (dim, heads, mlp, dropout)
  assert (m.num_encoder_layers, m.num_decoder_layers, m.pre_ln) == (6, 6, False)
  assert (c.data.corpus, c.data.src_lang, c.data.tgt_lang, c.data.vocab_size) == (
      "tfds:wmt14_translate/de-en", "en", "de", 32_000)
  rows = c.data.tokens_per_batch // c.data.max_len  # Packed: every row is max_len long.
  assert 24_000 <= rows * c.data.max_len <= 33_000
  assert (t.adam_b1, t.adam_b2, t.adam_eps, t.label_smoothing) == (0.9, 0.98, 1e-9, 0.1)
  # Vaswani et al., eq. 3: lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5).
  schedule = train_state.learning_rate_schedule(t)
  for step in (100, 4000, 20_000, 100_000):
    paper = dim**-0.5 * min(step**-0.5, step * 4000**-1.5)
    np.testing.assert_allclose(float(schedule(step)), paper, rtol=1e-5)
  assert (c.eval.beam_size, c.eval.alpha, c.checkpoint.keep) == (4, 0.6, keep)
  assert c.checkpoint.every_steps > 0


def _shrunk(name: str):
  """The config with a seconds-scale model and data; everything else as in the file."""
  c = load_config(name)
  c.model.emb_dim, c.model.num_heads, c.model.mlp_dim = 32, 4, 64
  c.model.num_encoder_layers = c.model.num_decoder_layers = 1
  c.data.vocab_size, c.data.max_len, c.data.tokens_per_batch = 200, 32, 128
  c.train.dtype = "float32"  # bfloat16 is slow on CPU (tests/test_train.py covers it).
  c.train.num_steps = c.eval.every_steps = 2
  c.train.log_every_steps = c.checkpoint.every_steps = 1
  c.checkpoint.keep = 2
  c.eval.batch_size, c.eval.max_sentences, c.eval.max_decode_len_b = 4, 4, 4
  return c


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_config_trains_on_mock_wmt14(tmp_path):
  """The base config, shrunk. (The big one, shrunk, differs only in dropout and learning rate:
  the same code path. That it loads and validates: test_config_follows_the_paper_and_validates.)
  """
  tfds = pytest.importorskip("tensorflow_datasets", reason=TFDS_EXTRA)
  c = _shrunk("wmt14_ende_transformer_base")
  c.eval.beam_size = 1  # Greedy validation compiles faster; the slow test below uses beam 4.
  with tfds.testing.mock_data(num_examples=24):
    result = loop.train_and_evaluate(c, tmp_path)
  assert result["step"] == 2 and np.isfinite(result["loss"])
  assert Checkpoints(tmp_path, keep=2).all_steps() == [1, 2]  # checkpoint.every_steps=1
  train_records = [r for r in read_metrics(tmp_path) if r["split"] == "train"]
  assert len(train_records) == 2 and all(r["tokens_per_step"] > 0 for r in train_records)


@pytest.mark.slow  # beam search compiled twice
def test_docstring_evaluation_averages_checkpoints_on_mock_wmt14(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets", reason=TFDS_EXTRA)
  c = _shrunk("wmt14_ende_transformer_base")
  c.train.num_steps = 3
  with tfds.testing.mock_data(num_examples=24):
    assert loop.train_and_evaluate(c, tmp_path)["step"] == 3
    scores, prefix = run_evaluation(tmp_path, split="test", checkpoint="avg:2", beam_size=4,
                                    alpha=0.6, batch_size=8)
  assert 0.0 <= scores["bleu"] <= 100.0
  assert prefix.name == "test.avg2.beam4"
