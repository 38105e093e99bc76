"""compare --checkpoint=selected: each run scored at the checkpoint chosen for it on validation
(`checked_choices`), and a run's record (`evaluation.record`) read instead of decoded: its
scores on val and on --split from its files, its hypotheses checked to be the ones scored
(`read_records`). What needs a model (--test_set, --gold_alignment) or a checkpoint other than
the recorded choice is refused for a record (`checked_choices`)."""

from collections.abc import Sequence
from pathlib import Path

from seq2seq.compare.evaluations import TestSet, disagreement
from seq2seq.compare.records import Run
from seq2seq.data.textio import read_lines
from seq2seq.errors import UserError
from seq2seq.evaluation.record import (
  candidate_files,
  check_scored_choice,
  checked_selection,
  score_command,
  selected_files,
)
from seq2seq.runs import workdirs

# How a record's fix ends: its evaluation made again in the run's workdir, the record follows.
_AGAIN = "then export its record again (seq2seq-export --format=record)"


def checked_choices(runs: Sequence[Run], checkpoint: str, search: tuple[int, float],
                    test_sets: Sequence[TestSet], gold_alignment: dict | None) -> dict[str, dict]:
  """With `checkpoint` selected, each run's choice on validation (`record.checked_selection`),
  by name: made, and made at `search`, for every run before any decodes ({} for best). A
  `UserError` for another checkpoint, and for a record compared at best or with what needs its
  model: --test_set's files decoded, --gold_alignment's attention (`gold_alignment`: as
  `compare_runs` takes it)."""
  if checkpoint not in ("best", "selected"):
    raise UserError(f"--checkpoint={checkpoint}: compare scores each run's best checkpoint, or"
                    " the one chosen on validation; pass best or selected.")
  recorded = [run.workdir for run in runs if run.recorded]
  what = f"{recorded[0]} is a run's record (its evaluations, no checkpoints)" if recorded else ""
  if recorded and checkpoint != "selected":
    raise UserError(f"{what}: it holds the scores of the checkpoint chosen on validation alone;"
                    " compare with --checkpoint=selected.")
  if recorded and test_sets:
    raise UserError(f"{what}: nothing decodes --test_set's files with it; drop --test_set, or"
                    " compare the runs' workdirs.")
  if recorded and (gold_alignment or {}).get("gold_alignment"):
    raise UserError(f"{what}: it has no model whose attention --gold_alignment scores; drop"
                    " --gold_alignment, or compare the runs' workdirs.")
  if checkpoint != "selected":
    return {}
  return {run.name: checked_selection(run.workdir, search) for run in runs}


def read_records(runs: Sequence[Run], choices: dict[str, dict], sets: Sequence[TestSet],
                 split: str, search: tuple[int, float],
                 texts: dict) -> dict[str, dict[str, tuple[dict, list[str] | None]]]:
  """Each record's scores and hypotheses per set: `records[run][set] = (scores, hypotheses)`;
  hypotheses None where the record holds none (validation's, in an older record)."""
  return {run.name: {ts.name: _recorded(run.workdir, ts.name, split, choices[run.name], search,
                                        texts[ts.name][1])
                     for ts in sets}
          for run in runs if run.recorded}


def _recorded(directory: Path, name: str, split: str, choice: dict, search: tuple[int, float],
              references: list[str]) -> tuple[dict, list[str] | None]:
  """A record's scores on `name` (--split: the choice scored, `selected_files`; val beside it:
  the chosen candidate's, `candidate_files`) and their hypotheses, which must be the ones
  scored against the corpus's `references`."""
  if name == split:
    hyp, scores = selected_files(directory, split, search)
    fix = f"score the choice in the run's workdir ({score_command('WORKDIR', split, search)}),"
    fix += f" {_AGAIN}"
    needed = (hyp, scores)
  else:
    hyp, scores = candidate_files(directory, choice["checkpoint"], search)
    fix = f"choose again in the run's workdir, {_AGAIN}"
    needed = (scores,)
  missing = [path for path in needed if not path.is_file()]
  if missing:
    raise UserError(f"{missing[0]} is missing from the record {directory}; {fix}.")
  result = (check_scored_choice(scores, choice, search, fix) if name == split
            else workdirs.read_json(scores, fix))
  if result.get("sentences") != len(references):
    raise UserError(f"{scores} scored {result.get('sentences')} sentences, but the run's {name}"
                    f" has {len(references)}; {fix}.")
  if not hyp.is_file():
    return result, None
  hypotheses = read_lines(hyp)
  wrong = (f"its hypotheses have {len(hypotheses)} lines, not {len(references)}"
           if len(hypotheses) != len(references)
           else disagreement(result, hypotheses, references))
  if wrong is not None:
    raise UserError(f"{scores}: {wrong} ({hyp.name}, against the run's {name} references); put"
                    f" back the files seq2seq-evaluate wrote, or {fix}.")
  return result, hypotheses
