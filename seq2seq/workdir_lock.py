"""One training process per workdir: an exclusive `flock` on `<workdir>/.lock`.

Two trainings in one workdir would interleave their metrics and overwrite each
other's checkpoints. The lock file names its holder (host and pid) for the
refusal message; the kernel drops the lock when its process dies, however it
dies, so a killed run never blocks the next one. The file is removed on release.
"""

import fcntl
import os
import socket
from pathlib import Path

from seq2seq.errors import UserError


class WorkdirLock:
  """Context manager holding `<workdir>/.lock`; `enabled=False` makes it a no-op (the
  processes of a multi-host run other than process 0)."""

  def __init__(self, workdir: str | Path, enabled: bool = True):
    self.path = Path(workdir) / ".lock"
    self.enabled = enabled
    self._file = None

  def acquire(self) -> None:
    while True:
      f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise UserError(f"{self.path.parent} is in use by another training ({holder}, holding"
                        f" {self.path}); wait for it to finish or stop it, or pass another"
                        " --workdir.") from None
      try:
        same = os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino
      except FileNotFoundError:
        same = False
      if same:  # Not a file that a releasing holder unlinked after we opened it.
        break
      f.close()
    f.seek(0)
    f.truncate()
    f.write(f"host {socket.gethostname()}, pid {os.getpid()}\n")
    f.flush()
    self._file = f

  def release(self) -> None:
    if self._file is not None:
      self.path.unlink(missing_ok=True)  # Before unlocking: a waiter re-checks the inode.
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self):
    if self.enabled:
      self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()
