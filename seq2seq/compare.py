"""Compare runs: a table of scores with paired-bootstrap significance, and pictures.

`compare_runs(workdirs, out_dir)` evaluates each run's best checkpoint on
validation and the chosen split, tests every run against the baseline with
sacreBLEU's paired bootstrap resampling, aggregates seeds, and writes
comparison.md, comparison.csv, bleu.png, curves.png and attention.png.

Its evaluations are cached in `<workdir>/eval/compare/`, each under the key of
everything that decides it (`evaluation_key`): the checkpoint steps "best" names
now and a digest of their parameters, the search, the decoding lengths, the run's
config and vocabulary, and the sha256 of the source and reference texts. A cached
result is used only when its key is the one asked for, so a run trained further,
another --alpha or another file of the same name is evaluated again; the files
scripts/evaluate.py writes (`<workdir>/eval/<name>.<checkpoint>.beam<k>.*`) are
never read.
"""

import csv
import hashlib
import json
import logging
import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.stats
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from seq2seq import config as config_lib
from seq2seq import layout, plots
from seq2seq.checkpoint import vocab_fingerprint
from seq2seq.errors import UserError
from seq2seq.metrics import evaluate_split, output_files
from seq2seq.textio import as_lines, read_lines
from seq2seq.translator import Translator, alignment, check_search

log = logging.getLogger("seq2seq")

SEED = "train.seed"
CACHE = layout.EVAL / "compare"  # compare's own evaluations, relative to the workdir.

FIXED_COLUMNS = ["parameters", "steps", "train_minutes", "tokens_per_sec"]
LENGTH_EDGES = (10, 20, 30)  # Source-length buckets in words: 0-9, 10-19, 20-29, 30+.


class TestSet(NamedTuple):
  """A set every run is scored on: a split of the runs' corpus, or a pair of files."""
  name: str
  src_file: str = ""
  ref_file: str = ""


def parse_test_set(spec: str) -> TestSet:
  """"NAME=SRC,REF" (the `--test_set` flag) -> TestSet."""
  name, sep, files = spec.partition("=")
  src, comma, ref = files.partition(",")
  if not (sep and comma and name and src and ref) or "," in ref:
    raise UserError(f"--test_set={spec} is not NAME=SRC,REF; e.g."
                    " --test_set=test2017=data/test_2017.en,data/test_2017.de.")
  if name in ("val", "test", "train"):
    raise UserError(f"--test_set={spec}: {name!r} is a split of the runs' corpus; give the files"
                    " another name.")
  for path in (src, ref):
    if not Path(path).is_file():
      raise UserError(f"--test_set={spec}: {path} is not a file; pass an existing text file.")
  return TestSet(name, src, ref)


def flat_config(config) -> dict[str, object]:
  """{"model.num_heads": 4, ...} of a run's config (sections of plain fields)."""
  config = config.to_dict() if hasattr(config, "to_dict") else config
  return {f"{section}.{key}": value for section, fields in config.items()
          for key, value in fields.items()}


def differing_fields(configs: Sequence) -> list[str]:
  """The dotted config fields whose values are not the same in every run, in config order."""
  flat = [flat_config(c) for c in configs]
  names = list(dict.fromkeys(name for f in flat for name in f))
  return [n for n in names if len({json.dumps(f.get(n), sort_keys=True) for f in flat}) > 1]


def seed_groups(rows: list[dict], fields: Sequence[str]) -> dict[tuple, list[dict]]:
  """Rows grouped by every differing field except `train.seed`: a group is one variant."""
  keys = [f for f in fields if f != SEED]
  groups = defaultdict(list)
  for row in rows:
    groups[tuple(row[k] for k in keys)].append(row)
  return dict(groups)


def welch_p_value(scores: Sequence[float], baseline: Sequence[float]) -> float | None:
  """Two-sided Welch's t-test of per-seed BLEU (None without two seeds on each side)."""
  if len(scores) < 2 or len(baseline) < 2:
    return None
  if statistics.pvariance(scores) == statistics.pvariance(baseline) == 0:
    return 1.0 if statistics.mean(scores) == statistics.mean(baseline) else 0.0
  return float(scipy.stats.ttest_ind(scores, baseline, equal_var=False).pvalue)


def length_buckets(sources: Sequence[str], hypotheses: Sequence[str],
                   references: Sequence[str], edges: Sequence[int] = LENGTH_EDGES) -> list[dict]:
  """BLEU of the sentences in each source-length bucket (words): [{bucket, sentences, bleu}]."""
  bounds = [0, *edges, None]
  out = []
  for low, high in zip(bounds[:-1], bounds[1:], strict=True):
    index = [i for i, src in enumerate(sources)
             if len(src.split()) >= low and (high is None or len(src.split()) < high)]
    name = f"{low}-{high - 1}" if high is not None else f"{low}+"
    bleu = (BLEU().corpus_score([hypotheses[i] for i in index],
                                [[references[i] for i in index]]).score if index else None)
    out.append({"bucket": name, "sentences": len(index), "bleu": bleu})
  return out


def run_names(workdirs: Sequence[str | Path]) -> list[str]:
  """Each run's name in the table: its path relative to the runs' common parent (`a/s0` and
  `b/s0` stay apart); one run alone is named by its directory."""
  resolved = [Path(w).resolve() for w in workdirs]
  if len(resolved) == 1:
    return [resolved[0].name]
  common = Path(os.path.commonpath(resolved))
  if common in resolved:  # One run inside another: name both below the outer one's parent.
    common = common.parent
  return [p.relative_to(common).as_posix() for p in resolved]


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _params_sha256(params) -> str:
  """sha256 of a parameter tree (names, dtypes, shapes, values): the weights themselves, so a
  checkpoint replaced at the same step (a run trained again) is not mistaken for the old one."""
  import jax

  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    array = np.ascontiguousarray(jax.device_get(leaf))
    digest.update(f"{jax.tree_util.keystr(path)} {array.dtype} {array.shape}\n".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def evaluation_key(translator: Translator, sources: Sequence[str],
                   references: Sequence[str]) -> dict:
  """Everything that decides an evaluation's hypotheses and scores, as plain JSON values."""
  config = translator.config
  workdir = translator.workdir
  return {
      "checkpoint": translator.checkpoint,
      "checkpoint_steps": [int(step) for step in translator.steps],
      "params_sha256": _params_sha256(translator.params),
      "beam_size": translator.beam_size, "alpha": float(translator.alpha),
      "batch_size": translator.batch_size,  # Batches decide the padded, so decoded, lengths.
      "max_decode_len_a": config.eval.max_decode_len_a,
      "max_decode_len_b": config.eval.max_decode_len_b,
      "model.max_len": config.model.max_len, "data.bucket_step": config.data.bucket_step,
      "config_sha256": _sha256((workdir / layout.CONFIG).read_bytes()),
      "vocab_sha256": vocab_fingerprint(workdir / layout.VOCAB),
      "sentences": len(sources),
      "src_sha256": _sha256(as_lines(sources).encode("utf-8")),
      "ref_sha256": _sha256(as_lines(references).encode("utf-8")),
  }


def _evaluation(workdir: Path, test_set: TestSet, beam_size: int, alpha: float,
                translator: Translator | None = None,
                text: tuple[list[str], list[str]] | None = None) -> tuple[dict, list]:
  """The run's scores on `test_set` (best checkpoint) and its hypotheses.

  Read from compare's cache when one was written under the same `evaluation_key`, otherwise
  evaluated as scripts/evaluate.py does (`evaluate_split`) and cached under that key.
  `translator` (of "best", `beam_size`, `alpha`) and `text` (sources, references) are built
  when not given.
  """
  workdir = Path(workdir)
  if translator is None:
    translator = Translator(workdir, "best", beam_size=beam_size, alpha=alpha)
  sources, references = text if text is not None else _text(translator.config, test_set)
  key = json.loads(json.dumps(evaluation_key(translator, sources, references)))
  digest = _sha256(json.dumps(key, sort_keys=True).encode())[:12]
  prefix = workdir / CACHE / f"{test_set.name}.beam{translator.beam_size}.{digest}"
  hyp_path, json_path = output_files(prefix)
  if json_path.is_file() and hyp_path.is_file():
    try:
      cached = json.loads(json_path.read_text(encoding="utf-8"))
    except ValueError:
      cached = {}  # Damaged: evaluated again and rewritten below.
    hypotheses = read_lines(hyp_path)
    if (isinstance(cached, dict) and cached.get("key") == key
        and len(hypotheses) == len(sources)):
      return {k: v for k, v in cached.items() if k != "key"}, hypotheses
  result = evaluate_split(translator, sources, references, prefix)
  # The key last: a kill before this line leaves a result without it, which is not reused.
  layout.write_atomically(json_path, json.dumps({**result, "key": key}, indent=2) + "\n")
  return result, read_lines(hyp_path)


def _training_record(workdir: Path) -> dict:
  path = workdir / layout.METRICS
  if not path.is_file():
    raise UserError(f"{workdir} has no validation result yet ({path} does not exist); train it"
                    " first.")
  lines = path.read_text(encoding="utf-8").splitlines()
  records = []
  for number, line in enumerate(lines, start=1):
    try:
      records.append(json.loads(line))
    except ValueError as e:
      if number < len(lines):
        raise UserError(f"{path} line {number} is not a JSON record ({e.msg}); repair or delete"
                        " that line.") from None
      log.warning("%s: its last line was cut off (the run was stopped while writing it?) and is"
                  " skipped.", path)
  train = [r for r in records if r["split"] == "train"]
  val = [r for r in records if r["split"] != "train" and "bleu" in r]
  if not val:
    raise UserError(f"{workdir} has no validation result yet; train it first.")
  return {"steps": val[-1]["step"], "train_minutes": val[-1]["train_wall_seconds"] / 60,
          "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in train),
          "curve": [(r["step"], r["bleu"], r["loss"]) for r in val]}


def _significance(baseline: list[str], systems: dict[str, list[str]], references: list[str],
                  n_samples: int) -> dict[str, tuple[float, float | None]]:
  """name -> (95% CI half-width of BLEU, p-value against the baseline; None for it).

  sacreBLEU's p-value follows multeval's convention, which gives two identical
  outputs p = 1 / (n + 1); a run whose output is the baseline's is reported
  with p = 1 (no difference at all).
  """
  named = [("baseline", baseline)] + list(systems.items())
  test = PairedTest(named, {"BLEU": BLEU(references=[references])}, None, test_type="bs",
                    n_samples=n_samples)
  _, results = test()
  out = {}
  for (name, hyps), result in zip(named[1:], results["BLEU"][1:], strict=True):
    p = 1.0 if list(hyps) == list(baseline) else result.p_value
    out[name] = (result.ci, p)
  out["baseline"] = (results["BLEU"][0].ci, None)
  return out


def compare_runs(workdirs: list[str | Path], out_dir: str | Path, *, baseline: str | Path = "",
                 split: str = "test", test_sets: Sequence[TestSet] = (), beam_size: int = 4,
                 alpha: float = 0.6, n_samples: int = 1000,
                 attention_text: str = "A man in an orange hat starring at something.") -> list:
  """Writes the comparison of `workdirs` to `out_dir`; returns the table's rows.

  Every run is scored (best checkpoint, beam search) on `val`, on `split` and on
  each extra test set; the table's columns are the config fields that differ
  between the runs, and per set its BLEU, chrF, 95% bootstrap interval and
  paired-bootstrap p-value against the baseline. Runs are named by their path
  below the runs' common parent (`run_names`).
  """
  workdirs = _check_runs(workdirs)
  if baseline and not (Path(baseline) / layout.CONFIG).exists():
    raise UserError(f"--baseline={baseline} is not a training run (no config.json); pass one of"
                    " the compared workdirs.")
  check_search(beam_size, alpha)  # Before --out is created.
  baseline = Path(baseline) if baseline else workdirs[0]
  workdirs = [baseline] + [w for w in workdirs if w.resolve() != baseline.resolve()]
  name = dict(zip(workdirs, run_names(workdirs), strict=True))
  base = name[baseline]
  configs = {w: config_lib.from_json((w / layout.CONFIG).read_text(encoding="utf-8"))
             for w in workdirs}
  records = {w: _training_record(w) for w in workdirs}  # Before anything is written.
  fields = differing_fields([configs[w] for w in workdirs])
  sets = list(dict.fromkeys([TestSet("val"), TestSet(split), *test_sets]))
  read = {}  # Each set's text, read once per corpus config.

  def text(workdir: Path, ts: TestSet) -> tuple[list[str], list[str]]:
    corpus = "" if ts.src_file else json.dumps(configs[workdir].data.to_dict(), sort_keys=True)
    if (corpus, ts) not in read:
      read[corpus, ts] = _text(configs[workdir], ts)
    return read[corpus, ts]

  texts = {ts.name: text(baseline, ts) for ts in sets}
  for workdir in workdirs:  # Each run is evaluated on its own corpus: the baseline's.
    for ts in sets:
      if text(workdir, ts) != texts[ts.name]:
        raise UserError(f"{workdir} has other {ts.name} sentences than the baseline {baseline}"
                        " (their config.data differs); compare runs of one corpus.")

  rows, hyps, curves, translators = [], defaultdict(dict), {}, {}
  for workdir in workdirs:
    record = dict(records[workdir])
    curves[name[workdir]] = record.pop("curve")
    translator = translators[workdir] = Translator(workdir, "best", beam_size=beam_size,
                                                   alpha=alpha)
    flat = flat_config(configs[workdir])
    row = {"run": name[workdir], **{f: flat.get(f) for f in fields},
           "parameters": _num_params(translator), **record}
    for ts in sets:
      scores, hyps[ts.name][name[workdir]] = _evaluation(workdir, ts, beam_size, alpha,
                                                         translator, texts[ts.name])
      row[f"{ts.name}_bleu"], row[f"{ts.name}_chrf"] = scores["bleu"], scores["chrf"]
      row["bleu_signature"] = scores["bleu_signature"]
    rows.append(row)
  for ts in sets:
    significance = _significance(hyps[ts.name][base],
                                 {r["run"]: hyps[ts.name][r["run"]] for r in rows[1:]},
                                 texts[ts.name][1], n_samples)
    for row in rows:
      row[f"{ts.name}_bleu_ci95"], row[f"{ts.name}_p_value"] = significance[
          "baseline" if row["run"] == base else row["run"]]
  columns = ["run", *fields, *FIXED_COLUMNS] + [
      f"{ts.name}_{c}" for ts in sets for c in ("bleu", "chrf", "bleu_ci95", "p_value")]
  seeds = seed_aggregate(rows, fields, [ts.name for ts in sets], base)
  out_dir = Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  _write_tables(rows, columns, seeds, out_dir, base, n_samples)
  lengths = [{"run": r["run"], **bucket} for r in rows
             for bucket in length_buckets(texts[split][0], hyps[split][r["run"]],
                                          texts[split][1])]
  _write_csv(out_dir / "length.csv", lengths, ["run", "bucket", "sentences", "bleu"])
  plots.length_chart({r["run"]: [(b["bucket"], b["bleu"]) for b in lengths if b["run"] == r["run"]]
                      for r in rows}, out_dir / "length.png",
                     ylabel=f"{split} BLEU (beam {beam_size})")
  plots.bleu_chart([r["run"] for r in rows], [r[f"{split}_bleu"] for r in rows],
                   [r[f"{split}_bleu_ci95"] for r in rows], out_dir / "bleu.png",
                   ylabel=f"{split} BLEU (beam {beam_size}), 95% CI")
  plots.training_curves(curves, out_dir / "curves.png")
  panels = []
  for workdir in workdirs:
    weights, src, tgt = alignment(translators[workdir], attention_text)
    panels.append((name[workdir], weights[-1].mean(axis=0), src, tgt))  # last layer, head mean
  plots.attention_side_by_side(panels, out_dir / "attention.png")
  return rows


def _check_runs(workdirs: Sequence[str | Path]) -> list[Path]:
  """The given run workdirs, each once; a path that is not a run is a `UserError` naming it."""
  if not workdirs:
    raise UserError("No training runs among the given directories; pass run workdirs.")
  bad = [f"{w} ({_not_a_run(Path(w))})" for w in workdirs
         if not (Path(w) / layout.CONFIG).is_file()]
  if bad:
    what = "Not a training run" if len(bad) == 1 else "Not training runs"
    raise UserError(f"{what}: {', '.join(bad)}; pass only the workdirs that scripts/train.py"
                    " wrote (each holds config.json), e.g. runs/rnn_attention/*.")
  unique = {}
  for w in workdirs:
    unique.setdefault(Path(w).resolve(), Path(w))
  return list(unique.values())


def _not_a_run(path: Path) -> str:
  if not path.exists():
    return "does not exist"
  return "no config.json" if path.is_dir() else "not a directory"


def seed_aggregate(rows: list[dict], fields: Sequence[str], sets: Sequence[str],
                   baseline: str) -> list[dict]:
  """Per variant (runs that differ only in `train.seed`): seeds, and for each set the mean and
  sample standard deviation of BLEU and Welch's p-value against the baseline's variant.
  Empty unless some variant has several seeds."""
  if SEED not in fields:
    return []
  groups = seed_groups(rows, fields)
  if all(len(g) < 2 for g in groups.values()):
    return []
  base = next(g for g in groups.values() if any(r["run"] == baseline for r in g))
  out = []
  for key, group in groups.items():
    entry = dict(zip([f for f in fields if f != SEED], key, strict=True))
    entry["seeds"] = len(group)
    for name in sets:
      scores = [r[f"{name}_bleu"] for r in group]
      entry[f"{name}_bleu_mean"] = statistics.mean(scores)
      entry[f"{name}_bleu_sd"] = statistics.stdev(scores) if len(scores) > 1 else 0.0
      entry[f"{name}_welch_p"] = (None if group is base else
                                  welch_p_value(scores, [r[f"{name}_bleu"] for r in base]))
    out.append(entry)
  return out


def _text(config, test_set: TestSet) -> tuple[list[str], list[str]]:
  """(sources, references) of a test set."""
  if test_set.src_file:
    return read_lines(test_set.src_file), read_lines(test_set.ref_file)
  from seq2seq.data import corpus

  text = corpus.read_split(config.data, test_set.name)
  return text.src, text.tgt


def _num_params(translator: Translator) -> int:
  import jax

  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(translator.params)))


def _write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


def _fmt(value, digits=2) -> str:
  if value is None:
    return "-"
  return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _markdown(rows: list[dict], columns: list[str]) -> list[str]:
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for row in rows:
    lines.append("| " + " | ".join(_fmt(row[c], 3 if c.endswith("_p") or c.endswith("p_value")
                                         else 2) for c in columns) + " |")
  return lines


def _write_tables(rows: list[dict], columns: list[str], seeds: list[dict], out_dir: Path,
                  baseline: str, n_samples: int) -> None:
  _write_csv(out_dir / "comparison.csv", rows, columns)
  lines = [f"Baseline: `{baseline}`. Per set: BLEU, chrF, the 95% bootstrap interval of BLEU and"
           f" the paired bootstrap p-value against the baseline (sacreBLEU, {n_samples}"
           f" resamples). {rows[0]['bleu_signature']}", "", *_markdown(rows, columns)]
  if seeds:
    seed_columns = list(seeds[0])
    _write_csv(out_dir / "seeds.csv", seeds, seed_columns)
    lines += ["", "Across seeds: mean and sample standard deviation of per-seed BLEU, and the"
              " two-sided p-value of Welch's t-test (unequal variances) of the per-seed BLEU"
              " against the baseline's variant, which accounts for seed variance.", "",
              *_markdown(seeds, seed_columns)]
  (out_dir / "comparison.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
