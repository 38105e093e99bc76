r"""This project's speed against JoeyNMT 2.3.0, one JSON line per config; or JoeyNMT trained at
a recipe's full budget and scored (--full_budget). Run from a checkout's root:

  python benchmarks/joeynmt/side_by_side.py --joeynmt_python=.anchors/joeynmt/bin/python \
      [--configs=configs/multi30k_transformer_sinusoidal.py,configs/multi30k_rnn.py] [--rounds=7] \
      [--steps=20] [--beam=4] [--sentences=0] [--vocab_from=RUN]

JoeyNMT 2.3.0 on each config's recipe, one line per config: the same corpus, the same
SentencePiece model (trained as a run trains it, or --vocab_from's), the architecture matched
parameter for parameter (`params`; what cannot match is in `unmatched`), the same real target
tokens per batch and the same threads. Each of --rounds trains --steps steps on each side and
decodes the test split (its first --sentences; 0: all) with beam --beam on each side, in turn;
`train_ratio` (real target tokens/s) and `decode_ratio` (sentences/s) are ours over JoeyNMT's
(benchmarks/joeynmt/anchor.py). JoeyNMT runs in a virtualenv of its own, made once by

  python3 -m venv .anchors/joeynmt && \
      .anchors/joeynmt/bin/pip install torch joeynmt==2.3.0 \
      importlib_metadata sentencepiece==0.2.1

(PyPI's torch brings CUDA libraries a CPU never loads; a CPU-only wheel, where pip finds one,
does as well: 2.13.0+cpu was measured. JoeyNMT imports importlib_metadata without declaring
it, and calls a method of sentencepiece that 0.2.2 dropped), whose Python --joeynmt_python
(or $JOEYNMT_PYTHON) names.
Measure on a quiet machine: torch's OpenMP threads spin while they wait, and collapse when
another process takes their cores (a busy machine wants OMP_WAIT_POLICY=PASSIVE, which the
record shows; XLA does not read it).

  python benchmarks/joeynmt/side_by_side.py --full_budget \
      --config=configs/multi30k_transformer_sinusoidal.py \
      --joeynmt_python=.anchors/joeynmt/bin/python \
      --workdir=runs/joeynmt/transformer [--config.<field>=VALUE] [--beam=4] [--sentences=0] \
      [--vocab_from=RUN]

--full_budget: JoeyNMT trains --config's recipe at its full budget (its steps, learning rate,
warmup, optimizer, validation and tokens per batch) in --workdir, then translates the test split
from its best checkpoint with beam --beam and the recipe's alpha, and prints one JSON line of
sacreBLEU's scores (also --workdir/result.json). The same command resumes a training stopped
or killed, from JoeyNMT's latest checkpoint, and trains a finished one no further. What cannot
match is in --workdir/plan.json (benchmarks/joeynmt/budget.py).
"""

import json
import os
from pathlib import Path

from absl import flags
from ml_collections import config_flags

from seq2seq.commands import cli
from seq2seq.errors import UserError

_ROUNDS = flags.DEFINE_integer("rounds", 7, "Timed rounds, each --steps train steps and one"
                               " decoding on each side.")
_BEAM = flags.DEFINE_integer("beam", 4, "Beam size of both searches.")
_PYTHON = flags.DEFINE_string("joeynmt_python", os.environ.get("JOEYNMT_PYTHON", ""),
                              "The Python of JoeyNMT's virtualenv (default $JOEYNMT_PYTHON).")
_CONFIGS = flags.DEFINE_list("configs", ["configs/multi30k_transformer_sinusoidal.py",
                                         "configs/multi30k_rnn.py"],
                             "The recipes to compare, one line each.")
_STEPS = flags.DEFINE_integer("steps", 20, "Train steps of each side per round.")
_SENTENCES = flags.DEFINE_integer("sentences", 0, "Test sentences decoded per round"
                                  " (--full_budget: the first N translated and scored; 0: the"
                                  " whole split).")
_VOCAB_FROM = flags.DEFINE_string("vocab_from", "", "A run whose SentencePiece model both sides"
                                  " take (default: one trained as a run trains it).")
_FULL_BUDGET = flags.DEFINE_bool("full_budget", False, "Train JoeyNMT on --config's recipe at"
                                 " its full budget in --workdir (resumed there), and score its"
                                 " test translation with sacreBLEU.")
_CONFIG = cli.define_config_flag()
_WORKDIR = flags.DEFINE_string("workdir", "", "--full_budget: JoeyNMT's run directory.")


def main(argv):
  del argv

  def measure():
    if _ROUNDS.value < 1 or _BEAM.value < 1:
      raise UserError(f"--rounds={_ROUNDS.value} and --beam={_BEAM.value} must be at least 1.")
    if _FULL_BUDGET.value or _CONFIG.value is not None or _WORKDIR.value:
      _full_budget()
    else:
      _timing()

  if _FULL_BUDGET.value:
    from benchmarks.joeynmt.budget import INTERRUPTED

    cli.run_main(measure, interrupted=INTERRUPTED)
  else:
    cli.run_main(measure)


def _full_budget() -> None:
  from benchmarks.joeynmt import anchor, budget
  from seq2seq.evaluation import scores

  if not (_FULL_BUDGET.value and _CONFIG.value is not None and _WORKDIR.value):
    raise UserError("--config and --workdir go with --full_budget, which needs both: pass"
                    " --full_budget --config=configs/multi30k_transformer_sinusoidal.py"
                    " --workdir=runs/joeynmt/transformer.")
  if flags.FLAGS["configs"].present:
    raise UserError("--configs names the timing's recipes; --full_budget trains the one that"
                    " --config names: drop --configs.")
  if _SENTENCES.value < 0:
    raise UserError(f"--sentences={_SENTENCES.value} must be at least 0 (0: the whole split).")
  python = anchor.check_python(_PYTHON.value)
  config = _CONFIG.value
  if _VOCAB_FROM.value:
    config.data.vocab_from = _VOCAB_FROM.value
  overrides = config_flags.get_override_values(flags.FLAGS["config"])
  name = " ".join([flags.FLAGS["config"].config_filename,
                   *(f"--config.{field}={value}" for field, value in overrides.items())])
  print(json.dumps(budget.run(config, python, Path(_WORKDIR.value), beam=_BEAM.value,
                              name=name, score=scores.scores,
                              sentences=_SENTENCES.value)), flush=True)


def _timing() -> None:
  from benchmarks.joeynmt import anchor

  if _STEPS.value < 1 or _SENTENCES.value < 0:
    raise UserError(f"--steps={_STEPS.value} must be at least 1 and --sentences="
                    f"{_SENTENCES.value} at least 0 (0: the whole test split).")
  python = anchor.check_python(_PYTHON.value)
  configs = []
  for path in _CONFIGS.value:  # Every config is checked before the first is measured.
    config = cli.load_config_file(path)
    if _VOCAB_FROM.value:
      config.data.vocab_from = _VOCAB_FROM.value
    anchor.joeynmt_model(config.model)
    configs.append((path, config))
  for path, config in configs:
    print(json.dumps(anchor.compare(
        config, python, rounds=_ROUNDS.value, steps=_STEPS.value, beam=_BEAM.value,
        sentences=_SENTENCES.value, name=path)), flush=True)
