"""Our model config as JoeyNMT 2.3.0 builds it (benchmarks/joeynmt/side_by_side.py): its
`model` section for the same architecture, parameter for parameter where JoeyNMT can
(`joeynmt_model`), the parameters JoeyNMT then holds, counted from the shapes of its modules
(`joeynmt_parameters`), and what differs, with what it costs (`unmatched`).

JoeyNMT's Transformer is ours with biases in the attention projections and attention dropout
tied to the layers' dropout; its RNN is our `general`-attention recipe (Luong et al.'s, which
JoeyNMT calls `luong`) with torch's two bias vectors per gate and the attention's projections
arranged otherwise. Nothing here imports torch or JoeyNMT: it only writes their config.
"""

import ml_collections

from seq2seq.errors import UserError

VERSION = "2.3.0"


def _check(condition: bool, problem: str) -> None:
  if not condition:
    raise UserError(f"{problem}; the JoeyNMT comparison takes the configs that JoeyNMT"
                    f" {VERSION} can build, such as configs/multi30k_transformer_sinusoidal.py and"
                    " configs/multi30k_rnn.py.")


def joeynmt_model(m: ml_collections.ConfigDict) -> dict:
  """JoeyNMT's `model` section for our `config.model`: the same architecture, parameter for
  parameter where JoeyNMT can (`unmatched` says where not). `UserError` for what JoeyNMT
  cannot build at all."""
  shared = m.share_embeddings
  if m.family == "transformer":
    _check(m.attention == "scaled_dot", f"JoeyNMT's Transformer has scaled_dot attention only, not"
           f" config.model.attention={m.attention!r}")
    _check(m.positions == "sinusoidal", f"JoeyNMT adds sinusoidal positions only, not"
           f" config.model.positions={m.positions!r}")
    _check(m.attention_normalizer == "softmax", "JoeyNMT's attention normalizes with softmax"
           f" only, not config.model.attention_normalizer={m.attention_normalizer!r}")
    _check(m.num_kv_heads in (0, m.num_heads), "JoeyNMT has one key/value head per query head,"
           f" not config.model.num_kv_heads={m.num_kv_heads}")

    def side(layers: int) -> dict:
      return {"type": "transformer", "num_layers": layers, "num_heads": m.num_heads,
              "hidden_size": m.emb_dim, "ff_size": m.mlp_dim, "dropout": m.dropout_rate,
              "layer_norm": "pre" if m.pre_ln else "post", "activation": "relu",
              "embeddings": {"embedding_dim": m.emb_dim, "scale": True,
                             "dropout": m.dropout_rate}}

    return {"tied_embeddings": shared, "tied_softmax": shared,
            "encoder": side(m.num_encoder_layers), "decoder": side(m.num_decoder_layers)}
  _check(m.family == "rnn", f"JoeyNMT builds Transformers and RNNs, not config.model.family="
         f"{m.family!r}")
  _check(m.attention == "general", f"our RNN's config.model.attention={m.attention!r} has no"
         " counterpart of the same shape in JoeyNMT (its `luong` is our `general`)")
  _check(m.rnn_query_state in ("auto", "current"), "JoeyNMT's decoder queries attention with the"
         f" current state, not config.model.rnn_query_state={m.rnn_query_state!r}")
  _check(not m.reverse_source, "JoeyNMT does not read the source backwards"
         " (config.model.reverse_source)")
  # JoeyNMT's attentional vector, fed back and read by the output layer, is rnn_hidden_dim
  # wide; ours is emb_dim wide. They match where the two are equal, as in the recipe.
  _check(m.emb_dim == m.rnn_hidden_dim, "JoeyNMT's RNN matches ours where config.model.emb_dim"
         f" equals rnn_hidden_dim, not {m.emb_dim} and {m.rnn_hidden_dim}")
  embeddings = {"embedding_dim": m.emb_dim, "dropout": m.dropout_rate}
  return {
      "tied_embeddings": shared, "tied_softmax": shared,
      "encoder": {"type": "recurrent", "rnn_type": m.rnn_cell, "hidden_size": m.rnn_hidden_dim,
                  "num_layers": m.num_encoder_layers, "bidirectional": m.bidirectional,
                  "dropout": m.dropout_rate, "embeddings": embeddings},
      "decoder": {"type": "recurrent", "rnn_type": m.rnn_cell, "hidden_size": m.rnn_hidden_dim,
                  "num_layers": m.num_decoder_layers, "attention": "luong",
                  "input_feeding": m.input_feeding,
                  "init_hidden": "bridge" if m.bridge else "zero", "dropout": m.dropout_rate,
                  "hidden_dropout": m.dropout_rate, "embeddings": embeddings},
  }


def joeynmt_parameters(model: dict, vocab: int) -> int:
  """The parameters JoeyNMT 2.3.0 builds for `model` (`joeynmt_model`'s) and a vocabulary of
  `vocab`, counted from its modules' shapes: every torch Linear has a bias unless JoeyNMT
  turns it off, an LSTM or GRU has two per gate, a LayerNorm a scale and a bias."""
  enc, dec = model["encoder"], model["decoder"]
  e, tied = enc["embeddings"]["embedding_dim"], model["tied_embeddings"]
  count = vocab * e * (1 if tied else 2) + (0 if model["tied_softmax"] else
                                            dec["hidden_size"] * vocab)
  if enc["type"] == "transformer":
    d, f = enc["hidden_size"], enc["ff_size"]
    attention, mlp, norm = 4 * (d * d + d), d * f + f + f * d + d, 2 * d
    count += enc["num_layers"] * (attention + mlp + 2 * norm)
    count += dec["num_layers"] * (2 * attention + mlp + 3 * norm)
    return count + (2 * norm if enc["layer_norm"] == "pre" else 0)
  gates = {"lstm": 4, "gru": 3}
  h, directions = enc["hidden_size"], 2 if enc["bidirectional"] else 1
  for i in range(enc["num_layers"]):
    inputs = e if i == 0 else directions * h
    count += directions * gates[enc["rnn_type"]] * h * (inputs + h + 2)
  encoded, h = directions * h, dec["hidden_size"]
  for i in range(dec["num_layers"]):
    inputs = (e + (h if dec["input_feeding"] else 0)) if i == 0 else h
    count += gates[dec["rnn_type"]] * h * (inputs + h + 2)
  count += (h + encoded) * h + h  # The attentional layer, tanh(W [h; c] + b).
  count += encoded * h  # Luong's `general` key projection, without bias.
  return count + (encoded * h + h if dec["init_hidden"] == "bridge" else 0)


def unmatched(m: ml_collections.ConfigDict, vocab: int) -> list[tuple[str, int]]:
  """What differs between our model of `m` and `joeynmt_model(m)`, each with the parameters
  it adds on JoeyNMT's side (negative: on ours); ours plus them is `joeynmt_parameters`."""
  notes = []
  if not m.share_embeddings:
    notes.append(("our output layer has a bias; JoeyNMT's none", -vocab))
  if m.family == "transformer":
    attentions = m.num_encoder_layers + 2 * m.num_decoder_layers
    notes.append(("JoeyNMT's attention projections have biases; ours none",
                  4 * m.emb_dim * attentions))
    if m.attention_dropout_rate != m.dropout_rate:
      notes.append((f"JoeyNMT drops attention weights at the layers' dropout ({m.dropout_rate});"
                    f" ours at config.model.attention_dropout_rate ({m.attention_dropout_rate})",
                    0))
    return notes
  h, directions = m.rnn_hidden_dim, 2 if m.bidirectional else 1
  cells = directions * m.num_encoder_layers + m.num_decoder_layers
  gates = {"lstm": 4, "gru": 3}[m.rnn_cell]
  notes.append((f"torch's {m.rnn_cell.upper()} has two bias vectors per gate; ours one",
                cells * gates * h))
  encoded = directions * h
  notes.append(("ours holds context_proj, which only `none` attention uses: here it never"
                " changes", -(encoded * h + h)))
  if m.bridge and m.num_decoder_layers > 1:
    notes.append(("ours bridges each decoder layer on its own; JoeyNMT has one bridge for all",
                  -(m.num_decoder_layers - 1) * (encoded * h + h)))
  theirs = encoded * h + (h + encoded) * h + h  # W_k; the attentional layer, with its bias.
  ours = (encoded * h + h if m.bidirectional else 0) + h * h + 2 * h * h  # W_enc; W_a; W_c.
  notes.append(("the same `general` attention, its projections arranged otherwise: JoeyNMT"
                " keys W_k h_enc, values the encoder states as they are, and [h; c] into a"
                " layer with a bias; ours projects the encoder states once (with a bias) for"
                " keys and values and scores them with W_a", theirs - ours))
  if m.rnn_cell == "lstm" and m.bridge:
    notes.append(("JoeyNMT's decoder LSTM starts its cell at the bridge too; ours at zero", 0))
  return notes


def initialization(m: ml_collections.ConfigDict) -> str:
  """How the two sides draw `m`'s initial weights: not a parameter count, so not `unmatched`."""
  return ("initial weights: JoeyNMT's xavier_uniform for every matrix and embedding table,"
          " biases 0 (an LSTM's forget gates 1); ours flax nnx's defaults"
          + (", with embeddings normal at std emb_dim ** -0.5 (fairseq's)"
             if m.family == "transformer" else ""))
