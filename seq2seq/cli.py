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
