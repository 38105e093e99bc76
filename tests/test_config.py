"""Config validation: every bad value stops the run with one line naming the fix."""

import json

import pytest
from absl import flags

from seq2seq import cli, models
from seq2seq import config as config_lib
from seq2seq.errors import UserError
from tests.conftest import ROOT, load_config
from tests.test_structure import import_graph


def check(config) -> None:
  """What training checks first: the generic fields, then what the model family can do."""
  config_lib.validate(config)
  models.check_config(config)


def test_config_does_not_import_the_models():
  graph = import_graph()
  seen, todo = set(), ["seq2seq.config"]
  while todo:
    module = todo.pop()
    if module not in seen:
      seen.add(module)
      todo += graph.get(module, ())
  assert not any(module.startswith("seq2seq.models") for module in seen), sorted(seen)


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("*.py")))
def test_shipped_configs_are_valid(name):
  config = load_config(name)
  check(config)
  if config.checkpoint.every_steps:  # Periodic checkpoints exist to be averaged: keep them.
    assert config.checkpoint.keep * config.checkpoint.every_steps >= config.eval.every_steps


@pytest.mark.parametrize("family,attention,message", [
    ("transformer", "location",
     "config.model.attention='location' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local."),
    ("transformer", "none",
     "config.model.attention='none' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local."),
    ("rnn", "linear",
     "config.model.attention='linear' is not available for the rnn; use one of:"
     " none, scaled_dot, dot, general, concat, location."),
    ("rnn", "bahdanau",
     "config.model.attention='bahdanau' is not available for the rnn; use one of:"
     " none, scaled_dot, dot, general, concat, location. (Bahdanau et al.'s additive attention"
     " is 'concat' here.)"),
    ("transformer", "Luong",
     "config.model.attention='Luong' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local. (Luong et al.'s bilinear (general)"
     " attention is 'general' here.)"),
    ("transformer", "sutskever",
     "config.model.attention='sutskever' is not available for the transformer; use one of:"
     " scaled_dot, dot, general, concat, linear, local."),
])
def test_attention_must_apply_to_the_family(family, attention, message):
  c = config_lib.base_config()
  c.model.family, c.model.attention = family, attention
  config_lib.validate(c)  # The family's checks are the models' own.
  with pytest.raises(UserError) as e:
    models.check_config(c)
  assert str(e.value) == message


@pytest.mark.parametrize("section,field,value,message", [
    ("model", "family", "lstm", "config.model.family='lstm' is not a model family;"
     " use one of: transformer, rnn."),
    ("model", "num_heads", 3, "config.model.emb_dim=256 is not divisible by"
     " config.model.num_heads=3; choose sizes where it is."),
    ("model", "rnn_cell", "rnn", "config.model.rnn_cell='rnn' is not a cell; use one of:"
     " lstm, gru."),
    ("train", "num_steps", 0, "config.train.num_steps=0 must be positive."),
    ("train", "schedule", "cos", "config.train.schedule='cos' is not a schedule; use one of:"
     " inverse_sqrt, linear, cosine."),
    ("model", "dropout_rate", 1.0, "config.model.dropout_rate=1.0 must be in [0, 1)."),
    ("data", "tgt_lang", "en", "config.data.src_lang and tgt_lang are both 'en';"
     " choose two different languages."),
    ("data", "max_len", 300, "config.data.max_len=300 pads to 304 tokens, more than"
     " config.model.max_len=256; raise model.max_len."),
])
def test_bad_values(section, field, value, message):
  c = config_lib.base_config()
  c[section][field] = value
  with pytest.raises(UserError) as e:
    check(c)
  assert str(e.value) == message


def test_unknown_field_suggests_the_closest():
  c = config_lib.base_config()
  c.model["attenton"] = "dot"
  with pytest.raises(UserError, match=r"Unknown config field model.attenton. Did you mean"
                     r" 'attention'\?"):
    config_lib.validate(c)


def test_rnn_ignores_the_head_count():
  c = config_lib.base_config()
  c.model.family, c.model.attention, c.model.num_heads = "rnn", "general", 3
  check(c)


def test_a_saved_config_missing_newer_fields_loads_with_defaults():
  c = config_lib.base_config()
  c.model.emb_dim = 64
  saved = c.to_dict()
  del saved["model"]["attention_window"]
  import json
  loaded = config_lib.from_json(json.dumps(saved))
  assert loaded.model.emb_dim == 64
  assert loaded.model.attention_window == config_lib.base_config().model.attention_window
  assert config_lib.from_json(config_lib.to_json(c)).to_dict() == c.to_dict()


def test_the_config_file_runs_once_and_takes_overrides(tmp_path):
  """scripts/train.py's --config: get_config() runs once, checked and overridden."""
  ran = tmp_path / "ran"
  path = tmp_path / "experiment.py"
  path.write_text("from seq2seq.config import base_config\n\n"
                  "def get_config():\n"
                  f"  with open({str(ran)!r}, 'a') as f:\n"
                  "    f.write('x')\n"
                  "  return base_config()\n")
  argv = ["train.py", f"--config={path}", "--config.train.num_steps=7"]
  values = flags.FlagValues()
  config = cli.define_config_flag(values, sys_argv=argv)
  cli.parse_flags(argv, values)
  assert ran.read_text() == "x"
  assert config.value.train.num_steps == 7
  assert config.value.is_locked


def test_a_run_saved_before_length_buckets_reads_as_every_length():
  saved = json.loads(config_lib.to_json(config_lib.base_config()))
  assert config_lib.from_json(json.dumps(saved)).data.num_buckets == 2
  del saved["data"]["num_buckets"]  # As runs saved it before the field.
  assert config_lib.from_json(json.dumps(saved)).data.num_buckets == 0
