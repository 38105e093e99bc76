"""The benchmark's FLOP count against XLA's own count of the compiled forward pass, and the
start-up benchmark's padding count."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.data import batching
from seq2seq.models import build_model
from seq2seq.performance import benchmark, profile, startup


def test_counted_flops_match_xla_cost_analysis():
  c = benchmark.transformer_config(layers=2, dim=64, heads=4, mlp=128)
  vocab, batch, length = 500, 4, 16
  graphdef, params = nnx.split(build_model(c, vocab), nnx.Param)
  data = benchmark.random_batch(batch, length, vocab)

  def forward(params):
    model = nnx.merge(graphdef, params)
    return model.decode(model.encode(data["src"]), data["tgt_in"])

  xla = jax.jit(forward).lower(params).compile().cost_analysis()
  xla = xla[0] if isinstance(xla, list) else xla
  ours = benchmark.transformer_flops(c.model, vocab, batch, length, length, training=False)
  # XLA also counts softmax, layer norm and other elementwise work: a little more.
  assert ours <= xla["flops"] <= 1.15 * ours


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_benchmark_reports_consistent_figures(dtype):  # bfloat16 is emulated on CPUs.
  """Throughput and MFU follow from the step time: every target token of the random batch is
  real (8 x 8 a step), and MFU is the counted FLOPs over the time and the measured matmul's."""
  result = benchmark.train_benchmark(layers=1, dim=32, heads=2, mlp=64, vocab=200, batch=8,
                                     length=8, steps=2, dtype=dtype)
  seconds = result["step_seconds"]
  assert result["target_tokens_per_sec"] == pytest.approx(8 * 8 / seconds, abs=0.1)
  flops = benchmark.transformer_flops(benchmark.transformer_config(1, 32, 2, 64).model, 200, 8,
                                      8, 8)
  assert result["mfu_vs_matmul"] == pytest.approx(
      flops / seconds / (result["matmul_tflops"] * 1e12), rel=0.05)  # The figures are rounded.
  assert 0 < result["mfu_vs_matmul"] < 1.5


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_decode_baselines_translate_exactly_like_ours():
  """The benchmark's baselines differ from our decoder in speed only."""
  model = build_model(benchmark.transformer_config(layers=2, dim=32, heads=2, mlp=64), 100)
  src = benchmark.random_batch(3, 7, 100)["src"]
  for beam in (1, 3):
    outputs = {impl: benchmark._search(model, src, beam=beam, out_len=9, impl=impl)
               for impl in benchmark.DECODERS}
    for impl, ids in outputs.items():
      np.testing.assert_array_equal(ids, outputs["ours"], err_msg=f"{impl}, beam {beam}")


def test_kv_heads_benchmark_counts_the_cache_of_the_shared_heads_only():
  """4 query heads on 4, 2 and 1 key/value heads: the cache and the cross-attention keys and
  values shrink in proportion (known bytes: layers x 2 (keys, values) x rows x heads x length
  x head size x 4 bytes)."""
  results = benchmark.kv_heads_benchmark(layers=1, dim=32, heads=4, mlp=64, vocab=100, batch=3,
                                         src_len=5, out_len=4, beam=2, kv_heads=(0, 2, 1),
                                         repeats=1)
  assert [r["num_kv_heads"] for r in results] == [4, 2, 1]
  assert [r["cache_bytes"] for r in results] == [1 * 2 * 6 * kv * 4 * 8 * 4 for kv in (4, 2, 1)]
  assert [r["cross_kv_bytes"] for r in results] == [1 * 2 * 3 * kv * 5 * 8 * 4
                                                    for kv in (4, 2, 1)]
  assert [r["cache_share"] for r in results] == [1.0, 0.5, 0.25]
  assert results[0]["speedup"] == 1.0


def _mixed(x, w, key):
  """One of each kind profile.classify tells apart."""
  scores = jnp.einsum("bqd,bkd->bqk", x, x)  # batched dot
  y = jnp.tanh(x.reshape(-1, x.shape[-1]) @ w)  # matmul
  keep = jax.random.bernoulli(key, 0.9, y.shape)  # random bits
  rows = y[jnp.argsort(y[:, 0])]  # gather
  top = jax.lax.top_k(rows.sum(-1), 3)[0]  # top_k
  return scores.sum() + jnp.where(keep, rows, 0.0).sum() + top.sum()


def test_profile_classifies_each_kind_of_instruction():
  x = jnp.ones((2, 5, 8))
  w = jnp.ones((8, 16))
  hlo = jax.jit(_mixed).lower(x, w, jax.random.key(0)).compile().as_text()
  kinds = {kind for kind, _ in profile.classify(hlo).values()}
  assert {"matmul", "batched dot", "random bits", "gather", "top_k"} <= kinds


def test_profile_shares_add_up_and_rank_instructions():
  w = jax.random.normal(jax.random.key(0), (256, 256))
  result = profile.profile_ops(jax.jit(lambda w: jnp.tanh(w @ w) @ w), w, calls=2, top=3)
  assert sum(result["share"].values()) == pytest.approx(1.0, abs=0.01)
  assert set(result["share"]) == set(profile.KINDS)
  assert result["share"]["matmul"] > 0
  times = [row["ms_per_call"] for row in result["top"]]
  assert times == sorted(times, reverse=True) and len(times) <= 3
  assert result["top"][0]["shape"].startswith("f32[256,256]")


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_profile_benchmarks_cover_each_mode():
  results = benchmark.profile_benchmarks(layers=1, dim=32, heads=2, mlp=64, vocab=100, batch=4,
                                         length=6, decode_batch=2, src_len=5, out_len=4,
                                         beams=(2,))
  assert [(r["profile"], r.get("beam")) for r in results] == [("train", None), ("decode", 2)]
  assert results[0]["share"]["random bits"] > 0  # dropout masks, drawn in training only
  assert results[1]["share"]["random bits"] == 0


def test_dots_alone_finds_every_product_with_its_flops():
  def fn(x, w, v):
    return jnp.tanh(x @ w) @ w, jnp.einsum("bqd,bkd->bqk", v, v)

  x, w, v = jnp.ones((64, 128)), jnp.ones((128, 128)), jnp.ones((3, 5, 8))
  result = profile.dots_alone(jax.jit(fn).lower(x, w, v).compile().as_text(), repeats=1)
  rows = {(row["lhs"], row["rhs"]): row for row in result["top"]}
  assert rows[("f32[64, 128]", "f32[128, 128]")]["count"] == 2
  batched = rows[("f32[3, 5, 8]", "f32[3, 5, 8]")]
  assert batched["count"] == 1 and batched["contracting"] == [[2], [2]]
  assert result["gflop"] == pytest.approx((2 * 2 * 64 * 128 * 128 + 2 * 3 * 5 * 5 * 8) / 1e9,
                                          abs=1e-4)
  assert result["ms"] == pytest.approx(sum(r["ms_each"] * r["count"] for r in result["top"]),
                                       abs=0.1)


def test_padding_is_counted_per_batch_over_every_row():
  lengths = np.array([30, 3, 9, 17, 5, 9])  # Sorted into batches of 2: 3 5 | 9 9 | 17 30.
  padded, lengths_used = startup._padded(lengths, 2, lambda longest: [
      batching.grid_length(int(n), 64) for n in longest])
  assert (padded, lengths_used) == ((8 + 16 + 32) * 2, [8, 16, 32])


def test_the_padding_benchmark_scores_the_grid_against_two_lengths(tiny_config):
  tiny_config.data.max_train_examples = 300
  results = startup.padding_benchmark(tiny_config)
  assert [(r["split"], r["of"]) for r in results] == [
      ("val", "sources"), ("val", "pairs"), ("test", "sources"), ("test", "pairs")]
  for r in results:
    rows = -(-r["sentences"] // r["rows"]) * r["rows"]  # Filler rows complete the last batch.
    assert r["tokens"] <= r["grid_padded"] <= rows * max(r["grid_lengths"])
    assert set(r["grid_lengths"]) <= set(batching.grid_lengths(tiny_config.model.max_len))
    assert len(r["two_lengths_lengths"]) <= 2
    assert r["grid_padding"] == round(r["grid_padded"] / r["tokens"] - 1, 4)


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_the_compile_benchmark_compiles_a_runs_programs_then_runs_them(tiny_config):
  results = startup.compile_benchmark(tiny_config, [1])
  assert len(results) == 1 and results[0]["threads"] == 1
  assert results[0]["programs"] == "1 train step, 1 validation loss, 1 validation search"
  assert 0 < results[0]["train_step_seconds"] <= results[0]["all_seconds"]
  rows, length = results[0]["search_shape"]  # The validation batch: eval rows, on the grid.
  assert rows == tiny_config.eval.batch_size and length in batching.GRID
  assert results[0]["step_seconds"] > 0 and results[0]["search_seconds"] > 0


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_the_calls_benchmark_runs_the_loops_calls(tiny_config):
  results = startup.calls_benchmark(tiny_config, [1, 2], steps=4)
  assert [(r["steps_per_call"], r["steps"]) for r in results] == [(1, 4), (2, 4)]
  # The fast tiny run's batches have one shape: every call of k=2 holds two steps.
  assert [r["calls"] for r in results] == [4, 2]
  assert all(r["steps_per_second"] > 0 for r in results)


@pytest.mark.slow  # Compiles and trains a run and a group: about 8 s.
def test_the_seeds_benchmark_trains_groups_of_each_size(tiny_config):
  results = startup.seeds_benchmark(tiny_config, [1, 2], steps=2)
  assert [(r["seeds"], r["steps"]) for r in results] == [(1, 2), (2, 2)]
  assert results[0]["time_vs_first"] == 1.0
  for r in results:  # A step of S seeds is S runs' steps.
    assert r["run_steps_per_second"] == pytest.approx(r["seeds"] * r["steps_per_second"],
                                                      rel=1e-2)


@pytest.mark.slow  # Compiles and times six train steps of an RNN: over ~7 s.
def test_the_buckets_benchmark_counts_each_settings_epoch(tiny_config):
  from seq2seq.data import batching

  tiny_config.model.family, tiny_config.model.attention = "rnn", "general"
  tiny_config.data.bucket_step, tiny_config.data.max_len = 8, 32  # Lengths pad to 8 ... 32.
  results = startup.buckets_benchmark(tiny_config, [(1, 512), (2, 512)], steps=1, rounds=1)
  assert [r["num_buckets"] for r in results] == [1, 2]
  assert [r["programs"] for r in results] == [len(r["shapes"]) for r in results] == [1, 2]
  # The real target tokens of an epoch are those of every kept pair, however it is batched.
  with pytest.MonkeyPatch.context() as patch:
    trained = []
    patch.setattr(batching.TrainBatches, "__init__", _recording(trained))
    startup.buckets_benchmark(tiny_config, [(1, 512)], steps=1, rounds=1)
  real = sum(len(t) + 1 for t in trained[0])
  for r in results:
    assert r["real_target_tokens"] == real
    padded = sum(rows * length for rows, length in r["shapes"])
    assert 0 <= r["target_padding"] < 1 and r["epoch_seconds"] > 0 and padded > 0
  assert results[1]["target_padding"] < results[0]["target_padding"]
  assert results[1]["speedup_vs_first"] == round(results[1]["target_tokens_per_sec"]
                                                 / results[0]["target_tokens_per_sec"], 3)


def _recording(trained: list):
  """TrainBatches.__init__, recording the kept target sequences of each plan in `trained`."""
  from seq2seq.data import batching

  original = batching.TrainBatches.__init__

  def init(self, src_ids, tgt_ids, **kwargs):
    original(self, src_ids, tgt_ids, **kwargs)
    limit = kwargs["max_len"]
    trained.append([t for s, t in zip(src_ids, tgt_ids, strict=True)
                    if 0 < len(s) < limit and 0 < len(t) < limit])

  return init


def test_the_saves_benchmark_times_both_ways_of_saving(tiny_config):
  results = startup.saves_benchmark(tiny_config, saves=2)
  assert [(r["in_background"], r["saves"]) for r in results] == [(False, 1), (True, 1)]
  for r in results:
    assert 0 < r["stall_seconds"] <= r["write_seconds"] and r["megabytes"] > 0


def test_the_side_by_sides_download_folder_is_removed_whatever_happens(tmp_path, monkeypatch):
  """seq2seq-side-by-side unpacks flax's source into a temporary folder: removed after the
  comparison, and after a failed download too (it stayed behind, one per run)."""
  import subprocess
  import tempfile

  from seq2seq.errors import UserError
  from seq2seq.performance import side_by_side

  monkeypatch.delenv("FLAX_WMT_DIR", raising=False)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  monkeypatch.setattr(side_by_side.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
      a, 1, "", "ERROR: No matching distribution found for flax"))
  with pytest.raises(UserError, match="No matching distribution found for flax"):
    with side_by_side.anchor_files():
      pass
  assert list(tmp_path.iterdir()) == []
