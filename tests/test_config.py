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


def test_the_former_default_is_the_default_with_its_documented_line():
  """configs/multi30k_transformer.py carries rotary positions and attention dropout; the default
  before them is the line of overrides its comment and the former default's file document, and
  that file is the default with that line, field for field."""
  default = load_config("multi30k_transformer")
  former = load_config("multi30k_transformer_sinusoidal")
  assert (default.model.positions, default.model.attention_dropout_rate) == ("rope", 0.1)
  line = "--config.model.positions=sinusoidal --config.model.attention_dropout_rate=0.0"
  for name in ("multi30k_transformer.py", "multi30k_transformer_sinusoidal.py"):
    text = " ".join((ROOT / "configs" / name).read_text().replace("#", " ").split())
    assert line in text.replace("\\ ", ""), name
  for override in line.split():
    field, value = override.removeprefix("--config.").split("=")
    section, key = field.split(".")
    default[section][key] = type(default[section][key])(value)
  assert default.to_dict() == former.to_dict()


def test_a_run_of_the_former_default_reads_as_it_trained():
  """A workdir's config.json says every field, so a change of the recipe's file does not change
  what an earlier run of it means (docs/recipe_study holds runs of both recipes)."""
  study = ROOT / "docs" / "recipe_study"
  for positions, rate in (("sinusoidal", 0.0), ("rope", 0.1)):
    run = f"positions-{positions}_attention_dropout_rate-{rate}_subword_sampling-0.0_seed-1"
    config = config_lib.from_saved(json.loads((study / run / "config.json").read_text()))
    assert (config.model.positions, config.model.attention_dropout_rate) == (positions, rate)
