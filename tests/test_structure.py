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
  assert "seq2seq.translator" in graph["seq2seq.train"]  # The graph does see imports.
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
  names = set(models.FAMILIES) | {n for names in models.ATTENTION_BY_FAMILY.values()
                                  for n in names}
  found = {str(p.relative_to(ROOT)): spelled for p in PACKAGE.rglob("*.py")
           if "models" not in p.parts and (spelled := spelled_names(p, names))}
  # Homonyms: the learning-rate schedule `linear` and XLA's `dot` opcode, not the variants.
  homonyms = {"seq2seq/train_state.py": {"linear"}, "seq2seq/profile.py": {"dot"}}
  assert {path: spelled for path, spelled in found.items()
          if {name for _, name in spelled} - homonyms.get(path, set())} == {}


def test_every_script_sets_up_signals_and_memory_before_anything_else():
  """The first statements after the docstring and `from seq2seq import ...`: signals (so that
  Ctrl-C during the slow imports ends the command) and malloc (before XLA's threads start)."""
  first = ["from seq2seq import allocator, signals", "signals.exit_on_signals()",
           "allocator.keep_freed_memory()"]
  for script in sorted((ROOT / "scripts").glob("*.py")):
    body = ast.parse(script.read_text(encoding="utf-8")).body[1:4]
    assert [ast.unparse(node) for node in body] == first, script.name
