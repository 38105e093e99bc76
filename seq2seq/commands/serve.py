r"""Serves runs over HTTP: a translation API, and a page that shows their attention.

  seq2seq-serve --workdir=runs/m30k_transformer --checkpoint=selected
  seq2seq-serve --workdir=runs/rnn_attention/general,runs/rnn_attention/location

http://127.0.0.1:8000/ is then the attention explorer, /docs the API's OpenAPI page, and

  curl -s localhost:8000/translate -H 'Content-Type: application/json' \
      -d '{"text": ["A dog runs on the beach."]}'

answers {"run": ..., "translations": [...], "scores": [...]}. Each run is loaded once and
named by its folder; every program it answers with starts compiling at start-up (or comes
from the compilation cache), in the background: the server answers at once, a request waiting
only for the programs it needs, and none compiles per request. It translates sentences up to
--max_subwords subwords (by default as long as the run's training pairs: config.data.max_len
with EOS), at the beams --beams lists (the first by default). Requests that arrive together are
translated together, in batches of --batch_size. A released model (models/) serves as its
run does and is only read.
"""

import logging
import socket

from absl import flags

from seq2seq.commands import cli
from seq2seq.commands.cli import run_main
from seq2seq.errors import UserError, require_extra
from seq2seq.serve import EXTRA as SERVE_EXTRA

_WORKDIR = flags.DEFINE_list("workdir", None, "Runs to serve (comma-separated workdirs).",
                             required=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", "best", "best, latest, a step, avg:N or"
                                  " selected (as seq2seq-evaluate takes them), for every run.")
_BEAMS = flags.DEFINE_list("beams", ["4"], "Beam sizes served (1: greedy); requests choose"
                           " one, the first by default.")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "GNMT length-penalty exponent.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Sentences per compiled batch.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every"
                            " interface).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_MAX_LINES = flags.DEFINE_integer("max_lines", 64, "Sentences per request, at most.")
_MAX_CHARS = flags.DEFINE_integer("max_chars", 1000, "Characters per sentence, at most.")
_MAX_SUBWORDS = flags.DEFINE_integer("max_subwords", None, "Subwords per sentence, at most"
                                     " (default: config.data.max_len less EOS); the server"
                                     " compiles for sentences this long.")
_MATMUL = cli.define_matmul_flag()

log = logging.getLogger("seq2seq")


def _beams() -> list[int]:
  """--beams as numbers, each at least 1."""
  try:
    beams = [int(b) for b in _BEAMS.value]
  except ValueError:
    raise UserError(f"--beams={','.join(_BEAMS.value)} must list whole numbers, e.g."
                    " --beams=4 or --beams=1,4.") from None
  if not beams or min(beams) < 1 or len(set(beams)) < len(beams):
    raise UserError(f"--beams={','.join(_BEAMS.value)} must list beam sizes of at least 1,"
                    " each once, e.g. --beams=1,4.")
  return beams


def _check_port(host: str, port: int) -> None:
  """Refuses, before anything is loaded, an address this process cannot listen on."""
  try:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
      probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      probe.bind((host, port))
  except OSError as e:
    raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); pass another --port, or"
                    " --host.") from None


def _server_class():
  import uvicorn

  class Server(uvicorn.Server):
    """uvicorn's server, which says `ready` once it listens (not before: a client that
    reads the line may connect at once)."""

    def __init__(self, config, ready: str):
      super().__init__(config)
      self.ready = ready

    async def startup(self, sockets=None) -> None:
      await super().startup(sockets)
      if self.started:
        log.info("%s", self.ready)

  return Server


def main(argv):
  del argv

  def serve():
    require_extra("serve", "seq2seq-serve", SERVE_EXTRA)
    for name, flag in (("batch_size", _BATCH), ("max_lines", _MAX_LINES),
                       ("max_chars", _MAX_CHARS)):
      if flag.value < 1:
        raise UserError(f"--{name}={flag.value} must be at least 1.")
    if not 0 < _PORT.value < 65536:
      raise UserError(f"--port={_PORT.value} must be between 1 and 65535.")
    beams = _beams()
    _check_port(_HOST.value, _PORT.value)
    from seq2seq.serve.app import is_loopback

    if not is_loopback(_HOST.value):
      log.warning("--host=%s serves this API, which has no authentication, to every machine"
                  " that can reach this address; put a proxy with authentication in front of"
                  " it, or serve on --host=127.0.0.1.", _HOST.value)
    import uvicorn  # The [serve] extra: imported once the flags are known to be good.

    from seq2seq.serve.app import create_app
    from seq2seq.serve.engine import Engine, Limits
    from seq2seq.serve.runs import check_workdirs, compile_runs, load_runs

    check_workdirs(_WORKDIR.value)  # Before the line below: a bad list prints only its error.

    log.info("Loading %d run%s: %s ...", len(_WORKDIR.value),
             "s" if len(_WORKDIR.value) > 1 else "", ", ".join(_WORKDIR.value))
    runs = load_runs(_WORKDIR.value, _CHECKPOINT.value, beams, _ALPHA.value, _BATCH.value,
                     _MAX_SUBWORDS.value, _MATMUL.value)
    compile_runs(runs)  # In the background: the server listens at once.
    engine = Engine(runs, Limits(_MAX_LINES.value, _MAX_CHARS.value)).start()
    host = f"[{_HOST.value}]" if ":" in _HOST.value else _HOST.value
    ready = (f"Serving {', '.join(r.name for r in runs)} at http://{host}:{_PORT.value}/ (the"
             " explorer; the API's page is /docs).")
    config = uvicorn.Config(create_app(engine), host=_HOST.value, port=_PORT.value,
                            log_level="warning")
    try:
      _server_class()(config, ready).run()
    finally:
      engine.close()

  run_main(serve, interrupted="nothing was written")
