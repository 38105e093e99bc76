"""seq2seq-export --format=ctranslate2: every configuration that converts computes in
CTranslate2 what it computes here (teacher-forced log-probabilities to float32 rounding), the
others are refused in one line, and an exported run translates as `Translator` does: greedy
search picks the same subwords; beam search, CTranslate2's own, mostly the same."""

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import sacrebleu
from flax import nnx

from seq2seq.data import corpus
from seq2seq.data.special_ids import BOS_ID, EOS_ID
from seq2seq.decoding import alignment, deploy
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.models import ATTENTION_BY_FAMILY, build_model, check_config, export
from seq2seq.models.normalizers import NORMALIZERS
from seq2seq.models.positions import POSITIONS
from seq2seq.performance import engines
from seq2seq.runs import workdirs
from tests.helpers import ENV, ROOT, fast_tiny_config

VOCAB = 40
PIECES = ["<pad>", "<unk>", "<s>", "</s>"] + [f"p{i}" for i in range(4, VOCAB)]

# Each configuration that converts, as `config.model` overrides: every attention variant,
# position scheme, LayerNorm placement, (un)tied table and key/value head count it maps,
# in two layers of each stack (a mistake in the second would not show in one).
CONVERTED = {
    "default": {},
    "post-LN, untied, general, grouped-query": {
        "pre_ln": False, "share_embeddings": False, "attention": "general", "num_heads": 4,
        "num_kv_heads": 2},
    "rope, dot, multi-query": {"positions": "rope", "attention": "dot", "num_heads": 4,
                               "num_kv_heads": 1},
    # Each on its own (slow: ~1 s each to compile).
    "post-LN, untied": {"pre_ln": False, "share_embeddings": False},
    "dot": {"attention": "dot"},
    "general": {"attention": "general"},
    "learned": {"positions": "learned"},
    "relative": {"positions": "relative", "max_relative_distance": 3},
    "rope": {"positions": "rope"},
    "multi-query": {"num_heads": 4, "num_kv_heads": 1},
    "grouped-query, relative": {"num_heads": 4, "num_kv_heads": 2, "positions": "relative",
                                "max_relative_distance": 3},
}
IN_DEFAULT_RUN = 3  # The first ones: every mapping but learned and relative positions.


def model_config(**overrides):
  c = fast_tiny_config()
  c.model.num_encoder_layers = c.model.num_decoder_layers = 2
  c.model.max_len = 24
  c.model.update(overrides)
  check_config(c)
  return c


def random_model(config, seed: int = 0):
  """The config's model with random parameters, every one (biases and LayerNorms would start
  at 0 and 1, where a parameter mapped to the wrong place may not show); drawn with NumPy,
  as nothing needs compiling."""
  model = nnx.eval_shape(lambda: build_model(config, VOCAB))
  rng = np.random.default_rng(seed)
  nnx.update(model, jax.tree.map(lambda x: 0.3 * rng.standard_normal(x.shape, np.float32),
                                 nnx.state(model, nnx.Param)))
  return model


@nnx.jit
def _log_probs(model, src, tgt_in):
  return jax.nn.log_softmax(model.decode(model.encode(src), tgt_in))


def our_log_probs(model, pairs: list[tuple[list[int], list[int]]]) -> list[np.ndarray]:
  """Per (source, output through EOS) pair, each subword of the output after the ones before
  it, teacher-forced: the pairs in one batch, padded (which masks the padding out)."""
  src, tgt_in = (np.zeros((len(pairs), max(len(p[k]) + 1 for p in pairs)), np.int32)
                 for k in (0, 1))
  for row, (s, out) in enumerate(pairs):
    src[row, :len(s) + 1], tgt_in[row, :len(out)] = s + [EOS_ID], [BOS_ID] + out[:-1]
  log_probs = np.asarray(_log_probs(model, src, tgt_in))
  return [log_probs[row, np.arange(len(out)), out] for row, (_, out) in enumerate(pairs)]


def convert(model, config, directory, alignment_layer=-1) -> "ctranslate2.Translator":  # noqa: F821
  import ctranslate2
  spm = directory.parent / f"{directory.name}.model"
  spm.write_bytes(b"a SentencePiece model")  # Copied beside the weights, not read.
  export.TransformerConverter(model, config.model, PIECES, str(spm),
                              alignment_layer).convert(str(directory))
  return ctranslate2.Translator(str(directory), compute_type="float32", intra_threads=1)


@pytest.mark.parametrize("overrides", [
    pytest.param(o, id=name, marks=() if i < IN_DEFAULT_RUN else pytest.mark.slow)
    for i, (name, o) in enumerate(CONVERTED.items())])
def test_ctranslate2_computes_what_the_model_computes(overrides, tmp_path):
  config = model_config(**overrides)
  assert export.ctranslate2_problem(config.model) is None
  model = random_model(config)
  translator = convert(model, config, tmp_path / "model")
  rng = np.random.default_rng(0)
  # Lengths past the relative distance, in one padded batch (CTranslate2 pads; we do not).
  pairs = [(rng.integers(4, VOCAB, n).tolist(), rng.integers(4, VOCAB, m).tolist() + [EOS_ID])
           for n, m in ((9, 11), (3, 2), (14, 6))]
  scored = translator.score_batch([[PIECES[i] for i in src] for src, _ in pairs],
                                  [[PIECES[i] for i in out[:-1]] for _, out in pairs])
  for (_, out), result, ours in zip(pairs, scored, our_log_probs(model, pairs), strict=True):
    assert result.tokens == [PIECES[i] for i in out]
    np.testing.assert_allclose(result.log_probs, ours, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("layer", [0, 1])
def test_the_attention_ctranslate2_returns_is_the_chosen_layers_heads_averaged(layer, tmp_path):
  """Of a 2-layer, 4-head model with random parameters, forced on a target: each layer's
  cross-attention, its heads averaged (without the `</s>` column, which CTranslate2 leaves
  out), and not the other layer's."""
  config = model_config(num_heads=4)
  model = random_model(config)
  translator = convert(model, config, tmp_path / "model", alignment_layer=layer)
  src, out = [5, 9, 14, 7, 21], [11, 6, 30, EOS_ID]
  found = translator.translate_batch([[PIECES[i] for i in src]], beam_size=1,
                                     target_prefix=[[PIECES[i] for i in out[:-1]]],
                                     return_attention=True, max_decoding_length=len(out))[0]
  ours = np.asarray(model.attention_weights(np.asarray([src + [EOS_ID]]), np.asarray(
      [[BOS_ID] + out[:-1]]))["cross"])[:, 0].mean(1)[..., :-1]  # [layers, target, source]
  attention = np.asarray(found.attention[0])[:len(out) - 1]
  np.testing.assert_allclose(attention, ours[layer, :len(out) - 1], atol=2e-5)
  assert not np.allclose(attention, ours[1 - layer, :len(out) - 1], atol=1e-3)


# What does not convert, and the end of the line that says so (`ctranslate2_problem`).
REFUSED = {
    "rnn": ({"family": "rnn", "attention": "general"}, "CTranslate2 runs Transformers only"),
    "concat": ({"attention": "concat"}, "CTranslate2 computes dot-product attention only"),
    "linear": ({"attention": "linear"}, "CTranslate2 computes dot-product attention only"),
    "local": ({"attention": "local"}, "CTranslate2 computes dot-product attention only"),
    "local_global": ({"attention": "local_global"},
                     "CTranslate2 computes dot-product attention only"),
    "sparsemax": ({"attention_normalizer": "sparsemax"}, "with the softmax only"),
    "entmax15": ({"attention_normalizer": "entmax15"}, "with the softmax only"),
    "alibi": ({"positions": "alibi"}, "CTranslate2 has ALiBi in decoders only"),
    "alibi_directional": ({"positions": "alibi_directional"},
                          "CTranslate2 has ALiBi in decoders only"),
    "none": ({"positions": "none"}, "CTranslate2 has no such positions"),
    "differential": ({"attention": "differential"},
                     "CTranslate2 computes dot-product attention only"),
    "decoder_positions": ({"decoder_positions": "none"}, "one kind of positions"),
    "qk_norm": ({"qk_norm": True}, "CTranslate2 has no QK-norm"),
    "headwise": ({"attention_gate": "headwise"}, "no gate on attention's output"),
    "elementwise": ({"attention_gate": "elementwise"}, "no gate on attention's output"),
}


@pytest.mark.parametrize("overrides,reason", REFUSED.values(), ids=REFUSED.keys())
def test_what_ctranslate2_does_not_compute_is_refused_in_one_line(overrides, reason):
  problem = export.ctranslate2_problem(model_config(**overrides).model)
  assert reason in problem and "\n" not in problem and problem.endswith(".")


def test_every_variant_positions_and_normalizer_is_converted_or_refused():
  """A variant added to a registry is decided here: converted (and in CONVERTED) or refused."""
  converted = {o.get("attention", "scaled_dot") for o in CONVERTED.values()}
  converted_positions = {o.get("positions", "sinusoidal") for o in CONVERTED.values()}
  refused = {o.get(k) for o, _ in REFUSED.values() for k in ("attention", "positions",
                                                             "attention_normalizer")}
  assert set(ATTENTION_BY_FAMILY["transformer"]) <= converted | refused
  assert converted == set(export.QUERIES_SCALE)
  assert set(POSITIONS) <= converted_positions | refused
  for name in set(NORMALIZERS) - {"softmax"}:
    assert export.ctranslate2_problem(model_config(attention_normalizer=name).model)


def test_an_ensemble_and_a_taken_output_are_refused(run, tmp_path):
  with pytest.raises(UserError, match="CTranslate2 runs one model"):
    deploy.export(run, "ensemble:2", tmp_path / "model")
  (tmp_path / "taken").mkdir()
  with pytest.raises(UserError, match="exists; pass a new directory"):
    deploy.export(run, "latest", tmp_path / "taken")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
  return deploy.export(run, "latest", tmp_path_factory.mktemp("export") / "model")


def test_the_export_holds_the_model_its_vocabulary_and_where_it_came_from(run, exported):
  assert sorted(p.name for p in exported.iterdir()) == [
      "config.json", "model.bin", "sentencepiece.model", "seq2seq.json",
      "shared_vocabulary.json"]
  assert (exported / "sentencepiece.model").read_bytes() == (run / "vocab/spm.model").read_bytes()
  translator = deploy.CTranslate2Translator(exported)
  assert translator.settings["steps"] == [4] and translator.settings["workdir"] == str(run)


def test_the_exports_attention_is_the_cross_attention_alignment_reads(run, exported):
  """CTranslate2's `return_attention` on the export gives, for each output subword, our
  model's cross-attention at the layer `--alignment` reads (the penultimate), its heads
  averaged, to float32 rounding, on every source subword but `</s>` (which CTranslate2 leaves
  out, as `--alignment` does): the links through the export are ours."""
  ours = Translator(run, "latest", beam_size=1)
  theirs = deploy.CTranslate2Translator(exported)
  layer = theirs.settings["alignment_layer"]
  assert layer == alignment.alignment_layer(ours, -2)
  for text in corpus.read_split(ours.config.data, "val").src[:4]:
    weights, source, target = alignment.alignment(ours, text)
    found = theirs.translator.translate_batch(
        [source[:-1]], beam_size=1, return_attention=True, max_decoding_length=len(target),
        suppress_sequences=theirs.never)[0]
    assert found.hypotheses[0] == target[:len(found.hypotheses[0])]
    attention = np.asarray(found.attention[0])  # [output subwords, source subwords]
    assert attention.shape == (len(found.hypotheses[0]), len(source) - 1)
    np.testing.assert_allclose(attention, weights[layer].mean(0)[:len(attention), :-1],
                               atol=2e-5)


def test_greedy_translations_and_their_scores_are_ours(run, exported):
  """On validation sentences of 16 to 23 subwords (one program to compile) and an empty line:
  the same subwords (the run's 4 steps leave BOS likely: CTranslate2 is told never to output
  it, as our searches never do), and CTranslate2's model gives them our score (the greedy
  score is over the GNMT penalty at alpha)."""
  config = workdirs.read_run_config(run)
  ours = Translator(run, "latest", beam_size=1, alpha=config.eval.alpha)
  texts = [text for text in corpus.read_split(config.data, "val").src[:40]
           if 16 < len(ours.source_ids(text)) + 1 <= 24][:8] + [""]
  assert len(texts) == 9
  hypotheses = [nbest[0] for nbest in ours.hypotheses(texts)]
  theirs = deploy.CTranslate2Translator(exported)
  assert [text for text, _ in theirs.translate(texts, beam_size=1)] == [h.text for h in
                                                                         hypotheses]
  searched = hypotheses[:-1]  # The empty line is not.
  np.testing.assert_allclose(theirs.log_probs(texts[:-1], [h.ids for h in searched]),
                             [h.score * ((5 + len(h.ids)) / 6) ** config.eval.alpha
                              for h in searched],
                             rtol=1e-5, atol=1e-4)


@pytest.mark.slow  # Greedy and beam search of 300 sentences both ways: ~60 s, compiling.
def test_the_exported_run_translates_the_test_set_as_ours(run, exported):
  """The run's first 300 test sentences: greedy search gives every line ours; beam search (4,
  no length penalty: CTranslate2's `length_penalty` is not the GNMT one) most (97% here), as
  CTranslate2 finishes a hypothesis from the best `beam` extensions of a step, ours from the
  best `2 * beam`; and CTranslate2's model scores our translations as ours does."""
  test = corpus.read_split(workdirs.read_run_config(run).data, "test")
  test = dataclasses.replace(test, src=test.src[:300], tgt=test.tgt[:300])
  theirs = deploy.CTranslate2Translator(exported, intra_threads=2)
  for beam, least in ((1, 1.0), (4, 0.9)):
    ours = [nbest[0] for nbest in Translator(run, "latest", beam_size=beam,
                                             alpha=0.0).hypotheses(test.src)]
    translated = [text for text, _ in theirs.translate(test.src, beam_size=beam)]
    equal = np.mean([h.text == t for h, t in zip(ours, translated, strict=True)])
    bleu = [sacrebleu.corpus_bleu(hyps, [test.tgt]).score
            for hyps in ([h.text for h in ours], translated)]
    print(f"beam {beam}: {equal:.1%} of lines equal, BLEU {bleu[0]:.2f} here,"
          f" {bleu[1]:.2f} in CTranslate2")
    assert equal >= least and abs(bleu[0] - bleu[1]) <= 0.1
    np.testing.assert_allclose(theirs.log_probs(test.src, [h.ids for h in ours]),
                               [h.score for h in ours], rtol=1e-5, atol=2e-4)


@pytest.mark.slow  # A process that imports JAX and reads a checkpoint: ~8 s.
def test_the_command_writes_the_model_directory(run, tmp_path):
  result = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"),
                           f"--workdir={run}", "--checkpoint=avg:2",
                           f"--output={tmp_path / 'model'}"],
                          capture_output=True, text=True, env=ENV, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == f"wrote {tmp_path / 'model'}\n"
  assert deploy.CTranslate2Translator(tmp_path / "model").settings["steps"] == [2, 4]


def child_processes() -> set[int]:
  """The ids of this process's children, zombies too (Linux's /proc)."""
  found = set()
  for stat in Path("/proc").glob("[0-9]*/stat"):
    with contextlib.suppress(OSError, IndexError, ValueError):
      if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
        found.add(int(stat.parent.name))
  return found


def test_the_native_engine_translates_as_the_by_cap_one_where_the_caps_allow(run, exported):
  """CTranslate2 as its users run it (`by_cap=False`: one call, its own batching by length,
  one cap for all, the largest of ours) gives the by-cap translations where the caps agree:
  every sentence of one cap (beam 4), and those of the largest cap. Greedy, each by-cap
  translation begins the native one, which goes on past the sentence's own cap where it
  reaches it unfinished (as the tiny run's all do; a trained model's seldom)."""
  theirs = deploy.CTranslate2Translator(exported, intra_threads=2)
  texts = [t for t in corpus.read_split(workdirs.read_run_config(run).data, "test").src[:60]
           if t.strip()]
  caps = [theirs.max_length(theirs.pieces(text)) for text in texts]
  alike = [text for text, cap in zip(texts, caps, strict=True) if cap == min(caps)] + [""]
  assert len(alike) > 8
  assert ([text for text, _ in theirs.translate(alike, batch_size=4, by_cap=False)]
          == [text for text, _ in theirs.translate(alike, batch_size=4)])
  texts, caps = texts[:30], caps[:30]
  assert max(caps) == theirs.one_cap(texts) and len(set(caps)) > 2
  by_cap, one_call = ([text for text, _ in theirs.translate(texts, beam_size=1, batch_size=4,
                                                           by_cap=grouped)]
                      for grouped in (True, False))
  assert all(long.startswith(short) for short, long in zip(by_cap, one_call, strict=True))
  assert [long for long, cap in zip(one_call, caps, strict=True) if cap == max(caps)] == [
      short for short, cap in zip(by_cap, caps, strict=True) if cap == max(caps)]


def test_a_ctranslate2_worker_never_imports_jax_and_translates_as_in_process(run, exported):
  """The benchmark's CTranslate2 engines, each in a process of its own: JAX never imported
  there; the by-cap and the native engine give what `CTranslate2Translator` gives here; both
  processes are gone once closed."""
  before = child_processes()
  setups = engines.worker_setups(run, "latest", exported, beam=4, batches=[1, 4], threads=2)
  texts = corpus.read_split(workdirs.read_run_config(run).data, "test").src[:10] + [""]
  theirs = deploy.CTranslate2Translator(exported, intra_threads=2)
  with (engines.Worker("ctranslate2_float32", setups["ctranslate2_float32"]) as grouped,
        engines.Worker(engines.NATIVE, setups[engines.NATIVE]) as native):
    for worker, by_cap in ((grouped, True), (native, False)):
      assert worker.wait_ready()["jax_imported"] is False
      reply = worker.request("translate", texts=texts, batch=4)
      assert reply["seconds"] > 0 and reply["translations"] == [
          text for text, _ in theirs.translate(texts, batch_size=4, by_cap=by_cap)]
      status = worker.request("status")
      assert not status["jax_imported"] and status["jax_backends"] == []
    assert reply["max_decoding_length"] == theirs.one_cap(texts)
    assert {grouped.process.pid, native.process.pid} <= child_processes()
  assert grouped.process.returncode == native.process.returncode == 0
  assert child_processes() <= before


def test_a_failing_worker_is_one_error_and_ends(run, exported, tmp_path):
  """A worker that cannot load its engine, or fails a request, is one `EngineError` here that
  names it; the process ends with the `with` (a failed request leaves it serving till then)."""
  before = child_processes()
  setups = engines.worker_setups(run, "latest", exported, beam=4, batches=[1], threads=2)
  missing = {**setups["ctranslate2_int8"], "model": str(tmp_path / "missing")}
  with pytest.raises(engines.EngineError, match=r"^ctranslate2_int8's worker \(process \d+\)"
                     r" failed at start: FileNotFoundError: .*seq2seq.json"):
    with engines.Worker("ctranslate2_int8", missing) as worker:
      worker.wait_ready()
  assert worker.process.returncode == 1
  with engines.Worker("ctranslate2_int8", setups["ctranslate2_int8"]) as worker:
    with pytest.raises(engines.EngineError, match="failed at translate: TypeError"):
      worker.request("translate", texts=None, batch=1)
    assert worker.request("status")["pid"] == worker.process.pid
  assert worker.process.returncode == 0 and child_processes() <= before


def test_an_interrupt_amid_a_request_ends_the_worker(run, exported):
  """Ctrl-C while a worker translates: the worker is killed at once, not left running."""
  setups = engines.worker_setups(run, "latest", exported, beam=4, batches=[1], threads=2)
  texts = corpus.read_split(workdirs.read_run_config(run).data, "test").src[:200]
  previous = signal.signal(signal.SIGALRM, signal.default_int_handler)
  try:
    with pytest.raises(KeyboardInterrupt):
      with engines.Worker("ctranslate2_float32", setups["ctranslate2_float32"]) as worker:
        worker.wait_ready()
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        worker.request("translate", texts=texts * 5, batch=1)
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
  assert worker.process.returncode == -signal.SIGKILL


def test_the_benchmark_ends_every_worker_when_one_fails(run, monkeypatch, tmp_path):
  """One engine that cannot load: the benchmark raises its error, and no worker is left."""
  before, setups = child_processes(), engines.worker_setups

  def one_broken(*args, **kwargs):
    found = setups(*args, **kwargs)
    del found["ours"], found[engines.OURS_BFLOAT16]  # (Quicker: no worker here imports JAX.)
    found["ctranslate2_int8"]["model"] = str(tmp_path / "missing")
    return found

  monkeypatch.setattr(engines, "worker_setups", one_broken)
  with pytest.raises(engines.EngineError, match="ctranslate2_int8's worker .* failed at start"):
    engines.ctranslate2_benchmark(run, "latest", sentences=4, rounds=1)
  assert child_processes() <= before


@pytest.mark.slow  # Five engines in processes of their own at two batch sizes, ours compiling:
def test_the_benchmark_times_ours_against_ctranslate2(run):  # ~40 s.
  before = child_processes()
  results = engines.ctranslate2_benchmark(run, "latest", sentences=4, rounds=1)
  assert [r["batch"] for r in results] == [1, workdirs.read_run_config(run).eval.batch_size]
  for result in results:
    assert result["sentences"] == 4 and result["intra_threads"] == 2
    assert result["separate_processes"] is True
    assert all(result[f"{name}_sentences_per_s"] > 0
               for name in ("ours", engines.OURS_BFLOAT16, "ctranslate2_float32",
                            "ctranslate2_int8", engines.NATIVE))
    assert result["float32_speedup"] > 0 and result["float32_native_speedup"] > 0
    assert result["ours_bfloat16_speedup"] > 0
    assert all(0 <= result[f"{prefix}equal_lines"] <= 1
               for prefix in ("", "native_", "ours_bfloat16_", "int8_"))
    assert result["native_max_decoding_length"] > 0
    assert result["compiled_while_timed"] == 0 and result["idle_workers_cpu_s"] >= 0
  assert child_processes() <= before
