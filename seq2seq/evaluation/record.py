"""A run's record: what of a run is kept once its checkpoints are not, such as the runs of a
study committed beside its write-up (docs/recipe_study/<run>/). seq2seq-export --format=record
writes one from a workdir (`write_record`); seq2seq-compare --checkpoint=selected reads one
as a run, its evaluations read instead of decoded (`is_record`, `checked_selection`,
`selected_files`, `candidate_files`).

Layout, relative to the record's directory, each file as the run's workdir holds it:

  config.json, metrics.jsonl     the run's config and its train and validation records
  parent.json                    the run it started from, where it has one
  eval/selected.json             the checkpoint chosen on validation, and at which search
  eval/val.<spec>.<search>.json  every candidate's validation scores at that search
  eval/val.<chosen>.<search>.hyp the chosen candidate's validation hypotheses
  eval/<split>.selected.<search>.hyp and .json
                                 the choice scored on test (and on val, where it was)

<search> is `evaluate.search_tag`'s (`beam4`, `beam5.alpha1`); `evaluate.output_prefix` names
them all, as seq2seq-evaluate does. A record holds no checkpoint and no vocabulary: nothing
decodes with it.
"""

import shutil
from pathlib import Path

from seq2seq.errors import UserError
from seq2seq.evaluation.evaluate import output_prefix, search_tag
from seq2seq.evaluation.scores import output_files
from seq2seq.runs import released, workdirs
from seq2seq.runs.selection import SELECTION, candidate_specs, chosen_search, selection_record


def is_record(path: str | Path) -> bool:
  """Whether `path` is a run's record: config.json, metrics.jsonl and eval/, no checkpoints/
  (a workdir has them from its first save) and not a released model."""
  path = Path(path)
  return ((path / workdirs.CONFIG).is_file() and (path / workdirs.METRICS).is_file()
          and (path / workdirs.EVAL).is_dir() and not (path / workdirs.CHECKPOINTS).exists()
          and not released.is_released(path))


def choose_command(workdir: str | Path, search: tuple[int, float],
                   candidates: list[str] | None = None) -> str:
  """The seq2seq-evaluate command that chooses among `candidates` (default: best, avg:5,
  avg:10) of `workdir` at `search`."""
  return (f"seq2seq-evaluate --workdir={workdir} --split=val"
          f" --checkpoint={','.join(candidates or ['best', 'avg:5', 'avg:10'])}"
          f" --beam_size={search[0]} --alpha={search[1]:g}")


def score_command(workdir: str | Path, split: str, search: tuple[int, float]) -> str:
  """The seq2seq-evaluate command that scores `workdir`'s choice on `split` at `search`."""
  return (f"seq2seq-evaluate --workdir={workdir} --split={split} --checkpoint=selected"
          f" --beam_size={search[0]} --alpha={search[1]:g}")


def _search_text(search: tuple[int, float] | None) -> str:
  return "no recorded search" if search is None else f"beam {search[0]}, alpha {search[1]:g}"


def checked_selection(run: Path, search: tuple[int, float]) -> dict:
  """The choice on validation of `run` (a workdir or a record: `selection_record`), which must
  have been made at `search` (beam size, alpha); else a `UserError` naming the command that
  makes it (in the workdir a record came from)."""
  path = Path(run) / SELECTION
  recorded = is_record(run)
  where = "WORKDIR" if recorded else run

  def fix(candidates=None):
    return f"choose at this search: {choose_command(where, search, candidates)}" + (
        f", then seq2seq-export --format=record --workdir={where} --output=NEW (its record)"
        if recorded else "")

  if not path.is_file():
    raise UserError(f"{path} is missing: --checkpoint=selected scores the checkpoint chosen on"
                    f" validation; {fix()}.")
  record = selection_record(run)
  chosen = chosen_search(record)
  if chosen != (search[0], float(search[1])):
    raise UserError(f"{path} chose {record.get('checkpoint')} at {_search_text(chosen)}, not at"
                    f" --beam_size={search[0]} --alpha={search[1]:g};"
                    f" {fix(candidate_specs(record))}, or compare at its search.")
  return record


def selected_files(directory: Path, split: str, search: tuple[int, float]) -> tuple[Path, Path]:
  """The .hyp and .json of the choice scored on `split` at `search` (seq2seq-evaluate
  --checkpoint=selected): `eval/<split>.selected.<search>.*`."""
  return output_files(output_prefix(Path(directory) / workdirs.EVAL, split, "selected",
                                    search_tag(*search)))


def candidate_files(directory: Path, spec: str, search: tuple[int, float]) -> tuple[Path, Path]:
  """The .hyp and .json of the candidate `spec` scored on val at `search` while choosing
  (seq2seq-evaluate --split=val --checkpoint=best,avg:N): `eval/val.<spec>.<search>.*`."""
  return output_files(output_prefix(Path(directory) / workdirs.EVAL, "val", spec,
                                    search_tag(*search)))


def check_scored_choice(path: Path, record: dict, search: tuple[int, float], fix: str) -> dict:
  """The scores in `path` (a `selected_files` .json), checked to be those of the checkpoint
  `record` chose, at `search`: a choice made again since it was scored is a `UserError`."""
  scores = workdirs.read_json(path, fix)
  scored = scores.get("selected_checkpoint", scores.get("checkpoint"))
  at = (scores.get("beam_size"), scores.get("alpha"))
  if scored != record.get("checkpoint") or at != (search[0], float(search[1])):
    raise UserError(f"{path} scored {scored} at beam {at[0]}, alpha {at[1]}, but {SELECTION}"
                    f" chose {record.get('checkpoint')} at {_search_text(search)}; {fix}.")
  return scores


def write_record(workdir: str | Path, output: str | Path) -> Path:
  """Writes the record of the run `workdir` (see the module's docstring) to `output`, which
  must not exist; returns it. Its choice on validation and that choice's test scores must
  exist (else a `UserError` naming the commands). Whole or not at all, as `released.release`."""
  workdir, output = Path(workdir), Path(output)
  if not (workdir / workdirs.CONFIG).is_file():
    raise UserError(f"{workdir} is not a training run (no config.json); pass the --workdir"
                    " that seq2seq-train wrote.")
  if released.is_released(workdir) or is_record(workdir):
    raise UserError(f"--workdir={workdir} is a released model or a record, not a run's workdir;"
                    " export the record of the run it came from.")
  if output.exists():
    raise UserError(f"--output={output} exists; pass a new directory, or remove it first.")
  files = _record_files(workdir)
  with workdirs.written_whole(output) as partial:
    for path in files:
      (partial / path).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(workdir / path, partial / path)
  return output


def _record_files(workdir: Path) -> list[Path]:
  """The files of `workdir`'s record, relative to it, each checked to exist (`write_record`)."""
  if not (workdir / SELECTION).is_file():
    raise UserError(f"{workdir / SELECTION} is missing: a record holds the checkpoint chosen on"
                    f" validation; choose it first: {choose_command(workdir, (4, 0.6))}.")
  record = selection_record(workdir)
  search = chosen_search(record)
  if search is None:
    raise UserError(f"{workdir / SELECTION} names no search it was chosen at; choose again:"
                    f" {choose_command(workdir, (4, 0.6))}.")
  if not (workdir / workdirs.METRICS).is_file():
    raise UserError(f"{workdir / workdirs.METRICS} is missing; put it back from a copy of the"
                    " run: a record holds its train and validation records.")
  val = [candidate_files(workdir, spec, search)[1] for spec in candidate_specs(record)]
  hyp = candidate_files(workdir, record["checkpoint"], search)[0]
  missing = [path for path in val if not path.is_file()]
  if missing:
    raise UserError(f"{missing[0]} is missing (the candidates' scores); choose again:"
                    f" {choose_command(workdir, search, candidate_specs(record))}.")
  files = [*val, *([hyp] if hyp.is_file() else [])]
  for split in ("test", "val"):
    fix = f"score the choice: {score_command(workdir, split, search)}"
    pair = selected_files(workdir, split, search)
    if split == "test" and not all(path.is_file() for path in pair):
      raise UserError(f"{pair[1].with_suffix('')}.hyp and .json are missing: a record holds the"
                      f" choice's test scores; {fix}.")
    if all(path.is_file() for path in pair):
      check_scored_choice(pair[1], record, search, fix)
      files += pair
  extra = [workdirs.PARENT] if (workdir / workdirs.PARENT).is_file() else []
  return [workdirs.CONFIG, workdirs.METRICS, *extra, SELECTION,
          *(path.relative_to(workdir) for path in files)]

