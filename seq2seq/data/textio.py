"""Text files of one sentence per line: read as UTF-8, written whole or not at all."""

from collections.abc import Sequence
from pathlib import Path

from seq2seq.errors import UserError

BOM = "\ufeff"  # A UTF-8 byte order mark, decoded: no character of the text.


def as_lines(lines: Sequence[str]) -> str:
  """The text of one line per entry: a newline inside an entry becomes a space."""
  return "".join(line.replace("\n", " ") + "\n" for line in lines)


def check_output(path: str | Path, flag: str, inputs: dict[str, str | Path] | None = None) -> None:
  """Raises `UserError` unless `path` can be written as a file without replacing one of the
  command's `inputs` (flag -> path; a link to one counts): checked before the work."""
  path = Path(path)
  for input_flag, source in (inputs or {}).items():
    if path.exists() and Path(source).exists() and path.samefile(source):
      raise UserError(f"{flag}={path} is {input_flag}={source}: writing it would replace the"
                      " input; pass another output file.")
  if path.is_dir():
    raise UserError(f"{flag}={path} is a directory; pass a file name.")
  if not path.parent.is_dir():
    raise UserError(f"{flag}={path}: the directory {path.parent} does not exist; create it or"
                    " pass another path.")


def write_atomically(path: Path, text: str) -> None:
  """Replaces `path` by `text` whole or not at all: written to `<name>.tmp` and renamed, so a
  kill leaves the old file, and an interrupted write leaves no temporary file behind. A
  symbolic link stays one: the file it points to is replaced."""
  path = path.resolve() if path.is_symlink() else path
  tmp = path.with_name(path.name + ".tmp")
  try:
    tmp.write_text(text, encoding="utf-8", newline="\n")
    tmp.replace(path)
  except OSError as e:  # Named by the file the user knows, not its temporary.
    raise OSError(e.errno, e.strerror, str(path)) from e
  finally:
    tmp.unlink(missing_ok=True)


def write_lines(path: str | Path, lines: Sequence[str]) -> None:
  """Writes one line per entry, whole or not at all (`write_atomically`)."""
  write_atomically(Path(path), as_lines(lines))


def read_lines(path: str | Path, flag: str = "") -> list[str]:
  """A text file's lines, without their newlines or a UTF-8 byte order mark at the start (as
  editors on Windows write it); undecodable UTF-8 is a UserError.

  `flag` (e.g. "--src_file") names where the path came from in error messages.
  """
  path = Path(path)
  if not path.exists() or path.is_dir():  # Not is_file(): /dev/stdin is a pipe.
    given = f"{flag}={path}" if flag else str(path)
    raise UserError(f"{given} {'is a directory' if path.exists() else 'does not exist'}; pass an"
                    " existing text file.")
  lines = []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      try:
        text = raw.decode("utf-8").rstrip("\r\n")
        lines.append(text.removeprefix(BOM) if number == 1 else text)
      except UnicodeDecodeError as e:
        raise UserError(f"{path} line {number} is not UTF-8 ({e.reason}); convert the file"
                        " to UTF-8.") from None
  return lines
