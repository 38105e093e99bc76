"""Config validation and loading: the shipped configs are valid, saved configs read back, and a
config file runs once. (Each bad value's one-line message: tests/test_errors.py.)"""

import json

import pytest
from absl import flags

from seq2seq import config as config_lib
from seq2seq.commands import cli
from seq2seq.training import loop
from tests.helpers import ROOT, import_graph, load_config


def check(config) -> None:
  """What training checks first: the generic fields, what the model family can do, and the
  loss terms and loop actions it chooses."""
  loop.check_config(config)


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
