"""Transformer encoder-decoder (Vaswani et al., 2017) in Flax NNX.

The model exposes the interface shared by every family (`interface.Seq2SeqModel`):
`encode`, teacher-forced `decode`, and `init_cache` / `decode_step` for
autoregressive decoding. `encode` also projects the cross-attention keys and
values of every decoder layer, once per sentence, so decoding steps never
recompute them. Dropout is active exactly when an `nnx.Rngs` is passed.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from seq2seq.models import masks
from seq2seq.models.attention import GATES, VARIANTS, MultiHeadAttention, hyperparameters
from seq2seq.models.dropout import Dropout
from seq2seq.models.linear import Linear, matmul
from seq2seq.models.positions import POSITIONS, sinusoidal_positions  # noqa: F401 (re-export)
from seq2seq.registry import live

KeyValue = tuple[jnp.ndarray, jnp.ndarray]  # each [batch, heads, length, head_dim]


class Memory(NamedTuple):
  """What the decoder needs from one source batch, computed once."""
  encoded: jnp.ndarray  # [batch, src_len, dim] encoder outputs
  src_mask: masks.Mask  # real source tokens
  cross_kv: tuple[KeyValue, ...]  # per decoder layer: projected encoder keys/values

  def for_beams(self, beam_size: int) -> "Memory":
    """The memory of `beam_size` hypotheses per sentence (`beams.expand_to_beams`).

    `encoded` gets a row per hypothesis (the cache is sized from it); the mask and
    the cross-attention keys/values stay one row per sentence, which its beams'
    queries share (`MultiHeadAttention` groups them): beam search then reads a
    quarter of the memory at beam 4, and copies none of it.
    """
    return self._replace(encoded=jnp.repeat(self.encoded, beam_size, axis=0))


class Cache(NamedTuple):
  """Decoder self-attention state for step-by-step decoding."""
  self_kv: tuple[KeyValue, ...]  # per decoder layer, [batch, kv_heads, max_len, head_dim]
  index: jnp.ndarray  # scalar int32: position of the next token

  def resized(self, length: int) -> "Cache":
    """The same state with room for `length` tokens (beam search grows it in phases).

    Unwritten slots are zeros and masked out, so padding with zeros or cutting
    unwritten slots changes no result; cut only slots past `index`.
    """
    def fit(x):
      if length <= x.shape[2]:
        return x[:, :, :length]
      return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))
    return self._replace(self_kv=tuple((fit(k), fit(v)) for k, v in self.self_kv))


def _dropout(layer: Dropout, x: jnp.ndarray, rngs: nnx.Rngs | None) -> jnp.ndarray:
  return layer(x, deterministic=rngs is None, rngs=rngs)


class FeedForward(nnx.Module):
  def __init__(self, dim: int, hidden: int, dropout_rate: float, rngs: nnx.Rngs, dtype=None):
    self.wi = Linear(dim, hidden, dtype=dtype, rngs=rngs)
    self.wo = Linear(hidden, dim, dtype=dtype, rngs=rngs)
    self.dropout = Dropout(dropout_rate)

  def __call__(self, x, rngs=None):
    return self.wo(_dropout(self.dropout, jax.nn.relu(self.wi(x)), rngs))


class Sublayers(nnx.Module):
  """Residual connections with pre- or post-LayerNorm around each sublayer."""

  def __init__(self, cfg: ml_collections.ConfigDict, count: int, rngs: nnx.Rngs, dtype=None):
    self.pre_ln = cfg.pre_ln
    self.norms = nnx.List([nnx.LayerNorm(cfg.emb_dim, dtype=dtype, rngs=rngs)
                           for _ in range(count)])
    self.dropout = Dropout(cfg.dropout_rate)

  def input(self, i: int, x):
    """What sublayer i sees: the normalized stream (pre-LN) or the stream itself."""
    return self.norms[i](x) if self.pre_ln else x

  def output(self, i: int, x, y, rngs):
    """Adds sublayer i's output `y` back to the stream `x`."""
    x = x + _dropout(self.dropout, y, rngs)
    return x if self.pre_ln else self.norms[i](x)


def decoder_positions(cfg: ml_collections.ConfigDict) -> str:
  """The decoder's `POSITIONS` name: `config.model.decoder_positions`, or where that is empty
  (the default), the encoder's `positions`."""
  return cfg.get("decoder_positions") or cfg.positions


def _attention(cfg, rngs, dtype, layer: int = 0, *, decoder: bool = False, cross: bool = False):
  # A variant may name another for cross-attention (`local` keeps it full: VARIANTS).
  attention = (VARIANTS[cfg.attention].cross or cfg.attention) if cross else cfg.attention
  # Positions act inside self-attention only, and only where the scheme does (POSITIONS).
  scheme = decoder_positions(cfg) if decoder else cfg.positions
  positions = None if cross or not POSITIONS[scheme].in_attention else scheme
  return MultiHeadAttention(cfg.emb_dim, cfg.num_heads, attention=attention,
                            dropout_rate=cfg.attention_dropout_rate, rngs=rngs,
                            max_keys=cfg.max_len, dtype=dtype, num_kv_heads=cfg.num_kv_heads,
                            positions=positions, normalizer=cfg.attention_normalizer,
                            qk_norm=cfg.qk_norm, qk_norm_scale=cfg.qk_norm_scale,
                            gate=cfg.attention_gate, layer=layer,
                            **hyperparameters(cfg, attention, positions,
                                              cfg.attention_normalizer))


def _rows(positions: jnp.ndarray) -> jnp.ndarray:
  """Positions as `[batch or 1, n]` (one row shared by every sentence when unpacked)."""
  return positions if positions.ndim == 2 else positions[None]


class EncoderLayer(nnx.Module):
  def __init__(self, cfg, rngs, dtype=None, layer: int = 0):
    self.self_attention = _attention(cfg, rngs, dtype, layer)
    self.mlp = FeedForward(cfg.emb_dim, cfg.mlp_dim, cfg.dropout_rate, rngs, dtype)
    self.sub = Sublayers(cfg, 2, rngs, dtype)

  def __call__(self, x, mask, positions, rngs=None, *, return_weights=False):
    """One encoder block: `x`, and its self-attention weights when `return_weights` (with
    their parts: `MultiHeadAttention`'s `return_parts`).
    `positions [batch or 1, src_len]`: each token's position in its sentence."""
    h = self.sub.input(0, x)
    attended, weights = self.self_attention(h, *self.self_attention.project_kv(h, positions),
                                            mask, positions=(positions, positions), rngs=rngs,
                                            return_weights=True, return_parts=return_weights)
    x = self.sub.output(0, x, attended, rngs)
    x = self.sub.output(1, x, self.mlp(self.sub.input(1, x), rngs), rngs)
    return (x, weights) if return_weights else x


class DecoderLayer(nnx.Module):
  def __init__(self, cfg, rngs, dtype=None, layer: int = 0):
    self.self_attention = _attention(cfg, rngs, dtype, layer, decoder=True)
    self.cross_attention = _attention(cfg, rngs, dtype, layer, decoder=True, cross=True)
    self.mlp = FeedForward(cfg.emb_dim, cfg.mlp_dim, cfg.dropout_rate, rngs, dtype)
    self.sub = Sublayers(cfg, 3, rngs, dtype)

  def __call__(self, x, self_mask, cross_kv, cross_mask, positions, *, cache=None, index=None,
               rngs=None, return_weights=False):
    """One decoder block.

    Args:
      x: `[batch, t, dim]` target stream (t = 1 when stepping with a cache).
      self_mask: causal mask (teacher forcing) or cache mask (stepping).
      cross_kv: this layer's projected encoder keys/values.
      cross_mask: the source padding mask.
      positions: `[batch or 1, t]`, the positions of `x`'s tokens in their sentences.
      cache: this layer's `(keys, values)` cache, `[batch, heads, max_len, head_dim]`, or None.
      index: scalar position written in the cache.

    Returns:
      (x, the keys/values self-attention used: the updated cache when stepping),
      plus the (self-, cross-)attention weights when `return_weights`, each with its parts
      (`MultiHeadAttention`'s `return_parts`).
    """
    h = self.sub.input(0, x)
    keys, values = self.self_attention.project_kv(h, positions)
    key_positions = positions
    if cache is not None:
      keys = jax.lax.dynamic_update_slice(cache[0], keys.astype(cache[0].dtype), (0, 0, index, 0))
      values = jax.lax.dynamic_update_slice(cache[1], values.astype(cache[1].dtype),
                                            (0, 0, index, 0))
      key_positions = jnp.arange(keys.shape[2])[None]
    attended, self_weights = self.self_attention(h, keys, values, self_mask,
                                                 positions=(positions, key_positions),
                                                 rngs=rngs, return_weights=True,
                                                 return_parts=return_weights)
    x = self.sub.output(0, x, attended, rngs)
    cross, weights = self.cross_attention(self.sub.input(1, x), *cross_kv, cross_mask, rngs=rngs,
                                          return_weights=True, return_parts=return_weights)
    x = self.sub.output(1, x, cross, rngs)
    x = self.sub.output(2, x, self.mlp(self.sub.input(2, x), rngs), rngs)
    if return_weights:
      return x, (keys, values), (self_weights, weights)
    return x, (keys, values)


class Transformer(nnx.Module):
  """Encoder-decoder Transformer; implements `interface.Seq2SeqModel`."""

  # The variants the Transformer takes: every registry entry but `location`, whose score
  # reads a query's position weights from the query alone (an RNN decoder's alignment model).
  # Read from the registries each time (`live`): what is registered when a command runs.
  ATTENTION_NAMES = live(lambda cls: tuple(name for name in VARIANTS if name != "location"))
  PACKS = True  # Segment ids keep packed sentences apart (where the variant can: VARIANTS).
  POSITION_NAMES = live(lambda cls: tuple(POSITIONS))  # Every way of giving word order.
  SHARES_KV_HEADS = True  # `config.model.num_kv_heads` may be fewer than the query heads.
  NORMALIZED = live(lambda cls: tuple(name for name in cls.ATTENTION_NAMES
                                      if VARIANTS[name].normalizes))
  UNATTENDED = ()  # Every variant attends to the source.
  # Whose weights take attention dropout: not those that never form them (`linear`).
  WEIGHT_DROPOUT = live(lambda cls: tuple(name for name in cls.ATTENTION_NAMES
                                          if VARIANTS[name].weight_dropout))
  MATMUL_DTYPES = ("float32", "bfloat16")  # Every dense product goes through `Linear`.

  @staticmethod
  def config_problem(cfg: ml_collections.ConfigDict) -> str | None:
    if cfg.emb_dim % cfg.num_heads:
      return (f"config.model.emb_dim={cfg.emb_dim} is not divisible by"
              f" config.model.num_heads={cfg.num_heads}; choose sizes where it is.")
    if cfg.num_kv_heads and cfg.num_heads % cfg.num_kv_heads:
      return (f"config.model.num_kv_heads={cfg.num_kv_heads} does not divide"
              f" config.model.num_heads={cfg.num_heads}; each key/value head serves the same"
              " number of query heads: choose a divisor (1 is multi-query attention).")
    if cfg.attention_gate not in GATES:
      return (f"config.model.attention_gate={cfg.attention_gate!r} is not a gate; use one of:"
              f" {', '.join(GATES)}.")
    if not cfg.qk_norm_scale >= 0.0:  # Also NaN.
      return (f"config.model.qk_norm_scale={cfg.qk_norm_scale} must be 0 (log2(L^2 - L) for L ="
              " config.model.max_len) or a positive initial scale.")
    head_dim = cfg.emb_dim // cfg.num_heads
    for field in ("positions", "decoder_positions"):
      if POSITIONS[cfg[field] or cfg.positions].rotate and head_dim % 2:
        return (f"config.model.{field}={cfg[field]!r} turns pairs of features, but the heads"
                f" have {head_dim} (emb_dim / num_heads, odd); choose sizes that give heads an"
                " even size.")
    reach = {"attention_window": cfg.max_len - 1, "attention_globals": cfg.max_len}
    for field in VARIANTS[cfg.attention].hyperparameters:
      if field in reach and cfg[field] >= reach[field]:
        return (f"config.model.{field}={cfg[field]} reaches every one of config.model.max_len="
                f"{cfg.max_len} positions, which is full attention, not {cfg.attention!r}; use"
                f" attention=scaled_dot, or {field} below {reach[field]}.")
    if VARIANTS[cfg.attention].layered and head_dim % 4:
      return (f"config.model.attention={cfg.attention!r} splits each head's {head_dim} features"
              " (emb_dim / num_heads) into two maps of whole feature pairs; choose sizes that"
              " give heads a multiple of 4.")
    if cfg.qk_norm and VARIANTS[cfg.attention].qk_scale is None:
      dot = ", ".join(name for name, variant in VARIANTS.items() if variant.qk_scale)
      return (f"config.model.qk_norm=True normalizes the queries and keys of dot products, and"
              f" {cfg.attention!r} attention's scores are not; use one of: {dot}, or"
              " qk_norm=False.")
    return None

  def __init__(self, cfg: ml_collections.ConfigDict, vocab_size: int, *, rngs: nnx.Rngs,
               dtype=None):
    """`dtype` is the computation's (e.g. bfloat16); parameters stay float32."""
    self.dim = cfg.emb_dim
    self.num_heads = cfg.num_heads
    self.num_kv_heads = cfg.num_kv_heads or cfg.num_heads
    # The names (static): POSITIONS[self.positions], the encoder's, and the decoder's.
    self.positions, self.decoder_positions = cfg.positions, decoder_positions(cfg)
    embed = lambda: nnx.Embed(  # noqa: E731
        vocab_size, cfg.emb_dim, dtype=dtype, rngs=rngs,
        embedding_init=nnx.initializers.normal(stddev=cfg.emb_dim**-0.5))
    self.src_embed = embed()
    # Sharing one table ties source, target and output (Press & Wolf, 2017).
    self.tgt_embed = self.src_embed if cfg.share_embeddings else embed()
    self.logits_dense = None if cfg.share_embeddings else Linear(
        cfg.emb_dim, vocab_size, dtype=dtype, rngs=rngs)
    # The inputs' dtype of the products of `Linear` and the tied output (static): float32
    # unless `models.build_model` is given another (`linear.use_matmul_dtype`).
    self.matmul_dtype = "float32"
    self.dropout = Dropout(cfg.dropout_rate)
    self.encoder_layers = nnx.List([EncoderLayer(cfg, rngs, dtype, i)
                                    for i in range(cfg.num_encoder_layers)])
    self.decoder_layers = nnx.List([DecoderLayer(cfg, rngs, dtype, i)
                                    for i in range(cfg.num_decoder_layers)])
    # Pre-LN leaves the residual stream unnormalized: normalize the stack outputs.
    final_norm = lambda: (nnx.LayerNorm(cfg.emb_dim, dtype=dtype, rngs=rngs)  # noqa: E731
                          if cfg.pre_ln else None)
    self.encoder_norm, self.decoder_norm = final_norm(), final_norm()
    # Learned positions: one table for source and target (Gehring et al., 2017, keep two;
    # one table suits the tied embeddings here), initialized as fairseq's.
    self.position_table = nnx.Embed(
        cfg.max_len, cfg.emb_dim, dtype=dtype, rngs=rngs,
        embedding_init=nnx.initializers.normal(stddev=cfg.emb_dim**-0.5),
    ) if any(POSITIONS[name].learned_table for name in (self.positions,
                                                         self.decoder_positions)) else None

  def _embed(self, ids, positions, rngs, *, target: bool = False):
    """The source's (or the `target`'s) scaled embeddings, with its side's positions where
    they are added at the input, after dropout."""
    x = (self.tgt_embed if target else self.src_embed)(ids)
    x = x * jnp.sqrt(self.dim).astype(x.dtype)
    embed = POSITIONS[self.decoder_positions if target else self.positions].embed
    if embed is not None:
      x = x + embed(positions, self.dim, self.position_table).astype(x.dtype)
    return _dropout(self.dropout, x, rngs)

  def _logits(self, y):
    if self.decoder_norm is not None:
      y = self.decoder_norm(y)
    if self.logits_dense is None and self.matmul_dtype != "float32":
      return matmul(y, self.tgt_embed.embedding[...].T, self.matmul_dtype)
    if self.logits_dense is None:
      return self.tgt_embed.attend(y).astype(jnp.float32)
    return self.logits_dense(y).astype(jnp.float32)

  def encode(self, src_ids: jnp.ndarray, *, segments: jnp.ndarray | None = None,
             positions: jnp.ndarray | None = None, rngs: nnx.Rngs | None = None) -> Memory:
    """Encodes `src_ids [batch, src_len]` (PAD_ID-padded).

    Packed rows (several sentences per row) also pass `segments` and `positions`,
    both `[batch, src_len]`: each token's sentence (1, 2, ...) and position in it.
    """
    src_mask = masks.padding_mask(src_ids, segments)
    if positions is None:
      positions = jnp.arange(src_ids.shape[1])
    x = self._embed(src_ids, positions, rngs)
    for layer in self.encoder_layers:
      x = layer(x, src_mask, _rows(positions), rngs)
    if self.encoder_norm is not None:
      x = self.encoder_norm(x)
    cross_kv = tuple(layer.cross_attention.project_kv(x) for layer in self.decoder_layers)
    return Memory(x, src_mask, cross_kv)

  def decode(self, memory: Memory, tgt_in_ids: jnp.ndarray, *,
             segments: jnp.ndarray | None = None, positions: jnp.ndarray | None = None,
             rngs: nnx.Rngs | None = None) -> jnp.ndarray:
    """Teacher-forced decoding: `tgt_in_ids [batch, t]` -> logits `[batch, t, vocab]`.

    For packed rows, `segments`/`positions` `[batch, t]` as in `encode`; target
    sentence i then attends to source sentence i only.
    """
    if positions is None:
      positions = jnp.arange(tgt_in_ids.shape[1])
    y = self._embed(tgt_in_ids, positions, rngs, target=True)
    self_mask = masks.decoder_self_mask(tgt_in_ids, segments)
    cross_mask = masks.cross_mask(memory.src_mask, segments)
    for layer, kv in zip(self.decoder_layers, memory.cross_kv, strict=True):
      y, _ = layer(y, self_mask, kv, cross_mask, _rows(positions), rngs=rngs)
    return self._logits(y)

  def attention_weights(self, src_ids: jnp.ndarray,
                        tgt_in_ids: jnp.ndarray) -> dict[str, jnp.ndarray]:
    """Every attention of one teacher-forced pass (for pictures), by kind, each
    `[layers, batch, heads, queries, keys]`: `cross` (target on source), `encoder` (source on
    source) and `decoder` (target on the target so far: causal). Then what makes them, where
    the model has it, as `<kind>_<part>`: differential attention's two maps `<kind>_map1` and
    `<kind>_map2` (the weights are `map1 - lambda map2`) and `<kind>_lambda` (`[..., queries,
    1]`, the layer's lambda repeated); a gated output's `<kind>_gate` (`[..., queries, 1]`:
    the gate on each head's output, an element-wise gate's mean over the head's features)."""
    src_mask = masks.padding_mask(src_ids)
    src_positions, tgt_positions = jnp.arange(src_ids.shape[1]), jnp.arange(tgt_in_ids.shape[1])
    x = self._embed(src_ids, src_positions, None)
    encoder = []
    for layer in self.encoder_layers:
      x, weights = layer(x, src_mask, _rows(src_positions), return_weights=True)
      encoder.append(weights)
    if self.encoder_norm is not None:
      x = self.encoder_norm(x)
    y = self._embed(tgt_in_ids, tgt_positions, None, target=True)
    self_mask = masks.decoder_self_mask(tgt_in_ids)
    decoder, cross = [], []
    for layer in self.decoder_layers:
      y, _, (self_weights, weights) = layer(y, self_mask, layer.cross_attention.project_kv(x),
                                            src_mask, _rows(tgt_positions), return_weights=True)
      decoder.append(self_weights)
      cross.append(weights)
    by_kind = {"cross": cross, "encoder": encoder, "decoder": decoder}
    found = {kind: jnp.stack([parts["weights"] for parts in layers])
             for kind, layers in by_kind.items()}
    for kind, layers in by_kind.items():
      for part in layers[0]:
        if part != "weights":
          found[f"{kind}_{part}"] = jnp.stack([parts[part] for parts in layers])
    return found

  def init_cache(self, memory: Memory, max_len: int) -> Cache:
    """An empty cache for decoding up to `max_len` target tokens."""
    batch = memory.encoded.shape[0]
    shape = (batch, self.num_kv_heads, max_len, self.dim // self.num_heads)
    dtype = memory.encoded.dtype
    zeros = lambda: jnp.zeros(shape, dtype)  # noqa: E731
    return Cache(tuple((zeros(), zeros()) for _ in self.decoder_layers),
                 jnp.zeros((), jnp.int32))

  def decode_step(self, memory: Memory, cache: Cache,
                  token_ids: jnp.ndarray) -> tuple[jnp.ndarray, Cache]:
    """Feeds `token_ids [batch]` at position `cache.index`; returns `[batch, vocab]` logits."""
    y = self._embed(token_ids[:, None], cache.index[None], None, target=True)  # [batch, 1, dim]
    self_mask = masks.cache_mask(cache.index, cache.self_kv[0][0].shape[2])
    new_kv = []
    for layer, kv, layer_cache in zip(self.decoder_layers, memory.cross_kv, cache.self_kv,
                                      strict=True):
      y, updated = layer(y, self_mask, kv, memory.src_mask, cache.index[None, None],
                         cache=layer_cache, index=cache.index)
      new_kv.append(updated)
    return self._logits(y)[:, 0], Cache(tuple(new_kv), cache.index + 1)
