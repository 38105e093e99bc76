"""A Transformer as a CTranslate2 model: what converts, and the conversion.

CTranslate2 (OpenNMT's C++ inference engine) runs its own Transformer: embeddings times
sqrt(d), positions added from a table or applied inside self-attention (Shaw's relative
vectors, rotary), pre- or post-LayerNorm sublayers, dot-product attention scaled by
`queries_scale`, shared key/value heads, a ReLU feed-forward block. `ctranslate2_problem` says
why a config falls outside that; `TransformerConverter` fills CTranslate2's
`TransformerSpec` with a model's parameters, as its own converters (OpenNMT-py, fairseq) do,
so that its computation is ours to float rounding. The vocabulary is the SentencePiece
model's pieces in id order, so CTranslate2's token ids are ours, and the model file travels
beside the converted weights for tokenizing.

Imports CTranslate2 (the optional `[export]` extra): commands import this module only after
`errors.require_extra`.
"""

import numpy as np
from ctranslate2.converters import Converter
from ctranslate2.specs.transformer_spec import (
    TransformerDecoderSpec,
    TransformerEncoderSpec,
    TransformerSpec,
)

from seq2seq.data.special_ids import BOS_ID, EOS_ID, UNK_ID
from seq2seq.models.positions import POSITIONS, sinusoidal_positions
from seq2seq.models.transformer import Transformer

# The attention variants CTranslate2 computes, with the `queries_scale` each needs (None: its
# default, 1/sqrt(head_dim)). Its scores are `queries_scale * q.k`: `dot` is that at scale 1,
# and `general`'s `q.(W_a k)` is `dot` of keys projected by W_k then W_a, one matrix.
QUERIES_SCALE = {"scaled_dot": None, "dot": 1.0, "general": 1.0}
# Positions it takes: a table added to the embeddings (ours, row by row, so that its own
# sinusoids, with another frequency progression, play no part), Shaw et al.'s relative
# vectors, and rotary embeddings turning the two halves of each head (GPT-NeoX's pairing).
POSITION_NAMES = ("sinusoidal", "learned", "relative", "rope")
SENTENCEPIECE_FILE = "sentencepiece.model"  # The run's vocabulary, beside the model.
# The run's tokens as CTranslate2 names them in config.json (`TransformerConverter`).
SPECIAL_TOKENS = {"unk_token": UNK_ID, "bos_token": BOS_ID, "eos_token": EOS_ID,
                  "decoder_start_token": BOS_ID}


def ctranslate2_problem(m) -> str | None:
  """Why a run of `config.model` `m` does not convert to CTranslate2 exactly, as the end of a
  one-line message (what it has, what CTranslate2 lacks, and which runs do convert); None
  when it converts."""
  if m.family != "transformer":
    return (f"config.model.family={m.family!r}: CTranslate2 runs Transformers only; export a"
            " Transformer run.")
  if m.attention not in QUERIES_SCALE:
    return (f"config.model.attention={m.attention!r}: CTranslate2 computes dot-product"
            f" attention only; runs of {', '.join(QUERIES_SCALE)} attention convert.")
  if m.attention_normalizer != "softmax":
    return (f"config.model.attention_normalizer={m.attention_normalizer!r}: CTranslate2"
            " normalizes attention with the softmax only; runs of softmax attention convert.")
  if m.positions not in POSITION_NAMES:
    lacks = ("has ALiBi in decoders only, and this encoder uses it too"
             if m.positions in ("alibi", "alibi_directional") else "has no such positions")
    return (f"config.model.positions={m.positions!r}: CTranslate2 {lacks}; runs of"
            f" {', '.join(POSITION_NAMES)} positions convert.")
  if m.get("decoder_positions", "") not in ("", m.positions):
    return (f"config.model.decoder_positions={m.decoder_positions!r}: CTranslate2 gives the"
            " encoder and decoder one kind of positions; runs whose decoder has the encoder's"
            " convert.")
  if m.get("qk_norm", False):
    return ("config.model.qk_norm=True: CTranslate2 has no QK-norm (its queries are scaled"
            " by one number, not normalized); runs without it convert.")
  if m.get("attention_gate", "none") != "none":
    return (f"config.model.attention_gate={m.attention_gate!r}: CTranslate2 has no gate on"
            " attention's output; runs without one convert.")
  return None


def _array(param) -> np.ndarray:
  return np.asarray(param[...], np.float32)


def _linear(spec, layer) -> None:
  """An `nnx.Linear` (`kernel [in, out]`) as CTranslate2's `[out, in]` weight, and its bias."""
  spec.weight = _array(layer.kernel).T
  if layer.bias is not None:
    spec.bias = _array(layer.bias)


def _layer_norm(spec, norm) -> None:
  spec.gamma, spec.beta = _array(norm.scale), _array(norm.bias)


def _keys_weight(attention) -> np.ndarray:
  """The `[kv_heads * head_dim, dim]` weight that makes the keys the attention scores: the key
  projection, followed where the score has one by its per-head matrix (`general`'s W_a)."""
  kernel = _array(attention.key.kernel).astype(np.float64)  # [dim, kv_heads * head_dim]
  params = attention.score_params
  if params is not None:
    w = _array(params.w).astype(np.float64)  # [kv_heads, head_dim, head_dim]: k' = W_a k
    heads = kernel.reshape(kernel.shape[0], w.shape[0], w.shape[1])
    kernel = np.einsum("xhd,hed->xhe", heads, w).reshape(kernel.shape)
  return kernel.T.astype(np.float32)


def _attention(spec, attention, norm, *, fused_queries: bool) -> None:
  """One attention sublayer: its LayerNorm, projections (queries, keys and values fused in one
  weight for self-attention, keys and values for cross-attention), scale, positions."""
  _layer_norm(spec.layer_norm, norm)
  queries = _array(attention.query.kernel).T
  keys, values = _keys_weight(attention), _array(attention.value.kernel).T
  if fused_queries:
    spec.linear[0].weight = np.concatenate([queries, keys, values])
  else:
    spec.linear[0].weight = queries
    spec.linear[1].weight = np.concatenate([keys, values])
  spec.linear[-1].weight = _array(attention.out.kernel).T
  scale = QUERIES_SCALE[attention.attention]
  if scale is not None:
    spec.queries_scale = np.float32(scale)
  if hasattr(spec, "relative_position_keys"):
    spec.relative_position_keys = _array(attention.position_params.keys)
    spec.relative_position_values = _array(attention.position_params.values)


def _feed_forward(spec, mlp, norm) -> None:
  _layer_norm(spec.layer_norm, norm)
  _linear(spec.linear_0, mlp.wi)
  _linear(spec.linear_1, mlp.wo)


def _position_table(model: Transformer, max_len: int) -> np.ndarray:
  """`[max_len + 1, dim]`: the vectors added to the embeddings at positions 0..max_len. The model
  reads positions below max_len; CTranslate2's `score_batch` reads one more, for the EOS it
  scores after an output of max_len subwords, which our scores leave out: a learned table
  gets a row of zeros there."""
  if model.position_table is not None:
    table = _array(model.position_table.embedding)
    return np.concatenate([table, np.zeros_like(table[:1])])
  return np.asarray(sinusoidal_positions(np.arange(max_len + 1), model.dim), np.float32)


def _stack_options(cfg) -> dict:
  """The keyword arguments CTranslate2's encoder and decoder specs share, from `config.model`."""
  rope = POSITIONS[cfg.positions].rotate is not None
  kv_heads = cfg.num_kv_heads or cfg.num_heads
  return dict(pre_norm=cfg.pre_ln, relative_position=cfg.positions == "relative",
              num_heads_kv=kv_heads if kv_heads != cfg.num_heads else None,
              rotary_dim=0 if rope else None, rotary_interleave=False)


def model_spec(model: Transformer, cfg, alignment_layer: int = -1) -> TransformerSpec:
  """`model` (of `config.model` `cfg`, which `ctranslate2_problem` passes) as CTranslate2's
  `TransformerSpec`, every variable set (vocabulary and config apart). The attention it
  returns (`return_attention`) is the cross-attention of decoder layer `alignment_layer`, all
  heads averaged: what `--alignment` reads of our model at that layer."""
  options = _stack_options(cfg)
  spec = TransformerSpec(TransformerEncoderSpec(cfg.num_encoder_layers, cfg.num_heads, **options),
                         TransformerDecoderSpec(cfg.num_decoder_layers, cfg.num_heads, **options,
                                                alignment_layer=alignment_layer,
                                                alignment_heads=cfg.num_heads))
  encoder, decoder = spec.encoder, spec.decoder
  encoder.embeddings[0].weight = _array(model.src_embed.embedding)
  decoder.embeddings.weight = _array(model.tgt_embed.embedding)
  if POSITIONS[cfg.positions].embed is not None:
    table = _position_table(model, cfg.max_len)
    encoder.position_encodings.encodings = decoder.position_encodings.encodings = table
  elif hasattr(encoder, "position_encodings"):
    del encoder.position_encodings  # Rotary: nothing is added (CTranslate2 would add sinusoids).
  for layer_spec, layer in zip(encoder.layer, model.encoder_layers, strict=True):
    _attention(layer_spec.self_attention, layer.self_attention, layer.sub.norms[0],
               fused_queries=True)
    _feed_forward(layer_spec.ffn, layer.mlp, layer.sub.norms[1])
  for layer_spec, layer in zip(decoder.layer, model.decoder_layers, strict=True):
    _attention(layer_spec.self_attention, layer.self_attention, layer.sub.norms[0],
               fused_queries=True)
    _attention(layer_spec.attention, layer.cross_attention, layer.sub.norms[1],
               fused_queries=False)
    _feed_forward(layer_spec.ffn, layer.mlp, layer.sub.norms[2])
  if cfg.pre_ln:
    _layer_norm(encoder.layer_norm, model.encoder_norm)
    _layer_norm(decoder.layer_norm, model.decoder_norm)
  if model.logits_dense is None:  # Tied: the logits are the target embeddings' dot products.
    decoder.projection.weight = _array(model.tgt_embed.embedding)
  else:
    _linear(decoder.projection, model.logits_dense)
  return spec


class TransformerConverter(Converter):
  """CTranslate2's converter of one of our Transformers: `convert(output_dir)` writes the
  model directory (model.bin, config.json, shared_vocabulary.json and the SentencePiece model
  as `SENTENCEPIECE_FILE`).

  Args:
    model: the Transformer, its parameters loaded.
    cfg: its `config.model` (one that `ctranslate2_problem` passes).
    pieces: the SentencePiece model's pieces, in id order (the model's vocabulary).
    sentencepiece_model: the path of that SentencePiece model.
    alignment_layer: the decoder layer (from 0, or -1: the last) whose cross-attention, heads
      averaged, CTranslate2 returns with `return_attention`.
  """

  def __init__(self, model: Transformer, cfg, pieces: list[str], sentencepiece_model: str,
               alignment_layer: int = -1):
    self.model, self.cfg, self.pieces = model, cfg, pieces
    self.sentencepiece_model, self.alignment_layer = sentencepiece_model, alignment_layer

  def _load(self) -> TransformerSpec:
    spec = model_spec(self.model, self.cfg, self.alignment_layer)
    spec.register_source_vocabulary(self.pieces)
    spec.register_target_vocabulary(self.pieces)
    for name, token_id in SPECIAL_TOKENS.items():
      setattr(spec.config, name, self.pieces[token_id])
    # Our encoder reads each source with EOS after it; the decoder starts from BOS.
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = float(self.model.encoder_layers[0].sub.norms[0].epsilon)
    spec.register_file(self.sentencepiece_model, SENTENCEPIECE_FILE)
    return spec
