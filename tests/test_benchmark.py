"""The benchmark's FLOP count against XLA's own count of the compiled forward pass."""

import jax
import numpy as np
import pytest
from flax import nnx

from seq2seq import benchmark
from seq2seq.models import build_model


def test_counted_flops_match_xla_cost_analysis():
  c = benchmark.transformer_config(layers=2, dim=64, heads=4, mlp=128)
  vocab, batch, length = 500, 4, 16
  graphdef, params = nnx.split(build_model(c, vocab), nnx.Param)
  data = benchmark._random_batch(batch, length, vocab)

  def forward(params):
    model = nnx.merge(graphdef, params)
    return model.decode(model.encode(data["src"]), data["tgt_in"])

  xla = jax.jit(forward).lower(params).compile().cost_analysis()
  xla = xla[0] if isinstance(xla, list) else xla
  ours = benchmark.transformer_flops(c.model, vocab, batch, length, length, training=False)
  # XLA also counts softmax, layer norm and other elementwise work: a little more.
  assert ours <= xla["flops"] <= 1.15 * ours


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_benchmark_reports_consistent_figures(dtype):
  result = benchmark.train_benchmark(layers=1, dim=32, heads=2, mlp=64, vocab=200, batch=8,
                                     length=8, steps=2, dtype=dtype)
  assert result["dtype"] == dtype
  assert 0 < result["mfu_vs_matmul"] < 1.5


def test_decode_baselines_translate_exactly_like_ours():
  """The benchmark's baselines differ from our decoder in speed only."""
  model = build_model(benchmark.transformer_config(layers=2, dim=32, heads=2, mlp=64), 100)
  src = benchmark._random_batch(3, 7, 100)["src"]
  for beam in (1, 3):
    outputs = {impl: benchmark._search(model, src, beam=beam, out_len=9, impl=impl)
               for impl in benchmark.DECODERS}
    for impl, ids in outputs.items():
      np.testing.assert_array_equal(ids, outputs["ours"], err_msg=f"{impl}, beam {beam}")
