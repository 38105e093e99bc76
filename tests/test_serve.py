"""seq2seq-serve: the API through FastAPI's test client, its answers against the Translator
and seq2seq-translate, a load of concurrent clients, and the explorer page in a real
browser (Debian's chromium, driven by Playwright)."""

import concurrent.futures
import contextlib
import functools
import io
import json
import logging
import re
import shutil
import socket
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("fastapi", reason="the server's tests need: pip install -e '.[serve]'")

from fastapi.testclient import TestClient  # noqa: E402

from seq2seq import config as config_lib  # noqa: E402
from seq2seq.compare.comparison import run_names  # noqa: E402
from seq2seq.data.special_ids import BOS_ID, EOS_ID  # noqa: E402
from seq2seq.decoding import search  # noqa: E402
from seq2seq.decoding.alignment import _forced, alignment  # noqa: E402
from seq2seq.decoding.translator import Translator  # noqa: E402
from seq2seq.models import build_model  # noqa: E402
from seq2seq.performance.serving import clients_per_thread  # noqa: E402
from seq2seq.runtime import compiling  # noqa: E402
from seq2seq.serve.app import create_app, is_loopback, serving_in_background  # noqa: E402
from seq2seq.serve.engine import BadRequest, Engine, Limits, exact  # noqa: E402
from seq2seq.serve.runs import ServedRun, attention_described, compile_runs  # noqa: E402
from tests.helpers import ENV, ROOT, VAL, free_port  # noqa: E402

SENTENCES = [source for source, _ in VAL]
BATCH = 4  # Rows of the server's compiled batches here.
MAX_SUBWORDS = 31  # The longest sentence served here (VAL's are up to 30 subwords).


@pytest.fixture(scope="module")
def runs(run, tmp_path_factory):
  """Two runs to serve: the session's, and a copy under another name."""
  other = tmp_path_factory.mktemp("serve") / "copy"
  shutil.copytree(run, other, ignore=shutil.ignore_patterns("eval"))
  return run, other


@pytest.fixture(scope="module")
def names(runs):
  """The runs' names on the server: their paths below their common folder."""
  return run_names(runs)


class _StartUp(logging.Handler):
  """Keeps each line the server logs, with how many programs JAX had compiled (or read from
  the persistent cache) by then: (line, programs so far)."""

  def __init__(self, counts):
    super().__init__(logging.INFO)
    self.counts, self.lines = counts, []

  def emit(self, record):
    self.lines.append((record.getMessage(), sum(self.counts.compiled.values())
                       + sum(self.counts.cached.values())))


@pytest.fixture(scope="module")
def start_up(runs, names):
  """The runs served, compiled as seq2seq-serve compiles them (`compile_runs`), and the lines
  it logged on the way (`_StartUp`)."""
  # The first run at two beams; the other greedy only: fewer programs to compile.
  served = [ServedRun(names[0], runs[0], "latest", [1, 3], 0.6, BATCH, MAX_SUBWORDS),
            ServedRun(names[1], runs[1], "latest", [1], 0.6, BATCH, MAX_SUBWORDS)]
  logger = logging.getLogger("seq2seq")
  level = logger.level
  with compiling.counting() as counts:
    handler = _StartUp(counts)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
      compile_runs(served).join()  # The thread that says when they are ready.
    finally:
      logger.removeHandler(handler)
      logger.setLevel(level)
  return served, handler.lines


@pytest.fixture(scope="module")
def engine(start_up):
  engine = Engine(start_up[0], Limits(max_lines=50, max_chars=200)).start()
  yield engine
  engine.close()


def test_start_up_says_how_many_programs_each_run_compiles(start_up, names):
  """seq2seq-serve's start-up line 'Compiling N programs for RUN in the background (run i of
  n; ...)', logged before each run's (possibly long) compilation, then one line per run once
  they are ready: the N add up to how many programs JAX compiles, or reads from the persistent
  cache (counted by JAX's compilation events, not from the grid that N is computed from)."""
  lines = start_up[1]
  assert len(lines) == 2 * len(names), lines
  said, done = lines[:len(names)], lines[len(names):]
  counts = []
  for i, (name, (line, _)) in enumerate(zip(names, said, strict=True)):
    found = re.fullmatch(rf"Compiling (\d+) programs for {re.escape(name)} in the background"
                         rf" \(run {i + 1} of {len(names)}; a second start reads them from the"
                         r" cache\) \.\.\.", line)
    assert found, line
    counts.append(int(found[1]))
    assert done[i][0].startswith(f"{name}: {found[1]} programs compiled"), done[i]
  assert said[0][1] == 0 and done[-1][1] == sum(counts) > 0, lines


def test_the_first_request_is_answered_before_the_pool_begins_the_start_ups_programs(runs):
  """seq2seq-serve listens at once: with every compiling thread held by other work, the
  start-up's programs wait in the pool's queue, and a request compiles its own and is
  answered, as the translator answers it."""
  served = ServedRun("held", runs[0], "latest", [1], 0.6, BATCH, MAX_SUBWORDS)
  threads = served.config.compile.threads or compiling.default_threads()
  release = threading.Event()
  holders = [compiling._pool(threads).submit(release.wait, 300) for _ in range(threads)]
  try:
    ready = compile_runs([served])  # Returns at once.
    engine = Engine([served], Limits(max_lines=50, max_chars=200)).start()
    try:
      with TestClient(create_app(engine)) as client:
        answer = client.post("/translate", json={"text": SENTENCES[:3], "run": "held"})
      assert not any(holder.done() for holder in holders) and ready.is_alive()
    finally:
      engine.close()
  finally:
    release.set()
  ready.join()
  assert answer.status_code == 200, answer.text
  expected = Translator(runs[0], "latest", beam_size=1, batch_size=BATCH).translate(SENTENCES[:3])
  assert answer.json()["translations"] == [nbest[0][0] for nbest in expected]


@pytest.fixture(scope="module")
def client(engine):
  with TestClient(create_app(engine)) as client:
    yield client


def test_runs_are_named_by_their_folders_and_described(client, names):
  answer = client.get("/runs").json()
  assert [r["name"] for r in answer["runs"]] == names
  assert names[0].endswith("/run") and names[1].endswith("/copy")
  first = answer["runs"][0]
  assert (first["family"], first["checkpoint"], first["beams"]) == ("transformer", "latest",
                                                                    [1, 3])
  assert answer["runs"][1]["beams"] == [1] and first["max_subwords"] == MAX_SUBWORDS
  assert first["attention_described"] == "scaled_dot attention"  # The defaults: no more.
  # What the explorer's legends read: softmax weights sum to one; no gate.
  assert (first["attention_normalizer"], first["weights_sum_to_one"],
          first["attention_gate"]) == ("softmax", True, "none")
  assert answer["limits"] == {"max_lines": 50, "max_chars": 200}


def test_a_runs_attention_is_named_with_each_setting_that_is_not_the_default():
  """The explorer's name for a run's attention (its run menus and panels): two runs that
  differ in normalizer, positions or shared key/value heads read apart."""
  m = config_lib.base_config().model
  assert attention_described(m) == "scaled_dot attention"
  m.attention_normalizer, m.positions, m.num_kv_heads = "entmax15", "rope", 1
  assert attention_described(m) == ("scaled_dot attention, entmax15 normalizer, rope positions,"
                                    " 1 key/value head")
  m.attention_normalizer, m.num_kv_heads = "softmax", 2
  assert attention_described(m) == "scaled_dot attention, rope positions, 2 key/value heads"
  m.num_kv_heads = m.num_heads  # One per query head, as 0 says.
  assert attention_described(m) == "scaled_dot attention, rope positions"
  m.qk_norm, m.attention_gate, m.decoder_positions = True, "headwise", "none"
  assert attention_described(m) == ("scaled_dot attention, rope positions, QK-norm, headwise"
                                    " output gate, none positions in the decoder")
  m.qk_norm, m.attention_gate, m.decoder_positions = False, "none", "rope"  # The encoder's.
  assert attention_described(m) == "scaled_dot attention, rope positions"
  m.family, m.attention, m.attention_normalizer = "rnn", "general", "sparsemax"
  m.positions, m.num_kv_heads = "sinusoidal", 0  # As models.check_config holds the RNN.
  m.decoder_positions = ""
  assert attention_described(m) == "general attention, sparsemax normalizer"


def test_translations_are_the_translators_one_per_line_in_order_with_no_compile(client, runs,
                                                                                names):
  translator = Translator(runs[0], "latest", beam_size=1, batch_size=BATCH)
  expected = translator.translate(SENTENCES)
  with compiling.counting() as counts:
    answer = client.post("/translate", json={"text": SENTENCES, "run": names[0],
                                             "beam": 1})
    reversed_answer = client.post("/translate", json={"text": SENTENCES[::-1],
                                                      "run": names[0], "beam": 1})
  assert answer.status_code == 200, answer.text
  body = answer.json()
  assert body["translations"] == [nbest[0][0] for nbest in expected]
  np.testing.assert_allclose(body["scores"], [nbest[0][1] for nbest in expected], rtol=1e-6)
  assert reversed_answer.json()["translations"] == body["translations"][::-1]
  assert "nbest" not in body and "attention" not in body
  # Every program was compiled at start-up: requests only run them.
  assert sum(counts.compiled.values()) + sum(counts.cached.values()) == 0


def test_translations_equal_seq2seq_translate_byte_for_byte(client, runs, tmp_path, names):
  source = tmp_path / "in.en"
  source.write_text("".join(s + "\n" for s in SENTENCES * 5), encoding="utf-8")
  command = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "translate.py"), f"--workdir={runs[0]}",
       "--checkpoint=latest", "--beam_size=3", f"--input={source}"],
      capture_output=True, text=True, env=ENV, timeout=300, check=True)
  answer = client.post("/translate", json={"text": SENTENCES * 5, "run": names[0],
                                           "beam": 3})
  served = "".join(t + "\n" for t in answer.json()["translations"])
  assert served.encode("utf-8") == command.stdout.encode("utf-8")


@pytest.mark.slow  # Over ~7 s: compiles the server's searches at batch 8, starts a command.
def test_answers_equal_seq2seq_translate_at_their_default_batch_sizes(runs, tmp_path):
  """docs/evaluation.md's promise, at each side's default batch size: seq2seq-serve's
  --batch_size (8) and seq2seq-translate's, the run's config.eval.batch_size (128 by
  default; the session run's config says 64, so a copy says 128). 40 sentences: five
  batches of 8 against one of 128."""
  serve_batch = int(re.search(r'DEFINE_integer\("batch_size", (\d+),', (
      ROOT / "seq2seq" / "commands" / "serve.py").read_text(encoding="utf-8"))[1])
  translate_batch = config_lib.base_config().eval.batch_size
  assert (serve_batch, translate_batch) == (8, 128)
  workdir = tmp_path / "run"
  shutil.copytree(runs[0], workdir, ignore=shutil.ignore_patterns("eval"))
  config = json.loads((workdir / "config.json").read_text(encoding="utf-8"))
  config["eval"]["batch_size"] = translate_batch
  (workdir / "config.json").write_text(json.dumps(config), encoding="utf-8")
  source = tmp_path / "in.en"
  source.write_text("".join(s + "\n" for s in SENTENCES * 5), encoding="utf-8")
  command = subprocess.run(
      [sys.executable, str(ROOT / "scripts" / "translate.py"), f"--workdir={workdir}",
       "--checkpoint=latest", "--beam_size=3", f"--input={source}"],
      capture_output=True, text=True, env=ENV, timeout=300, check=True)
  engine = Engine([ServedRun("run", workdir, "latest", [3], 0.6, serve_batch,
                             MAX_SUBWORDS)]).start()
  try:
    with TestClient(create_app(engine)) as client:
      answer = client.post("/translate", json={"text": SENTENCES * 5})
  finally:
    engine.close()
  served = "".join(t + "\n" for t in answer.json()["translations"])
  assert served.encode("utf-8") == command.stdout.encode("utf-8")


def test_nbest_lists_are_the_beams_best(client, runs, names):
  translator = Translator(runs[0], "latest", beam_size=3, nbest=3, batch_size=BATCH)
  expected = translator.translate(SENTENCES[:3])
  body = client.post("/translate", json={"text": SENTENCES[:3], "run": names[0],
                                         "beam": 3, "nbest": 2}).json()
  assert [[h["translation"] for h in nbest] for nbest in body["nbest"]] == [
      [text for text, _ in nbest[:2]] for nbest in expected]
  assert [nbest[0]["translation"] for nbest in body["nbest"]] == body["translations"]


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_attention_has_a_row_per_target_and_a_column_per_source_subword(client, runs, names):
  answer = client.post("/translate", json={"text": SENTENCES[1:2], "run": names[0], "beam": 1,
                                           "attention": True})
  assert answer.status_code == 200, answer.text
  body = answer.json()
  translator = Translator(runs[0], "latest", beam_size=1, batch_size=BATCH)
  for text, attention in zip(SENTENCES[1:2], body["attention"], strict=True):
    weights, source, target = alignment(translator, text)  # Op by op, unpadded.
    assert (attention["source"], attention["target"]) == (source, target)
    served = np.asarray(attention["weights"])
    assert served.shape == weights.shape == (weights.shape[0], weights.shape[1], len(target),
                                             len(source))
    np.testing.assert_allclose(served, weights, atol=1e-4)  # Compiled against op by op.
    np.testing.assert_allclose(served.sum(-1), 1.0, atol=1e-3)


def test_every_attention_kind_has_its_shape_and_the_decoders_is_causal(client, names):
  """The Transformer's answer holds its encoder self-attention `[L, H, source, source]` and
  decoder self-attention `[L, H, target, target_inputs]` beside the cross-attention
  `[L, H, target, source]`: rows of weights that sum to 1, none on a later target subword.
  The decoder's columns are what it read: `<s>`, then the target but its last subword."""
  body = client.post("/translate", json={"text": SENTENCES[:2], "run": names[0],
                                         "attention": True}).json()
  for found in body["attention"]:
    s, t = len(found["source"]), len(found["target"])
    cross, encoder, decoder = (np.asarray(found[k]) for k in ("weights", "encoder", "decoder"))
    layers, heads = cross.shape[:2]
    assert cross.shape == (layers, heads, t, s)
    assert encoder.shape[1:] == (heads, s, s) and decoder.shape == (layers, heads, t, t)
    assert found["target_inputs"] == ["<s>", *found["target"][:-1]]
    for weights in (cross, encoder, decoder):
      np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-3)
    assert np.all(np.triu(decoder, k=1) == 0) and np.all(np.diagonal(decoder, axis1=2,
                                                                      axis2=3) > 0)


@pytest.mark.parametrize("body, status, detail", [
    ({"text": []}, 400, "'text' holds no sentence; send at least one."),
    ({"text": ["A dog.", "  "]}, 400, "text[1] is empty; send sentences with words in them."),
    ({"text": ["A dog."] * 51}, 413,
     "'text' holds 51 sentences; send at most 50 per request (--max_lines)."),
    ({"text": ["a" * 201]}, 413,
     "text[0] has 201 characters; send at most 200 per sentence (--max_chars)."),
    ({"text": ["A dog.\nA cat."]}, 400,
     "text[0] holds a line break; send one sentence per entry."),
    ({"text": ["A dog."], "run": "nope"}, 404,
     "run 'nope' is not served here; the runs are: {runs}."),
    ({"text": ["A dog."], "beam": 2}, 400,
     "beam 2 is not served for {first}; use one of 1, 3 (seq2seq-serve --beams)."),
    ({"text": ["A dog."], "beam": 3, "nbest": 4}, 400,
     "nbest 4 must be between 1 and the beam size, 3."),
    ({"text": ["A dog."], "nbest": 0}, 400, "nbest 0 must be between 1 and the beam size, 1."),
    ({"text": ["A dog."], "run": None, "beam": "four"}, 422,
     "beam: Input should be a valid integer."),
    ({"text": ["A dog."], "temperature": 2}, 422, "temperature: Extra inputs are not permitted."),
    ({"sentences": ["A dog."]}, 422, "text: Field required."),
    ({"text": ["A dog."], "target": ["Ein Hund.", "Eine Katze."]}, 400,
     "'target' and 'text' hold 2 and 1 entries; send one translation per sentence."),
    ({"text": ["A dog."], "beam": 3, "nbest": 2, "target": ["Ein Hund."]}, 400,
     "nbest 2 asks for a search's n best; with 'target' each sentence has the one translation"
     " given: leave nbest at 1."),
    ({"text": ["A dog."], "target": [" "]}, 400,
     "target[0] is empty; send sentences with words in them."),
    ("{not json", 422, "the body is not valid JSON (Expecting property name enclosed in double"
                       " quotes)."),
])
def test_bad_requests_are_a_4xx_with_one_line_and_the_server_stays_up(client, runs, body, status,
                                                                      detail, names):
  first = names[0]
  if isinstance(body, dict) and "run" not in body:
    body = {**body, "run": first}
  elif isinstance(body, dict) and body["run"] is None:
    body = {**body, "run": first}
  answer = (client.post("/translate", content=body, headers={"Content-Type": "application/json"})
            if isinstance(body, str) else client.post("/translate", json=body))
  assert (answer.status_code, answer.json()) == (status, {"detail": detail.format(
      runs=", ".join(names), first=first)})
  assert client.post("/translate", json={"text": ["A dog."], "run": first}).status_code == 200


HOSTILE = [  # (body with {run} for the run's name, status, the answer's one line)
    ('{{"text": ["A dog \\ud800 runs."], "run": "{run}"}}', 400,
     "text[0] holds a lone surrogate U+D800, which is not text; remove it (JSON escapes such as"
     " \\ud800 must pair into one character)."),
    ('{{"text": ["A dog \\u0007 runs."], "run": "{run}"}}', 400,
     "text[0] holds the control character U+0007, which is not text; remove it (JSON escapes"
     " such as \\ud800 must pair into one character)."),
    ('{{"text": ["A dog."], "target": ["Ein \\udfff Hund."], "run": "{run}"}}', 400,
     "target[0] holds a lone surrogate U+DFFF, which is not text; remove it (JSON escapes such"
     " as \\ud800 must pair into one character)."),
    ('{{"text": ["A dog."], "beam": true, "run": "{run}"}}', 422,
     "beam: Input should be a valid integer."),
    ('{{"text": ["A dog."], "attention": "yes", "run": "{run}"}}', 422,
     "attention: Input should be a valid boolean."),
    ('{{"text": 5, "run": "{run}"}}', 422, None),
    (b'{"text": ["A dog \xff runs."]}', 400,
     "the body is not UTF-8 (byte 0xff at position 17); send JSON encoded in UTF-8."),
    ("[" * 100_000 + "]" * 100_000, 400,
     'the body nests deeper than the JSON parser follows; send an object of the documented'
     ' shape, such as {"text": ["A dog runs."]}.'),
    ('{{"text": ["A dog."], "beam": ' + "1" * 5000 + ', "run": "{run}"}}', 400,
     "the body holds a number of 5000 digits, more than the JSON parser reads (4300); the"
     " numbers of a request (beam, nbest) are small whole numbers."),
]


@pytest.mark.parametrize("body, status, detail", HOSTILE, ids=[
    "lone surrogate", "control character", "target surrogate", "beam true", "attention yes",
    "text a number", "not utf-8", "100,000 deep", "5,000 digits"])
def test_hostile_bodies_are_a_4xx_with_one_line_and_the_server_stays_up(client, names, body,
                                                                        status, detail):
  content = body if isinstance(body, bytes) else body.format(run=names[0]) if "{run}" in body \
      else body
  answer = client.post("/translate", content=content,
                       headers={"Content-Type": "application/json"})
  assert answer.status_code == status, answer.text
  line = answer.json()["detail"]
  assert isinstance(line, str) and "\n" not in line
  if detail is not None:
    assert line == detail
  assert client.post("/translate", json={"text": ["A dog."], "run": names[0]}).status_code == 200


# What a client may send in any field, each a refusal wherever it is sent (but "attention":
# true): lone surrogates, control characters, nulls and keys at any depth, huge lists, wrong
# types. json.dumps writes a lone surrogate as its \ud800 escape, as a broken client does.
ODD = {"lone surrogate": "\ud800", "control character": "a\u0000b", "empty": "",
       "surrogate in a list": ["\ud800"], "surrogate in a nested list": [["A \udfff"]],
       "null in a list": [None], "null in a nested list": [[None]], "object": {"a": None},
       "surrogate key": {"\ud800": 1}, "empty list": [], "empty nested list": [[]],
       "deep list": [[["\u2581Ein"]]], "huge number": 10**30, "negative": -1, "fraction": 1.5,
       "true": True, "huge list": ["A dog."] * 5000,
       "huge nested list": [["\u2581Hund"] * 5000]}


@pytest.mark.parametrize("field", ["text", "run", "beam", "nbest", "attention", "target",
                                   "target_subwords", "temperature", "the body"])
def test_odd_values_in_every_field_are_a_4xx_naming_it_never_a_5xx(client, engine, names,
                                                                    field):
  """Every field goes through one validation (`refuse_what_is_not_text`, then its own
  checks): each odd value, in each field of /translate (an unknown one too) or as the whole
  body, is a 4xx whose one line names the field, never a 500 (a lone surrogate in
  'target_subwords' was one, with a traceback in the log); the server stays up."""
  base = {"text": ["A dog."], "run": names[0]}
  for what, value in ODD.items():
    if (field, value) == ("attention", True):
      continue  # The one value that is no refusal.
    body = value if field == "the body" else {**base, field: value}
    answer = client.post("/translate", content=json.dumps(body),
                         headers={"Content-Type": "application/json"})
    assert 400 <= answer.status_code < 500, (field, what, answer.status_code, answer.text)
    assert list(answer.json()) == ["detail"], (field, what, answer.text)
    line = answer.json()["detail"]
    assert isinstance(line, str) and "\n" not in line, (field, what, line)
    if field != "the body":
      assert field in line, (field, what, line)
  # Through the engine as through HTTP: the same validation, before any field is read.
  with pytest.raises(BadRequest, match=r"target_subwords\[0\]\[1\] holds a lone surrogate"):
    engine.translate(["A dog."], names[0], target_subwords=[["\u2581Ein", "\ud800"]])
  assert client.post("/translate", json=base).status_code == 200


@pytest.mark.parametrize("headers, detail", [
    ({"Content-Type": "application/x-www-form-urlencoded"},  # What curl -d sends.
     "the body is sent as application/x-www-form-urlencoded, so it is not read as JSON; send"
     " the header Content-Type: application/json (curl: -H 'Content-Type: application/json')."),
    ({}, "the body comes without a Content-Type header, so it is not read as JSON; send the"
         " header Content-Type: application/json (curl: -H 'Content-Type: application/json')."),
], ids=["curl -d", "no header"])
def test_a_body_not_sent_as_json_is_told_the_header(client, names, headers, detail):
  body = json.dumps({"text": ["A dog."], "run": names[0]})
  answer = client.post("/translate", content=body, headers=headers)
  assert (answer.status_code, answer.json()) == (415, {"detail": detail})


def _exchange(url: str, head: bytes, chunks=()) -> tuple[int, dict]:
  """POST /translate over a socket of its own: the request line and `head` (header lines),
  then each of `chunks` in chunked encoding, never the last (empty) one; then the answer's
  status and JSON, which must come, and the connection close, within 5 s."""
  host, port = url.removeprefix("http://").split(":")
  with socket.create_connection((host, int(port)), timeout=5) as connection:
    connection.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
    for chunk in chunks:
      connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    answer = b""
    while data := connection.recv(65536):  # Until the server closes the connection.
      answer += data
  head, _, body = answer.partition(b"\r\n\r\n")
  return int(head.split()[1]), json.loads(body)


def test_a_body_over_the_limit_is_refused_before_it_is_read(engine):
  """Whatever its Content-Type, a body longer than a request within the limits can need is a
  413 in the server's shape: at once by its Content-Length (the 200 MB it declares never
  sent), and, sent chunked without one, once it passes the limit. (FastAPI read every body
  whole: 200 MB bodies took the server from 1.17 to 2.93 GB.)"""
  most = engine.limits.max_bytes
  assert most < 2_000_000
  with serving_in_background(create_app(engine)) as url:
    status, answer = _exchange(url, b"Content-Type: text/plain\r\nContent-Length: 200000000"
                                    b"\r\n")
    assert (status, answer) == (413, {"detail": (
        f"the body is 200000000 bytes long (its Content-Length); this server reads at most"
        f" {most} bytes (what --max_lines sentences of --max_chars characters can need): send"
        " fewer or shorter sentences per request.")})
    # One byte over, all of it read by the server: a close with bytes unread would be a reset.
    chunks = [b"x" * 65536] * (most // 65536) + [b"x" * (most % 65536 + 1)]
    status, answer = _exchange(url, b"Content-Type: application/json\r\n"
                                    b"Transfer-Encoding: chunked\r\n", chunks)
    assert status == 413 and answer["detail"].startswith(
        f"the body is longer than {most} bytes, the most this server reads")


LONG = " ".join(["dog"] * 40)  # 159 characters, more than 31 subwords.


def test_a_sentence_longer_than_the_compiled_shapes_is_refused(client, runs, names):
  answer = client.post("/translate", json={"text": [LONG], "run": names[0]})
  assert answer.status_code == 413
  assert answer.json()["detail"].startswith("sentence 1 is ")
  assert answer.json()["detail"].endswith(f"{names[0]} translates up to {MAX_SUBWORDS}: shorten"
                                          " or split it.")


def test_a_sentence_over_the_limit_fails_alone_and_the_others_translate(client, names):
  """Its translation, score and attention are null, `errors` says why on its line (counted
  from 1), and the others are those they get alone."""
  alone = client.post("/translate", json={"text": SENTENCES[:2], "run": names[0],
                                          "attention": True}).json()
  body = client.post("/translate", json={"text": [SENTENCES[0], LONG, SENTENCES[1]],
                                         "run": names[0], "attention": True}).json()
  assert body["translations"] == [alone["translations"][0], None, alone["translations"][1]]
  assert body["scores"] == [alone["scores"][0], None, alone["scores"][1]]
  assert body["attention"] == [alone["attention"][0], None, alone["attention"][1]]
  assert body["errors"][0] is None and body["errors"][2] is None
  assert body["errors"][1].startswith("sentence 2 is ")
  assert "errors" not in alone
  forced = client.post("/translate", json={"text": SENTENCES[:2], "run": names[0],
                                           "target": [VAL[0][1], LONG]})
  assert forced.status_code == 200, forced.text
  forced = forced.json()
  assert forced["translations"] == [VAL[0][1], None]
  assert forced["errors"][1].startswith("the target of sentence 2 is ")


def test_a_target_given_as_subwords_is_scored_as_split(client, engine, names):
  """A search may split its output otherwise than its text splits again (here a lone "▁"
  first, which the text does not show): 'target_subwords' scores the split given, as the
  search scored it; 'target' scores the text's own split. Subwords of no vocabulary, and both
  fields at once, are refused in one line."""
  served, source = engine.runs[names[0]], SENTENCES[0]
  vocabulary = served.tokenizer
  odd = [vocabulary.piece_id("▁"), *vocabulary.encode(VAL[0][1])]
  assert vocabulary.encode(vocabulary.decode(odd)) == odd[1:]
  out = np.asarray([*odd, EOS_ID], np.int32)
  _, log_probs = served.alignments(served.alignments.translator.source_ids(source), out)
  expected = log_probs.sum() / search.length_penalty(len(out), served.alpha)
  body = {"text": [source], "run": names[0]}
  split = client.post("/translate", json={**body, "target_subwords": [
      vocabulary.pieces(out)]}).json()
  assert split["translations"] == [vocabulary.decode(odd)]
  np.testing.assert_allclose(split["scores"][0], expected, rtol=1e-5)
  text = client.post("/translate", json={**body, "target": [vocabulary.decode(odd)]}).json()
  assert abs(text["scores"][0] - expected) > 1e-3
  for extra, why in [({"target_subwords": [["▁Ein", "zzqq"]]}, "holds 'zzqq', which is not a"
                      " subword"), ({"target_subwords": [["</s>"]]}, "is empty"),
                     ({"target_subwords": [["▁Ein"]], "target": ["Ein"]}, "holds both")]:
    refused = client.post("/translate", json={**body, **extra})
    assert refused.status_code == 400 and why in refused.json()["detail"], refused.text


def test_a_huge_target_subwords_list_is_refused_as_itself(client, names):
  """Not as 'target' (it was: "target[0] has 24999 characters"): 'target_subwords' names
  itself, over the request's limit as over the run's compiled lengths."""
  body = {"text": ["A dog."], "run": names[0]}
  answer = client.post("/translate", json={**body, "target_subwords": [["\u2581Hund"] * 5000]})
  assert (answer.status_code, answer.json()["detail"]) == (
      413, "target_subwords[0] holds 5000 subwords; send at most 200 per translation"
           " (--max_chars characters).")
  answer = client.post("/translate", json={**body, "target_subwords": [["\u2581Hund"] * 100]})
  assert answer.status_code == 413 and answer.json()["detail"].startswith(
      "target_subwords[0] (sentence 1) is 101 subwords long with </s>; for this sentence"), (
      answer.text)


def test_a_translation_cut_at_its_length_cap_scores_forced_back_as_the_search_scored_it(
    client, names):
  """A search that reaches a sentence's length cap stops without </s> (the session run, 4
  steps in, never ends one): its subwords forced back through 'target_subwords' as its
  attention lists them, without </s>, score what the search scored (no </s> it never chose)
  and keep its rows, with a warning that says why. With </s> added, they score as a
  translation that ends; a shorter target without </s> had its </s> left out: it gets one."""
  body = {"text": SENTENCES[:2], "run": names[0], "attention": True}
  searched = client.post("/translate", json=body).json()
  targets = [found["target"] for found in searched["attention"]]
  assert all(target[-1] != "</s>" for target in targets), targets  # Cut at the cap.
  forced = client.post("/translate", json={**body, "target_subwords": targets}).json()
  np.testing.assert_allclose(forced["scores"], searched["scores"], rtol=1e-5)
  assert [found["target"] for found in forced["attention"]] == targets
  for i, (warning, target) in enumerate(zip(forced["warnings"], targets, strict=True)):
    assert warning.startswith(f"target_subwords[{i}] ends without </s> at {len(target)}"
                              f" subwords, the length cap of a search of {names[0]} for"
                              f" sentence {i + 1} ({len(target)}): a search cut there never"
                              " chose </s>, so it is scored without </s>"), warning
  ended = client.post("/translate", json={**body, "target_subwords": [
      [*target, "</s>"] for target in targets]}).json()
  assert "warnings" not in ended and ended["attention"][0]["target"] == [*targets[0], "</s>"]
  assert abs(ended["scores"][0] - searched["scores"][0]) > 1e-3
  short = [target[:3] for target in targets]
  left_out, given = (client.post("/translate", json={**body, "target_subwords": subwords}).json()
                     for subwords in (short, [[*target, "</s>"] for target in short]))
  assert left_out["scores"] == given["scores"] and "warnings" not in left_out


def test_weights_are_sent_whole_so_that_exact_zeros_stay_zeros(client, engine, names):
  """Each weight is the float32 the model computed, not rounded to 4 decimals (which made a
  real 0 and 0.00004 both 0.0): the API's weights read back bit for bit, the decoder's masked
  weights (on a later target subword) are exactly 0, and a weight of 4e-5 stays itself, in the
  fewest digits that read back as its float32."""
  served = engine.runs[names[0]]
  found = client.post("/translate", json={"text": SENTENCES[:1], "run": names[0],
                                          "attention": True}).json()["attention"][0]
  ids = served.searches[1, 1].hypotheses(SENTENCES[:1])[0][0].ids
  weights, _ = served.alignments(served.alignments.translator.source_ids(SENTENCES[0]), ids)
  for kind, field in (("cross", "weights"), ("encoder", "encoder"), ("decoder", "decoder")):
    np.testing.assert_array_equal(np.asarray(found[field], np.float32), weights[kind])
  decoder = np.asarray(found["decoder"])
  seen = np.tril(np.ones(decoder.shape[-2:], bool))  # A row's own subword and those before.
  assert np.all(decoder[..., ~seen] == 0) and np.all(decoder[..., seen] > 0)
  values = np.float32([0, 4e-5, 1e-9, 0.1, 0.123456789, 1, 2e-45])
  sent = exact(values)
  assert json.dumps(sent) == "[0.0, 4e-05, 1e-09, 0.1, 0.12345679, 1.0, 1.4013e-45]"
  np.testing.assert_array_equal(np.float32(sent), values)


def test_the_apis_examples_are_requests_this_server_answers(client, names):
  """/docs' "Try it out" sends the description's example, which named a run "string" (a 404):
  POST /translate's example, and a request of its fields' examples, name the first run served,
  and are answered."""
  spec = client.get("/openapi.json").json()
  example = spec["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"][
      "example"]
  assert example == {"text": ["A dog runs on the beach."], "run": names[0]}
  assert client.post("/translate", json=example).status_code == 200
  fields = spec["components"]["schemas"]["TranslateRequest"]["properties"]
  from_fields = {name: field["example"] for name, field in fields.items() if "example" in field}
  assert from_fields == {**example, "beam": 1}
  assert client.post("/translate", json=from_fields).status_code == 200
  assert client.get("/runs").status_code == 200  # GET /runs takes nothing.


def test_a_run_is_described_by_its_direction_size_and_parameters(runs, names, tmp_path):
  """Its direction, its size, and what its parameters are: a checkpoint's step, an average's
  steps, and for a released model (seq2seq-export --format=seq2seq) the average its
  released.json records, not "checkpoint latest" of the one checkpoint it holds."""
  from seq2seq.runs import released

  output = released.release(runs[0], "avg:2", tmp_path / "released")
  described = {spec: ServedRun("x", workdir, checkpoint, [1], 0.6, BATCH, 8).info()
               for spec, workdir, checkpoint in (("latest", runs[0], "latest"),
                                                 ("avg:2", runs[0], "avg:2"),
                                                 ("released", output, "latest"))}
  translator = Translator(runs[0], "latest", beam_size=1, batch_size=BATCH)
  size = int(sum(np.prod(x.shape) for x in jax.tree.leaves(translator.params)))
  assert 1e3 <= size < 1e6 and described["latest"]["parameters"] == size
  head = f"en->de, {size / 1e3:.0f}k parameters"
  assert described["latest"]["described"] == f"{head}; checkpoint latest, step 4"
  assert described["avg:2"]["described"] == f"{head}; checkpoint avg:2, the average of steps 2, 4"
  info = described["released"]
  assert info["described"] == (f"{head}; a released model: the average of steps 2, 4 of"
                               f" {runs[0].name} (its checkpoint avg:2)")
  assert info["released"] == {"run": runs[0].name, "steps": [2, 4], "checkpoint": "avg:2",
                              "spec": "avg:2"}
  assert info["direction"] == "en->de" and described["latest"]["released"] is None


@pytest.mark.parametrize("beam", [1, 3], ids=["greedy", "beam-3"])
def test_a_forced_target_of_the_searchs_own_output_has_its_score(engine, names, beam):
  """Scoring a search's best output as a given target gives the search's score: the
  log-probability of its subwords over the GNMT length penalty at alpha 0.6."""
  served = engine.runs[names[0]]
  translator = served.searches[beam, 1]
  for line, nbest in zip(SENTENCES, translator.hypotheses(SENTENCES), strict=True):
    _, log_probs = served.alignments(translator.source_ids(line), nbest[0].ids)
    np.testing.assert_allclose(log_probs.sum() / search.length_penalty(len(nbest[0].ids), 0.6),
                               nbest[0].score, rtol=1e-5)
    assert nbest[0].score < 0


def test_forced_scores_are_the_runs_log_probabilities_of_the_targets(client, runs, names):
  """The API's score of each given target is its length-normalized log-probability under the
  run, computed op by op on the sentence alone."""
  references = [reference for _, reference in VAL]
  body = client.post("/translate", json={"text": SENTENCES, "run": names[0],
                                         "target": references}).json()
  assert body.get("forced") and "beam" not in body, body
  assert body["translations"] == references
  translator = Translator(runs[0], "latest", beam_size=1, batch_size=BATCH)
  model = nnx.merge(translator.graphdef, translator.params)
  for line, reference, score in zip(SENTENCES, references, body["scores"], strict=True):
    out = [*translator.tokenizer.encode(reference), EOS_ID]
    src = jnp.asarray([[*translator.source_ids(line), EOS_ID]])
    logits = model.decode(model.encode(src), jnp.asarray([[BOS_ID, *out[:-1]]]))[0]
    log_probs = jax.nn.log_softmax(logits)[jnp.arange(len(out)), jnp.asarray(out)]
    np.testing.assert_allclose(score, log_probs.sum() / search.length_penalty(len(out), 0.6),
                               rtol=1e-4)


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_the_forced_program_runs_the_model_once(tiny_config, family):
  """`_forced` asks the model for its logits and its attention in two calls, and XLA merges
  the two passes into one: by XLA's cost analysis, the program costs the logits alone plus
  under a tenth of what the attention alone costs (0.6% for the Transformer, 5% for the
  RNN here), where two passes would add all of it."""
  tiny_config.model.family = family
  graphdef, params = nnx.split(build_model(tiny_config, 40))
  src, tgt = jnp.ones((1, 12), jnp.int32), jnp.ones((1, 16), jnp.int32)

  def log_probs(params, src, tgt_in, out):
    return _forced(params, src, tgt_in, out, graphdef=graphdef)[1]

  def weights(params, src, tgt_in, out):
    return _forced(params, src, tgt_in, out, graphdef=graphdef)[0]

  def flops(f):
    return jax.jit(f).lower(params, src, tgt, tgt).compile().cost_analysis()["flops"]

  both = flops(functools.partial(_forced, graphdef=graphdef))
  assert both - flops(log_probs) < 0.1 * flops(weights)


def test_forced_attention_follows_the_target_given(client, runs, names):
  references = [reference for _, reference in VAL[:2]]
  body = client.post("/translate", json={"text": SENTENCES[:2], "run": names[0],
                                         "target": references, "attention": True}).json()
  translator = Translator(runs[0], "latest", beam_size=1, batch_size=BATCH)
  for line, reference, found in zip(SENTENCES[:2], references, body["attention"], strict=True):
    pieces = translator.tokenizer.pieces([*translator.tokenizer.encode(reference), EOS_ID])
    source = translator.tokenizer.pieces([*translator.source_ids(line), EOS_ID])
    assert (found["target"], found["source"]) == (pieces, source)
    weights = np.asarray(found["weights"])
    assert weights.shape[2:] == (len(pieces), len(source))
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-3)
  assert all(score < 0 for score in body["scores"])


def test_a_target_longer_than_the_compiled_outputs_is_refused(client, names):
  long = " ".join(["Hund"] * 39)  # 194 characters, more than 32 subwords.
  answer = client.post("/translate", json={"text": ["A dog."], "run": names[0],
                                           "target": [long]})
  assert answer.status_code == 413
  assert answer.json()["detail"].startswith("the target of sentence 1 is ")
  assert f"for this sentence {names[0]} scores translations of up to" in (
      answer.json()["detail"])


def test_only_loopback_hosts_serve_without_a_warning():
  """seq2seq-serve warns, once, when --host is not this machine alone: the API has no
  authentication."""
  assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
  assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.20", "example.org"]))


def test_several_runs_need_a_name(client):
  answer = client.post("/translate", json={"text": ["A dog."]})
  assert answer.status_code == 400 and "name one in 'run'" in answer.json()["detail"]


def test_the_page_api_docs_and_their_assets_are_local(client):
  page = client.get("/")
  assert page.status_code == 200 and "attention explorer" in page.text
  docs = client.get("/docs").text
  assets = [part.split('"')[0] for part in (page.text + docs).split('src="')[1:]]
  assets += [part.split('"')[0] for part in (page.text + docs).split('href="')[1:]]
  assets = [a for a in assets if not a.startswith("data:")]  # Inline: nothing to fetch.
  assert assets and all(a.startswith("/") for a in assets), assets
  for asset in assets:
    assert client.get(asset).status_code == 200, asset
  assert "/translate" in client.get("/openapi.json").json()["paths"]


def test_the_api_is_described_as_openapi_3_0_which_the_bundled_swagger_ui_reads(client):
  """Swagger UI 4.x (swagger-ui-bundle) shows 'Unable to render this definition' for
  FastAPI's OpenAPI 3.1: the description is served as 3.0 (nullable, example)."""
  spec = client.get("/openapi.json").json()
  text = json.dumps(spec)
  assert spec["openapi"] == "3.0.3" and '"type": "null"' not in text
  request = spec["components"]["schemas"]["TranslateRequest"]["properties"]
  assert request["beam"] == {**request["beam"], "type": "integer", "nullable": True}
  assert request["text"]["example"] == ["A dog runs on the beach."]
  assert "examples" not in request["text"]
  assert "/translate" in spec["paths"]


def test_the_api_declares_the_refusals_it_answers_with(client, names):
  """/docs lists the 4xx answers POST /translate gives, each in the server's one shape
  (`{"detail": "<one line>"}`), not FastAPI's 422 list of errors, which it never sends."""
  spec = client.get("/openapi.json").json()
  responses = spec["paths"]["/translate"]["post"]["responses"]
  refusal = {"$ref": "#/components/schemas/Refusal"}
  assert set(responses) == {"200", "400", "404", "413", "415", "422"}
  for status, declared in responses.items():
    if status != "200":
      assert declared["content"]["application/json"]["schema"] == refusal, status
  detail = spec["components"]["schemas"]["Refusal"]["properties"]["detail"]
  assert detail["type"] == "string" and spec["components"]["schemas"]["Refusal"][
      "required"] == ["detail"]
  assert "HTTPValidationError" not in spec["components"]["schemas"]
  for body, status in (({"text": []}, 400), ({"text": ["A dog."], "run": "nope"}, 404),
                       ({"text": ["A dog."] * 51}, 413), ({"text": 5}, 422)):
    answer = client.post("/translate", json={"run": names[0], **body})
    assert answer.status_code == status and list(answer.json()) == ["detail"]
    assert isinstance(answer.json()["detail"], str)


def test_scores_are_described_as_what_they_are(client):
  """A score is the log-probability over the GNMT length penalty, not per length: so say the
  API's description and docs/evaluation.md's "Serving" (the page: the browser tests)."""
  spec = client.get("/openapi.json").json()
  serving = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8").split(
      "## Serving")[1]
  for text in (json.dumps(spec), serving):
    assert "per length" not in text and "length-normalized" not in text
  scores = spec["components"]["schemas"]["TranslateResponse"]["properties"]["scores"]
  assert "divided by the GNMT length penalty ((5 + length) / 6) ** alpha" in (
      scores["description"])
  assert "divided by the GNMT length penalty" in serving


def test_a_target_the_vocabulary_cannot_spell_is_scored_with_a_warning(client, names):
  """Its characters the vocabulary lacks are each scored as <unk> (the tokenizer's): the answer
  says so for that sentence, and names them."""
  target = "Ein Hund \u2603 l\u00e4uft."  # A snowman: not in the session run's vocabulary.
  answer = client.post("/translate", json={"text": SENTENCES[:2], "run": names[0],
                                           "target": [VAL[0][1], target]})
  assert answer.status_code == 200, answer.text
  body = answer.json()
  assert body["translations"] == [VAL[0][1], target] and body["scores"][1] < 0
  assert body["warnings"] == [None, (
      f"the target of sentence 2 holds '\u2603' (U+2603), which the vocabulary of {names[0]}"
      " lacks: each is scored as <unk>, whose probability says nothing of the character (such"
      " a target can outscore a real translation); replace or remove it.")]
  plain = client.post("/translate", json={"text": SENTENCES[:1], "run": names[0],
                                          "target": [VAL[0][1]]}).json()
  assert "warnings" not in plain


def test_32_concurrent_clients_get_every_answer_right(engine, runs, names):
  """500 requests of one to three sentences from 32 client threads over real HTTP, each with its
  own connection (as the serving benchmark's clients): none fails, and each answer is the
  translation of its own sentences. (One httpx.Client shared by 32 threads is not 32 clients,
  and its pool can close a connection that another thread was just handed: EBADF.)"""
  translator = Translator(runs[0], "latest", beam_size=1, batch_size=BATCH)
  expected = dict(zip(SENTENCES, [n[0][0] for n in translator.translate(SENTENCES)],
                      strict=True))
  rng = np.random.default_rng(0)
  requests = [list(rng.choice(SENTENCES, size=rng.integers(1, 4))) for _ in range(500)]
  with (serving_in_background(create_app(engine)) as url,
        clients_per_thread(url, timeout=120) as client):
    def ask(lines):
      answer = client().post("/translate", json={"text": lines, "run": names[0], "beam": 1})
      return answer.status_code, answer.json()

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
      answers = list(pool.map(ask, requests))
  assert [status for status, _ in answers] == [200] * len(requests)
  assert [body["translations"] for _, body in answers] == [
      [expected[line] for line in lines] for lines in requests]


def _chromium() -> str | None:
  return shutil.which("chromium") or shutil.which("chromium-browser")


# A 40-word sentence: the explorer must show two runs' maps of it side by side at 1400 px.
FORTY = ("A man in a blue shirt and a woman in a red dress are standing on a ladder near the"
         " old house while two small dogs run after a ball on the green grass of the park by"
         " the river.")
BROWSER_SUBWORDS = 63  # The session run's longest (config.model.max_len less EOS).


@pytest.fixture(scope="module")
def browser():
  """Debian's chromium, driven by Playwright: one for the module's explorers (Playwright's
  sync API runs one instance at a time)."""
  if _chromium() is None:
    pytest.skip("no browser: apt-get install chromium")
  from playwright.sync_api import sync_playwright

  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=_chromium(), args=["--no-sandbox"])
    try:
      yield browser
    finally:
      browser.close()


@pytest.fixture(scope="module")
def explorer(browser, runs, names):
  """The explorer in Debian's chromium at 1400x900, over a server of two runs of one
  vocabulary that differ (the run at its last checkpoint, its copy at its first), each
  serving sentences as long as FORTY."""
  served = [ServedRun(names[0], runs[0], "latest", [1], 0.6, BATCH, BROWSER_SUBWORDS),
            ServedRun(names[1], runs[1], "2", [1], 0.6, BATCH, BROWSER_SUBWORDS)]
  with _browser_over(browser, served) as explorer:
    yield explorer


@contextlib.contextmanager
def _browser_over(browser, served):
  """A page of `browser` at 1400x900 on the explorer over the `served` runs, compiled first:
  (page, its server's URL, a test client of the same server)."""
  for run in served:
    run.compile_ahead()
  engine = Engine(served, Limits(max_lines=4, max_chars=400)).start()
  client = TestClient(create_app(engine))
  with serving_in_background(client.app) as url:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
      yield page, url, client
    finally:
      page.close()
      engine.close()


def _open(page, url, text, *, compare=None, reference=""):
  """The explorer, fresh, after Translate on `text` with both runs (forced to one target with
  `compare`: 'reference', 'a' or 'b')."""
  page.goto(url + "/")
  page.wait_for_function("document.querySelector('#status').textContent === 'Ready.'")
  page.fill("#source", text)
  if compare:
    page.check("#compare")
    page.select_option("#target-from", compare)
    if reference:
      page.fill("#reference", reference)
  page.click("#translate")
  page.wait_for_function("!['Translating…', 'Ready.'].includes(document.querySelector("
                         "'#status').textContent) && !document.querySelector('#translate')"
                         ".disabled")


def _cells(page, panel):
  """The weights of a panel's map (not its gate column), row by row."""
  return page.eval_on_selector_all(f"#{panel} table.heatmap td:not(.gate)",
                                   "cells => cells.map(c => Number(c.dataset.w))")


def _overflowing(page) -> list[str]:
  """Every element that scrolls or clips sideways (its content wider than its box)."""
  return page.evaluate("""() => {
    const out = [];
    if (document.documentElement.scrollWidth > window.innerWidth) out.push('the page');
    for (const e of document.querySelectorAll('body *')) {
      const style = getComputedStyle(e);
      if (e.offsetParent === null || style.display === 'inline') continue;
      if (e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0
          && !['TH', 'SPAN', 'OPTION', 'SELECT'].includes(e.tagName))
        out.push(e.tagName + '#' + e.id + '.' + e.className + ' ' + e.scrollWidth + '>' +
                 e.clientWidth);
    }
    return out;
  }""")


def test_the_explorer_fits_two_runs_maps_of_a_40_word_sentence_at_1400_px(explorer, names):
  page, url, client = explorer
  api = client.post("/translate", json={"text": [FORTY], "run": names[0],
                                        "attention": True}).json()
  source = api["attention"][0]["source"]
  assert len(FORTY.split()) == 40 and len(source) >= 43
  _open(page, url, FORTY)
  page.wait_for_selector("#panel-b table.heatmap")
  for kind in ("cross", "encoder"):
    page.select_option("#kind", kind)
    for panel in ("panel-a", "panel-b"):
      rows = page.query_selector_all(f"#{panel} table.heatmap tbody tr")
      expected = api["attention"][0]["target" if kind == "cross" else "source"]
      assert len(rows) == len(expected)
      assert len(rows[0].query_selector_all("td")) == len(source)
      assert kind.split()[0] in page.inner_text(f"#{panel} .shows")  # It says what it shows.
    assert _overflowing(page) == []
  # Word starts are shown without their mark; the source line wraps instead of clipping.
  labels = page.eval_on_selector_all("#panel-a table.heatmap thead th",
                                     "ths => ths.map(t => t.textContent)")
  assert not any("\u2581" in label for label in labels) and labels[1] == "A"
  # The decoder's columns are what it read: <s>, then the translation but its last subword.
  page.select_option("#kind", "decoder")
  labels = page.eval_on_selector_all("#panel-a table.heatmap thead th",
                                     "ths => ths.map(t => t.textContent)")
  assert labels[1] == "<s>" and len(labels) == 1 + len(api["attention"][0]["target_inputs"])
  assert page.eval_on_selector("#panel-a .source-line",
                               "e => e.getClientRects().length && e.offsetHeight > 40")


def test_at_1280x720_translate_brings_the_first_maps_rows_into_view_below_the_pickers(
    explorer):
  """Two runs' maps of a 40-word sentence start below a 720 px window (its translations and
  source line wrap): after Translate the page scrolls their first rows into view, under the
  pickers, which stay at the top of the window."""
  page, url, _ = explorer
  page.set_viewport_size({"width": 1280, "height": 720})
  try:
    _open(page, url, FORTY + "\n" + SENTENCES[0])
    page.wait_for_selector("#panel-b table.heatmap")
    assert page.evaluate("window.scrollY") > 0
    toolbar = page.eval_on_selector("#toolbar", "e => e.getBoundingClientRect().toJSON()")
    top = page.eval_on_selector("#panel-a table.heatmap tbody",
                                "e => e.getBoundingClientRect().top")
    assert toolbar["top"] >= -1 and toolbar["bottom"] < top < 720 - 48, (toolbar, top)
  finally:
    page.set_viewport_size({"width": 1400, "height": 900})


def test_panels_share_the_sentence_layer_head_and_hover(explorer, names):
  page, url, client = explorer
  api = [client.post("/translate", json={"text": SENTENCES[:2], "run": name,
                                         "attention": True}).json() for name in names]
  _open(page, url, "\n".join(SENTENCES[:2]))
  page.wait_for_selector("#panel-b table.heatmap")
  heads = len(api[0]["attention"][0]["weights"][0])
  assert heads > 1
  page.select_option("#head", str(heads))  # The last head, shown from 1.
  page.click("#sentences li:nth-child(2)")
  assert page.input_value("#head") == str(heads)
  for i, panel in enumerate(("panel-a", "panel-b")):
    assert page.inner_text(f"#{panel} .translation") == api[i]["translations"][1]
    expected = api[i]["attention"][1]["weights"][0][heads - 1]
    np.testing.assert_allclose(_cells(page, panel), np.ravel(expected), atol=1e-4)
  page.select_option("#head", "mean")
  mean = np.mean(api[0]["attention"][1]["weights"][0], axis=0)
  np.testing.assert_allclose(_cells(page, "panel-a"), np.ravel(mean), atol=1e-4)
  page.hover("#panel-a table.heatmap tbody tr:first-child th")
  for panel in ("panel-a", "panel-b"):
    assert page.eval_on_selector(f"#{panel} table.heatmap tbody tr:first-child",
                                 "tr => tr.classList.contains('hover')")
  shaded = page.eval_on_selector_all("#panel-b .source-line span",
                                     "spans => spans.map(s => s.style.background)")
  assert all(shaded)
  # The score says what it is: the log-probability over the length penalty, not per length.
  assert page.inner_text("#panel-a .score") == (
      f"(score {api[0]['scores'][1]:.3f}: log-probability / GNMT length penalty, alpha 0.6)")
  # A sentence typed but not translated is in its box alone: a click on a thumbnail (or any
  # picker) writes the address from what the maps show.
  page.fill("#source", "A sentence typed after the translation.")
  page.click("#panel-a canvas.thumb[data-head='2']")
  permalink = page.url
  assert _address(permalink)["text"] == "\n".join(SENTENCES[:2])
  # The view is a permalink: the address restores it, translated again.
  page.goto("about:blank")
  page.goto(permalink)
  page.wait_for_function("document.querySelector('#status').textContent === 'Done.'")
  assert page.input_value("#head") == "2" and page.input_value("#source") == "\n".join(
      SENTENCES[:2])
  assert page.eval_on_selector("#sentences li.current", "li => li.textContent") == SENTENCES[1]
  expected = api[0]["attention"][1]["weights"][0][1]
  np.testing.assert_allclose(_cells(page, "panel-a"), np.ravel(expected), atol=1e-4)


def _address(url: str) -> dict:
  """The state the explorer's address holds (after its '#')."""
  from urllib.parse import parse_qs
  return {k: v[0] for k, v in parse_qs(url.partition("#")[2], keep_blank_values=True).items()}


def _rgb(css: str) -> np.ndarray:
  """A CSS colour as the page computes it, `rgb(r, g, b)` or `rgba(r, g, b, a)`, as the
  colour it shows on white."""
  parts = [float(p) for p in re.findall(r"[\d.]+", css)]
  alpha = parts[3] if len(parts) > 3 else 1.0
  return np.asarray(parts[:3]) * alpha + 255 * (1 - alpha)


def _bar_colour(bar: dict, value: float) -> np.ndarray:
  """The colour the colour bar shows at `value`, on white: its gradient's stops (evenly
  spaced, as the page writes them), premultiplied and interpolated as CSS does, at `value`'s
  place between the bar's two labelled ends."""
  stops = [np.asarray([float(p) for p in re.findall(r"[\d.]+", c)] + [1.0])[:4]
           for c in re.findall(r"rgba?\([^)]*\)", bar["gradient"])]
  stops = [np.concatenate([stop[:3] * stop[3], stop[3:]]) for stop in stops]
  where = (value - bar["low"]) / (bar["high"] - bar["low"]) * (len(stops) - 1)
  k = min(int(where), len(stops) - 2)
  r, g, b, a = stops[k] + (where - k) * (stops[k + 1] - stops[k])
  return np.asarray([r, g, b]) + 255 * (1 - a)


def _colour_bar(page, panel: str) -> dict:
  return page.eval_on_selector(f"#{panel} .colour-bar", """bar => ({
    low: Number(bar.querySelector('.low').textContent),
    high: Number(bar.querySelector('.high').textContent),
    gradient: getComputedStyle(bar.querySelector('.scale')).backgroundImage,
    legend: bar.querySelector('.about').textContent})""")


def _assert_drawn_on_their_bar(page, panel: str) -> np.ndarray:
  """Every weight cell of `panel` has the colour its colour bar shows at the cell's value, and
  lies within the bar's range (its ends labelled to 3 significant digits, the cells' values
  whole); returns the values."""
  bar = _colour_bar(page, panel)
  cells = page.eval_on_selector_all(f"#{panel} table.heatmap td:not(.gate)", """cells =>
      cells.map(c => [Number(c.dataset.w), getComputedStyle(c).backgroundColor])""")
  values = np.asarray([w for w, _ in cells])
  assert bar["low"] - 5e-3 * abs(bar["low"]) <= values.min(), (bar, values.min())
  assert values.max() <= bar["high"] + 5e-3 * abs(bar["high"]), (bar, values.max())
  for value, css in cells:
    np.testing.assert_allclose(_rgb(css), _bar_colour(bar, value), atol=2.5,
                               err_msg=f"{panel}: {value} on a bar of {bar}")
  return values


def test_each_maps_colour_bar_is_the_scale_its_cells_are_drawn_on(explorer, names):
  """Every cell has the colour its colour bar shows at the cell's value, on each run's map
  (0 to 1: a map whose weights peak at 0.3 is pale, and its bar says so) and on the
  difference's (minus to plus its largest difference)."""
  page, url, _ = explorer
  _open(page, url, SENTENCES[1], compare="reference", reference=VAL[1][1])
  page.wait_for_selector("#panel-diff table.heatmap")
  for panel in ("panel-a", "panel-b", "panel-diff"):
    _assert_drawn_on_their_bar(page, panel)
  assert (_colour_bar(page, "panel-a")["low"], _colour_bar(page, "panel-a")["high"]) == (0, 1)
  assert _colour_bar(page, "panel-a")["legend"] == "attention weight"  # Rows sum to one.
  # Neither run is differential or gated: no map picker, no gate column.
  assert page.is_hidden("#map-label") and not page.query_selector("td.gate")
  assert f"red, A ({names[0]}) attends more; blue, B ({names[1]})" in _colour_bar(
      page, "panel-diff")["legend"]


def test_two_runs_forced_on_one_reference_share_axes_and_their_difference_is_a_minus_b(
    explorer, names):
  page, url, client = explorer
  reference = VAL[1][1]
  api = [client.post("/translate", json={"text": [SENTENCES[1]], "run": name,
                                         "target": [reference], "attention": True}).json()
         for name in names]
  _open(page, url, SENTENCES[1], compare="reference", reference=reference)
  page.wait_for_selector("#panel-diff table.heatmap")
  target = api[0]["attention"][0]["target"]
  assert api[1]["attention"][0]["target"] == target
  for panel in ("panel-a", "panel-b"):
    assert page.inner_text(f"#{panel} .translation") == reference
    assert len(page.query_selector_all(f"#{panel} table.heatmap tbody tr")) == len(target)
  a, b = (np.mean(found["attention"][0]["weights"][0], axis=0) for found in api)
  assert np.abs(a - b).max() > 1e-3  # The two checkpoints attend differently.
  np.testing.assert_allclose(_cells(page, "panel-diff"), np.ravel(a - b), atol=2e-4)
  with page.expect_download() as download:
    page.click("#panel-a button.export[data-format=JSON]")
  exported = json.loads(open(download.value.path()).read())
  np.testing.assert_allclose(exported["weights"], a, atol=1e-4)
  assert (exported["runs"], exported["text"], exported["scale"]["low"],
          exported["scale"]["high"]) == ([names[0]], SENTENCES[1], 0, 1)
  figures = {}
  for format in ("PNG", "SVG"):
    with page.expect_download() as download:
      page.click(f"#panel-diff button.export[data-format={format}]")
    figures[format] = open(download.value.path(), "rb").read()
  _stands_alone(page, figures, names, a - b)


def test_a_target_the_vocabulary_cannot_spell_is_a_warning_on_the_page(explorer, names):
  page, url, _ = explorer
  _open(page, url, SENTENCES[1], compare="reference", reference="Ein Hund \u2603 l\u00e4uft.")
  assert page.eval_on_selector("#status", "s => s.className") == "warning"
  assert page.inner_text("#status").startswith(
      f"Done, with 2 warnings (each panel shows its own): {names[0]}: the target of sentence 1"
      f" holds '\u2603' (U+2603), which the vocabulary of {names[0]} lacks:")
  for name, panel in zip(names, ("panel-a", "panel-b"), strict=True):
    assert page.inner_text(f"#{panel} .warning").startswith(
        f"Warning: the target of sentence 1 holds '\u2603' (U+2603), which the vocabulary of"
        f" {name} lacks")


def _stands_alone(page, figures: dict, names, difference):
  """The difference's exported SVG names both runs, the sentence, and which sign is which;
  it has the colour bar, labelled with its range; every word of it lies inside the picture;
  and the PNG is that SVG drawn at twice its size."""
  from PIL import Image

  svg = figures["SVG"].decode("utf-8")
  most = float(f"{np.abs(difference).max():.3g}")
  for text in (f"{names[0]} minus {names[1]}", f"Sentence 1: {SENTENCES[1]}",
               f"red, A ({names[0]}) attends more; blue, B ({names[1]}) does",
               'fill="url(#scale)"', f">{-most:g}<", f">{most:g}<"):
    assert text in svg, text
  outside = page.evaluate("""svg => {
    const box = document.createElement('div');
    box.innerHTML = svg;
    document.body.append(box);
    const picture = box.firstChild.getBoundingClientRect(), out = [];
    for (const text of box.querySelectorAll('text')) {
      const r = text.getBoundingClientRect();
      if (r.left < picture.left - 0.5 || r.right > picture.right + 0.5
          || r.top < picture.top - 0.5 || r.bottom > picture.bottom + 0.5)
        out.push(text.textContent);
    }
    box.remove();
    return out;
  }""", svg)
  assert outside == []
  width, height = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', svg).groups())
  with Image.open(io.BytesIO(figures["PNG"])) as png:
    assert png.size == (2 * width, 2 * height)


def test_the_page_reports_failures_in_its_own_terms(explorer, names):
  page, url, _ = explorer
  too_long = " ".join(["dog"] * 70)  # Over the runs' 63 subwords.
  _open(page, url, SENTENCES[0] + "\n" + too_long)
  page.wait_for_selector("#panel-a table.heatmap")  # The first line translated.
  assert page.eval_on_selector("#sentences li:nth-child(2)",
                               "li => li.classList.contains('failed')")
  page.click("#sentences li:nth-child(2)")
  assert page.inner_text("#panel-a .error").startswith("Line 2: sentence 2 is ")
  # Compared on A's translation, the line A could not translate says why, as without compare.
  _open(page, url, SENTENCES[0] + "\n" + too_long, compare="a")
  page.wait_for_selector("#panel-diff table.heatmap")
  page.click("#sentences li:nth-child(2)")
  for panel in ("panel-a", "panel-b"):
    assert re.fullmatch(rf"Line 2: sentence 2 is \d+ subwords long; {re.escape(names[0])}"
                        rf" translates up to {BROWSER_SUBWORDS}: shorten or split it\.",
                        page.inner_text(f"#{panel} .error")), page.inner_text(f"#{panel} .error")
  # A refusal keeps the maps on screen, and says why in the server's words.
  page.click("#sentences li:nth-child(1)")
  cells, permalink = _cells(page, "panel-a"), page.url
  page.fill("#source", too_long)
  page.click("#translate")
  page.wait_for_function("document.querySelector('#status').className === 'error'")
  assert re.fullmatch(rf"{re.escape(names[0])}: sentence 1 is \d+ subwords long; .* shorten or"
                      r" split it\. \(The maps shown are still the last translation's\.\)",
                      page.inner_text("#status")), page.inner_text("#status")
  assert page.is_visible("#panel-a table.heatmap") and _cells(page, "panel-a") == cells
  assert page.url == permalink
  # Over the page's own limits: refused before sending, counted from 1, with the fix; the maps
  # of the last translation stay.
  page.fill("#source", "\n".join([SENTENCES[0], "x" * 401]))
  page.click("#translate")
  assert page.inner_text("#status") == ("Line 2 has 401 characters; this server takes at most"
                                        " 400 per line: shorten it. (The maps shown are still"
                                        " the last translation's.)")
  assert _cells(page, "panel-a") == cells
  _open(page, url, "\n".join([SENTENCES[0], "x" * 401]))  # A fresh page: no maps to keep.
  assert page.inner_text("#status") == ("Line 2 has 401 characters; this server takes at most"
                                        " 400 per line: shorten it.")
  assert page.is_hidden("#result")
  # While a request runs the button is disabled; a server that is gone is said so.
  page.route("**/translate", lambda route: route.abort())
  page.fill("#source", SENTENCES[0])
  page.click("#translate")
  page.wait_for_function("document.querySelector('#status').className === 'error'")
  assert "cannot be reached" in page.inner_text("#status")
  assert page.is_hidden("#result") and not page.is_disabled("#translate")
  page.unroute("**/translate")
  page.route("**/translate", lambda route: (page.wait_for_timeout(300), route.continue_()))
  page.click("#translate")
  assert page.is_disabled("#translate")
  page.wait_for_function("document.querySelector('#status').textContent === 'Done.'")
  page.unroute("**/translate")


def test_the_api_page_renders_the_translate_operation_and_its_example_works(explorer, names):
  """/docs renders POST /translate, and its "Try it out" sends the example as it stands, which
  the server answers (it named a run "string": a 404)."""
  page, url, _ = explorer
  page.goto(url + "/docs")  # The API's page renders the operation, not an error.
  page.wait_for_selector(".opblock-summary-path", timeout=30_000)
  paths = page.eval_on_selector_all(".opblock-summary-path",
                                    "paths => paths.map(p => p.textContent.trim())")
  assert "/translate" in paths and "Unable to render" not in page.inner_text("body")
  page.click(".opblock-post .opblock-summary")
  page.click(".opblock-post .try-out__btn")
  assert json.loads(page.input_value(".opblock-post textarea.body-param__text")) == {
      "text": ["A dog runs on the beach."], "run": names[0]}
  page.click(".opblock-post .execute")
  status = ".opblock-post .live-responses-table tbody .response-col_status"
  page.wait_for_selector(status, timeout=30_000)
  assert page.inner_text(status).strip() == "200"


@pytest.fixture(scope="module")
def explorer_sparse(browser, run, tmp_path_factory):
  """The explorer over a sparse run, the session's with sparsemax in place of its softmax (the
  same parameters: a normalizer has none), beside the session's run released at avg:2
  (seq2seq-export --format=seq2seq), each serving sentences up to its data.max_len
  (`_browser_over`), and their names."""
  from seq2seq.runs import released

  root = tmp_path_factory.mktemp("sparse")
  shutil.copytree(run, root / "sparsemax", ignore=shutil.ignore_patterns("eval"))
  saved = json.loads((root / "sparsemax" / "config.json").read_text(encoding="utf-8"))
  saved["model"]["attention_normalizer"] = "sparsemax"
  (root / "sparsemax" / "config.json").write_text(json.dumps(saved), encoding="utf-8")
  released.release(run, "avg:2", root / "released")
  workdirs = [root / "sparsemax", root / "released"]
  names = run_names(workdirs)
  with _browser_over(browser, [ServedRun(name, workdir, "latest", [1], 0.6, BATCH)
                               for name, workdir in zip(names, workdirs, strict=True)]) as explorer:
    yield (*explorer, names)


def _cell(page, panel: str, value: float) -> str:
  """The selector of the first weight cell of `panel` whose value is `value`."""
  index = page.eval_on_selector_all(
      f"#{panel} table.heatmap td:not(.gate)",
      f"cells => cells.findIndex(c => Number(c.dataset.w) === {value})")
  assert index >= 0, value
  return f"#{panel} table.heatmap td:not(.gate) >> nth={index}"


SHORT = [SENTENCES[0], SENTENCES[2], "Two dogs play in the snow.", "A man rides a red bike."]


def _weight_text(value: float) -> str:
  """A weight as the page writes it (its read-out, its figures' cells)."""
  return "0 (exactly)" if value == 0 else f"{value:.2e}".replace("e-0", "e-")


def test_the_explorer_draws_exact_zeros_apart_and_says_what_each_run_is(explorer_sparse):
  """At 1280x720, over a sparsemax run and a released model: a weight that is exactly 0 is
  drawn hatched, apart from a small positive weight (both are near white by colour alone),
  with an "exactly 0" legend, and stays so in the exports (JSON, SVG); the read-out says
  which, and is cleared when the sentence or the runs change; the first map's rows are in the
  window after Translate, and the pickers stay in view as the page scrolls; the released
  model is described as the average it is, each run by its direction and size."""
  from PIL import Image

  page, url, client, (sparse, release) = explorer_sparse
  page.set_viewport_size({"width": 1280, "height": 720})
  api = client.post("/translate", json={"text": SHORT, "run": sparse, "attention": True}).json()
  weights = np.asarray(api["attention"][0]["weights"][0])  # Layer 1: [head, target, source].
  head = int(np.argmin(np.where(weights > 0, weights, 1).min(axis=(1, 2))))
  small = float(weights[head][weights[head] > 0].min())
  assert 0 < small < 2e-3 and np.sum(weights[head] == 0) > 0  # Sparse: 0s and small weights.
  _open(page, url, "\n".join(SHORT))
  page.wait_for_selector("#panel-b table.heatmap")
  # The first map's rows are in the window, below the pickers.
  top = page.eval_on_selector("#panel-a table.heatmap tbody", "e => e.getBoundingClientRect().top")
  assert 0 < top < 720 - 48, top
  page.select_option("#head", str(head + 1))
  zero, tiny = _cell(page, "panel-a", 0), _cell(page, "panel-a", small)
  look = ("c => [c.className, getComputedStyle(c).backgroundColor,"
          " getComputedStyle(c).backgroundImage]")
  (zero_class, zero_colour, zero_image), (tiny_class, tiny_colour, tiny_image) = (
      page.eval_on_selector(cell, look) for cell in (zero, tiny))
  np.testing.assert_allclose(_rgb(zero_colour), _rgb(tiny_colour), atol=1)  # Colour alone: alike.
  assert (zero_class, tiny_class, tiny_image) == ("zero", "", "none") and "gradient" in zero_image
  pixels = [np.asarray(Image.open(io.BytesIO(page.locator(cell).screenshot())).convert("L"))
            for cell in (zero, tiny)]
  assert pixels[0].min() < 200 and pixels[1].min() > 245  # Drawn: hatched grey; near white.
  assert page.inner_text("#panel-a .colour-bar .zero-key") == "exactly 0"
  page.hover(zero)
  assert page.inner_text("#readout").endswith(": 0 (exactly)")
  page.hover(tiny)
  assert page.inner_text("#readout").endswith(f": {_weight_text(small)}")
  # Exported, the zeros stay zeros and the small weight itself.
  with page.expect_download() as download:
    page.click("#panel-a button.export[data-format=JSON]")
  exported = json.loads(open(download.value.path(), encoding="utf-8").read())
  assert exported["weights"] == weights[head].tolist() and exported["scale"]["zeros"] is True
  with page.expect_download() as download:
    page.click("#panel-a button.export[data-format=SVG]")
  svg = open(download.value.path(), encoding="utf-8").read()
  assert svg.count('fill="url(#zero)"') == np.sum(weights[head] == 0) + 1  # The cells, the key.
  assert ">exactly 0</text>" in svg
  with page.expect_download() as download:
    page.click("#panel-a button.export[data-format=PNG]")
  with Image.open(download.value.path()) as png:  # The SVG drawn at twice its size.
    drawn = np.asarray(png.convert("L"))
  for value, hatched in ((0, True), (small, False)):
    x, y = (int(v) for v in re.search(rf'<rect x="(\d+)" y="(\d+)" width="16" height="16"'
                                      rf' fill="[^"]*"><title>{re.escape(_weight_text(value))}<',
                                      svg).groups())
    cell = drawn[2 * y + 2:2 * y + 30, 2 * x + 2:2 * x + 30]
    assert (cell.min() < 200) == hatched, (value, cell.min())
  # The read-out is cleared when the sentence changes, and when the runs do.
  page.click("#sentences li:nth-child(2)")
  assert page.inner_text("#readout").strip() == ""
  page.hover(zero)
  page.select_option("#run-a", release)
  page.select_option("#run-b", sparse)
  page.click("#translate")
  page.wait_for_function(f"document.querySelector('#panel-a h2').textContent === 'A: {release}'")
  assert page.inner_text("#readout").strip() == ""
  # Each run says what it is: a released model, the average its released.json records.
  about = page.inner_text("#panel-a .about")
  assert re.search(r"en->de, \d+k parameters; a released model: the average of steps 2, 4 of"
                   r" run \(its checkpoint avg:2\); beam 1$", about), about
  assert re.search(r"en->de, \d+k parameters; checkpoint latest, step 4; beam 1$",
                   page.inner_text("#panel-b .about"))
  # The pickers stay in view as the maps scroll under them.
  page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
  assert page.evaluate("window.scrollY") > 100
  box = page.eval_on_selector("#toolbar", "e => e.getBoundingClientRect().toJSON()")
  assert abs(box["top"]) <= 1 and page.is_visible("#head")
  page.select_option("#head", "1")  # Reachable where the page has scrolled to.
  assert page.input_value("#head") == "1"


def _texts(page, selector: str, read: str = "e.textContent") -> list:
  """`read` (a JavaScript expression of `e`) of each element `selector` finds."""
  return page.eval_on_selector_all(selector, f"es => es.map(e => {read})")


@pytest.fixture(scope="module")
def explorer_2025(browser, run, tmp_path_factory):
  """The explorer over two runs of 2025's attention (`_browser_over`), and their names:
  differential attention with a head-wise output gate (trained 2 steps), and the session's run
  with sigmoid attention in place of its softmax (the same parameters: a normalizer has
  none), each serving sentences up to its data.max_len."""
  from seq2seq.training import loop
  from tests.helpers import shared_run_config

  root = tmp_path_factory.mktemp("attention_2025")
  c = shared_run_config(2)
  c.model.attention, c.model.attention_gate = "differential", "headwise"
  loop.train_and_evaluate(c, root / "differential")
  shutil.copytree(run, root / "sigmoid", ignore=shutil.ignore_patterns("eval"))
  saved = json.loads((root / "sigmoid" / "config.json").read_text(encoding="utf-8"))
  saved["model"]["attention_normalizer"] = "sigmoid"
  (root / "sigmoid" / "config.json").write_text(json.dumps(saved), encoding="utf-8")
  workdirs = [root / "differential", root / "sigmoid"]
  names = run_names(workdirs)
  with _browser_over(browser, [ServedRun(name, workdir, "latest", [1], 0.6, BATCH)
                               for name, workdir in zip(names, workdirs, strict=True)]) as explorer:
    yield (*explorer, names)


@pytest.mark.slow  # Over a minute: trains a differential run, compiles two runs' programs.
def test_the_explorer_shows_differential_maps_gates_and_weights_that_need_not_sum_to_one(
    explorer_2025):
  """A differential run's panel picks map 1, map 2 or its weights map 1 - lambda map 2, drawn
  on a scale from -1 (red) to 1 (blue) that its legend explains; a gated run's map has a gate
  column (the head's gate per row) and a line of each head's mean gate; a run whose
  normalizer's weights need not sum to one says so in its legend, and its exports too."""
  page, url, client, (differential, sigmoid) = explorer_2025
  info = {r["name"]: r for r in client.get("/runs").json()["runs"]}
  assert (info[differential]["attention_gate"], info[differential]["weights_sum_to_one"],
          info[differential]["attention_described"]) == (
              "headwise", True, "differential attention, headwise output gate")
  assert (info[sigmoid]["attention_normalizer"], info[sigmoid]["weights_sum_to_one"]) == (
      "sigmoid", False)
  text = "Two dogs play in the snow."
  api = {name: client.post("/translate", json={"text": [text], "run": name,
                                               "attention": True}).json()["attention"][0]
         for name in (differential, sigmoid)}
  found = api[differential]
  assert set(found["maps"]) == set(found["gates"]) == {"weights", "encoder", "decoder"}
  assert "maps" not in api[sigmoid] and "gates" not in api[sigmoid]
  assert np.abs(np.asarray(api[sigmoid]["weights"]).sum(-1) - 1).max() > 0.01
  maps = {kind: {part: np.asarray(v) for part, v in found["maps"][kind].items()}
          for kind in found["maps"]}
  for kind, field in (("cross", "weights"), ("encoder", "encoder"), ("decoder", "decoder")):
    lam = maps[field]["lambda"][:, None, None, None]
    np.testing.assert_allclose(found[field], maps[field]["map1"] - lam * maps[field]["map2"],
                               atol=2e-4, err_msg=kind)
  _open(page, url, text)
  page.wait_for_selector("#panel-b table.heatmap")
  # The map picker, beside the layer and head: the weights first, then each map.
  assert page.is_visible("#map-label") and page.input_value("#map") == "difference"
  assert _texts(page, "#map option", "e.value") == ["difference", "map1", "map2"]
  lam = found["maps"]["weights"]["lambda"][0]
  np.testing.assert_allclose(_cells(page, "panel-a"), np.ravel(np.mean(found["weights"][0], 0)),
                             atol=1e-4)
  bar = _colour_bar(page, "panel-a")
  assert (bar["low"], bar["high"]) == (-1, 1)
  assert bar["legend"] == ("weight = map 1 \u2212 \u03bb\u00b7map 2: blue, positive; red,"
                           f" negative (a row sums to 1 \u2212 \u03bb, \u03bb {lam:.3f})")
  assert f"map 1 \u2212 \u03bb\u00b7map 2 (\u03bb {lam:.3f})" in page.inner_text(
      "#panel-a .shows")
  # A negative weight is drawn red, as far from clear as a positive one of its size is blue,
  # never as 0: on the head and kind with the most negative weight.
  assert page.evaluate("color(-0.5, 'signed')") == "rgba(190, 40, 40, 0.500)"
  kind, field = min((("cross", "weights"), ("encoder", "encoder"), ("decoder", "decoder")),
                    key=lambda k: np.min(found[k[1]]))
  head = int(np.argmin(np.min(found[field][0], axis=(1, 2)))) + 1
  page.select_option("#kind", kind)
  page.select_option("#head", str(head))
  values = _assert_drawn_on_their_bar(page, "panel-a")
  assert values.min() < 0 and values.min() == pytest.approx(np.min(found[field][0][head - 1]))
  page.select_option("#kind", "cross")
  # The gate column: the head's gate on each target row; a line of every head's mean gate.
  gates = np.asarray(found["gates"]["weights"][0])  # [heads, target]
  shown = _texts(page, "#panel-a td.gate", "Number(e.dataset.gate)")
  np.testing.assert_allclose(shown, gates[head - 1], atol=1e-4)
  assert len(shown) == len(found["target"]) and not page.query_selector("#panel-b td.gate")
  means = _texts(page, "#panel-a .gates .gate-value")
  assert means == [f"{h + 1}: {g:.3f}" for h, g in enumerate(gates.mean(1))]
  assert page.inner_text("#panel-a .gates .gate-value.current") == means[head - 1]
  page.select_option("#head", "mean")
  np.testing.assert_allclose(_texts(page, "#panel-a td.gate", "Number(e.dataset.gate)"),
                             gates.mean(0), atol=2e-4)
  # Each map alone: a softmax, on the weights' own scale.
  for part, name in (("map1", "map 1"), ("map2", "map 2")):
    page.select_option("#map", part)
    np.testing.assert_allclose(_cells(page, "panel-a"), np.ravel(maps["weights"][part][0].mean(0)),
                               atol=1e-4)
    assert f", {name}, layer 1" in page.inner_text("#panel-a .shows")
    bar = _colour_bar(page, "panel-a")
    assert (bar["low"], bar["high"], bar["legend"]) == (0, 1, "attention weight")
    _assert_drawn_on_their_bar(page, "panel-a")
  assert _address(page.url)["map"] == "map2"  # The view is a permalink.
  # Sigmoid attention (B, beside): its weights, whatever the map picked; its legend says they
  # need not sum to one, and so does its exported figure.
  np.testing.assert_allclose(_cells(page, "panel-b"), np.ravel(np.mean(api[sigmoid]["weights"][0],
                                                                        0)), atol=1e-4)
  legend = _colour_bar(page, "panel-b")["legend"]
  assert legend == ("attention weight; sigmoid weights need not sum to one: each is between 0"
                    " and 1 on its own")
  with page.expect_download() as download:
    page.click("#panel-b button.export[data-format=SVG]")
  assert legend in open(download.value.path(), encoding="utf-8").read()


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_readme_serve_command_and_curl_line_work_as_written(run, tmp_path):
  """The README's two lines: seq2seq-serve on a run with a selected checkpoint, then curl."""
  readme = (ROOT / "README.md").read_text(encoding="utf-8")
  serve_line = next(line for line in readme.splitlines() if line.startswith("seq2seq-serve "))
  curl_line = next(line for line in readme.splitlines() if line.startswith("curl "))
  workdir = tmp_path / "runs" / "m30k_transformer"
  shutil.copytree(run, workdir, ignore=shutil.ignore_patterns("eval"))
  (workdir / "eval").mkdir()
  (workdir / "eval" / "selected.json").write_text(json.dumps({"checkpoint": "latest"}))
  port = free_port()
  env = dict(ENV, PATH=f"{sys.executable.rsplit('/', 1)[0]}:{ENV['PATH']}")
  # `exec`: the shell becomes the server, so that stopping it stops the server.
  server = subprocess.Popen(f"exec {serve_line} --port={port}", shell=True, cwd=tmp_path,
                            env=env, stderr=subprocess.PIPE, text=True)
  try:
    lines = []
    for line in server.stderr:
      lines.append(line)
      if "Serving" in line:
        break
    assert any("Serving m30k_transformer at" in line for line in lines), "".join(lines)
    curl = curl_line.replace("localhost:8000", f"localhost:{port}")
    if shutil.which("curl"):
      out = subprocess.run(curl, shell=True, capture_output=True, text=True, check=True,
                           timeout=60).stdout
      assert len(json.loads(out)["translations"]) == 1
  finally:
    server.terminate()  # SIGTERM: uvicorn shuts down, then the command ends as signals do.
    assert server.wait(timeout=60) == 130


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_the_serve_benchmark_reports_latency_and_throughput_against_translate(runs):
  from seq2seq.performance import serving

  records = serving.serve_benchmark(runs[0], "latest", beam=1, batch_size=BATCH, clients=4,
                                    requests=12, single=3)
  assert [r["measure"] for r in records] == ["single sentence, one client", "concurrent clients",
                                             "seq2seq-translate, one batch call"]
  assert records[0]["errors"] == records[1]["errors"] == 0
  assert (records[0]["requests"], records[1]["requests"], records[2]["sentences"]) == (3, 12, 12)
  assert 0 < records[0]["latency_p50_ms"] <= records[0]["latency_p99_ms"]
  assert records[2]["server_share"] == pytest.approx(
      records[1]["sentences_per_s"] / records[2]["sentences_per_s"], rel=0.01)
