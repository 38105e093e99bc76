"""The package's folders are layers: each imports only the layers below it, no module reaches
into another package's private names, and the graph has no cycle, so every module can be read,
and changed, on its own. No test module imports another."""

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
  assert {"seq2seq.training.loop", "seq2seq.evaluation.evaluate"} <= graph.keys()
  # The graph does see imports.
  assert "seq2seq.decoding.translator" in graph["seq2seq.training.trainer"]
  assert find_cycle(graph) is None


def test_the_package_imports_nothing_of_the_reproductions():
  """benchmarks/ (not installed) may import the package; the package imports nothing of it."""
  assert (ROOT / "benchmarks" / "joeynmt" / "anchor.py").is_file()
  assert {module_name(p): found for p in PACKAGE.rglob("*.py")
          if (found := imported_modules(p, "benchmarks"))} == {}


# The layers, bottom up, in the order data flows: `shared` is the top-level modules that
# every layer may use (errors, config, registry); each other layer is a subpackage.
LAYERS = ("shared", "runtime", "data", "models", "runs", "decoding", "evaluation", "training",
          "compare", "serve", "performance", "commands")
SHARED = {"__init__.py", "errors.py", "config.py", "config_files.py", "registry.py"}
MAY_IMPORT = re.compile(r"^May import: ([\w, \n]+)\.$", re.MULTILINE)


def layer(module: str) -> str:
  """`seq2seq.runs.checkpoints` -> `runs`; a top-level module -> `shared`."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "shared"


def declared_imports(package: str) -> set[str]:
  """The layers a subpackage's docstring says it may import (its "May import:" line)."""
  doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text("utf-8")))
  found = MAY_IMPORT.findall(doc or "")
  assert len(found) == 1, f"seq2seq/{package}/__init__.py needs one 'May import: ...' line"
  return {name.strip() for name in found[0].split(",")}


def test_the_top_level_is_the_shared_modules_and_one_folder_per_layer():
  entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
  assert entries == SHARED | set(LAYERS[1:])
  for package in LAYERS[1:]:
    assert ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text("utf-8")))


def test_the_package_docstring_lists_the_layers_in_order():
  doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text("utf-8")))
  assert re.findall(r"^  (\w+)/ ", doc, re.MULTILINE) == list(LAYERS[1:])


def test_each_package_imports_only_the_layers_it_declares_and_they_lie_below_it():
  graph = import_graph()
  for package in LAYERS[1:]:
    declared = declared_imports(package)
    below = set(LAYERS[:LAYERS.index(package)])
    assert declared <= below, f"{package} declares {sorted(declared - below)}, not below it"
    imported = {layer(dep) for module, deps in graph.items() if layer(module) == package
                for dep in deps} - {package}
    assert imported <= declared, f"{package} imports {sorted(imported - declared)} undeclared"
  assert {layer(dep) for module, deps in graph.items() if layer(module) == "shared"
          for dep in deps} <= {"shared"}


def test_declared_imports_read_the_may_import_line(tmp_path, monkeypatch):
  package = tmp_path / "seq2seq" / "layer"
  package.mkdir(parents=True)
  (package / "__init__.py").write_text('"""What it owns.\n\nMay import: shared,\ndata."""\n')
  monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "seq2seq")
  assert declared_imports("layer") == {"shared", "data"}
  assert layer("seq2seq.layer.x") == "layer" and layer("seq2seq.config") == "shared"


def private_imports(path) -> list[str]:
  """The private names (`_name`) of another package's modules that the module at `path` uses:
  imported by name, or read as an attribute of an imported module."""
  own = layer(module_name(path))
  tree = ast.parse(path.read_text(encoding="utf-8"))
  modules, found = {}, []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seq2seq"):
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        if (PACKAGE.parent / f"{full.replace('.', '/')}.py").is_file():
          modules[alias.asname or alias.name] = full
        elif alias.name.startswith("_") and layer(node.module) != own:
          found.append(f"{node.module}.{alias.name}")
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.attr.startswith("_") and not node.attr.startswith("__")
        and node.value.id in modules and layer(modules[node.value.id]) != own):
      found.append(f"{modules[node.value.id]}.{node.attr}")
  return found


def test_private_imports_sees_names_and_attributes(tmp_path):
  module = PACKAGE / "compare" / "_probe_for_test.py"
  module.write_text("from seq2seq.runs import workdirs\nfrom seq2seq.runs.workdirs import _x\n"
                    "from seq2seq.compare import sweep\nworkdirs._y, sweep._z, workdirs.CONFIG\n")
  try:
    assert private_imports(module) == ["seq2seq.runs.workdirs._x", "seq2seq.runs.workdirs._y"]
  finally:
    module.unlink()


def test_no_module_uses_another_packages_private_names():
  assert {str(p.relative_to(ROOT)): found for p in PACKAGE.rglob("*.py")
          if (found := private_imports(p))} == {}


def function_lines(node) -> int:
  """A function's lines, from its `def` to its last line: its docstring, comments and blank
  lines count (a decorator above the `def` does not)."""
  return node.end_lineno - node.lineno + 1


def test_function_lines_count_every_line_from_the_def_to_the_end():
  source = ('@decorator\ndef f():\n  """Doc.\n\n  More."""\n  # note\n\n  x = 1\n  return x\n'
            "\n\ndef g(): return 1\n")
  f, g = ast.parse(source).body
  assert function_lines(f) == 8 and function_lines(g) == 1


def test_no_function_is_over_50_lines_and_no_module_over_400_lines():
  long_functions, long_modules = {}, {}
  for path in PACKAGE.rglob("*.py"):
    source = path.read_text(encoding="utf-8")
    if (n := len(source.splitlines())) > 400:
      long_modules[str(path.relative_to(ROOT))] = n
    for node in ast.walk(ast.parse(source)):
      if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and (n := function_lines(node)) > 50):
        long_functions[f"{path.relative_to(ROOT)}:{node.name}"] = n
  assert long_functions == {} and long_modules == {}


def test_the_training_package_is_at_most_1200_lines():
  """Training drives what the layers below it own (a run's workdir and checkpoints, the
  batches, the shardings, the scores): what grows there is not training's (issue 81)."""
  lines = {p.name: len(p.read_text(encoding="utf-8").splitlines())
           for p in (PACKAGE / "training").glob("*.py")}
  assert {"loop.py", "trainer.py", "steps.py"} <= lines.keys()
  assert sum(lines.values()) <= 1200, lines


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
  `base_config` and the model's defaults it builds (`_model_defaults`): configuration, not
  dispatch."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  skipped = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.FunctionDef) and node.name in ("base_config", "_model_defaults"):
      skipped |= {id(n) for n in ast.walk(node)}
  return [(node.lineno, node.value) for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and node.value in names and id(node) not in skipped]


def test_spelled_names_sees_dispatch_but_not_defaults(tmp_path):
  module = tmp_path / "m.py"
  module.write_text('def base_config():\n  x = "rnn"\n\ndef f(c):\n  return c == "rnn"\n'
                    '\ndef _model_defaults():\n  m = "rnn"\n')
  assert spelled_names(module, {"rnn"}) == [(5, "rnn")]


def test_no_family_or_variant_is_named_outside_models():
  from seq2seq import models
  names = set(models.FAMILY_NAMES) | {n for names in models.ATTENTION_BY_FAMILY.values()
                                  for n in names}
  found = {str(p.relative_to(ROOT)): spelled for p in PACKAGE.rglob("*.py")
           if "models" not in p.parts and (spelled := spelled_names(p, names))}
  # Homonyms: the learning-rate schedule `linear` and XLA's `dot` opcode, not the variants.
  homonyms = {"seq2seq/config.py": {"linear"}, "seq2seq/runs/train_state.py": {"linear"},
              "seq2seq/performance/profile.py": {"dot"}}
  assert {path: spelled for path, spelled in found.items()
          if {name for _, name in spelled} - homonyms.get(path, set())} == {}


def test_every_command_is_a_console_script_and_a_script_alias():
  """`seq2seq-<name>` runs `seq2seq.commands.main.<name>`, which runs
  seq2seq/commands/<name>.py; and scripts/<name>.py, where there is one, only calls that
  function, so the set-up (seq2seq.commands.main) is written once."""
  commands = {p.stem for p in (PACKAGE / "commands").glob("*.py")} - {"__init__", "main", "cli"}
  assert {"train", "evaluate", "translate"} <= commands
  assert console_scripts() == {f"seq2seq-{name.replace('_', '-')}":
                               f"seq2seq.commands.main:{name}" for name in commands}
  main = {node.name: ast.unparse(node.body[-1]) for node in
          ast.parse((PACKAGE / "commands" / "main.py").read_text(encoding="utf-8")).body
          if isinstance(node, ast.FunctionDef) and node.name in commands}
  assert main == {name: f"run({name!r})" for name in commands}
  scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
  assert {"train", "evaluate", "translate"} <= scripts <= commands
  for name in scripts:
    body = ast.parse((ROOT / "scripts" / f"{name}.py").read_text(encoding="utf-8")).body
    assert ast.get_docstring(ast.Module(body, [])), name
    assert [ast.unparse(node) for node in body[1:]] == [
        "from seq2seq.commands import main", f"if __name__ == '__main__':\n    main.{name}()"], name
