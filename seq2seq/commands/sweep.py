r"""Trains the cross product of config values, one workdir per combination.

  seq2seq-sweep --config=configs/multi30k_rnn.py \
      --sweep=model.attention=none,dot,general,concat,location [--sweep=train.seed=0,1,2] \
      --root=runs/rnn_attention [--parallel=N] [--config.train.num_steps=400]

Finished runs are skipped, unfinished ones resume, and failures are listed at
the end without stopping the others (exit status 1 if any failed). The seeds of
each point train as one program (--one_by_one: each alone); every run has its
own workdir either way. Each field is swept by one --sweep, each value listed once (two
would name one workdir); a grid that repeats either is refused before anything trains.
"""

from absl import flags

from seq2seq.commands.cli import define_config_flag, run_main
from seq2seq.compare.sweep import run_sweep

_CONFIG = define_config_flag()
_SWEEP = flags.DEFINE_multi_string("sweep", [], "FIELD=V1,V2,... (repeat for a cross product).")
_ROOT = flags.DEFINE_string("root", None, "Directory holding one workdir per combination.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Runs trained at once (separate processes).")
_ONE_BY_ONE = flags.DEFINE_bool(
    "one_by_one", False, "Train the seeds of each point one by one, not as one program.")
flags.mark_flags_as_required(["config", "root"])


def main(argv):
  del argv

  def sweep():
    status = run_sweep(_CONFIG.value, _SWEEP.value, _ROOT.value, _PARALLEL.value,
                       one_by_one=_ONE_BY_ONE.value)
    width = max(map(len, status))
    for name, result in status.items():
      print(f"{name:<{width}}  {result}")
    return 1 if any(result.startswith("failed") for result in status.values()) else 0

  run_main(sweep)
