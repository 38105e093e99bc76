"""RNN encoder-decoder invariants, for every attention variant."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.decoding import search
from seq2seq.models import ATTENTION_BY_FAMILY, attention, build_model, normalizers, rnn
from seq2seq.models.local_rnn import LOCAL
from seq2seq.models.normalizers import NORMALIZERS
from seq2seq.performance.rnn_reference import StepwiseRNN
from seq2seq.training.steps import cross_entropy
from tests.helpers import assert_stepping_matches_decode

VOCAB = 40
SRC = jnp.array([[5, 6, 7, 8, 3, 0], [9, 10, 3, 0, 0, 0]])  # EOS=3, PAD=0
TGT = jnp.array([[2, 11, 12, 13, 14], [2, 15, 16, 0, 0]])  # BOS=2
RNN_VARIANTS = ATTENTION_BY_FAMILY["rnn"]


def rnn_config(tiny_config, **model):
  c = tiny_config
  c.model.family = "rnn"
  c.model.emb_dim, c.model.rnn_hidden_dim = 16, 24
  c.model.num_encoder_layers = c.model.num_decoder_layers = 2
  c.model.update(model)
  return c


# Every attention with the default cell (LSTM with input feeding); the GRU and no input feeding
# each with an attention that scores with the previous state (concat) and one that scores with
# the current one (general), and no input feeding with the local windows too (whose position
# is the step's own in the loop, and every step's at once without feeding). The rest of the
# grid runs with -m slow.
CELLS = [("lstm", True), ("lstm", False), ("gru", True)]
STEPPED = [pytest.param(name, cell, feeding, id=f"{cell}-{feeding}-{name}",
                        marks=() if (cell, feeding) == CELLS[0] or name in ("concat", "general")
                        or (not feeding and name in LOCAL) else pytest.mark.slow)
           for cell, feeding in CELLS for name in RNN_VARIANTS]


@pytest.mark.parametrize("name,cell,input_feeding", STEPPED)
def test_decode_step_reproduces_teacher_forced_decode(tiny_config, name, cell, input_feeding):
  model = build_model(rnn_config(tiny_config, attention=name, rnn_cell=cell,
                                 input_feeding=input_feeding), VOCAB)
  assert_stepping_matches_decode(model, SRC, TGT, all_positions=True)


# The sparse normalizers with the global score the RNN recipe uses, and inside local_p's window.
@pytest.mark.parametrize("name,normalizer", [("general", n) for n in NORMALIZERS if n != "softmax"]
                         + [("local_p", "entmax15"), ("concat", "sparsemax")])
def test_a_sparse_normalizer_steps_as_it_teacher_forces(tiny_config, name, normalizer):
  model = build_model(rnn_config(tiny_config, attention=name, attention_normalizer=normalizer),
                      VOCAB)
  assert_stepping_matches_decode(model, SRC, TGT, all_positions=True)
  weights = np.asarray(model.attention_weights(SRC, TGT)["cross"])[0, :, 0]
  assert np.all(weights[np.broadcast_to(np.asarray(SRC == 0)[:, None, :], weights.shape)] == 0)
  if name != "local_p" and normalizers.NORMALIZERS[normalizer].sums_to_one:
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


def test_the_normalizer_reaches_the_rnns_attention(tiny_config):
  """Same parameters, another normalizer: sparsemax's weights where softmax's are."""
  softmax = build_model(rnn_config(tiny_config, attention="general"), VOCAB)
  sparse = build_model(rnn_config(tiny_config, attention="general",
                                  attention_normalizer="sparsemax"), VOCAB)
  memory = softmax.encode(SRC)
  query = jax.random.normal(jax.random.key(0), (2, 1, 24))
  scores = jnp.einsum("bqd,bkd->bqk", query, memory.keys[:, 0])
  mask = np.asarray(SRC != 0)[:, None, :]
  np.testing.assert_allclose(softmax._attend(memory, query)[1], normalizers.masked_softmax(
      scores, mask), atol=1e-6)
  np.testing.assert_allclose(sparse._attend(memory, query)[1], normalizers.sparsemax(
      scores, mask), atol=1e-6)


@pytest.mark.parametrize("name", [n for n in RNN_VARIANTS if n != "none"])
def test_alignment_sums_to_one_and_ignores_padding(tiny_config, name):
  """local_p's softmax is scaled by a Gaussian and not renormalized (Luong et al., eq. 10):
  its weights sum to less than one."""
  model = build_model(rnn_config(tiny_config, attention=name), VOCAB)
  weights = np.asarray(model.attention_weights(SRC, TGT)["cross"])[0, :, 0]  # [b, t, src]
  padded = np.broadcast_to(np.asarray(SRC == 0)[:, None, :], weights.shape)
  assert np.all(weights[padded] == 0.0)
  if name in LOCAL and LOCAL[name].predictive:
    assert np.all((weights.sum(-1) > 0) & (weights.sum(-1) < 1))
  else:
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


def test_bahdanau_scores_with_the_previous_state(tiny_config):
  """Step 1's alignment is scored with the decoder's initial (bridged) state s_0."""
  model = build_model(rnn_config(tiny_config, attention="concat"), VOCAB)
  memory = model.encode(SRC)
  weights = model.attention_weights(SRC, TGT)["cross"][0, :, 0]
  s0 = rnn.hidden_of(memory.initial[-1])[:, None, None, :]  # [b, 1 head, 1 query, hidden]
  _, expected = attention.attend(attention.SCORES["concat"], s0, memory.keys,
                                 memory.encoded[:, None], memory.src_mask.dense(1),
                                 model.score_params)
  np.testing.assert_allclose(weights[:, 0], expected[:, 0, 0], atol=1e-6)


@pytest.mark.parametrize("name,explicit", [("concat", "previous"), ("general", "current")])
def test_auto_query_state_is_the_papers_choice(tiny_config, name, explicit):
  auto = build_model(rnn_config(tiny_config, attention=name), VOCAB)
  chosen = build_model(rnn_config(tiny_config, attention=name, rnn_query_state=explicit), VOCAB)
  np.testing.assert_array_equal(auto.decode(auto.encode(SRC), TGT),
                                chosen.decode(chosen.encode(SRC), TGT))


@pytest.mark.parametrize("name,state", [("concat", "current"), ("general", "previous")])
def test_swapped_query_state_changes_the_model_and_still_steps(tiny_config, name, state):
  """Luong's scores with Bahdanau's recurrence (and back): a real ablation, decodable."""
  model = build_model(rnn_config(tiny_config, attention=name, rnn_query_state=state), VOCAB)
  assert model.query_previous == (state == "previous")
  assert_stepping_matches_decode(model, SRC, TGT, all_positions=True)
  paper = build_model(rnn_config(tiny_config, rnn_query_state="auto"), VOCAB)
  assert not np.allclose(model.decode(model.encode(SRC), TGT), paper.decode(paper.encode(SRC), TGT))


def test_reverse_padded_keeps_padding_in_place():
  x = jnp.array([[1, 2, 3, 0], [4, 5, 0, 0]])
  np.testing.assert_array_equal(rnn.reverse_padded(x, jnp.array([3, 2])),
                                [[3, 2, 1, 0], [5, 4, 0, 0]])


def test_reverse_source_reads_the_source_backwards(tiny_config):
  forward = build_model(rnn_config(tiny_config, reverse_source=False), VOCAB)
  backward = build_model(rnn_config(tiny_config, reverse_source=True), VOCAB)
  reversed_ids = rnn.reverse_padded(SRC, (SRC != 0).sum(1))
  a = forward.decode(forward.encode(reversed_ids), TGT)
  b = backward.decode(backward.encode(SRC), TGT)  # same seed: same parameters
  np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_padding_does_not_change_the_encoding(tiny_config, bidirectional):
  model = build_model(rnn_config(tiny_config, bidirectional=bidirectional), VOCAB)
  short, long = model.encode(SRC), model.encode(jnp.pad(SRC, ((0, 0), (0, 3))))
  np.testing.assert_allclose(short.encoded, long.encoded[:, :6], atol=1e-6)
  np.testing.assert_allclose(short.context, long.context, atol=1e-6)


def test_zero_bridge_starts_from_zeros(tiny_config):
  model = build_model(rnn_config(tiny_config, bridge=False), VOCAB)
  for carry in model.encode(SRC).initial:
    assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(carry))


def test_dropout_only_with_rngs(tiny_config):
  model = build_model(rnn_config(tiny_config, dropout_rate=0.3), VOCAB)
  a = model.decode(model.encode(SRC), TGT)
  np.testing.assert_array_equal(a, model.decode(model.encode(SRC), TGT))
  b = model.decode(model.encode(SRC, rngs=nnx.Rngs(dropout=0)), TGT, rngs=nnx.Rngs(dropout=1))
  assert not np.allclose(a, b)


# The fused recurrence (inputs multiplied before the loop, gates side by side, logits after the
# loop) against the cells as written, on the same parameters. By default two layers of the
# LSTM scored with the current state (general) and of the GRU with the previous one (concat),
# both with input feeding; every cell, feeding, attention and depth with -m slow.
FUSED = [pytest.param(name, cell, feeding, layers, id=f"{cell}-{feeding}-{name}-{layers}",
                      marks=() if (cell, feeding, name, layers) in (
                          ("lstm", True, "general", 2), ("gru", True, "concat", 2))
                      else pytest.mark.slow)
         for cell, feeding in CELLS for name in RNN_VARIANTS for layers in (1, 2)
         # The local windows attend as `general` does, from the current state: one case each.
         if name not in LOCAL or (cell, feeding, layers) == ("lstm", True, 1)]


@pytest.fixture
def _release_programs():
  """Drops the test's programs when it ends. The slow grid's ~60 cases, run op by op, each
  compile hundreds of small programs; held together in one process, XLA:CPU (jaxlib 0.10.2,
  FAST_COMPILE's flags) crashed with SIGSEGV compiling the 45th case's greedy search, in CI's
  slow run and here, as conftest's module-wide release once did for ~40 cases."""
  yield
  jax.clear_caches()


@pytest.mark.usefixtures("_release_programs")
@pytest.mark.parametrize("name,cell,input_feeding,layers", FUSED)
def test_fused_recurrence_matches_the_cells_as_written(tiny_config, name, cell, input_feeding,
                                                       layers):
  """Same loss and gradients under dropout, same logits and greedy translations, to float32
  rounding: only the order of the products differs."""
  config = rnn_config(tiny_config, attention=name, rnn_cell=cell, input_feeding=input_feeding,
                      num_encoder_layers=layers, num_decoder_layers=layers, dropout_rate=0.3)
  out = jnp.concatenate([TGT[:, 1:], jnp.array([[3], [0]])], axis=1)
  results = []
  for cls in (rnn.RNN, StepwiseRNN):
    graphdef, params = nnx.split(cls(config.model, VOCAB, rngs=nnx.Rngs(params=0),
                                     dtype=jnp.float32), nnx.Param)

    def loss(params, key, graphdef=graphdef):
      model, rngs = nnx.merge(graphdef, params), nnx.Rngs(dropout=key)
      logits = model.decode(model.encode(SRC, rngs=rngs), TGT, rngs=rngs)
      return cross_entropy(logits, out, 0.1)["loss"]

    value, grads = jax.value_and_grad(loss)(params, jax.random.key(7))
    model = nnx.merge(graphdef, params)
    memory = model.encode(SRC)
    greedy = search.greedy_search(functools.partial(model.decode_step, memory),
                                  model.init_cache(memory, 8), SRC.shape[0], 8)
    results.append((value, nnx.to_pure_dict(grads), model.decode(memory, TGT), greedy))
  (fused, fused_grads, fused_logits, fused_greedy), (ref, ref_grads, ref_logits, ref_greedy) = (
      results)
  np.testing.assert_allclose(fused, ref, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), fused_grads,
               ref_grads)
  np.testing.assert_allclose(fused_logits, ref_logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(fused_greedy, ref_greedy)
