"""Sequence packing (config.data.pack): several pairs per row, segment-aware masks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.data import batching
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.models import attention, build_model, masks
from seq2seq.models.positions import POSITIONS
from seq2seq.training import steps

VOCAB = 40


def _pairs(n: int = 60, seed: int = 0):
  """Random pairs of 1..9 source / 1..12 target ids (no special ids)."""
  rng = np.random.default_rng(seed)
  src = [rng.integers(4, VOCAB, rng.integers(1, 10)).astype(np.int32) for _ in range(n)]
  tgt = [rng.integers(4, VOCAB, rng.integers(1, 13)).astype(np.int32) for _ in range(n)]
  return src, tgt


def _epoch(batches: batching.TrainBatches) -> list[dict]:
  return [batches(step) for step in range(batches.batches_per_epoch)]


def _segments(row: np.ndarray, segments: np.ndarray) -> list[list[int]]:
  return [row[segments == s].tolist() for s in range(1, segments.max() + 1)]


def test_packed_rows_hold_every_pair_once_with_its_own_positions():
  src, tgt = _pairs()
  batches = batching.TrainBatches(src, tgt, tokens_per_batch=64, max_len=16, bucket_step=8,
                                  seed=1, pack=True)
  assert batches.shapes == [(4, 16)]  # One shape, max_len rounded up to bucket_step.
  seen = []
  for batch in _epoch(batches):
    for r in range(len(batch["src"])):
      src_parts = _segments(batch["src"][r], batch["src_segments"][r])
      tgt_in = _segments(batch["tgt_in"][r], batch["tgt_segments"][r])
      tgt_out = _segments(batch["tgt_out"][r], batch["tgt_segments"][r])
      assert len(src_parts) == len(tgt_in) == len(tgt_out)
      for s, t_in, t_out in zip(src_parts, tgt_in, tgt_out, strict=True):
        assert s[-1] == EOS_ID and t_in[0] == BOS_ID and t_out[-1] == EOS_ID
        assert t_in[1:] == t_out[:-1]
        seen.append((tuple(s[:-1]), tuple(t_out[:-1])))
      for side in ("src", "tgt"):
        segments, positions = batch[f"{side}_segments"][r], batch[f"{side}_positions"][r]
        for s in range(1, segments.max() + 1):
          assert positions[segments == s].tolist() == list(range((segments == s).sum()))
        assert np.all(batch[side if side == "src" else "tgt_in"][r][segments == 0] == PAD_ID)
  assert sorted(seen) == sorted((tuple(s), tuple(t)) for s, t in zip(src, tgt, strict=True))
  assert batches.batches_per_epoch < len(src) / 4  # Packing did put several pairs per row.


def test_packing_fills_rows():
  rng = np.random.default_rng(2)
  src = [np.full(rng.integers(1, 12), 5, np.int32) for _ in range(400)]
  tgt = [np.full(len(s) + rng.integers(-1, 2) if len(s) > 1 else 1, 6, np.int32) for s in src]
  batches = batching.TrainBatches(src, tgt, tokens_per_batch=64, max_len=32, bucket_step=8,
                                  seed=0, pack=True)
  used = sum(max(len(s), len(t)) + 1 for s, t in zip(src, tgt, strict=True))
  rows = batches.batches_per_epoch * 2  # 64 tokens / 32 per row; the last batch may be short.
  assert used / (rows * 32) > 0.95  # Best fit decreasing leaves little room unused.


def test_segment_masks_keep_sentences_apart():
  # One row: source sentences of 3 and 2 tokens, target sentences of 2 and 3, then PAD.
  src_seg = jnp.array([[1, 1, 1, 2, 2, 0]])
  tgt_seg = jnp.array([[1, 1, 2, 2, 2, 0]])
  ids = lambda seg: jnp.where(seg > 0, 5, PAD_ID)  # noqa: E731
  encoder = np.asarray(masks.padding_mask(ids(src_seg), src_seg).dense(6))[0, 0]
  assert encoder[:3, :3].all() and not encoder[:3, 3:].any() and not encoder[3:5, :3].any()
  decoder = np.asarray(masks.decoder_self_mask(ids(tgt_seg), tgt_seg).dense(6))[0, 0]
  expected = np.zeros((6, 6), bool)
  expected[:2, :2] = np.tril(np.ones((2, 2), bool))
  expected[2:5, 2:5] = np.tril(np.ones((3, 3), bool))
  np.testing.assert_array_equal(decoder[:, :5], expected[:, :5])
  cross = np.asarray(masks.cross_mask(masks.padding_mask(ids(src_seg), src_seg),
                                      tgt_seg).dense(6))[0, 0]
  np.testing.assert_array_equal(cross[:2], np.array([[1, 1, 1, 0, 0, 0]] * 2, bool))
  np.testing.assert_array_equal(cross[2:5], np.array([[0, 0, 0, 1, 1, 0]] * 3, bool))
  # Masked keys get exactly zero weight through the shared softmax.
  scores = jax.random.normal(jax.random.key(0), (1, 2, 6, 6))
  assert np.all(np.asarray(attention.masked_softmax(scores, cross[None, None]))[..., ~cross] == 0)


# Every attention that packs, every position scheme (positions restart at each packed
# sentence), shared key/value heads and a sparse normalizer. Each: {config.model field: value}.
# The default run takes the first four; -m slow the rest.
_PACKED = ([{"attention": "scaled_dot"}, {"attention": "local"}, {"positions": "relative"},
            {"attention_normalizer": "entmax15"}]
           + [{"positions": name} for name in POSITIONS if name not in ("sinusoidal", "relative")]
           + [{"positions": "rope", "attention": "local"}, {"num_kv_heads": 1}])
PACKED_CASES = [case if i < 4 else pytest.param(case, marks=pytest.mark.slow)
                for i, case in enumerate(_PACKED)]


@pytest.mark.parametrize("case", PACKED_CASES,
                         ids=lambda case: "-".join(f"{k}={v}" for k, v in case.items()))
def test_packed_batches_give_the_loss_of_the_same_pairs_unpacked(tiny_config, case):
  tiny_config.model.update(case)
  tiny_config.model.attention_window = 3
  tiny_config.model.dropout_rate = 0.0
  tiny_config.model.num_encoder_layers = tiny_config.model.num_decoder_layers = 2
  graphdef, params = nnx.split(build_model(tiny_config, VOCAB), nnx.Param)
  step = jax.jit(lambda p, b: steps.eval_step(p, b, graphdef=graphdef))
  src, tgt = _pairs()

  def summed(pack: bool) -> dict:
    batches = batching.TrainBatches(src, tgt, tokens_per_batch=64, max_len=16, bucket_step=8,
                                    seed=1, pack=pack)
    sums = [step(params, {k: jnp.asarray(v) for k, v in batch.items()})
            for batch in _epoch(batches)]
    return {k: float(sum(s[k] for s in sums)) for k in ("nll", "tokens")}

  packed, unpacked = summed(True), summed(False)
  assert packed["tokens"] == unpacked["tokens"] == sum(len(t) + 1 for t in tgt)
  np.testing.assert_allclose(packed["nll"], unpacked["nll"], rtol=1e-5)


