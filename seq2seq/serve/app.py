"""The HTTP side: FastAPI routes over an `Engine`.

  GET  /            the attention explorer (static/: every file local, nothing from a CDN)
  GET  /runs        the runs served, with what the page needs to know of each
  POST /translate   sentences in, translations (and scores, n-best lists, attention) out
  GET  /docs        the OpenAPI page (Swagger UI from the swagger-ui-bundle package)

Every refused request is a 4xx whose JSON body is `{"detail": "<one line>"}`.
"""

import contextlib
import ipaddress
import socket
import threading
import time
from pathlib import Path

import swagger_ui_bundle
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from seq2seq.serve.engine import BadRequest, Engine

STATIC = Path(__file__).parent / "static"


class TranslateRequest(BaseModel):
  """Sentences to translate, one per entry, and how. Types are strict: `"beam": true` or
  `"beam": "4"` is refused, not read as 1 or 4."""
  model_config = ConfigDict(extra="forbid", strict=True)
  text: list[str] | str = Field(description="One sentence, or a list of sentences.",
                                examples=[["A dog runs on the beach."]])
  run: str | None = Field(None, description="The run's name (GET /runs); needed when the"
                                            " server has several.")
  beam: int | None = Field(None, description="Beam size: one of the run's served beams"
                                             " (default: the first).")
  nbest: int = Field(1, description="Hypotheses per sentence, 1 to the beam.")
  attention: bool = Field(False, description="Also return the attention of each best"
                                             " translation.")
  target: list[str] | str | None = Field(
      None, description="Forced decoding: one translation per sentence, scored instead of"
                        " searched; the answer holds them as given, with their"
                        " length-normalized log-probabilities under the run (and their"
                        " attention). beam and nbest do not apply.")


class Hypothesis(BaseModel):
  translation: str
  score: float


class Attention(BaseModel):
  source: list[str] = Field(description="Source subwords, ending with </s>.")
  target: list[str] = Field(description="Target subwords of the best (or given) translation,"
                                        " with </s> where the search reached it.")
  target_inputs: list[str] = Field(description="What the decoder read before each target"
                                               " subword: <s>, then the target but its last;"
                                               " the columns of 'decoder'.")
  weights: list[list[list[list[float]]]] = Field(
      description="Cross-attention, [layer][head][target][source]; the RNN's alignment has one"
                  " layer and one head.")
  encoder: list[list[list[list[float]]]] | None = Field(
      None, description="Encoder self-attention, [layer][head][source][source] (the"
                        " Transformer's).")
  decoder: list[list[list[list[float]]]] | None = Field(
      None, description="Decoder self-attention, [layer][head][target][target_inputs], causal"
                        " (the Transformer's).")


class TranslateResponse(BaseModel):
  run: str
  beam: int | None = Field(None, description="The search's beam (absent with 'target').")
  forced: bool | None = Field(None, description="True when the translations are the request's"
                                                " 'target', scored rather than searched.")
  translations: list[str | None] = Field(
      description="The best translation of each sentence, in order (with 'target': the"
                  " targets given); null for a sentence that failed (see 'errors').")
  scores: list[float | None] = Field(description="Their length-normalized log-probabilities.")
  nbest: list[list[Hypothesis] | None] | None = Field(None, description="With nbest > 1: each"
                                                                        " sentence's n best.")
  attention: list[Attention | None] | None = None
  errors: list[str | None] | None = Field(
      None, description="Present when some sentences failed alone (longer than the run"
                        " translates): per sentence, why, or null. The others are answered.")


def is_loopback(host: str) -> bool:
  """Whether `host` (`seq2seq-serve --host`, a name or an address) is this machine alone."""
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:  # Another name: whatever it resolves to may be reachable.
    return False


def _unparsable(error: HTTPException) -> str | None:
  """Why a body could not be parsed at all, in one line, where FastAPI says only that it
  could not (the cause it raised from)."""
  cause = error.__cause__
  if isinstance(cause, UnicodeDecodeError):
    return (f"the body is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at position"
            f" {cause.start}); send JSON encoded in UTF-8.")
  if isinstance(cause, RecursionError):
    return ("the body nests deeper than the JSON parser follows; send an object of the"
            " documented shape, such as {\"text\": [\"A dog runs.\"]}.")
  return None


def as_openapi_3_0(node):
  """FastAPI's OpenAPI 3.1 description as 3.0, which the bundled Swagger UI (4.x) renders:
  `anyOf: [T, {type: null}]` becomes T with `nullable: true`, and a schema's `examples` list
  its `example`."""
  if isinstance(node, list):
    return [as_openapi_3_0(item) for item in node]
  if not isinstance(node, dict):
    return node
  node = {key: as_openapi_3_0(value) for key, value in node.items()}
  if node.get("openapi", "").startswith("3.1"):
    node["openapi"] = "3.0.3"
  kinds = node.get("anyOf")
  if isinstance(kinds, list) and {"type": "null"} in kinds:
    rest = [kind for kind in kinds if kind != {"type": "null"}]
    del node["anyOf"]
    node.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
    node["nullable"] = True
  if isinstance(node.get("examples"), list):  # 3.0's `examples` (of a media type) is a map.
    node["example"] = node.pop("examples")[0]
  return node


def _one_line(error: RequestValidationError) -> str:
  """The first problem pydantic found, as one line naming the field."""
  first = error.errors()[0]
  if first["type"] == "json_invalid":
    return f"the body is not valid JSON ({first.get('ctx', {}).get('error', first['msg'])})."
  where = ".".join(str(part) for part in first["loc"] if part != "body") or "the body"
  return f"{where}: {first['msg']}."


@contextlib.contextmanager
def serving_in_background(app: FastAPI, host: str = "127.0.0.1", port: int = 0):
  """Serves `app` with uvicorn in a thread (on a free port by default): yields its URL once it
  listens, and stops it after."""
  import uvicorn

  if not port:
    with socket.socket() as probe:
      probe.bind((host, 0))
      port = probe.getsockname()[1]
  server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
  thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
  thread.start()
  deadline = time.monotonic() + 60
  while not server.started:
    if not thread.is_alive() or time.monotonic() > deadline:
      raise RuntimeError(f"the server did not start on {host}:{port}")
    time.sleep(0.02)
  try:
    yield f"http://{host}:{port}"
  finally:
    server.should_exit = True
    thread.join(timeout=60)


def create_app(engine: Engine) -> FastAPI:
  """The server's routes over `engine` (started by the caller)."""
  app = FastAPI(title="seq2seq", description="Translate with trained runs; see their"
                                             " attention.", docs_url=None, redoc_url=None)
  app.mount("/static", StaticFiles(directory=STATIC), name="static")
  describe = app.openapi

  def openapi_3_0() -> dict:
    if app.openapi_schema is None:
      app.openapi_schema = as_openapi_3_0(describe())
    return app.openapi_schema

  app.openapi = openapi_3_0
  app.mount("/swagger", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger")

  @app.exception_handler(BadRequest)
  def bad_request(request: Request, error: BadRequest):
    del request
    return JSONResponse({"detail": error.reason}, status_code=error.status)

  @app.exception_handler(HTTPException)
  def http_error(request: Request, error: HTTPException):
    del request
    reason = _unparsable(error)
    if reason is not None:
      return JSONResponse({"detail": reason}, status_code=400)
    return JSONResponse({"detail": error.detail}, status_code=error.status_code,
                        headers=error.headers)

  @app.exception_handler(RequestValidationError)
  def invalid(request: Request, error: RequestValidationError):
    del request
    return JSONResponse({"detail": _one_line(error)}, status_code=422)

  @app.get("/", include_in_schema=False)
  def page():
    return FileResponse(STATIC / "index.html")

  @app.get("/docs", include_in_schema=False)
  def docs():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="seq2seq API",
                               swagger_js_url="/swagger/swagger-ui-bundle.js",
                               swagger_css_url="/swagger/swagger-ui.css",
                               swagger_favicon_url="/swagger/favicon-32x32.png")

  @app.get("/runs")
  def runs() -> dict:
    """The runs served: name, family, attention, checkpoint, beams, longest sentence."""
    return {"runs": [run.info() for run in engine.runs.values()],
            "limits": {"max_lines": engine.limits.max_lines,
                       "max_chars": engine.limits.max_chars}}

  @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True)
  def translate(request: TranslateRequest) -> dict:
    """Translates each sentence of `text` with a run; requests that arrive together are
    translated together, in the compiled batch shapes."""
    return engine.translate(request.text, request.run, request.beam, request.nbest,
                            request.attention, request.target)

  return app
