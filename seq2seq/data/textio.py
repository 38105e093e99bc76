"""Text files of one sentence per line: read as UTF-8, written whole or not at all."""

import os
import tempfile
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


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


_MODE = 0o666 & ~_umask()  # What `open(path, "w")` gives a new file.


def sync_folder(folder: Path) -> None:
  """Makes a rename or removal in `folder` durable (fsync of the folder), where the file
  system allows it."""
  try:
    fd = os.open(folder, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def write_bytes_atomically(path: Path, data: bytes) -> None:
  """Replaces `path` by `data` whole or not at all, after a kill or a power loss: written to
  a temporary file of a name of its own in the same folder (`.<name>.<random>.tmp`: two
  writers never share one), flushed and synced to the disk, renamed over `path`, and the
  folder synced. So `path` is the old file or the new one, never a part, and no temporary file
  outlives a failed write. A symbolic link stays one: the file it points to is replaced."""
  path = path.resolve() if path.is_symlink() else path
  tmp = None
  try:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      os.fchmod(f.fileno(), _MODE)  # Not mkstemp's 0600: as any file the command writes.
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_folder(path.parent)
  except OSError as e:  # Named by the file the user knows, not its temporary.
    raise OSError(e.errno, e.strerror, str(path)) from e
  finally:
    if tmp is not None:
      Path(tmp).unlink(missing_ok=True)


def write_atomically(path: Path, text: str) -> None:
  """Replaces `path` by `text` (UTF-8) whole or not at all (`write_bytes_atomically`)."""
  write_bytes_atomically(path, text.encode("utf-8"))


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
