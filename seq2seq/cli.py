"""What every command-line script shares: user errors as one line, not a traceback."""

import logging
import sys

from absl import flags
from absl import logging as absl_logging

from seq2seq.errors import UserError

flags.DEFINE_bool("verbose", False, "Show the full traceback of a user error.")


def run_main(fn) -> None:
  """Runs `fn()`; a `UserError` prints `error: <message>` and exits with status 2."""
  # orbax and JAX log every save at INFO through absl; keep the console for progress.
  absl_logging.set_verbosity(absl_logging.WARNING)
  handler = logging.StreamHandler(sys.stderr)
  handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
  logger = logging.getLogger("seq2seq")
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  logger.propagate = False
  try:
    fn()
  except UserError as e:
    if flags.FLAGS.verbose:
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def define_run_flags(beam_size: int = 4) -> dict:
  """The flags of every command that decodes with a run: workdir, checkpoint, search."""
  return {
      "workdir": flags.DEFINE_string("workdir", None, "Directory of a training run.",
                                     required=True),
      "checkpoint": flags.DEFINE_string("checkpoint", "best", "best, latest, a step, or avg:N."),
      "beam_size": flags.DEFINE_integer("beam_size", beam_size, "Beam size (1: greedy)."),
      "alpha": flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent."),
  }
