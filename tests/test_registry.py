"""One registry mechanism for every named part (seq2seq/registry.py): an entry is registered
once, read when a command runs, and one that a run's own Python file registers
(`config.train.extensions`, docs/extending.md) trains and decodes through the commands."""

import json
import re
import subprocess
import sys

import jax.numpy as jnp
import pytest

from seq2seq import config as config_lib
from seq2seq import models, registry
from seq2seq.errors import UserError
from seq2seq.models import attention, local_rnn, normalizers, positions, rnn, transformer
from seq2seq.runs import workdirs
from seq2seq.training import actions, steps
from tests.helpers import ENV, ROOT, train_command

# A user's own file, outside the package (docs/extending.md's): a softmax score (cosine
# similarity) and a position scheme (minus a sixteenth of the distance, every head).
EXAMPLE = ROOT / "examples" / "my_parts.py"


def user_file(path, score="cosine_sim", positions_name="distance_bias"):
  """The example written to `path`, its entries named `score` and `positions_name`."""
  text = EXAMPLE.read_text(encoding="utf-8")
  path.write_text(text.replace('"cosine_sim"', f'"{score}"').replace(
      '"distance_bias"', f'"{positions_name}"'), encoding="utf-8")
  return path


def test_the_docs_show_the_example_file_as_it_is():
  """docs/extending.md, "Your own file", shows examples/my_parts.py's code (without its
  docstring), which the tests below run."""
  doc = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
  shown = re.search(r"\(`examples/my_parts.py`\):\n\n```python\n(.*?)```", doc, re.S)
  text = EXAMPLE.read_text(encoding="utf-8")
  assert shown and shown.group(1) == text[text.index('"""', 3) + 3:].lstrip("\n")


def test_a_registry_refuses_a_taken_name_in_one_line_and_registers_by_call_or_decorator():
  with pytest.raises(ValueError) as e:
    positions.POSITIONS.register("sinusoidal", object())
  assert str(e.value) == ("A position scheme named 'sinusoidal' is already registered; choose"
                          " another name.")
  with pytest.raises(ValueError, match="A normalizer named 'softmax' is already registered"):
    normalizers.NORMALIZERS.register("softmax")
  # A score's name is a variant's and an RNN kernel's too: one a variant holds is taken.
  with pytest.raises(ValueError, match="An attention score named 'linear' is taken by an"
                     " attention variant of that name; choose another name."):
    attention.SCORES.register("linear", attention.SCORES["dot"])
  with pytest.raises(ValueError, match="taken by an attention of the RNN of that name"):
    attention.SCORES.register("local_m", attention.SCORES["dot"])
  entry = object()
  with normalizers.NORMALIZERS.registered("mine", entry):
    assert normalizers.NORMALIZERS["mine"] is entry
  assert "mine" not in normalizers.NORMALIZERS
  decorated = actions.ACTIONS.register("mine")(type("Mine", (), {}))
  try:
    assert actions.ACTIONS["mine"] is decorated
    with pytest.raises(ValueError, match="A loop action named 'mine' is already registered"):
      actions.ACTIONS.register("mine")
  finally:
    del actions.ACTIONS["mine"]


def test_model_and_training_registries_are_one_class():
  for entries in (attention.SCORES, attention.VARIANTS, positions.POSITIONS,
                  normalizers.NORMALIZERS, local_rnn.KERNELS, steps.LOSS_TERMS, actions.ACTIONS):
    assert type(entries) is registry.Registry


def test_a_registered_score_is_a_variant_and_an_rnn_kernel_until_it_is_removed():
  score = attention.SCORES["dot"]
  before = {name: tuple(names) for name, names in models.ATTENTION_BY_FAMILY.items()}
  with attention.SCORES.registered("dot_again", score):
    assert attention.VARIANTS["dot_again"].init is score.init
    assert isinstance(local_rnn.KERNELS["dot_again"], local_rnn.Softmax)
    assert models.ATTENTION_BY_FAMILY["transformer"] == (*before["transformer"], "dot_again")
    assert "dot_again" in rnn.RNN.ATTENTION_NAMES and "dot_again" in rnn.RNN.NORMALIZED
    assert "dot_again" in transformer.Transformer.NORMALIZED
  assert "dot_again" not in attention.VARIANTS and "dot_again" not in local_rnn.KERNELS
  assert {name: tuple(names) for name, names in models.ATTENTION_BY_FAMILY.items()} == before


@pytest.mark.parametrize("family", models.FAMILY_NAMES)
def test_check_config_takes_a_registered_entry_and_refuses_it_once_removed(family, tiny_config):
  c = tiny_config
  c.model.family, c.model.attention = family, "cosine_again"
  with attention.SCORES.registered("cosine_again", attention.SCORES["scaled_dot"]):
    models.check_config(c)
    assert models.build_model(c, 40)
  with pytest.raises(UserError, match="config.model.attention='cosine_again' is not available"):
    models.check_config(c)
  c = config_lib.base_config()
  c.model.positions, c.model.attention_normalizer = "no_order", "also_softmax"
  with (positions.POSITIONS.registered("no_order", positions.Positions()),
        normalizers.NORMALIZERS.registered("also_softmax", normalizers.NORMALIZERS["softmax"])):
    models.check_config(c)
  with pytest.raises(UserError, match="config.model.positions='no_order' is not a way of"):
    models.check_config(c)


def test_the_run_config_imports_its_files_before_it_is_checked(tmp_path, tiny_config):
  """`config.train.extensions`: a file, by path, registers entries that check_config then
  takes; imported once per process, however often a config names it."""
  path = user_file(tmp_path / "my_parts.py", "cosine_unit", "distance_unit")
  c = tiny_config
  c.train.extensions = str(path)
  c.model.attention, c.model.positions = "cosine_unit", "distance_unit"
  try:
    models.check_config(c)
    models.check_config(c)  # Again: not imported twice (which would register twice).
    model = models.build_model(c, 40)
    memory = model.encode(jnp.array([[5, 6, 3]]))
    assert model.decode(memory, jnp.array([[2, 7]])).shape == (1, 2, 40)
  finally:  # What the file registered, and the file, as if never imported.
    for name, entries in (("cosine_unit", attention.SCORES),
                          ("distance_unit", positions.POSITIONS)):
      if name in entries:
        del entries[name]  # (A score's variant and RNN kernel go with it.)
    for name in [n for n, m in sys.modules.items()
                 if getattr(m, "__file__", None) == str(path.resolve())]:
      del sys.modules[name]


@pytest.mark.parametrize("text, line", [
    ("{tmp}/missing.py", "config.train.extensions='{tmp}/missing.py': {tmp}/missing.py is not a"
     " file (a relative path is read from the directory the command runs in); give the path of"
     " the Python file that registers the run's entries, or run the command from the directory"
     " it is relative to."),
    ("{tmp}/broken.py", "{tmp}/broken.py:2: ValueError: A position scheme named 'rope' is"
     " already registered; choose another name. (raised while importing"
     " config.train.extensions's {tmp}/broken.py); fix the file."),
    ("no_such_module_here", "config.train.extensions='no_such_module_here': no module named"
     " 'no_such_module_here' can be imported; pass a Python file's path (ending in .py) or an"
     " importable module's name, as in config.train.extensions=my_attention.py."),
    ("a.py,,b.py", "config.train.extensions='a.py,,b.py' has an empty item (two commas in a"
     " row, or one at an end); separate its files by single commas, as in"
     " config.train.extensions=my_attention.py."),
])
def test_an_extension_that_cannot_be_imported_is_one_line_naming_it(tmp_path, text, line):
  (tmp_path / "broken.py").write_text(
      "from seq2seq.models.positions import POSITIONS, Positions\n"
      "POSITIONS.register('rope', Positions())\n")
  with pytest.raises(UserError) as e:
    registry.import_extensions(text.format(tmp=tmp_path))
  assert str(e.value) == line.format(tmp=tmp_path)


def test_no_extension_imports_nothing():
  modules = set(sys.modules)
  registry.import_extensions("")
  assert set(sys.modules) == modules
  assert config_lib.base_config().train.extensions == ""
  # A config saved before the field existed reads back without it: none.
  saved = json.loads(config_lib.to_json(config_lib.base_config()))
  del saved["train"]["extensions"]
  assert config_lib.from_saved(saved).train.extensions == ""


def test_a_users_file_trains_through_the_command_and_its_run_decodes_without_it(tmp_path):
  """docs/extending.md, "Your own file": `seq2seq-train --config.train.extensions=FILE`
  chooses a score and a position scheme the file registers; `seq2seq-translate` reads the
  run's config.json, imports the same file, and decodes with no flag for it. The relative path
  is read from the directory the commands run in (so both run in the file's)."""
  user_file(tmp_path / "my_parts.py")
  workdir = tmp_path / "run"
  train = subprocess.run(
      train_command(workdir, "--config.train.extensions=my_parts.py",
                    "--config.model.attention=cosine_sim",
                    "--config.model.positions=distance_bias", "--config.train.num_steps=2",
                    "--config.eval.every_steps=2", "--config.eval.test_beam_size=0"),
      cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300)
  assert train.returncode == 0, train.stderr[-3000:]
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["train"]["extensions"] == "my_parts.py"
  assert (saved["model"]["attention"], saved["model"]["positions"]) == ("cosine_sim",
                                                                        "distance_bias")
  translate = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "translate.py"), f"--workdir={workdir}",
       "--beam_size=2"], input="A dog runs.\nTwo men.\n", cwd=tmp_path, capture_output=True,
      text=True, env=ENV, timeout=300)
  assert translate.returncode == 0, translate.stderr[-3000:]
  assert len(translate.stdout.split("\n")) == 3


def test_a_runs_file_that_is_not_where_its_config_says_is_one_line(tmp_path, monkeypatch):
  """A command reading a run (`workdirs.read_run_config`, as seq2seq-translate, -evaluate,
  -compare, -serve and -export do) from a directory where the run's relative path leads
  nowhere: the line names the config.json and what to do."""
  config = config_lib.base_config()
  config.train.extensions = "my_parts.py"
  (tmp_path / "config.json").write_text(config_lib.to_json(config))
  monkeypatch.chdir(ROOT)
  with pytest.raises(UserError) as e:
    workdirs.read_run_config(tmp_path)
  assert str(e.value) == (
      f"{tmp_path}/config.json: config.train.extensions='my_parts.py': my_parts.py is not a"
      " file (a relative path is read from the directory the command runs in); give the path"
      " of the Python file that registers the run's entries, or run the command from the"
      " directory it is relative to.")
