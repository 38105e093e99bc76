"""Named extensions that a config field chooses: the loss terms (`steps.LOSS_TERMS`) and the
loop actions (`actions.ACTIONS`). An entry is added where it is written, by a decorator
(`@register_loss_term("z_loss")`), never by editing a module's globals; the training driver
reads the field (`Registry.chosen`) before anything compiles, and refuses a name that is not
registered in one line that lists those that are.
"""

import contextlib
import math

from seq2seq.errors import UserError


class Registry(dict):
  """Entries by name, each added once by `register(name)`. `field` (such as
  "config.train.actions") chooses among them: `"name,..."`, or where the registry is
  `weighted`, `"name:weight,..."`, as in `example`; `reserved` are names an entry may not
  take."""

  def __init__(self, what: str, field: str, example: str, *, weighted: bool = False,
               reserved: tuple[str, ...] = ()):
    super().__init__()
    self.what, self.field, self.example = what, field, f"{field}={example}"
    self.weighted, self.reserved = weighted, reserved

  def register(self, name: str):
    """The decorator that registers what it decorates as `name` and returns it unchanged.

    Raises:
      ValueError: `name` is taken (registered already, or reserved).
    """
    if name in self or name in self.reserved:
      taken = "reserved" if name in self.reserved else "already registered"
      raise ValueError(f"A {self.what} named {name!r} is {taken}; choose another name.")

    def add(entry):
      self[name] = entry
      return entry

    return add

  @contextlib.contextmanager
  def registered(self, name: str, entry):
    """Within, `entry` is registered as `name`; after, it is not (a test's or notebook's)."""
    self.register(name)(entry)
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
