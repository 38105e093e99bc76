"""The manual, the README, the CHANGELOG, configs/ and the package speak of the project, not of
the machine it was developed on: no sessions, lent machines, work trees, lost runs or the
development machine's queue, and no absolute path of a machine in docs/. A timing names its
host, its commit and whether it ran alone or busy; its history is in git log."""

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

# Each entry: what the words speak of, and a pattern (case-insensitive) precise enough that
# the package's own words pass (a process's `start_new_session`, `import queue`, "queued
# batches", "steps per call", "the call of k steps", "had lost the command").
VOCABULARY = {
  "a development session": r"\bsession's\b|\bsessions\b"
                           r"|\b(?:this|that|next|last|every|working|development) session\b",
  "a work tree": r"\bwork ?trees?\b|\bworktrees?\b",
  "device time": r"\bdevice time\b",
  "a lent or borrowed machine": r"\bborrowed\b|\blent (?:machine|device|host|GPU)s?\b"
                                r"|\b(?:machine|device|host|GPU)s? (?:was |were |is )?lent\b"
                                r"|\bnext machine\b|\bmachine (?:was|is) new\b",
  "the development machine": r"\bdevelopment (?:machine|CPU|host|box)s?\b"
                             r"|\bthis development\b",
  "lost runs": r"\blost with (?:a|the|its)\b|\bthe lost (?:run|seed|workdir)s?\b"
               r"|\b(?:runs?|workdirs?) (?:was|were|had been|has been|have been) lost\b",
  "the development machine's queue": r"\bbackground queue\b|\bqueue line\b|\bthe queue's\b"
                                     r"|\b(?:is|are|was|were) queued\b"
                                     r"|\bthe queue (?:stopped|held|paused|trains|trained|takes"
                                     r"|took|gave|skips|keeps)\b",
  "a call of the lent device": r"\bprepared call\b|\bthe call's (?:limit|deadline)\b"
                               r"|\bthe call allowed\b|\bcalls? of the device\b"
                               r"|\bcall reached its deadline\b",
  "the development machine's folders": r"~/seq2seq-|\bhome folder\b",
  "an absolute path of a machine": r"(?<![\w.~])/(?:work|root|home|tmp|mnt|Users)/",
}
# An absolute path of a machine anywhere in docs/ (tables, CSV, JSON, hypotheses); system paths
# that commands name (/usr/bin/time, /proc/cpuinfo, /dev/null) are no machine's.
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|root|home|tmp|mnt|Users|scratch)/[\w.-]")
BINARY_SUFFIXES = {".png", ".jpg", ".gz", ".pyc", ".model", ".npz", ".ocdbt"}


def _text_files(root: Path, pattern: str) -> list[Path]:
  return sorted(path for path in root.glob(pattern) if path.is_file()
                and path.suffix not in BINARY_SUFFIXES and "__pycache__" not in path.parts)


def speaking_files(root: Path) -> list[Path]:
  """The files that speak of the project: docs/'s documents, the README, the CHANGELOG,
  configs/, the package, and models/README.md where there is one."""
  files = [*_text_files(root, "docs/**/*.md"), *_text_files(root, "configs/**/*"),
           *_text_files(root, "seq2seq/**/*")]
  files += [root / name for name in ("README.md", "CHANGELOG.md", "models/README.md")
            if (root / name).is_file()]
  return files


def _lines(path: Path):
  try:
    text = path.read_text(encoding="utf-8")
  except UnicodeDecodeError:
    return
  yield from enumerate(text.splitlines(), 1)


def machine_words(root: Path) -> list[str]:
  """Each line of `speaking_files` that holds the machine's vocabulary, as FILE:LINE: WORD."""
  patterns = {name: re.compile(pattern, re.IGNORECASE) for name, pattern in VOCABULARY.items()}
  found = []
  for path in speaking_files(root):
    for number, line in _lines(path):
      for name, pattern in patterns.items():
        if match := pattern.search(line):
          found.append(f"{path.relative_to(root)}:{number}: {match.group(0)!r} ({name})")
  return found


def machine_paths(root: Path) -> list[str]:
  """Each line of any text file under docs/ that holds an absolute path of a machine."""
  found = []
  for path in _text_files(root, "docs/**/*"):
    for number, line in _lines(path):
      if match := MACHINE_PATH.search(line):
        found.append(f"{path.relative_to(root)}:{number}: {match.group(0)!r}")
  return found


def test_docs_readme_changelog_configs_and_package_hold_none_of_the_machines_words():
  found = machine_words(ROOT)
  assert not found, ("the development machine's words (say the host, the commit, alone or "
                     "busy, and resumed from which step; history goes to git log):\n"
                     + "\n".join(found))


def test_docs_hold_no_absolute_path_of_a_machine():
  found = machine_paths(ROOT)
  assert not found, "absolute paths of a machine (give them relative):\n" + "\n".join(found)


PLANTED = {
  "a development session": "Seed 1 trained over two working sessions.",
  "a work tree": "Its runs went with the work tree.",
  "device time": "It stopped with 51 s of device time left.",
  "a lent or borrowed machine": "It is scored on the next machine lent.",
  "the development machine": "Timed on the 2-core development CPU.",
  "lost runs": "The lost run's figure, to the second decimal.",
  "the development machine's queue": "Quiet (the queue stopped), at 5c8c61d.",
  "a call of the lent device": "Stopped at the call's limit while compiling.",
  "the development machine's folders": "Its runs live in ~/seq2seq-runs.",
  "an absolute path of a machine": "| from_parent | /work/main/runs/transfer/parent |",
}
INNOCENT = [
  "subprocess.Popen(command, start_new_session=True)",
  "import queue",
  "self._queue.put(job)  # Stop once these are answered.",
  "# calls, the bar stays current, and queued batches do not pile up in memory.",
  "| steps per call | steps/s, run 1 |",
  "the call of k steps runs in one program",
  "docs/evaluation.md had lost the command that trained it",
  "about 3.5 minutes of its wall time were lost to a short experiment run beside it",
  "`/usr/bin/time`; `grep -m1 -o avx512f /proc/cpuinfo` > /dev/null",
  "Busy: other work ran beside it; resumed once from its step-600 checkpoint.",
  "`~/.cache/seq2seq/jax` holds the compilation cache",
]


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_sentence_is_caught_with_its_file_and_line(tmp_path, name):
  assert set(PLANTED) == set(VOCABULARY)
  (tmp_path / "docs" / "notes").mkdir(parents=True)
  (tmp_path / "docs" / "notes" / "runs.md").write_text(
    "# Runs\n\n" + "\n".join(INNOCENT) + "\n" + PLANTED[name] + "\n", encoding="utf-8")
  found = machine_words(tmp_path)
  assert len(found) == 1 and found[0].startswith(f"docs/notes/runs.md:{len(INNOCENT) + 3}: ")
  assert found[0].endswith(f"({name})")


def test_the_scan_covers_readme_changelog_configs_the_package_and_models_readme(tmp_path):
  for name in ("README.md", "CHANGELOG.md", "configs/recipe.py", "seq2seq/layer/module.py",
               "models/README.md"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("\n".join(INNOCENT) + "\nBeside this session's tests.\n",
                                 encoding="utf-8")
  found = machine_words(tmp_path)
  assert sorted(line.split(":")[0] for line in found) == [
    "CHANGELOG.md", "README.md", "configs/recipe.py", "models/README.md",
    "seq2seq/layer/module.py"]


def test_an_absolute_path_in_any_file_of_docs_is_caught(tmp_path):
  (tmp_path / "docs" / "transfer").mkdir(parents=True)
  (tmp_path / "docs" / "transfer" / "seeds.csv").write_text(
    "init_from,seed\nruns/transfer/parent,2\n/root/runs/transfer/parent,2\n", encoding="utf-8")
  (tmp_path / "docs" / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n/work/x")
  assert machine_paths(tmp_path) == ["docs/transfer/seeds.csv:3: '/root/r'"]
