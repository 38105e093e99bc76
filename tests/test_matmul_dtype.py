"""Decoding with bfloat16 products (`--matmul_dtype`): the product's value, every dense layer
and the output layer (tied or not) taking it, float32 left as it was, a run decoded so into
files of their own, and the runs it is refused for, in one line."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.commands import cli
from seq2seq.errors import UserError
from seq2seq.evaluation.evaluate import run_evaluation
from seq2seq.models import build_model, check_matmul_dtype
from seq2seq.models.linear import MATRIX_DOTS, bfloat16_dot, cast_kernels, matmul, matrix_dot


def test_the_bfloat16_product_is_bfloat16_inputs_summed_in_float32():
  x = jax.random.normal(jax.random.key(0), (3, 5, 64))
  kernel = jax.random.normal(jax.random.key(1), (64, 8))
  got = bfloat16_dot(x, kernel, (((2,), (0,)), ((), ())))
  assert got.dtype == jnp.float32 and got.shape == (3, 5, 8)
  rounded = x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16)
  np.testing.assert_allclose(got, jnp.dot(*rounded, preferred_element_type=jnp.float32),
                             rtol=1e-6, atol=1e-6)
  # The same as float64 sums of the rounded inputs: nothing else is rounded.
  exact = np.asarray(rounded[0], np.float64) @ np.asarray(rounded[1], np.float64)
  np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)
  assert np.array_equal(matmul(x, kernel, "bfloat16"), got)
  assert not np.allclose(matmul(x, kernel), got, rtol=1e-6, atol=1e-6)  # float32's differs.


def _linears(model) -> list:
  return [m for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Linear)]


@pytest.mark.parametrize("tied", [True, False])
def test_every_dense_layer_and_the_output_take_bfloat16_inputs(tiny_config, tied):
  tiny_config.model.share_embeddings = tied
  ours, bf16 = (build_model(tiny_config, 40, matmul_dtype=d) for d in ("float32", "bfloat16"))
  assert all(m.dot_general is matrix_dot for m in _linears(ours)) and ours.matmul_dtype == "float32"
  assert _linears(bf16) and all(m.dot_general is bfloat16_dot for m in _linears(bf16))
  # The parameters are the same; the output layer's product takes the bfloat16 inputs.
  assert jax.tree.all(jax.tree.map(np.array_equal, nnx.state(ours, nnx.Param),
                                   nnx.state(bf16, nnx.Param)))
  y = jax.random.normal(jax.random.key(2), (2, 3, tiny_config.model.emb_dim))
  normed = bf16.decoder_norm(y) if bf16.decoder_norm is not None else y
  table = (bf16.tgt_embed.embedding[...].T if tied else bf16.logits_dense.kernel[...])
  expected = jnp.dot(normed.astype(jnp.bfloat16), table.astype(jnp.bfloat16),
                     preferred_element_type=jnp.float32)
  expected = expected if tied else expected + bf16.logits_dense.bias[...]
  np.testing.assert_allclose(bf16._logits(y), expected, rtol=1e-6, atol=1e-6)
  # A whole teacher-forced pass: near float32's, not equal to it.
  src, tgt = jnp.array([[5, 6, 7, 2]]), jnp.array([[1, 8, 9]])
  teacher_forced = nnx.jit(lambda m: m.decode(m.encode(src), tgt))  # One program per model.
  f32_logits, bf16_logits = teacher_forced(ours), teacher_forced(bf16)
  assert bf16_logits.dtype == jnp.float32
  np.testing.assert_allclose(bf16_logits, f32_logits, rtol=0.05, atol=0.05)
  assert not np.array_equal(bf16_logits, f32_logits)


def test_the_kernels_of_bfloat16_products_are_cast_once_and_nothing_else(tiny_config):
  graphdef, params = nnx.split(build_model(tiny_config, 40, matmul_dtype="bfloat16"), nnx.Param)
  assert cast_kernels(graphdef, params, "float32") is params  # float32: as they are.
  cast = cast_kernels(graphdef, params, "bfloat16")
  dtypes = {jax.tree_util.keystr(path): x.dtype for path, x in jax.tree.leaves_with_path(cast)}
  kernels = {path for path in dtypes if "'kernel'" in path}
  assert kernels and {dtypes[p] for p in kernels} == {jnp.dtype(jnp.bfloat16)}
  others = {dtype for path, dtype in dtypes.items() if path not in kernels}
  assert others == {jnp.dtype(jnp.float32)}
  assert any("embed" in path for path in dtypes)  # The tied table stays float32 (its lookups).


def test_a_run_decoded_with_bfloat16_products_writes_files_of_its_own(run, tmp_path):
  src, ref = tmp_path / "in.en", tmp_path / "ref.de"
  src.write_text("A man rides a bike.\n\nTwo dogs play.\n", encoding="utf-8")
  ref.write_text("Ein Mann fährt Fahrrad.\n\nZwei Hunde spielen.\n", encoding="utf-8")
  out = tmp_path / "eval"
  result, prefix = run_evaluation(run, src_file=str(src), ref_file=str(ref), checkpoint="latest",
                                  beam_size=2, out=out, matmul_dtype="bfloat16")
  assert prefix == out / "in.en.latest.beam2.matmul-bfloat16"
  hypotheses = (out / "in.en.latest.beam2.matmul-bfloat16.hyp").read_text(encoding="utf-8")
  assert len(hypotheses.splitlines()) == 3 == result["sentences"]
  assert hypotheses.splitlines()[1] == ""  # An empty line stays empty.
  scores = json.loads((out / "in.en.latest.beam2.matmul-bfloat16.json").read_text())
  assert scores["matmul_dtype"] == "bfloat16" and scores["beam_size"] == 2
  assert sorted(p.name for p in out.iterdir()) == [
      "in.en.latest.beam2.matmul-bfloat16.hyp", "in.en.latest.beam2.matmul-bfloat16.json"]


@pytest.mark.parametrize("field, value, dtype, says", [
    ("model.family", "rnn", "bfloat16", "the rnn's recurrent cells multiply outside"),
    ("train.dtype", "bfloat16", "bfloat16", "computes in config.train.dtype=bfloat16"),
    ("train.dtype", "float32", "float16", "--matmul_dtype=float16 is not a product dtype"),
])
def test_what_cannot_decode_so_is_refused_in_one_line(tiny_config, field, value, dtype, says):
  section, key = field.split(".")
  tiny_config[section][key] = value
  with pytest.raises(UserError, match=says) as refused:
    check_matmul_dtype(tiny_config, dtype)
  assert "\n" not in str(refused.value) and "--matmul_dtype" in str(refused.value)
  check_matmul_dtype(tiny_config, "float32")  # float32 decodes every run.


def test_the_flag_offers_the_products_the_models_have():
  assert cli.MATMUL_DTYPES == tuple(MATRIX_DOTS)
