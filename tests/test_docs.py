"""The manual holds as written: every file, section and link that README.md and docs/ name
exists (the commands themselves run in the tests of each feature)."""

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A section named in prose: `docs/training.md`, "Compilation" (or README.md, "Results").
SECTION_REFERENCE = re.compile(r"((?:docs/)?[a-z_]+\.md|README)`?,\s+\"([^\"]+)\"")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(r"`((?:seq2seq|configs|scripts|tests|docs|data)/[\w./-]+\.(?:py|md|txt))`")


def _sections(path: Path) -> set[str]:
  """A document's headings and the bold labels its bullets start with."""
  text = path.read_text(encoding="utf-8")
  return ({re.sub(r"^#+\s*", "", line).strip() for line in text.splitlines()
           if line.startswith("#")} | set(re.findall(r"^- \*\*([^*]+)\*\*", text, re.M)))


def _target(name: str) -> Path:
  if name == "README":
    return ROOT / "README.md"
  return ROOT / name if name.startswith("docs/") or name == "README.md" else ROOT / "docs" / name


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_section_link_and_path_a_document_names_exists(doc):
  text = " ".join(doc.read_text(encoding="utf-8").split())  # References may span lines.
  missing = []
  for name, section in SECTION_REFERENCE.findall(text):
    if not _target(name).is_file() or section not in _sections(_target(name)):
      missing.append(f'{name}, "{section}"')
  for link in LINK.findall(text):
    if "://" not in link and not (doc.parent / link).exists():
      missing.append(link)
  missing += [path for path in PATH.findall(text) if not (ROOT / path).exists()]
  assert not missing, f"{doc.name} names what does not exist: {missing}"
