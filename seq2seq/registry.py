"""Named extensions that a config field chooses, one mechanism for every layer: the attention
scores and variants (`models.attention.SCORES`, `VARIANTS`), positions
(`models.positions.POSITIONS`), normalizers (`models.normalizers.NORMALIZERS`), the RNN's
kernels (`models.local_rnn.KERNELS`), loss terms (`training.steps.LOSS_TERMS`) and loop
actions (`training.actions.ACTIONS`), each a `Registry`.

An entry is added where it is written, by `register(name)` (a decorator, or a call with the
entry), never by editing a module's globals: in the package, or in a user's own Python file
that `config.train.extensions` names, which every command imports (`import_extensions`) before
it checks the config. Whatever reads a registry reads it when a command runs, never a copy
made at import (what a family declares it takes is `live`), so such an entry is as good as a
built-in one (docs/extending.md).
"""

import contextlib
import hashlib
import importlib
import importlib.util
import math
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seq2seq.errors import UserError

_ENTRY = object()  # `register(name)` without an entry: the decorator.


def _a(what: str, article: str = "A") -> str:
  """`what` after its indefinite article ("A" or "a")."""
  return f"{article}{'n' * (what[:1] in 'aeiou')} {what}"


class Registry(dict):
  """Entries by name, each added once by `register(name)`. `field` (such as
  "config.train.actions") chooses among them: `"name,..."`, or where the registry is
  `weighted`, `"name:weight,..."`, as in `example`; `reserved` are names an entry may not
  take; `entries` are those it starts with (the package's own)."""

  def __init__(self, what: str, field: str, example: str = "", *,
               entries: dict[str, Any] | None = None, weighted: bool = False,
               reserved: tuple[str, ...] = ()):
    super().__init__(entries or {})
    self.what, self.field, self.example = what, field, f"{field}={example}"
    self.weighted, self.reserved = weighted, reserved
    self._followers: list[tuple[Registry, Callable[[str, Any], Any]]] = []
    self._derived: dict[str, Registry] = {}  # Name -> the registry its entry comes from.

  def follows(self, source: "Registry", convert: Callable[[str, Any], Any]) -> None:
    """Every entry of `source` is one here too, as `convert(name, entry)`: those it holds
    now (but names held here already) and those registered in it later, until they are
    removed from it (as every softmax score is an attention variant)."""
    for name, entry in source.items():
      if name not in self:
        self._derived[name] = source
        dict.__setitem__(self, name, convert(name, entry))
    source._followers.append((self, convert))

  def _taken(self, name: str) -> str | None:
    """Why `name` cannot be registered here (None: it can), also where a follower holds it."""
    if name in self.reserved:
      return "reserved"
    if name in self:
      return "already registered"
    for follower, _ in self._followers:
      if follower._taken(name):
        return f"taken by {_a(follower.what, 'a')} of that name"
    return None

  def register(self, name: str, entry: Any = _ENTRY):
    """Registers `entry` as `name` and returns it; without `entry`, the decorator that
    registers what it decorates and returns it unchanged.

    Raises:
      ValueError: `name` is taken (registered already, reserved, or held by a registry that
        follows this one).
    """
    if (taken := self._taken(name)) is not None:
      raise ValueError(f"{_a(self.what)} named {name!r} is {taken}; choose another name.")

    def add(entry):
      self[name] = entry
      return entry

    return add if entry is _ENTRY else add(entry)

  def __setitem__(self, name: str, entry) -> None:
    super().__setitem__(name, entry)
    self._derived.pop(name, None)
    for follower, convert in self._followers:
      if name not in follower or follower._derived.get(name) is self:
        follower[name] = convert(name, entry)
        follower._derived[name] = self

  def __delitem__(self, name: str) -> None:
    super().__delitem__(name)
    self._derived.pop(name, None)
    for follower, _ in self._followers:
      if follower._derived.get(name) is self:
        del follower[name]

  @contextlib.contextmanager
  def registered(self, name: str, entry):
    """Within, `entry` is registered as `name`; after, it is not (a test's or notebook's)."""
    self.register(name, entry)
    try:
      yield entry
    finally:
      del self[name]

  def chosen(self, text: str) -> dict[str, float | None]:
    """The entries that `field`'s value `text` chooses, in its order: name -> weight (None
    where the registry is not weighted). `""` chooses none.

    Raises:
      UserError: in one line, if an item is empty or malformed, a weight is not a finite
        number, a name comes twice, or a name is not registered (listing those that are).
    """
    if not text.strip():
      return {}
    chosen = {}
    for item in (part.strip() for part in text.split(",")):
      name, weight = self._parsed(item, text)
      if name in chosen:
        raise UserError(f"{self.field}={text!r} names {name!r} twice; name each once.")
      if name not in self:
        names = (f"the registered ones are: {', '.join(sorted(self))}" if self else
                 f"no {self.what} is registered")
        raise UserError(f"{self.field}={text!r}: {name!r} is not a registered {self.what};"
                        f" {names} (docs/extending.md adds one).")
      chosen[name] = weight
    return chosen

  def _parsed(self, item: str, text: str) -> tuple[str, float | None]:
    """One item of `text`: its name and weight (None where not `weighted`)."""
    if not item:
      raise UserError(f"{self.field}={text!r} has an empty item (two commas in a row, or one"
                      f" at an end); separate its items by single commas, as in {self.example}.")
    if not self.weighted:
      return item, None
    name, colon, weight = (part.strip() for part in item.partition(":"))
    if not (colon and name and weight):
      raise UserError(f"{self.field}={text!r}: {item!r} is not name:weight; pass items such as"
                      f" {self.example} (several separated by commas).")
    try:
      value = float(weight)
    except ValueError:
      value = math.nan
    if not math.isfinite(value):
      raise UserError(f"{self.field}={text!r}: the weight of {name!r}, {weight!r}, is not a"
                      f" finite number; pass one, as in {self.example}.")
    return name, value


class live:
  """A class attribute computed each time it is read, `compute(cls)`: what a class declares
  from the registries (a family's `ATTENTION_NAMES`) then holds what is registered when a
  command runs, not what was at import."""

  def __init__(self, compute: Callable[[type], Any]):
    self.compute = compute

  def __get__(self, instance, owner: type):
    return self.compute(owner)


# The config field that names a run's own Python files or modules (seq2seq/config.py).
EXTENSIONS_FIELD = "config.train.extensions"
_EXAMPLE = f"{EXTENSIONS_FIELD}=my_attention.py"


def import_extensions(text: str) -> None:
  """Imports each Python file (a path: it ends in .py or holds a /) or module that `text`,
  the value of `config.train.extensions`, names, comma-separated, in its order, once per
  process: the entries they register then exist when the config is checked. `""`: none.

  Raises:
    UserError: in one line, naming the item and the fix, if an item is empty, a file does
      not exist, a module is not found, or importing one raises.
  """
  items = [part.strip() for part in text.split(",")] if text.strip() else []
  if "" in items:
    raise UserError(f"{EXTENSIONS_FIELD}={text!r} has an empty item (two commas in a row, or"
                    f" one at an end); separate its files by single commas, as in {_EXAMPLE}.")
  for item in items:
    if item.endswith(".py") or "/" in item:
      _import_file(item, text)
    else:
      _import_module(item, text)


def _import_file(item: str, text: str) -> None:
  path = Path(item).expanduser()
  if not path.is_file():
    raise UserError(f"{EXTENSIONS_FIELD}={text!r}: {item} is not a file (a relative path is"
                    " read from the directory the command runs in); give the path of the"
                    " Python file that registers the run's entries, or run the command from the"
                    " directory it is relative to.")
  resolved = path.resolve()
  digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
  name = f"seq2seq_extension_{resolved.stem}_{digest}"
  if name in sys.modules:
    return
  spec = importlib.util.spec_from_file_location(name, resolved)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except Exception as e:
    del sys.modules[name]
    lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
             if Path(f.filename).resolve() == resolved]
    at = f"{item}:{lines[-1]}" if lines else item
    raise UserError(f"{at}: {type(e).__name__}: {_one_line(e)} (raised while importing"
                    f" {EXTENSIONS_FIELD}'s {item}); fix the file.") from e


def _import_module(item: str, text: str) -> None:
  if item in sys.modules:
    return
  try:
    importlib.import_module(item)
  except ModuleNotFoundError as e:
    if e.name is None or not (item == e.name or item.startswith(e.name + ".")):
      raise UserError(f"{item}: {type(e).__name__}: {_one_line(e)} (raised while importing"
                      f" {EXTENSIONS_FIELD}'s {item}); fix the module.") from e
    raise UserError(f"{EXTENSIONS_FIELD}={text!r}: no module named {item!r} can be imported;"
                    " pass a Python file's path (ending in .py) or an importable module's"
                    f" name, as in {_EXAMPLE}.") from None
  except Exception as e:
    raise UserError(f"{item}: {type(e).__name__}: {_one_line(e)} (raised while importing"
                    f" {EXTENSIONS_FIELD}'s {item}); fix the module.") from e


def _one_line(error: Exception) -> str:
  return " ".join(line.strip() for line in str(error).splitlines() if line.strip())
