"""The runs a server serves (`seq2seq-serve --workdir`): checked, loaded once, each with its
searches and attention compiled ahead, in the background, for every source length it answers."""

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import jax

from seq2seq import config as config_lib
from seq2seq.data import tokenizer
from seq2seq.decoding.alignment import Alignments
from seq2seq.decoding.translator import Translator, check_is_run
from seq2seq.errors import UserError
from seq2seq.models.normalizers import NORMALIZERS
from seq2seq.runs import released, workdirs

log = logging.getLogger("seq2seq")


class ServedRun:
  """One run, loaded once: a search per served beam (with one hypothesis, and with the beam's
  n-best), and its attention, each compiled for sources up to `max_subwords` subwords (by
  default as long as the run's training pairs, config.data.max_len); `matmul_dtype`: the
  inputs' dtype of its dense products (`Translator`)."""

  def __init__(self, name: str, workdir: Path, checkpoint: str, beams: Sequence[int],
               alpha: float, batch_size: int, max_subwords: int | None = None,
               matmul_dtype: str = "float32"):
    self.name, self.beams, self.alpha = name, tuple(beams), alpha
    first = Translator(workdir, checkpoint, beam_size=beams[0], alpha=alpha,
                       batch_size=batch_size, matmul_dtype=matmul_dtype)
    self.config = first.config
    # A released model (seq2seq-export --format=seq2seq) says what its parameters are: the
    # steps and checkpoint spec of its run (named by its folder alone, not its path).
    self.released = None
    if released.is_released(workdir):
      record = json.loads((Path(workdir) / released.RECORD).read_text(encoding="utf-8"))
      self.released = {"run": Path(record["workdir"]).name, "steps": record["steps"],
                       **{k: record[k] for k in ("checkpoint", "spec") if k in record}}
    self.num_params = int(sum(x.size for x in jax.tree.leaves(first.params)))
    model_limit = first.config.model.max_len - 1  # With EOS, a source fills model.max_len.
    if max_subwords is not None and not 1 <= max_subwords <= model_limit:
      raise UserError(f"--max_subwords={max_subwords} must be between 1 and {model_limit}"
                      f" (config.model.max_len of {workdir}, less EOS).")
    # The longest source with EOS: the server compiles for these and no other.
    self.longest = 1 + (max_subwords or min(first.config.data.max_len - 1, model_limit))
    self.searches = {(beams[0], 1): first}
    for beam in beams:
      for nbest in sorted({1, beam}):
        if (beam, nbest) not in self.searches:
          self.searches[beam, nbest] = first.with_search(beam, nbest)
    self.alignments = Alignments(first, self.longest)
    self.tokenizer = first.tokenizer
    # Runs of one vocabulary can be forced to one target and their maps compared cell by cell.
    self.vocabulary = tokenizer.fingerprint(workdir / workdirs.VOCAB)

  def programs(self) -> int:
    """How many programs `compile_ahead` compiles: each search's and the attention's, one per
    grid length up to the longest sentence served."""
    return len(self.alignments.lengths) * (len(self.searches) + 1)

  def compile_ahead(self, *, background: bool = False) -> int:
    """Compiles every program the run will answer with (with `background`, on the pool,
    returning at once: the first beam's search first, shortest sources first); returns their
    count."""
    return (sum(t.compile_ahead(self.longest, background=background)
                for t in self.searches.values())
            + self.alignments.compile_ahead(background=background))

  def compiled(self) -> int:
    """Waits for every program `compile_ahead` added; returns their count."""
    return (sum(len(t.compiled()) for t in self.searches.values())
            + len(self.alignments.compiled()))

  def info(self) -> dict:
    """What the page and `GET /runs` show of the run."""
    m, t = self.config.model, next(iter(self.searches.values()))
    return {"name": self.name, "family": m.family, "attention": m.attention,
            "attention_described": attention_described(m),
            # What the legends say of the weights: a normalizer's that need not sum to one.
            "attention_normalizer": m.attention_normalizer,
            "weights_sum_to_one": NORMALIZERS[m.attention_normalizer].sums_to_one,
            "attention_gate": m.attention_gate,
            "checkpoint": t.checkpoint, "steps": t.steps, "beams": list(self.beams),
            "alpha": self.alpha,
            "direction": f"{self.config.data.src_lang}->{self.config.data.tgt_lang}",
            "parameters": self.num_params, "released": self.released,
            "described": self.described(),
            "max_subwords": self.longest - 1, "vocabulary": self.vocabulary}

  def described(self) -> str:
    """The run in words, as its panel names it beside its family and attention: its
    direction, its size, and what its parameters are: "en->de, 2.6M parameters; checkpoint
    avg:5, the average of steps 7600, 7800, 8000, 8200, 8400". A released model's single
    checkpoint is the choice recorded in its released.json (an average stays one)."""
    t = next(iter(self.searches.values()))
    size = (f"{self.num_params / 1e6:.1f}M" if self.num_params >= 1e6 else
            f"{self.num_params / 1e3:.0f}k" if self.num_params >= 1e3 else str(self.num_params))
    head = f"{self.config.data.src_lang}->{self.config.data.tgt_lang}, {size} parameters"
    if self.released is not None:
      r = self.released
      # The spec exported, and what it stood for where it differs: "selected = avg:5".
      chosen = " = ".join(dict.fromkeys(filter(None, (r.get("checkpoint"), r.get("spec")))))
      return (f"{head}; a released model: {_steps(r['steps'])} of {r['run']} (its checkpoint"
              f" {chosen})")
    return f"{head}; checkpoint {t.checkpoint}, {_steps(t.steps)}"


def _steps(steps: Sequence[int]) -> str:
  """Steps as the parameters are made of them: "step 8000", "the average of steps 7800,
  8000"."""
  if len(steps) == 1:
    return f"step {steps[0]}"
  return f"the average of steps {', '.join(map(str, steps))}"


def attention_described(model) -> str:
  """A run's attention in words, as the explorer names it beside the family: the variant, then
  each attention setting that is not config.py's default (the normalizer, the positions, shared
  key/value heads, QK-norm, the output gate, the decoder's positions: a family that takes one
  not has it at its default, which models.check_config holds it to), so that two runs that
  differ there read apart: "scaled_dot attention, entmax15 normalizer"."""
  default = config_lib.base_config().model
  parts = [f"{model.attention} attention"]
  if model.attention_normalizer != default.attention_normalizer:
    parts.append(f"{model.attention_normalizer} normalizer")
  if model.positions != default.positions:
    parts.append(f"{model.positions} positions")
  if model.num_kv_heads not in (default.num_kv_heads, model.num_heads):
    parts.append(f"{model.num_kv_heads} key/value head" + "s" * (model.num_kv_heads > 1))
  if model.qk_norm != default.qk_norm:
    parts.append("QK-norm")
  if model.attention_gate != default.attention_gate:
    parts.append(f"{model.attention_gate} output gate")
  if model.decoder_positions not in (default.decoder_positions, model.positions):
    parts.append(f"{model.decoder_positions} positions in the decoder")
  return ", ".join(parts)


def compile_runs(runs: Sequence[ServedRun]) -> threading.Thread:
  """Starts compiling every program of each run in the background (`ServedRun.compile_ahead`),
  saying first how many (a first start can take minutes), and returns the thread that says,
  run by run, once they are ready. Meanwhile the server answers: a request waits only for the
  programs it needs, and one the pool has not begun compiles at once (`compiling.Programs`)."""
  start = time.perf_counter()
  for i, run in enumerate(runs, start=1):
    log.info("Compiling %d programs for %s in the background (run %d of %d; a second start"
             " reads them from the cache) ...", run.programs(), run.name, i, len(runs))
    run.compile_ahead(background=True)

  def say_when_ready():
    for run in runs:
      count = run.compiled()
      log.info("%s: %d programs compiled (or read from the cache), all ready %.1f s after the"
               " first began.", run.name, count, time.perf_counter() - start)

  thread = threading.Thread(target=say_when_ready, name="compiled", daemon=True)
  thread.start()
  return thread


def check_workdirs(workdirs: Sequence[str]) -> None:
  """Refuses, before anything is loaded, a `--workdir` list with an empty entry, one run
  twice, or a folder that is not a run."""
  if not workdirs or any(not w.strip() for w in workdirs):
    raise UserError("--workdir lists an empty entry; pass one or more runs, e.g."
                    " --workdir=runs/a,runs/b.")
  seen: dict[Path, str] = {}
  for w in workdirs:
    if Path(w).resolve() in seen:
      raise UserError(f"--workdir lists one run twice ({seen[Path(w).resolve()]} and {w}); list"
                      " each run once (--checkpoint picks the same checkpoint of every run).")
    seen[Path(w).resolve()] = w
    check_is_run(Path(w))


def load_runs(workdirs: Sequence[str], checkpoint: str, beams: Sequence[int], alpha: float,
              batch_size: int, max_subwords: int | None = None,
              matmul_dtype: str = "float32") -> list[ServedRun]:
  """The runs of `--workdir`, each named by its folder (made distinct where two share one),
  each decoding with `matmul_dtype` products (`ServedRun`)."""
  from seq2seq.compare.comparison import run_names  # The names the comparison tables use.

  check_workdirs(workdirs)
  return [ServedRun(name, Path(w), checkpoint, beams, alpha, batch_size, max_subwords,
                    matmul_dtype)
          for name, w in zip(run_names(workdirs), workdirs, strict=True)]
