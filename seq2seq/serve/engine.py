"""What the server computes, apart from HTTP: one worker that translates the requests waiting
together as one list, so that they share batches, with the runs it serves (`runs`), each
loaded once with its searches and attention compiled from start-up on, in the background.

A request is checked whole before it waits (`BadRequest`: a status and one line); the worker
then groups the waiting requests by run and search, translates each group's sentences with
one `Translator.hypotheses` call (batches of the compiled shapes), and answers each request
with its own lines, in order. A request with a `target` (forced decoding) is not searched:
each given translation is scored, and its attention computed, by the run's `Alignments`.
"""

import concurrent.futures
import dataclasses
import logging
import queue
import threading
from collections.abc import Sequence

import numpy as np

from seq2seq.data import batching, tokenizer
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.decoding import search
from seq2seq.decoding.alignment import labels
from seq2seq.decoding.translator import Hypothesis, Translator
from seq2seq.serve.runs import ServedRun
from seq2seq.serve.wire import BadRequest, exact, refuse_what_is_not_text

log = logging.getLogger("seq2seq")


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask (`seq2seq-serve`'s flags)."""
  max_lines: int = 64  # Sentences per request.
  max_chars: int = 1000  # Characters per sentence.

  @property
  def max_bytes(self) -> int:
    """The longest body a request within the limits can need: `text` and `target` full, each
    character written as JSON's longest escape (12 bytes: a surrogate pair), and 64 KiB for
    the rest. Longer bodies are refused before they are read (`app.BodyLimit`)."""
    return 2 * self.max_lines * (12 * self.max_chars + 8) + 65536


@dataclasses.dataclass
class _Job:
  run: ServedRun
  lines: list[str]
  beam: int
  nbest: int
  attention: bool
  targets: list[str] | None  # Forced decoding: the translations to score, one per line,
  target_ids: list[list[int]] | None = None  # ... and their subword ids, without EOS,
  # ... and whether each is scored with EOS after them: not one given as subwords that a search
  # cut at its length cap (`Engine._subword_targets`).
  ended: list[bool] | None = None
  # Sentences that fail alone (over the run's compiled lengths), by index: why.
  failed: dict[int, str] = dataclasses.field(default_factory=dict)
  # Sentences answered with a caveat (a target the vocabulary cannot spell), by index: which.
  warned: dict[int, str] = dataclasses.field(default_factory=dict)
  answer: concurrent.futures.Future = dataclasses.field(
      default_factory=concurrent.futures.Future)


class Engine:
  """The runs by name, the limits, and the worker that translates. `start()` starts the
  worker; `close()` stops it once the requests waiting are answered."""

  def __init__(self, runs: Sequence[ServedRun], limits: Limits = Limits()):
    self.runs = {run.name: run for run in runs}
    self.limits = limits
    self._queue: queue.Queue[_Job | None] = queue.Queue()
    self._worker = threading.Thread(target=self._work, name="translate", daemon=True)

  def start(self) -> "Engine":
    self._worker.start()
    return self

  def close(self) -> None:
    if self._worker.is_alive():
      self._queue.put(None)
      self._worker.join()

  def translate(self, text: Sequence[str], run: str | None = None, beam: int | None = None,
                nbest: int = 1, attention: bool = False, target: Sequence[str] | None = None,
                target_subwords: Sequence[Sequence[str]] | None = None) -> dict:
    """The answer to one request (`BadRequest` for one the limits or runs refuse); with
    `target`, one translation per sentence, those translations scored instead of searched;
    with `target_subwords`, translations given as subwords, scored as split. Every field goes
    through `refuse_what_is_not_text` first (as the HTTP request did whole)."""
    refuse_what_is_not_text({"text": text, "run": run, "target": target,
                             "target_subwords": target_subwords})
    job = self._check(text, run, beam, nbest, attention)
    if target is not None and target_subwords is not None:
      raise BadRequest(400, "the request holds both 'target' and 'target_subwords'; send one.")
    field = "target" if target_subwords is None else "target_subwords"
    if target_subwords is not None:
      target = self._subword_targets(job, target_subwords)
    if target is not None:
      job.targets = self._check_targets(job, target, field)
    self._queue.put(job)
    return job.answer.result()

  def _check_lines(self, field: str, lines: list[str]) -> None:
    """Each entry of `field` (text or target) is one sentence within the limits (its
    characters are text: `refuse_what_is_not_text`)."""
    for i, line in enumerate(lines):
      if not line.strip():
        raise BadRequest(400, f"{field}[{i}] is empty; send sentences with words in them.")
      if len(line) > self.limits.max_chars:
        raise BadRequest(413, f"{field}[{i}] has {len(line)} characters; send at most"
                              f" {self.limits.max_chars} per sentence (--max_chars).")
      if "\n" in line or "\r" in line:
        raise BadRequest(400, f"{field}[{i}] holds a line break; send one sentence per entry.")

  def _subword_targets(self, job: _Job, subwords: Sequence[Sequence[str]]) -> list[str]:
    """Sets `job.target_ids` from translations given as subwords (a translation's `target`
    labels, `</s>` last or left out), as split: a search may split a text otherwise than
    encoding its text again would. Returns their texts.

    A translation without `</s>` exactly as long as the search's length cap for its sentence
    is what a search cut there gives (it never chose `</s>`): it is scored without `</s>`, as
    the search scored it, and its answer says so (`warnings`). Another one without `</s>` (no
    search gives it so) is one whose `</s>` was left out: it is scored with it."""
    if len(subwords) != len(job.lines):
      raise BadRequest(400, f"'target_subwords' and 'text' hold {len(subwords)} and"
                            f" {len(job.lines)} entries; send one translation per sentence.")
    tokenizer, job.target_ids, job.ended = job.run.tokenizer, [], []
    for i, pieces in enumerate(subwords):
      if len(pieces) > self.limits.max_chars:  # A subword spells one character or more.
        raise BadRequest(413, f"target_subwords[{i}] holds {len(pieces)} subwords; send at most"
                              f" {self.limits.max_chars} per translation (--max_chars"
                              " characters).")
      ids = [tokenizer.piece_id(piece) for piece in pieces]
      ended = bool(ids) and ids[-1] == EOS_ID  # The labels end with </s> where the search did.
      if ended:
        pieces, ids = pieces[:-1], ids[:-1]
      bad = next((p for p, j in zip(pieces, ids, strict=True)
                  if j is None or j in (PAD_ID, BOS_ID, EOS_ID)), None)
      if not pieces or bad is not None:
        raise BadRequest(400, f"target_subwords[{i}] " + (f"holds {bad!r}, which is not a subword"
                              f" of {job.run.name}'s vocabulary" if pieces else "is empty")
                              + "; send the 'target' subwords of a translation by a run of"
                              " the same vocabulary.")
      cap = _search_cap(job.run, job.lines[i])
      if not ended and len(ids) == cap and i not in job.failed:
        job.warned[i] = (f"target_subwords[{i}] ends without </s> at {len(ids)} subwords, the"
                         f" length cap of a search of {job.run.name} for sentence {i + 1}"
                         f" ({cap}): a search cut there never chose </s>, so it is scored"
                         " without </s>, as the search scored it; add </s> last to score it"
                         " as a translation that ends.")
      job.target_ids.append(ids)
      job.ended.append(ended or len(ids) != cap)
    return [tokenizer.decode(ids) for ids in job.target_ids]

  def _check_targets(self, job: _Job, target, field: str = "target") -> list[str]:
    """The translations to score, one per sentence, each short enough for the run's compiled
    attention programs for its sentence; `field`: the request's field that gave them."""
    targets = [target] if isinstance(target, str) else list(target)
    if len(targets) != len(job.lines):
      raise BadRequest(400, f"'target' and 'text' hold {len(targets)} and {len(job.lines)}"
                            " entries; send one translation per sentence.")
    if job.nbest > 1:
      raise BadRequest(400, f"nbest {job.nbest} asks for a search's n best; with '{field}' each"
                            " sentence has the one translation given: leave nbest at 1.")
    run = job.run
    if job.target_ids is None:  # Given as text (`_subword_targets` checked subwords as such).
      self._check_lines("target", targets)
      job.target_ids = [run.tokenizer.encode(translation) for translation in targets]
      job.ended = [True] * len(targets)
    for i, (line, translation) in enumerate(zip(job.lines, targets, strict=True)):
      if i in job.failed:
        continue
      length = len(job.target_ids[i]) + job.ended[i]  # With EOS, where it is scored.
      longest = run.alignments.max_output(run.alignments.translator.source_ids(line))
      if length > longest:
        what = (f"the target of sentence {i + 1}" if field == "target" else
                f"target_subwords[{i}] (sentence {i + 1})")
        job.warned.pop(i, None)
        job.failed[i] = (f"{what} is {length} subwords long" + " with </s>" * job.ended[i]
                         + f"; for this sentence {run.name} scores translations of up to"
                         f" {longest}: shorten the target.")
      elif unknown := _unspellable(run.tokenizer, translation):
        job.warned[i] = " ".join(filter(None, (job.warned.get(i), (
            f"the target of sentence {i + 1} holds {unknown}, which the vocabulary of"
            f" {run.name} lacks: each is scored as <unk>, whose probability says nothing of the"
            " character (such a target can outscore a real translation); replace or remove"
            " it."))))
    self._refuse_if_all_failed(job)
    return targets

  @staticmethod
  def _refuse_if_all_failed(job: _Job) -> None:
    """A request none of whose sentences can be answered is refused (413), with the first
    reason; otherwise those that fail are answered alone (`errors`), the others translate."""
    if len(job.failed) == len(job.lines):
      raise BadRequest(413, job.failed[min(job.failed)])

  def _check(self, text, run, beam, nbest, attention) -> _Job:
    """A request as a job, or `BadRequest` naming the first thing wrong with it."""
    names = ", ".join(self.runs)
    if run is None:
      if len(self.runs) > 1:
        raise BadRequest(400, f"this server has several runs ({names}); name one in 'run'.")
      run = next(iter(self.runs))
    if run not in self.runs:
      raise BadRequest(404, f"run {run!r} is not served here; the runs are: {names}.")
    served = self.runs[run]
    beam = served.beams[0] if beam is None else beam
    if beam not in served.beams:
      raise BadRequest(400, f"beam {beam} is not served for {run}; use one of"
                            f" {', '.join(map(str, served.beams))} (seq2seq-serve --beams).")
    if (problem := search.nbest_problem(nbest, beam)) is not None:
      raise BadRequest(400, problem)
    lines = [text] if isinstance(text, str) else list(text)
    if not lines:
      raise BadRequest(400, "'text' holds no sentence; send at least one.")
    if len(lines) > self.limits.max_lines:
      raise BadRequest(413, f"'text' holds {len(lines)} sentences; send at most"
                            f" {self.limits.max_lines} per request (--max_lines).")
    self._check_lines("text", lines)
    job = _Job(served, lines, beam, nbest, attention, None)
    for i, line in enumerate(lines):
      length = len(served.tokenizer.encode(line))
      if length >= served.longest:
        job.failed[i] = (f"sentence {i + 1} is {length} subwords long; {run} translates up"
                         f" to {served.longest - 1}: shorten or split it.")
    self._refuse_if_all_failed(job)
    return job

  def _work(self) -> None:
    """Takes every job waiting, translates each group of one run and search together."""
    while (job := self._queue.get()) is not None:
      jobs = [job]
      while True:
        try:
          more = self._queue.get_nowait()
        except queue.Empty:
          break
        if more is None:
          self._queue.put(None)  # Stop once these are answered.
          break
        jobs.append(more)
      groups: dict[tuple, list[_Job]] = {}
      for j in jobs:
        key = (j.run.name, j.beam, 1 if j.nbest == 1 else j.beam, j.targets is not None)
        groups.setdefault(key, []).append(j)
      for (_, beam, nbest, forced), group in groups.items():
        if forced:
          self._answer_forced(group)
        else:
          self._answer(group, group[0].run.searches[beam, nbest])

  def _answer(self, jobs: list[_Job], translator: Translator) -> None:
    """Translates the jobs' sentences as one list and answers each job with its own."""
    try:
      hypotheses = iter(translator.hypotheses([line for job in jobs for i, line in
                                               enumerate(job.lines) if i not in job.failed]))
      for job in jobs:
        mine = [None if i in job.failed else next(hypotheses) for i in range(len(job.lines))]
        job.answer.set_result(self._response(job, mine))
    except Exception as e:  # noqa: BLE001 (every waiting request hears of it)
      log.exception("Translating %d requests failed", len(jobs))
      for job in jobs:
        if not job.answer.done():
          job.answer.set_exception(e)

  @staticmethod
  def _with_errors(job: _Job, response: dict) -> dict:
    """`response`, with each failed sentence's reason in `errors` where any failed, and each
    caveat in `warnings` where any has one."""
    if job.failed:
      response["errors"] = [job.failed.get(i) for i in range(len(job.lines))]
    if job.warned:
      response["warnings"] = [job.warned.get(i) for i in range(len(job.lines))]
    return response

  def _response(self, job: _Job, hypotheses: list[list[Hypothesis] | None]) -> dict:
    """A job's answer: the best translation and score per sentence (None where it failed),
    the n-best lists where asked, and the attention of the best where asked."""
    response = {"run": job.run.name, "beam": job.beam,
                "translations": [nbest and nbest[0].text for nbest in hypotheses],
                "scores": [nbest and nbest[0].score for nbest in hypotheses]}
    if job.nbest > 1:
      response["nbest"] = [nbest and [{"translation": h.text, "score": h.score}
                                      for h in nbest[:job.nbest]] for nbest in hypotheses]
    if job.attention:
      response["attention"] = [nbest and self._attention(job.run, line, nbest[0].ids)
                               for line, nbest in zip(job.lines, hypotheses, strict=True)]
      for found in response["attention"]:
        if found:
          del found["log_probs"]
    return self._with_errors(job, response)

  def _answer_forced(self, jobs: list[_Job]) -> None:
    """Scores each job's given translations, with their attention where asked."""
    for job in jobs:
      try:
        run, translations, scores, attention = job.run, [], [], []
        for i, (line, target) in enumerate(zip(job.lines, job.targets, strict=True)):
          if i in job.failed:
            translations.append(None)
            scores.append(None)
            attention.append(None)
            continue
          # EOS, unless the target is a search's cut at its cap (`_subword_targets`).
          out = np.asarray([*job.target_ids[i], *[EOS_ID] * job.ended[i]], np.int32)
          found = self._attention(run, line, out)
          translations.append(target)
          scores.append(float(found.pop("log_probs").sum()
                              / search.length_penalty(len(out), run.alpha)))
          attention.append(found)
        response = {"run": run.name, "forced": True, "translations": translations,
                    "scores": scores}
        job.answer.set_result(self._with_errors(
            job, {**response, "attention": attention} if job.attention else response))
      except Exception as e:  # noqa: BLE001 (the request hears of it)
        log.exception("Scoring %d given translations failed", len(job.lines))
        job.answer.set_exception(e)

  @staticmethod
  def _attention(run: ServedRun, line: str, out: np.ndarray) -> dict:
    """The attention of output `out` (ids through EOS) for `line`: the subwords of its rows and
    columns (`labels`: the `source`, the `target`, and the `target_inputs` the decoder read,
    `<s>` then the target but its last), the cross-attention `weights`
    `[layers][heads][target][source]` and, where the model has them, the `encoder`
    (`[...][source][source]`) and `decoder` (`[...][target][target_inputs]`) self-attention,
    each weight the float32 the model computed (`exact`: an exact 0 stays 0, a weight of 1e-9
    stays 1e-9); and the log-probability of each output subword (`log_probs`).
    Where the model has them, by the same names: `maps`, differential attention's two maps
    (`map1`, `map2`: the weights are `map1 - lambda map2`) and its `lambda` per layer; and
    `gates`, the gate on each head's output, `[layers][heads][queries]` (an element-wise
    gate's mean over the head's features)."""
    src = run.alignments.translator.source_ids(line)[:run.longest - 1]
    weights, log_probs = run.alignments(src, out)
    named = labels(run.tokenizer.pieces, src, out)
    found = {"source": named["cross"][1], "target": named["cross"][0],
             "target_inputs": named["decoder"][1], "log_probs": log_probs}
    rounded = exact
    for kind, name in (("cross", "weights"), ("encoder", "encoder"), ("decoder", "decoder")):
      if kind in weights:
        found[name] = rounded(weights[kind])
      if f"{kind}_map1" in weights:  # [layers, heads, queries, 1]: one lambda per layer.
        found.setdefault("maps", {})[name] = {
            "map1": rounded(weights[f"{kind}_map1"]), "map2": rounded(weights[f"{kind}_map2"]),
            "lambda": rounded(weights[f"{kind}_lambda"][:, 0, 0, 0])}
      if f"{kind}_gate" in weights:
        found.setdefault("gates", {})[name] = rounded(weights[f"{kind}_gate"][..., 0])
    return found


def _search_cap(run: ServedRun, line: str) -> int:
  """The most subwords a search of `run` gives `line` (its output's cap, `search.decode_caps`:
  that of the sentence's length with EOS, on the evaluation grid); a search that reaches it
  stops without </s>."""
  c = run.config
  src_len = min(len(run.alignments.translator.source_ids(line)), run.longest - 1) + 1
  return search.max_decode_len(batching.grid_length(src_len, c.model.max_len),
                               c.eval.max_decode_len_a, c.eval.max_decode_len_b, c.model.max_len)


def _unspellable(vocabulary: tokenizer.Tokenizer, text: str) -> str:
  """The characters of `text` the vocabulary has no piece for (each encodes to <unk>), named
  as a reader finds them ("'☃' (U+2603)"), or ""."""
  missing = sorted({c for c in text if not c.isspace() and UNK_ID in vocabulary.encode(c)})
  return ", ".join(f"{c!r} (U+{ord(c):04X})" for c in missing)
