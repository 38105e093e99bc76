"""The package's import graph has no cycle: every module can be read, and changed, on its own."""

import ast

from tests.conftest import ROOT

PACKAGE = ROOT / "seq2seq"


def _module_name(path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
  """{module: the seq2seq modules it imports}, from the source (nothing is executed)."""
  modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
  graph = {}
  for name, path in modules.items():
    deps = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("seq2seq"):
        for alias in node.names:  # `from seq2seq import train` names a module.
          full = f"{node.module}.{alias.name}"
          deps.add(full if full in modules else node.module)
      elif isinstance(node, ast.Import):
        deps |= {a.name for a in node.names if a.name.startswith("seq2seq")}
    graph[name] = deps - {name}
  return graph


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


def console_scripts() -> dict[str, str]:
  """pyproject.toml's [project.scripts]: {command name: "module:function"}."""
  lines = (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines()
  section = lines[lines.index("[project.scripts]") + 1:]
  entries = [line for line in section[:next((i for i, line in enumerate(section)
                                              if line.startswith("[")), len(section))]
             if "=" in line]
  return {name.strip(): value.strip().strip('"') for name, value in
          (line.split("=", 1) for line in entries)}


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
