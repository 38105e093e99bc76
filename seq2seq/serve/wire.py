"""What the server sends and takes, apart from HTTP and the models: every request body checked
for text that is not text before any field is read (`refuse_what_is_not_text`), and float32
values written whole, in the fewest digits that read back as themselves (`exact`)."""

import unicodedata

import numpy as np


class BadRequest(Exception):
  """A request the server refuses: its HTTP status and one line that says why."""

  def __init__(self, status: int, reason: str):
    super().__init__(reason)
    self.status, self.reason = status, reason


def _not_text(c: str) -> bool:
  """A lone UTF-16 surrogate (no character: UTF-8 cannot encode it) or a control character
  other than a tab or a line break (Unicode category Cc; a sentence's line break is refused
  as such, `Engine._check_lines`)."""
  return "\ud800" <= c <= "\udfff" or (unicodedata.category(c) == "Cc" and c not in "\t\n\r")


def _named(c: str) -> str:
  kind = "a lone surrogate" if "\ud800" <= c <= "\udfff" else "the control character"
  return f"{kind} U+{ord(c):04X}"


def refuse_what_is_not_text(body, where: str = "") -> None:
  """Refuses (`BadRequest` 400) the first string anywhere in `body` (a request: each field,
  each entry of a list, each key and value of an object, however nested) that holds a
  character that is not text (`_not_text`), naming where it is (`target_subwords[0][2]`).
  Every request passes through it whole before any field is read (`app.TranslateRequest`,
  `Engine.translate`), so that a field added later cannot skip it: such a string can neither
  reach the vocabulary nor be written into an answer (UTF-8 cannot encode a lone surrogate)."""
  todo = [(where, body)]
  while todo:  # Depth first, in the order sent; no recursion however deep the lists nest.
    path, node = todo.pop()
    if isinstance(node, str):
      odd = next((c for c in node if _not_text(c)), None)
      if odd is not None:
        raise BadRequest(400, f"{path or 'the body'} holds {_named(odd)}, which is not text;"
                              " remove it (JSON escapes such as \\ud800 must pair into one"
                              " character).")
    elif isinstance(node, dict):
      for key in node:
        odd = next((c for c in str(key) if _not_text(c)), None)
        if odd is not None:
          raise BadRequest(400, f"a field name{' in ' + path if path else ''} holds"
                                f" {_named(odd)}, which is not text; send the documented"
                                " fields only, such as {\"text\": [\"A dog runs.\"]}.")
      todo.extend((f"{path}.{key}" if path else str(key), node[key])
                  for key in reversed(list(node)))
    elif isinstance(node, list | tuple):
      todo.extend((f"{path}[{i}]", node[i]) for i in reversed(range(len(node))))


def exact(values) -> list:
  """float32 `values` as nested lists of Python floats, each written (as JSON writes a float)
  in the fewest significant digits from 6 to 9 that read back as the same float32: an exact 0
  stays 0 and the smallest weight stays itself, in about 10 characters a weight where the
  float32's own float64 takes 19."""
  x = np.asarray(values, np.float32)
  wide = x.astype(np.float64)
  out = wide.copy()  # Zeros and non-finite values as they are; others where a shorter reads back.
  todo = np.flatnonzero((wide != 0) & np.isfinite(wide))
  if todo.size:
    flat = wide.reshape(-1)[todo]
    scale = np.floor(np.log10(np.abs(flat)))
    found = np.zeros(todo.size, bool)
    for digits in range(6, 10):
      power = 10.0 ** (digits - 1 - scale)
      with np.errstate(over="ignore", invalid="ignore"):
        candidate = np.round(flat * power) / power
      fits = ~found & np.isfinite(candidate) & (candidate.astype(np.float32)
                                               == x.reshape(-1)[todo])
      out.reshape(-1)[todo[fits]] = candidate[fits]
      found |= fits
  return out.tolist()
