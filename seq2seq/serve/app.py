"""The HTTP side: FastAPI routes over an `Engine`.

  GET  /            the attention explorer (static/: every file local, nothing from a CDN)
  GET  /runs        the runs served, with what the page needs to know of each
  POST /translate   sentences in, translations (and scores, n-best lists, attention) out
  GET  /docs        the OpenAPI page (Swagger UI from the swagger-ui-bundle package)

Every refused request is a 4xx whose JSON body is `{"detail": "<one line>"}` (`Refusal`, so
declared in the OpenAPI description); a body longer than a request within the limits can need
is refused by its Content-Length, or as it streams in, before it is read whole (`BodyLimit`).
"""

import contextlib
import ipaddress
import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

import swagger_ui_bundle
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException

from seq2seq.serve.engine import Engine
from seq2seq.serve.wire import BadRequest, refuse_what_is_not_text

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
                        " searched; the answer holds them as given, with their scores under"
                        " the run (and their attention). beam and nbest do not apply.")
  target_subwords: list[list[str]] | None = Field(
      None, description="Forced decoding as 'target', each translation given as its subwords"
                        " (the 'target' of a translation's attention, </s> last or left out),"
                        " scored as split: a search may split its output otherwise than its"
                        " text splits again. Instead of 'target'. One without </s> at the"
                        " search's length cap for its sentence (a search cut there) is scored"
                        " without </s>, as the search scored it, with a warning.")

  @model_validator(mode="before")
  @classmethod
  def _text_everywhere(cls, body):
    """The whole body as sent, before any field is read: every string in it, in whatever
    field (one added later too), at whatever depth, and every key, is text
    (`refuse_what_is_not_text`: a 400 naming where it is not)."""
    refuse_what_is_not_text(body)
    return body


# What a score is, wherever one is described: not a per-subword mean.
SCORE = ("the log-probability of the subwords and </s> under the run, divided by the GNMT"
         " length penalty ((5 + length) / 6) ** alpha, at the served --alpha (GET /runs), as"
         " the beam search ranks its hypotheses")


class Hypothesis(BaseModel):
  translation: str
  score: float = Field(description=f"Its score: {SCORE}.")


class DifferentialMaps(BaseModel):
  map1: list[list[list[list[float]]]] = Field(
      description="The first softmax map of each head, [layer][head][query][key]; its rows sum"
                  " to 1.")
  map2: list[list[list[list[float]]]] = Field(
      description="The second softmax map, subtracted: the weights are map1 - lambda map2, whose"
                  " rows sum to 1 - lambda and may be negative.")
  lambda_: list[float] = Field(alias="lambda", description="Each layer's lambda.")


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
  maps: dict[str, DifferentialMaps] | None = Field(
      None, description="Differential attention's two maps and lambda, by the name of the"
                        " weights they make ('weights', 'encoder', 'decoder'; absent for other"
                        " attention).")
  gates: dict[str, list[list[list[float]]]] | None = Field(
      None, description="A gated output's gate on each head, by the name of the weights"
                        " ('weights', 'encoder', 'decoder'), [layer][head][query], from 0"
                        " (the head's output shut) to 1; an element-wise gate's mean over the"
                        " head's features (absent without a gate).")


class TranslateResponse(BaseModel):
  run: str
  beam: int | None = Field(None, description="The search's beam (absent with 'target').")
  forced: bool | None = Field(None, description="True when the translations are the request's"
                                                " 'target', scored rather than searched.")
  translations: list[str | None] = Field(
      description="The best translation of each sentence, in order (with 'target': the"
                  " targets given); null for a sentence that failed (see 'errors').")
  scores: list[float | None] = Field(description=f"Their scores: {SCORE}.")
  nbest: list[list[Hypothesis] | None] | None = Field(None, description="With nbest > 1: each"
                                                                        " sentence's n best.")
  attention: list[Attention | None] | None = None
  errors: list[str | None] | None = Field(
      None, description="Present when some sentences failed alone (longer than the run"
                        " translates): per sentence, why, or null. The others are answered.")
  warnings: list[str | None] | None = Field(
      None, description="Present when some answers need a caveat (a target holding characters"
                        " the run's vocabulary lacks, scored as <unk>): per sentence, which,"
                        " or null.")


class Refusal(BaseModel):
  """The body of every refused request."""
  detail: str = Field(description="Why, in one line that names the fix.",
                      examples=["'text' holds no sentence; send at least one."])


# The refusals POST /translate answers with, for the OpenAPI description (FastAPI would
# declare only a 422 of its own shape, which this server never sends).
REFUSALS = {status: {"model": Refusal, "description": about} for status, about in (
    (400, "A request the server cannot answer as sent: an empty sentence, a beam not served,"
          " a body that is not UTF-8 or not parseable, ..."),
    (404, "A run not served here."),
    (413, "Over a limit: sentences, characters, subwords, or the body's bytes."),
    (415, "A body not sent as JSON (no Content-Type: application/json header)."),
    (422, "A field missing, unknown, or of the wrong type."))}


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
  digits = re.search(r"value has (\d+) digits", str(cause)) if isinstance(cause, ValueError) \
      else None
  if digits:  # Python reads at most sys.get_int_max_str_digits() digits of an integer.
    return (f"the body holds a number of {digits[1]} digits, more than the JSON parser reads"
            f" ({sys.get_int_max_str_digits()}); the numbers of a request (beam, nbest) are"
            " small whole numbers.")
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
  """The first problem pydantic found, as one line naming the field as a request writes it
  (`target_subwords[0][1]`), without the member of a union pydantic tried (`list[str]`)."""
  first = error.errors()[0]
  if first["type"] == "json_invalid":
    return f"the body is not valid JSON ({first.get('ctx', {}).get('error', first['msg'])})."
  where = ""
  for part in first["loc"][1:] if first["loc"][:1] == ("body",) else first["loc"]:
    if isinstance(part, int):
      where += f"[{part}]"
    elif not where or part not in _UNION_MEMBERS:
      where += f".{part}" if where else str(part)
  return f"{where or 'the body'}: {first['msg']}."


# How pydantic names the member of a union it tried, in an error's location: not a field.
_UNION_MEMBERS = {"str", "int", "bool", "list[str]", "list[list[str]]"}


def _refusal(detail: str, status: int, headers=None) -> JSONResponse:
  """A refusal as the server sends every one: `{"detail": "<one line>"}`. Whatever the line
  quotes of a request, it stays one line that UTF-8 can encode (a lone surrogate is written
  as its escape), so that no refusal becomes a 500 on its way out."""
  line = " ".join(str(detail).split("\n")).encode("utf-8", "backslashreplace").decode("utf-8")
  return JSONResponse({"detail": line}, status_code=status, headers=headers)


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


class BodyLimit:
  """ASGI middleware that refuses (413, the server's shape) a body over `most` bytes: by its
  Content-Length before a byte is read, or, sent without one (chunked), once the bytes read
  pass `most`. A body within it is read here and handed on whole. FastAPI reads every body
  whole before it looks at its Content-Type: without this, any client could make the server
  hold as much as it sends."""

  def __init__(self, app, most: int):
    self.app, self.most = app, most

  async def __call__(self, scope, receive, send) -> None:
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    declared = dict(scope["headers"]).get(b"content-length", b"")
    if declared.isdigit() and int(declared) > self.most:
      return await self._refuse(send, f"the body is {int(declared)} bytes long (its"
                                      " Content-Length); this server reads at most"
                                      f" {self.most} bytes")
    chunks, size = [], 0
    while True:
      message = await receive()
      if message["type"] != "http.request":
        return None  # The client left.
      chunks.append(message.get("body", b""))
      size += len(chunks[-1])
      if size > self.most:
        return await self._refuse(send, f"the body is longer than {self.most} bytes, the most"
                                        " this server reads")
      if not message.get("more_body"):
        break
    whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    async def replay():
      nonlocal whole
      message, whole = whole, None
      return message if message is not None else await receive()

    return await self.app(scope, replay, send)

  @staticmethod
  async def _refuse(send, why: str) -> None:
    body = json.dumps({"detail": f"{why} (what --max_lines sentences of --max_chars characters"
                                 " can need): send fewer or shorter sentences per"
                                 " request."}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _answer_refusals_in_one_line(app: FastAPI) -> None:
  """Every refusal as `Refusal`: the engine's, FastAPI's and pydantic's."""

  @app.exception_handler(BadRequest)
  def bad_request(request: Request, error: BadRequest):
    del request
    return _refusal(error.reason, error.status)

  @app.exception_handler(HTTPException)
  def http_error(request: Request, error: HTTPException):
    del request
    reason = _unparsable(error)
    if reason is not None:
      return _refusal(reason, 400)
    return _refusal(error.detail, error.status_code, error.headers)

  @app.exception_handler(RequestValidationError)
  def invalid(request: Request, error: RequestValidationError):
    if isinstance(error.body, bytes | bytearray) and error.body:  # Not read as JSON: why.
      sent = request.headers.get("content-type")
      how = (f"is sent as {sent}" if sent else "comes without a Content-Type header")
      return _refusal(f"the body {how}, so it is not read as JSON; send the header"
                      " Content-Type: application/json (curl: -H 'Content-Type:"
                      " application/json').", 415)
    return _refusal(_one_line(error), 422)


def _serve_the_docs(app: FastAPI, engine: Engine) -> None:
  """/docs: the bundled Swagger UI, over the description as OpenAPI 3.0 (which it renders),
  whose examples are requests this server answers: "Try it out" on POST /translate sends a
  sentence to the first run served, by its name (a generated example names a run "string")."""
  describe = app.openapi
  first = next(iter(engine.runs.values()))
  example = {"text": TranslateRequest.model_fields["text"].examples[0], "run": first.name}

  def openapi_3_0() -> dict:
    if app.openapi_schema is None:
      schema = as_openapi_3_0(describe())
      schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"][
          "example"] = example
      fields = schema["components"]["schemas"]["TranslateRequest"]["properties"]
      fields["run"]["example"], fields["beam"]["example"] = first.name, first.beams[0]
      app.openapi_schema = schema
    return app.openapi_schema

  app.openapi = openapi_3_0
  app.mount("/swagger", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger")

  @app.get("/docs", include_in_schema=False)
  def docs():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="seq2seq API",
                               swagger_js_url="/swagger/swagger-ui-bundle.js",
                               swagger_css_url="/swagger/swagger-ui.css",
                               swagger_favicon_url="/swagger/favicon-32x32.png")


def create_app(engine: Engine) -> FastAPI:
  """The server's routes over `engine` (started by the caller)."""
  app = FastAPI(title="seq2seq", description="Translate with trained runs; see their"
                                             " attention.", docs_url=None, redoc_url=None)
  app.add_middleware(BodyLimit, most=engine.limits.max_bytes)
  app.mount("/static", StaticFiles(directory=STATIC), name="static")
  _serve_the_docs(app, engine)
  _answer_refusals_in_one_line(app)

  @app.get("/", include_in_schema=False)
  def page():
    return FileResponse(STATIC / "index.html")

  @app.get("/runs")
  def runs() -> dict:
    """The runs served: name, family, attention (and in words with its settings that are not
    the defaults: normalizer, positions, key/value heads), checkpoint, beams, length-penalty
    alpha, longest sentence."""
    return {"runs": [run.info() for run in engine.runs.values()],
            "limits": {"max_lines": engine.limits.max_lines,
                       "max_chars": engine.limits.max_chars}}

  @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True,
            responses=REFUSALS)
  def translate(request: TranslateRequest) -> dict:
    """Translates each sentence of `text` with a run; requests that arrive together are
    translated together, in the compiled batch shapes."""
    return engine.translate(request.text, request.run, request.beam, request.nbest,
                            request.attention, request.target, request.target_subwords)

  return app
