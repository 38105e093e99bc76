"""The package's import graph has no cycle: every module can be read, and changed, on its own;
and no test module imports another."""

import ast
import re

from tests.helpers import (
  PACKAGE,
  ROOT,
  console_scripts,
  import_graph,
  imported_modules,
  module_name,
)

TESTS = ROOT / "tests"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle as [a, b, ..., a], or None."""
  state = {}

  def visit(node, path):
    state[node] = "open"
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == "open":
        return path[path.index(dep):] + [dep]
      if dep not in state and (cycle := visit(dep, path + [dep])):
        return cycle
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state and (cycle := visit(node, [node])):
      return cycle
  return None


def test_find_cycle_finds_one():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle():
  graph = import_graph()
  assert {"seq2seq.train", "seq2seq.evaluate", "seq2seq.train_state"} <= graph.keys()
  assert "seq2seq.translator" in graph["seq2seq.trainer"]  # The graph does see imports.
  assert find_cycle(graph) is None


IMPORTS_IN_CODE = re.compile(r"^\s*(?:from\s+(tests(?:\.\w+)*)\s+import\s+([\w, ]+)"
                             r"|import\s+(tests(?:\.\w+)*))", re.MULTILINE)


def imported_test_modules(path) -> set[str]:
  """The modules of tests/ other than tests.helpers that `path` imports: in its own import
  statements, and in code it hands to Python as a string (a script a test starts)."""
  known = {module_name(p) for p in TESTS.glob("*.py")}
  found = imported_modules(path, "tests", known)
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      for package, names, module in IMPORTS_IN_CODE.findall(node.value):
        if module:
          found.add(module)
        else:
          found |= {full if (full := f"{package}.{n.strip()}") in known else package
                    for n in names.split(",")}
  return found - {"tests", "tests.helpers"}


def test_imported_test_modules_sees_imports_and_code_in_strings(tmp_path):
  module = tmp_path / "m.py"
  # `{t}` for "tests": this file's own strings hold no import of a test module.
  module.write_text("import {t}.test_cli\nfrom {t} import helpers, test_data\n"
                    "from {t}.helpers import ROOT\nfrom {t}.conftest import x\n"
                    "CODE = 'import os\\nfrom {t}.test_train import read_metrics\\n'\n"
                    .format(t="tests"))
  assert imported_test_modules(module) == {"tests.test_cli", "tests.test_data",
                                           "tests.conftest", "tests.test_train"}


def test_no_test_module_imports_another():
  """What tests share is in tests/helpers.py (and fixtures in conftest.py): a test module
  can be read, run and changed on its own."""
  modules = sorted(TESTS.glob("*.py"))
  assert {"conftest.py", "helpers.py", "test_cli.py"} <= {p.name for p in modules}
  assert {p.name: found for p in modules if (found := imported_test_modules(p))} == {}


def test_conftest_holds_only_fixtures():
  """Plain functions go to tests/helpers.py, where every test module can import them (private
  ones, `_name`, are conftest's own session set-up)."""
  tree = ast.parse((TESTS / "conftest.py").read_text(encoding="utf-8"))
  functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
  assert functions
  assert [f.name for f in functions if not f.name.startswith(("pytest_", "_")) and not any(
      "fixture" in ast.unparse(d) for d in f.decorator_list)] == []


def spelled_names(path, names: set[str]) -> list[tuple[int, str]]:
  """(line, name) of each string constant in `path` that is one of `names`, outside
  `base_config` (whose defaults are configuration, not dispatch)."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  skipped = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.FunctionDef) and node.name == "base_config":
      skipped |= {id(n) for n in ast.walk(node)}
  return [(node.lineno, node.value) for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and node.value in names and id(node) not in skipped]


def test_spelled_names_sees_dispatch_but_not_defaults(tmp_path):
  module = tmp_path / "m.py"
  module.write_text('def base_config():\n  x = "rnn"\n\ndef f(c):\n  return c == "rnn"\n')
  assert spelled_names(module, {"rnn"}) == [(5, "rnn")]


def test_no_family_or_variant_is_named_outside_models():
  from seq2seq import models
  names = set(models.FAMILY_NAMES) | {n for names in models.ATTENTION_BY_FAMILY.values()
                                  for n in names}
  found = {str(p.relative_to(ROOT)): spelled for p in PACKAGE.rglob("*.py")
           if "models" not in p.parts and (spelled := spelled_names(p, names))}
  # Homonyms: the learning-rate schedule `linear` and XLA's `dot` opcode, not the variants.
  homonyms = {"seq2seq/train_state.py": {"linear"}, "seq2seq/profile.py": {"dot"}}
  assert {path: spelled for path, spelled in found.items()
          if {name for _, name in spelled} - homonyms.get(path, set())} == {}


def test_every_command_is_a_console_script_and_a_script_alias():
  """`seq2seq-<name>` runs `seq2seq.main.<name>`, which runs seq2seq/commands/<name>.py; and
  scripts/<name>.py, where there is one, only calls that function, so the set-up
  (seq2seq.main) is written once."""
  commands = {p.stem for p in (PACKAGE / "commands").glob("*.py")} - {"__init__"}
  assert {"train", "evaluate", "translate"} <= commands
  assert console_scripts() == {f"seq2seq-{name.replace('_', '-')}": f"seq2seq.main:{name}"
                               for name in commands}
  main = {node.name: ast.unparse(node.body[-1]) for node in
          ast.parse((PACKAGE / "main.py").read_text(encoding="utf-8")).body
          if isinstance(node, ast.FunctionDef) and node.name in commands}
  assert main == {name: f"run({name!r})" for name in commands}
  scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
  assert {"train", "evaluate", "translate"} <= scripts <= commands
  for name in scripts:
    body = ast.parse((ROOT / "scripts" / f"{name}.py").read_text(encoding="utf-8")).body
    assert ast.get_docstring(ast.Module(body, [])), name
    assert [ast.unparse(node) for node in body[1:]] == [
        "from seq2seq import main", f"if __name__ == '__main__':\n    main.{name}()"], name
