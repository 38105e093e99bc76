"""What several test modules share: paths, configs, commands, and checks. Fixtures live in
tests/conftest.py; no test module imports another (tests/test_structure.py checks).

This module imports nothing slow at the top, so the scripts the tests start can import it too.
"""

import ast
import errno
import importlib.util
import json
import os
import shutil
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "seq2seq"
TFDS_EXTRA = "TFDS tests need the optional extra: pip install -e '.[tfds]'"
PNG = b"\x89PNG\r\n\x1a\n"  # The first bytes of every PNG file.

# The environment of the scripts the tests start: this checkout's package (and the session's
# compilation cache, which tests/conftest.py sets before this module is imported).
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


# --- Configs ---------------------------------------------------------------------------------


def load_config(name: str):
  """`get_config()` of `configs/<name>.py`, loaded the way config_flags does."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def fast_tiny_config():
  """configs/tiny.py shrunk so that a run compiles one train shape and decodes 8 sentences."""
  c = load_config("tiny")
  c.data.max_train_examples = 300
  c.data.max_len = 16
  c.data.bucket_step = 16  # One padded length: one compiled train step.
  c.data.tokens_per_batch = 256
  c.eval.max_sentences = 8
  c.eval.batch_size = 64  # Rows of every evaluation batch: validation's 8 sentences are one.
  c.eval.max_decode_len_a = 1.0
  c.eval.max_decode_len_b = 0
  # No evaluation searches compiled ahead (tests/test_compiling.py turns them on): most tests'
  # runs are never evaluated at a beam, and many of their models are compiled once only.
  c.eval.test_beam_size = 0
  return c


def shared_run_config(num_steps: int = 4):
  """The config of the session's shared `run` (tests/conftest.py): checkpoints every 2 steps,
  at 2 and 4."""
  c = fast_tiny_config()
  c.train.num_steps, c.eval.every_steps = num_steps, 2
  return c


# --- The training command, as a user runs it -------------------------------------------------

# fast_tiny_config's data and evaluation sizes, as flags of scripts/train.py.
FAST = ["--config.data.max_train_examples=300", "--config.data.max_len=16",
        "--config.data.bucket_step=16", "--config.eval.max_sentences=8",
        "--config.eval.batch_size=64", "--config.eval.max_decode_len_a=1.0",
        "--config.eval.max_decode_len_b=0"]


def overridden(flags_: list[str], overrides: list[str]) -> list[str]:
  """`flags_` with each of `overrides` (`--name=value`) in the place of the flag of its name, or
  appended where `flags_` has none: the commands refuse a flag of one value given twice
  (`cli.check_flags_given_once`). Flags that may repeat (`--sweep`) stay as given."""
  values = {f.split("=", 1)[0]: f for f in overrides}
  kept = [values.pop(f.split("=", 1)[0], f) if f.startswith("--") else f for f in flags_]
  return kept + list(values.values())


def train_command(workdir, *overrides: str) -> list[str]:
  """scripts/train.py on configs/tiny.py with FAST, then `overrides` (which win over FAST)."""
  return [sys.executable, str(ROOT / "scripts" / "train.py"),
          *overridden([f"--config={ROOT / 'configs' / 'tiny.py'}", f"--workdir={workdir}", *FAST],
                      list(overrides))]


def train_script(workdir, *overrides: str):
  """Runs train_command to the end: the CompletedProcess (text stdout and stderr)."""
  import subprocess
  return subprocess.run(train_command(workdir, *overrides), capture_output=True, text=True,
                        env=ENV, timeout=300)


# 256 tokens at padded length 16 are 16 rows: a multiple of 1, 2 and 4 devices, so runs on
# several devices or processes see exactly the global batches of one device.
DEVICE_RUN = ["--config.data.tokens_per_batch=256", "--config.train.num_steps=4",
              "--config.eval.every_steps=4", "--config.train.log_every_steps=1"]


def device_env(devices: int) -> dict:
  """The environment of a process with `devices` (forced) CPU devices."""
  return dict(ENV, XLA_FLAGS=" ".join([ENV.get("XLA_FLAGS", ""),
                                       f"--xla_force_host_platform_device_count={devices}"]))


def train_on(devices: int, workdir, *overrides: str, expect: str = "") -> list[float]:
  """Trains (train_command with DEVICE_RUN, then `overrides`) in a process with `devices` CPU
  devices; returns the logged training losses. `expect`: an excerpt of its log."""
  import subprocess
  result = subprocess.run(train_command(workdir, *DEVICE_RUN, *overrides), capture_output=True,
                          text=True, env=device_env(devices), timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"devices: {devices}." in result.stderr and expect in result.stderr
  return train_losses(workdir)


# --- What a run wrote -----------------------------------------------------------------------


def read_metrics(workdir) -> list[dict]:
  """Every record of the run's metrics.jsonl."""
  return [json.loads(line)
          for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def train_losses(workdir) -> list[float]:
  return [r["loss"] for r in read_metrics(workdir) if r["split"] == "train"]


def snapshot(directory) -> dict:
  """Every file under `directory`: its bytes and modification time."""
  directory = Path(directory)
  return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
          for p in sorted(directory.rglob("*")) if p.is_file()}


def damage_checkpoint(workdir, step: int, damage: str) -> None:
  """Damages checkpoint `step` of `workdir`: its biggest file "truncated" to half, or its
  OCDBT manifest "missing"."""
  saved = Path(workdir) / "checkpoints" / str(step) / "default"
  if damage == "truncated":
    biggest = max((p for p in saved.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
  else:
    (saved / "manifest.ocdbt").unlink()


def full_disk_at(step: int):
  """orbax's lowest Python write (`async_path.write_text`, each step's metadata files), failing
  with ENOSPC inside the temporary directory of checkpoint `step`, as on a full disk. Install
  it with `async_path.write_text = full_disk_at(step)`."""
  from orbax.checkpoint._src.path import async_path
  write_text = async_path.write_text

  async def write(path, text):
    if f"/{step}.orbax-checkpoint-tmp" in str(path):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return await write_text(path, text)

  return write


# --- Copies of the shared run for compare.py ------------------------------------------------

# A corpus of three sentences: comparing a run of it decodes three sentences.
VAL = [("A dog runs on the beach.", "Ein Hund rennt am Strand."),
       ("Two men are playing football in a long green park near the river.",
        "Zwei Männer spielen Fußball in einem langen grünen Park am Fluss."),
       ("A woman is cooking.", "Eine Frau kocht.")]


def small_run(run, workdir):
  """A copy of the trained run at `workdir` whose corpus (val and test) is VAL alone, in
  `<workdir>-corpus`. Its checkpoints, vocabulary and metrics are the run's."""
  corpus = workdir.parent / f"{workdir.name}-corpus"
  corpus.mkdir(parents=True)
  for split in ("val", "test"):
    (corpus / f"{split}.en").write_text("".join(s + "\n" for s, _ in VAL), encoding="utf-8")
    (corpus / f"{split}.de").write_text("".join(t + "\n" for _, t in VAL), encoding="utf-8")
  shutil.copytree(run, workdir, ignore=shutil.ignore_patterns("eval"))
  config = json.loads((workdir / "config.json").read_text(encoding="utf-8"))
  config["data"]["corpus"] = str(corpus)
  (workdir / "config.json").write_text(json.dumps(config), encoding="utf-8")
  return workdir


def metrics_copy(run, directory, extra: str = "", at: int | None = None):
  """`directory`, given the run's metrics.jsonl with `extra` appended or inserted before line
  `at`."""
  lines = (Path(run) / "metrics.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
  lines.insert(len(lines) if at is None else at - 1, extra)
  (Path(directory) / "metrics.jsonl").write_text("".join(lines), encoding="utf-8")
  return directory


def rescore_one_piece(vocab) -> None:
  """Changes the score of one piece of the SentencePiece model `vocab`: a vocabulary of the same
  size and pieces that is not the one it was (another file name alone is still the same
  vocabulary: `tokenizer.fingerprint`)."""
  from sentencepiece import sentencepiece_model_pb2
  vocab = Path(vocab)
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(vocab.read_bytes())
  proto.pieces[10].score -= 1.0
  vocab.write_bytes(proto.SerializeToString())


# --- Models ---------------------------------------------------------------------------------


def assert_stepping_matches_decode(model, src, tgt, *, all_positions: bool = False):
  """Feeding `tgt [batch, t]` through decode_step gives decode's teacher-forced logits.

  Only real (non-PAD) target positions are compared unless `all_positions`.
  Returns the cache after the last step.
  """
  import jax.numpy as jnp
  import numpy as np
  memory = model.encode(src)
  full = np.asarray(model.decode(memory, tgt))
  cache = model.init_cache(memory, tgt.shape[1])
  stepped = []
  for t in range(tgt.shape[1]):
    logits, cache = model.decode_step(memory, cache, tgt[:, t])
    stepped.append(logits)
  stepped = np.asarray(jnp.stack(stepped, axis=1))
  compared = np.ones(tgt.shape, bool) if all_positions else np.asarray(tgt != 0)
  np.testing.assert_allclose(stepped[compared], full[compared], atol=1e-5)
  return cache


# --- The project's source --------------------------------------------------------------------


def module_name(path) -> str:
  """`seq2seq/models/rnn.py` -> `seq2seq.models.rnn` (a package: its `__init__`'s name)."""
  parts = Path(path).relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path, prefix: str, known=()) -> set[str]:
  """The modules starting with `prefix` that the source of `path` imports (nothing is
  executed). `from a import b` counts as `a.b` where `a.b` is one of `known`, else as `a`."""
  deps = set()
  for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
      for alias in node.names:  # `from seq2seq import train` names a module.
        full = f"{node.module}.{alias.name}"
        deps.add(full if full in known else node.module)
    elif isinstance(node, ast.Import):
      deps |= {a.name for a in node.names if a.name.startswith(prefix)}
  return deps


def import_graph() -> dict[str, set[str]]:
  """{module: the seq2seq modules it imports}, from the source (nothing is executed)."""
  modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
  return {name: imported_modules(path, "seq2seq", modules) - {name}
          for name, path in modules.items()}


def console_scripts() -> dict[str, str]:
  """pyproject.toml's [project.scripts]: {command name: "module:function"}."""
  lines = (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines()
  section = lines[lines.index("[project.scripts]") + 1:]
  entries = [line for line in section[:next((i for i, line in enumerate(section)
                                              if line.startswith("[")), len(section))]
             if "=" in line]
  return {name.strip(): value.strip().strip('"') for name, value in
          (line.split("=", 1) for line in entries)}


# --- Servers ---------------------------------------------------------------------------------


def free_port() -> int:
  """A TCP port of 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
