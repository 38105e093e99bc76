"""What each row and column of every attention shown stands for (`alignment.labels`): a row of
the decoder's self-attention sees `<s>` and the outputs before its own, and a source the RNN
read reversed is shown in the order of its words, in the pictures, the server's answers and
the word links alike; and what makes the weights that the server sends beside them
(differential attention's two maps, a gated output's gates). Untrained tiny models, a
hand-made vocabulary."""

import types

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.decoding import alignment
from seq2seq.decoding import word_alignment as wa
from seq2seq.models import build_model
from seq2seq.serve.engine import Engine

VOCAB = 30
SOURCE = "▁w5 ▁w6 ▁w7 ▁w8 ▁w9"  # Ids 5..9, each its own word.
OUT = np.array([11, 12, 13, EOS_ID], np.int32)  # The translation every search gives here.


class Pieces:
  """A tokenizer of `▁w<id>` pieces, one per word."""
  vocab_size = VOCAB
  SPECIAL = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}

  def pieces(self, ids) -> list[str]:
    return [self.SPECIAL.get(i, f"▁w{i}") for i in np.asarray(ids).reshape(-1).tolist()]

  def encode(self, text: str) -> list[int]:
    return [int(piece[2:]) for piece in text.split()]


def translator(config):
  """What `alignment` and `Alignments` read of a `Translator`, for an untrained model of
  `config` whose search gives OUT."""
  graphdef, params = nnx.split(build_model(config, VOCAB), nnx.Param)
  tokenizer = Pieces()
  return types.SimpleNamespace(
      graphdef=graphdef, params=params, config=config, batch_size=2, tokenizer=tokenizer,
      source_ids=lambda text: np.asarray(tokenizer.encode(text), np.int32),
      hypotheses=lambda texts: [[types.SimpleNamespace(ids=OUT)] for _ in texts])


def served(found) -> dict:
  """The server's answer for SOURCE translated as OUT (`Engine._attention`) by `translator`
  `found`, its attention compiled ahead as the server compiles it."""
  run = types.SimpleNamespace(alignments=alignment.Alignments(found, 6), tokenizer=Pieces(),
                              longest=6)
  run.alignments.compile_ahead()
  return Engine._attention(run, SOURCE, OUT)


def test_each_kind_is_labelled_by_what_its_rows_and_columns_stand_for():
  """Rows are what the model reads or predicts at each step; a decoder's columns are what it
  read: `<s>`, then its outputs but the last (it never reads `</s>`)."""
  source = ["▁w5", "▁w6", "</s>"]
  assert alignment.labels(Pieces().pieces, np.array([5, 6]), np.array([11, 12, EOS_ID])) == {
      "cross": (["▁w11", "▁w12", "</s>"], source), "encoder": (source, source),
      "decoder": (["▁w11", "▁w12", "</s>"], ["<s>", "▁w11", "▁w12"])}


def test_a_decoder_row_sees_bos_and_the_outputs_before_its_own(tiny_config):
  """The server's answer labels every kind by `labels`; a decoder row puts its weight on
  `<s>` and the outputs before its own, the first row all of it on `<s>`."""
  found = served(translator(tiny_config))  # The Transformer: all three kinds.
  assert "maps" not in found and "gates" not in found  # Neither differential nor gated.
  expected = alignment.labels(Pieces().pieces, Pieces().encode(SOURCE), OUT)
  assert (found["target"], found["source"]) == expected["cross"]
  assert found["target_inputs"] == expected["decoder"][1] == ["<s>", "▁w11", "▁w12", "▁w13"]
  for kind, name in (("cross", "weights"), ("encoder", "encoder"), ("decoder", "decoder")):
    rows, columns = expected[kind]
    assert np.asarray(found[name]).shape[2:] == (len(rows), len(columns))
  decoder = np.asarray(found["decoder"])
  np.testing.assert_allclose(decoder[..., 0, 0], 1.0)
  for row in range(len(OUT)):
    seen = np.flatnonzero(decoder[..., row, :].max(axis=(0, 1)) > 0)
    assert [found["target_inputs"][i] for i in seen] == ["<s>", *found["target"][:row]]


def reversed_run(config):
  """An RNN with `dot` attention that reads its source reversed, and the weight each source
  word gets at each step when `</s> w9 .. w5` is read forwards by the same RNN (the same
  parameters): reading `w5 .. w9 </s>` reversed, it attends alike."""
  config.model.family, config.model.attention, config.model.reverse_source = "rnn", "dot", True
  forwards = config.copy_and_resolve_references()
  forwards.model.reverse_source = False
  memory = jnp.asarray([[EOS_ID, 9, 8, 7, 6, 5]])
  tgt_in = jnp.asarray([np.concatenate([[BOS_ID], OUT[:-1]])])
  weights = np.asarray(build_model(forwards, VOCAB).attention_weights(memory, tgt_in)["cross"])
  return translator(config), dict(zip(Pieces().pieces(memory[0]), weights[0, 0, 0].T,
                                      strict=True))


def test_a_reversed_source_is_pictured_in_the_order_of_its_words(tiny_config):
  """The picture's column of each word (`alignment.alignment`, as seq2seq-plot-attention and
  seq2seq-compare draw it) holds the weight of that word, not of its mirror image."""
  run, by_word = reversed_run(tiny_config)
  shown, source, _ = alignment.alignment(run, SOURCE)
  assert source == ["▁w5", "▁w6", "▁w7", "▁w8", "▁w9", "</s>"]
  np.testing.assert_allclose(shown[0, 0], np.stack([by_word[p] for p in source], 1), atol=1e-6)


@pytest.mark.slow  # Over ~7 s: compiles the server's attention and the word links' batches.
def test_the_server_and_the_word_links_show_a_reversed_source_in_its_order(tiny_config):
  """The server's answer (the explorer's maps) and the word links of `--alignment` read the
  reversed run's columns in the order of the source's words, as the pictures do."""
  run, by_word = reversed_run(tiny_config)
  answer = served(run)
  weights = np.stack([by_word[p] for p in answer["source"]], 1)
  assert answer["source"] == ["▁w5", "▁w6", "▁w7", "▁w8", "▁w9", "</s>"]
  np.testing.assert_allclose(answer["weights"][0][0], weights, atol=1e-4)
  links = alignment.word_alignments(run, [np.arange(5, 10, dtype=np.int32)], [OUT])
  assert links[0] == wa.word_links(weights[:-1, :-1], list(range(5)), list(range(3)))


def test_a_run_without_attention_is_refused_its_picture_not_drawn_blank(tiny_config, tmp_path):
  """An RNN trained with `attention=none` attends to no source word: its weights are zeros, and
  seq2seq-plot-attention (and evaluate's --plot_attention) drew them as a blank map without a
  word. Now one line names the run, why, and the fix, and nothing is written."""
  from seq2seq.errors import UserError
  from seq2seq.evaluation import plots

  tiny_config.model.family, tiny_config.model.attention = "rnn", "none"
  run = translator(tiny_config)
  run.workdir = tmp_path / "run"
  assert not np.any(alignment.alignment(run, SOURCE)[0])  # What the map would show.
  out = tmp_path / "attention.png"
  with pytest.raises(UserError) as raised:
    plots.plot_alignment(run, SOURCE, out)
  assert str(raised.value) == (
      f"{run.workdir} was trained with config.model.attention=none: its decoder reads one fixed"
      " vector of the source and attends to none of its words, so there is no attention to"
      " draw; pass the --workdir of a run trained with attention (any config.model.attention"
      " but none).")
  assert not out.exists()


# The server's names for each kind of attention, and the model's stack of that kind's layers'
# attention modules.
STACKS = {"weights": lambda m: [layer.cross_attention for layer in m.decoder_layers],
          "encoder": lambda m: [layer.self_attention for layer in m.encoder_layers],
          "decoder": lambda m: [layer.self_attention for layer in m.decoder_layers]}


def test_a_differential_runs_answer_holds_its_two_maps_and_lambda(tiny_config):
  """Beside each kind of weights, the server sends differential attention's two softmax maps,
  each row summing to 1, and each layer's lambda (the model's, `DifferentialParams.strength`):
  the weights are map1 - lambda map2 (to the 4 decimals sent). The API's model keeps them, as
  `lambda`; nothing else counts them as weights (`zero_shares`)."""
  from seq2seq.serve.app import Attention

  tiny_config.model.attention = "differential"
  tiny_config.model.num_encoder_layers = tiny_config.model.num_decoder_layers = 2
  run = translator(tiny_config)
  found = served(run)
  model = nnx.merge(run.graphdef, run.params)
  assert set(found["maps"]) == set(STACKS) and "gates" not in found
  negative = 0
  for name, stack in STACKS.items():
    weights, maps = np.asarray(found[name]), found["maps"][name]
    map1, map2, lam = np.asarray(maps["map1"]), np.asarray(maps["map2"]), maps["lambda"]
    assert map1.shape == map2.shape == weights.shape and len(lam) == weights.shape[0] == 2
    np.testing.assert_allclose(lam, [float(a.score_params.strength()) for a in stack(model)],
                               atol=1e-4)
    np.testing.assert_allclose(map1.sum(-1), 1.0, atol=1e-3)
    np.testing.assert_allclose(map2.sum(-1), 1.0, atol=1e-3)
    np.testing.assert_allclose(weights, map1 - np.asarray(lam)[:, None, None, None] * map2,
                               atol=2e-4)
    negative += int(np.sum(weights < 0))
  assert negative > 0  # The weights the explorer draws on a signed scale.
  sent = Attention.model_validate(found).model_dump(by_alias=True, exclude_none=True)
  assert sent["maps"]["weights"]["lambda"] == found["maps"]["weights"]["lambda"]
  assert set(alignment.zero_shares(run, [SOURCE], ["▁w11 ▁w12 ▁w13"], batch=2)) == {
      "cross", "encoder", "decoder"}


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_a_gated_runs_answer_holds_each_heads_gate_per_row(tiny_config, gate):
  """A gated run's answer holds the gate on each head's output per layer, head and row (its
  query), `[layers][heads][rows]`, between 0 and 1; a model without a gate or differential
  attention gives the three kinds alone (and the server sends neither: the test above)."""
  tiny_config.model.attention_gate, tiny_config.model.attention_normalizer = gate, "sigmoid"
  found = served(translator(tiny_config))
  assert set(found["gates"]) == set(STACKS) and "maps" not in found
  for name in STACKS:
    gates, weights = np.asarray(found["gates"][name]), np.asarray(found[name])
    assert gates.shape == weights.shape[:3] and np.all((gates > 0) & (gates < 1))
  plain = tiny_config.copy_and_resolve_references()
  plain.model.attention_gate, plain.model.attention_normalizer = "none", "softmax"
  src, tgt = jnp.asarray([[5, 6, EOS_ID]]), jnp.asarray([[BOS_ID, 11]])
  assert list(build_model(plain, VOCAB).attention_weights(src, tgt)) == ["cross", "encoder",
                                                                          "decoder"]


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_the_gate_sent_is_the_sigmoid_of_the_input_per_head(gate):
  """`MultiHeadAttention`'s parts: the gate, `sigmoid(x W)` per head (Qiu et al. 2025), as
  `[batch, heads, q, 1]`, an element-wise gate's mean over the head's features; computed here
  in numpy from the layer's weights."""
  from seq2seq.models import attention, masks

  mha = attention.MultiHeadAttention(16, 2, attention="scaled_dot", dropout_rate=0.0,
                                     rngs=nnx.Rngs(0), gate=gate)
  x = np.random.default_rng(0).normal(size=(2, 3, 16)).astype(np.float32)
  mask = masks.padding_mask(jnp.asarray([[5, 6, 3], [5, 3, 0]]))
  out, parts = mha(jnp.asarray(x), *mha.project_kv(jnp.asarray(x)), mask, return_weights=True,
                   return_parts=True)
  sigmoid = 1 / (1 + np.exp(-(x.astype(np.float64) @ np.asarray(mha.gate.kernel[...]))))
  per_head = sigmoid.reshape(2, 3, 2, -1).transpose(0, 2, 1, 3)  # [batch, heads, q, 1 or d]
  assert set(parts) == {"weights", "gate"} and parts["gate"].shape == (2, 2, 3, 1)
  np.testing.assert_allclose(parts["gate"], per_head.mean(-1, keepdims=True), atol=1e-6)
  np.testing.assert_allclose(out, mha(jnp.asarray(x), *mha.project_kv(jnp.asarray(x)), mask),
                             atol=1e-6)
