"""A comparison's --out folder, replaced whole or not at all.

A comparison is a set of files that only make sense together (a table and the charts of
its rows). Written in place over an earlier one, a failure halfway (a full disk) left a
mix: some new files, some old, one cut short, and an error that named no file. So
`write_whole` writes the new comparison into a sibling folder and swaps it in by renames
once every file is written; a failure removes that folder, leaves the earlier comparison as
it was, and is one line naming the folder.

A folder that holds more than a comparison's files (by default --out is the runs' parent,
beside their workdirs) is not swapped away: each new file is renamed into it, once all are
written, and the earlier comparison's files that the new one lacks (seeds.csv, say) are
removed, so that no stale file stays beside the new ones.
"""

import contextlib
import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path

from seq2seq.errors import FULL_DISK, UserError, chained


def check_out(out_dir: Path) -> None:
  """Raises `UserError` if --out is a file (before anything is decoded)."""
  if out_dir.exists() and not out_dir.is_dir():
    raise UserError(f"--out={out_dir} is a file, not a directory; pass a directory for the"
                    " comparison.")


def write_whole(out_dir: Path, write: Callable[[Path], None], ours: Collection[str]) -> None:
  """Runs `write(folder)` on a fresh sibling folder of `out_dir`, then puts what it wrote in
  `out_dir`'s place (`ours`: the names of the files a comparison writes). An OSError while
  writing is a `UserError` naming `out_dir`, which is left as it was."""
  # A link to a folder: the folder it names is replaced, and the link stays one.
  out_dir = out_dir.resolve() if out_dir.is_symlink() else Path(os.path.abspath(out_dir))
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  partial = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
  shutil.rmtree(partial, ignore_errors=True)  # A killed earlier attempt of this pid's.
  try:
    partial.mkdir()
    write(partial)
    _swap_in(partial, out_dir, ours)
  except BaseException as e:
    shutil.rmtree(partial, ignore_errors=True)
    fault = next((c for c in chained(e) if isinstance(c, OSError) and c.errno), None)
    if fault is None or isinstance(e, UserError):
      raise
    raise _write_error(fault, out_dir, partial) from e


def _write_error(fault: OSError, out_dir: Path, partial: Path) -> UserError:
  what = "the earlier comparison there is kept" if out_dir.exists() else "nothing was written"
  fix = ("free some space and run the command again" if fault.errno in FULL_DISK
         else "pass another --out, or fix the cause and run the command again")
  # A file is named as the user will find it: in --out, not in the folder just removed.
  where = f" ({str(fault.filename).replace(str(partial), str(out_dir))})" if fault.filename else ""
  return UserError(f"{fault.strerror or os.strerror(fault.errno)}{where} while writing the"
                   f" comparison to {out_dir}; {what}: {fix}.")


def _swap_in(partial: Path, out_dir: Path, ours: Collection[str]) -> None:
  """`partial`'s files in `out_dir`'s place: the whole folder renamed over a folder of a
  comparison alone, or file by file into a folder that holds other things too."""
  if not out_dir.exists():
    partial.rename(out_dir)
    return
  if all(p.name in ours and p.is_file() for p in out_dir.iterdir()):
    replaced = out_dir.with_name(f".{out_dir.name}.replaced-{os.getpid()}")
    out_dir.rename(replaced)
    try:
      partial.rename(out_dir)
    except BaseException:
      replaced.rename(out_dir)  # The earlier comparison, back in its place.
      raise
    shutil.rmtree(replaced, ignore_errors=True)
    return
  new = {p.name for p in partial.iterdir()}
  for name in new:
    os.replace(partial / name, out_dir / name)
  for name in set(ours) - new:  # The earlier comparison's, which this one did not write.
    with contextlib.suppress(FileNotFoundError):
      (out_dir / name).unlink()
  partial.rmdir()
