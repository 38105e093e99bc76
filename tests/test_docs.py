"""The manual holds as written: every file, section and link that README.md and docs/ name
exists (the commands themselves run in the tests of each feature)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ENV, ROOT, overridden

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A section named in prose: `docs/training.md`, "Compilation" (or README.md, "Results").
SECTION_REFERENCE = re.compile(r"((?:docs/)?[a-z_]+\.md|README)`?,\s+\"([^\"]+)\"")
# A section of the same document: see "On a GPU" below, under "The RNN recipe".
OWN_SECTION = re.compile(r"(?:[Ss]ee|under) \"([^\"]+)\"")
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
  missing += [f'"{section}"' for section in OWN_SECTION.findall(text)
              if section not in _sections(doc)]
  for link in LINK.findall(text):
    if "://" not in link and not (doc.parent / link).exists():
      missing.append(link)
  missing += [path for path in PATH.findall(text) if not (ROOT / path).exists()]
  assert not missing, f"{doc.name} names what does not exist: {missing}"


# --- Every command of the manual, run as written (shortened) -----------------------------------

# The documents in the order a reader runs them: later ones use the runs earlier ones train.
# experiments.md before recipe.md: the recipes' re-measured rows evaluate its sweeps' runs.
ORDER = ["README.md", "training.md", "evaluation.md", "experiments.md", "recipe.md",
         "performance.md", "extending.md"]
# Appended to every command that trains or measures a config: a seconds-scale model and data,
# 10 steps with a checkpoint at each (so the published recipe's avg:10, and avg:5 and
# ensemble:5, have theirs), validation at 5, 10.
SHORT_RUN = ["--config.train.num_steps=10", "--config.train.warmup_steps=2",
             "--config.eval.every_steps=5", "--config.checkpoint.every_steps=1",
             "--config.checkpoint.keep=10", "--config.data.max_train_examples=300",
             "--config.data.vocab_size=500", "--config.eval.max_sentences=8",
             "--config.model.emb_dim=32", "--config.model.mlp_dim=64",
             "--config.model.num_heads=2", "--config.model.num_encoder_layers=1",
             "--config.model.num_decoder_layers=1", "--config.model.rnn_hidden_dim=32",
             "--config.eval.max_decode_len_a=1.0", "--config.eval.max_decode_len_b=0"]
# Appended to seq2seq-benchmark at fixed shapes (no --config).
SHORT_BENCHMARK = ["--layers=1", "--dim=32", "--heads=2", "--mlp=64", "--vocab=500", "--batch=4",
                   "--length=8", "--steps=1", "--decode_batch=4", "--src_len=8", "--out_len=8",
                   "--clients=4", "--requests=24"]
# Blocks not run here, and why.
NOT_RUN = {"pip install": "installs the project: .ci/run does, on a fresh machine",
           "pytest": "the suite this test is part of",
           "seq2seq-side-by-side": "downloads flax's source; tests download nothing",
           "seq2seq-serve": "serves until stopped: tests/test_serve.py runs it, then the curl line",
           "curl ": "asks the server above: tests/test_serve.py runs it"}


def bash_blocks(doc: Path) -> list[str]:
  """The ```bash blocks of `doc`, each with its continued lines joined."""
  blocks = re.findall(r"```bash\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
  return [re.sub(r"\\\n\s*", "", block) for block in blocks]


def shortened(line: str) -> str:
  """`line` with the flags that make its run seconds-scale (before a trailing `&`)."""
  extra = (SHORT_RUN if "--config=" in line else SHORT_BENCHMARK
           if "seq2seq-benchmark" in line else [])
  if not extra or line.lstrip().startswith("#"):
    return line
  body, background = (line.rstrip()[:-1], " &") if line.rstrip().endswith("&") else (line, "")
  # A flag the line gives already takes the short value in its place (a flag given twice is
  # refused); the others are appended.
  return " ".join(overridden(body.rstrip().split(" "), extra)) + background


def test_a_shortened_line_gives_each_flag_once_with_the_short_value():
  line = "seq2seq-train --config=c.py --config.train.num_steps=600 --config.model.emb_dim=256 &"
  flags_ = shortened(line).removesuffix(" &").split()
  assert flags_[2:4] == ["--config.train.num_steps=10", "--config.model.emb_dim=32"]
  names = [f.split("=")[0] for f in flags_[1:]]
  assert len(names) == len(set(names)) == 1 + len(SHORT_RUN)
  assert shortened(line).endswith(" &") and shortened("# --config=x") == "# --config=x"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
  """A directory to run the manual in, as a user's checkout: configs/, data/ and docs/, an input
  file (in.en), and the runs the commands train (runs/)."""
  home = tmp_path_factory.mktemp("manual")
  for name in ("configs", "data", "scripts", "docs", "examples"):
    (home / name).symlink_to(ROOT / name)
  (home / "in.en").write_text("A dog runs on the beach.\nTwo men play football.\n")
  return home


@pytest.mark.slow  # Every command of the manual, shortened: several minutes.
@pytest.mark.parametrize("name", ORDER)
def test_every_command_of_the_manual_runs_as_written(workspace, name):
  doc = ROOT / name if name == "README.md" else ROOT / "docs" / name
  failed = []
  env = dict(ENV, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
  for block in bash_blocks(doc):
    if any(marker in block for marker in NOT_RUN) or (
        "/usr/bin/time" in block and not Path("/usr/bin/time").exists()):  # Debian's `time`.
      continue
    script = "set -eo pipefail\n" + "\n".join(map(shortened, block.splitlines())) + "\nwait\n"
    result = subprocess.run(["bash", "-c", script], cwd=workspace, env=env, capture_output=True,
                            text=True, timeout=900)
    if result.returncode:
      failed.append(f"{block.strip()[:200]}\n  -> status {result.returncode}:"
                    f" {result.stderr.strip()[-600:]}")
  assert not failed, f"{name}: " + "\n".join(failed)
