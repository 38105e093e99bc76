"""Attentional RNN encoder-decoder (Sutskever et al. 2014; Bahdanau et al. 2015; Luong et al. 2015).

Same interface as the Transformer: `encode`, teacher-forced `decode`, `init_cache` /
`decode_step`. The encoder is a stack of (bi)directional LSTM/GRU layers; the decoder starts
from the encoder's final state through a bridge (or from zeros) and, at step t:

  Luong (dot, scaled_dot, general, location, local_m, local_p, none): runs the stack on
    [y_{t-1}; h~_{t-1}] (input feeding), scores with the *current* state h_t;
  Bahdanau (concat): scores with the *previous* state s_{t-1} and feeds the
    context into the stack: [y_{t-1}; c_t (; h~_{t-1})];

(`config.model.rnn_query_state` picks the query state; "auto" is previous for concat, as
Bahdanau et al. built it, and current for the other scores), then forms the attentional hidden
state h~_t = tanh(W_c [c_t; h_t]) and the logits from h~_t. With `none`, c_t is the fixed final
encoder state. Without input feeding, a Luong decoder's recurrence does not depend on
attention, so teacher-forced decoding runs the stack once and attends for all steps at once.
Every recurrence is a `jax.lax.scan`.

A recurrence is latency-bound on a CPU, so each loop body holds only what depends on the
step before (`recurrence`: the inputs known in advance, the source and the target embeddings,
multiplied for every step at once before the loop, each step's other inputs and its state in
one product with the gates side by side), and teacher forcing takes the logits of every step in
one product after the loop. `seq2seq.performance.rnn_reference` runs the cells as written, one
product per gate in the loop.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from seq2seq.data.special_ids import PAD_ID
from seq2seq.models import masks
from seq2seq.models.dropout import Dropout
from seq2seq.models.linear import Linear
from seq2seq.models.local_rnn import KERNELS, LOCAL
from seq2seq.models.normalizers import bound, learned_alpha, options_of
from seq2seq.models.recurrence import (
  CELLS,
  Carry,
  GateKernels,
  hidden_of,
  scan_cell,
  time_major,
  zeros_like_carry,
)
from seq2seq.registry import live

# Variants scored with the previous state s_{t-1} when config.model.rnn_query_state is "auto".
PREVIOUS_STATE_QUERIES = ("concat",)
# What `jax.random.fold_in` adds to a step's dropout key for each use: layer i's output i
# (`_stack`), h~ 1000 (`_output`), the attention weights this (`_attend`).
ATTENTION_DROPOUT_KEY = 2000


def queries_previous_state(cfg: ml_collections.ConfigDict) -> bool:
  """Whether the decoder attends with s_{t-1} (Bahdanau) rather than h_t (Luong)."""
  if cfg.rnn_query_state == "auto":
    return cfg.attention in PREVIOUS_STATE_QUERIES
  return cfg.rnn_query_state == "previous"


class Memory(NamedTuple):
  encoded: jnp.ndarray  # [batch, src_len, hidden] attention values (encoder outputs)
  keys: jnp.ndarray  # [batch, 1, src_len, hidden] keys, prepared once for the score
  src_mask: masks.Mask  # real source tokens
  context: jnp.ndarray  # [batch, hidden] fixed context of `none`: the final encoder state
  initial: tuple[Carry, ...]  # per decoder layer: its first state (bridge or zeros)


class Cache(NamedTuple):
  carries: tuple[Carry, ...]  # per decoder layer
  feed: jnp.ndarray  # [batch, emb_dim] h~ of the previous step (input feeding)
  index: jnp.ndarray  # scalar int32: steps taken


def _refuse_packed(segments, positions) -> None:
  if segments is not None or positions is not None:
    raise ValueError("The RNN takes one sentence per row (PACKS is False): packed rows would"
                     " run the recurrence across sentences; set config.data.pack=False.")


def reverse_padded(x: jnp.ndarray, lengths: jnp.ndarray) -> jnp.ndarray:
  """Reverses each row's first `lengths[i]` positions, leaving padding in place.

  Args:
    x: `[batch, length, ...]`.
    lengths: `[batch]`.
  """
  positions = jnp.arange(x.shape[1])[None, :]
  index = jnp.where(positions < lengths[:, None], lengths[:, None] - 1 - positions, positions)
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


class RNN(nnx.Module):
  """See the module docstring; implements `interface.Seq2SeqModel` (`cfg` is `config.model`)."""

  # The variants the RNN takes: none (Sutskever et al.), any softmax score, a local window.
  # Read from the registries each time (`live`): what is registered when a command runs.
  ATTENTION_NAMES = live(lambda cls: ("none", *KERNELS))
  PACKS = False  # One sentence per row: the recurrence would run across packed sentences.
  POSITION_NAMES = ("sinusoidal",)  # The default, ignored: its recurrence orders the words.
  SHARES_KV_HEADS = False  # One attention head: no key/value heads to share.
  NORMALIZED = live(lambda cls: tuple(KERNELS))  # Whose weights a normalizer gives (not `none`).
  # Its cells multiply outside `Linear` (`recurrence.GateKernels`): float32 products only.
  MATMUL_DTYPES = ("float32",)
  UNATTENDED = ("none",)  # Whose decoder reads one fixed vector: `cross` weights all 0.
  # Whose alignment weights take attention dropout (`none` has none).
  WEIGHT_DROPOUT = live(lambda cls: tuple(name for name, kernel in KERNELS.items()
                                          if kernel.weight_dropout))
  # Teacher forcing: every step's logits in one product after the loop (not in it).
  LOGITS_IN_LOOP = False

  @staticmethod
  def config_problem(cfg: ml_collections.ConfigDict) -> str | None:
    # Every RNN field is range-checked with the base config; these are the Transformer's.
    for field, default in (("qk_norm", False), ("attention_gate", "none"),
                           ("decoder_positions", "")):
      if cfg[field] != default:
        return (f"config.model.{field}={cfg[field]!r} is the Transformer's; the RNN's attention"
                f" has no heads of queries and keys: leave it at {default!r}.")
    if cfg.attention in LOCAL and cfg.attention_window >= cfg.max_len - 1:
      return (f"config.model.attention_window={cfg.attention_window}: a window of 2D + 1 words"
              f" around p_t reaches every one of config.model.max_len={cfg.max_len} source"
              f" words, which is global attention, not {cfg.attention!r}; use"
              f" attention=general, or a window below {cfg.max_len - 1}.")
    return None

  def __init__(self, cfg: ml_collections.ConfigDict, vocab_size: int, *, rngs: nnx.Rngs,
               dtype=None):
    """`dtype` is the computation's (e.g. bfloat16); parameters stay float32."""
    self.cell_type = cfg.rnn_cell
    self.attention = cfg.attention
    self.query_previous = queries_previous_state(cfg)
    self.input_feeding = cfg.input_feeding
    self.reverse_source = cfg.reverse_source
    self.window = cfg.attention_window  # D of the local attentions.
    self.normalizer = (cfg.attention_normalizer, options_of(cfg.attention_normalizer, cfg))
    self.alpha = learned_alpha(cfg.attention_normalizer, cfg, 1)
    self.bidirectional = cfg.bidirectional
    hidden, emb = cfg.rnn_hidden_dim, cfg.emb_dim
    self.hidden = hidden
    cell = functools.partial(CELLS[cfg.rnn_cell], dtype=dtype)
    linear = functools.partial(Linear, dtype=dtype, rngs=rngs)
    embed = functools.partial(nnx.Embed, vocab_size, emb, dtype=dtype, rngs=rngs)
    self.src_embed = embed()
    self.tgt_embed = self.src_embed if cfg.share_embeddings else embed()
    self.dropout = Dropout(cfg.dropout_rate)
    self.attention_dropout = Dropout(cfg.attention_dropout_rate)  # On the alignment weights.

    directions = 2 if cfg.bidirectional else 1
    self.encoder_forward = nnx.List([
        cell(emb if i == 0 else hidden * directions, hidden, rngs=rngs)
        for i in range(cfg.num_encoder_layers)])
    self.encoder_backward = nnx.List([
        cell(emb if i == 0 else hidden * directions, hidden, rngs=rngs)
        for i in range(cfg.num_encoder_layers)]) if cfg.bidirectional else None
    # Attention needs keys in the decoder's space: fold both directions into one.
    self.encoder_out = (linear(hidden * directions, hidden)
                        if cfg.bidirectional else None)
    self.bridge = (nnx.List([linear(hidden * directions, hidden)
                             for _ in range(cfg.num_decoder_layers)]) if cfg.bridge else None)
    self.context_proj = linear(hidden * directions, hidden)

    first_input = emb + (emb if cfg.input_feeding else 0) + (hidden if self.query_previous else 0)
    self.decoder_cells = nnx.List([cell(first_input if i == 0 else hidden, hidden, rngs=rngs)
                                   for i in range(cfg.num_decoder_layers)])
    self.score_params = (KERNELS[cfg.attention].init(1, hidden, cfg.max_len, rngs)
                         if cfg.attention in KERNELS else None)
    self.combine = linear(2 * hidden, emb, use_bias=False)  # W_c
    self.logits_dense = None if cfg.share_embeddings else linear(emb, vocab_size)

  def encode(self, src_ids: jnp.ndarray, *, segments: jnp.ndarray | None = None,
             positions: jnp.ndarray | None = None, rngs: nnx.Rngs | None = None) -> Memory:
    """Encodes `src_ids [batch, src_len]` (PAD_ID-padded); packed rows are refused (PACKS)."""
    _refuse_packed(segments, positions)
    valid = src_ids != PAD_ID
    src_mask, lengths = masks.padding_mask(src_ids), valid.sum(axis=1)
    if self.reverse_source:  # Sutskever et al.: reversed source, padding stays at the end.
      src_ids = reverse_padded(src_ids, lengths)
    batch = src_ids.shape[0]
    x = self.dropout(self.src_embed(src_ids), deterministic=rngs is None, rngs=rngs)
    final = None
    for i, forward in enumerate(self.encoder_forward):
      zero = zeros_like_carry(self.cell_type, batch, self.hidden, x.dtype)
      gates = self._gates(forward, x.shape[-1])
      carry, out = scan_cell(gates, zero, gates.project(time_major(x)), valid)
      final = hidden_of(carry)
      if self.bidirectional:
        gates = self._gates(self.encoder_backward[i], x.shape[-1])
        back_carry, back = scan_cell(
            gates, zero, gates.project(time_major(reverse_padded(x, lengths))), valid)
        out = jnp.concatenate([out, reverse_padded(back, lengths)], axis=-1)
        final = jnp.concatenate([final, hidden_of(back_carry)], axis=-1)
      x = self.dropout(out, deterministic=rngs is None, rngs=rngs)
    encoded = self.encoder_out(x) if self.encoder_out is not None else x
    if self.bridge is not None:  # An LSTM's cell starts at zero, its hidden state bridged.
      initial = tuple((jnp.zeros_like(h), h) if self.cell_type == "lstm" else h
                      for h in (jnp.tanh(b(final)) for b in self.bridge))
    else:
      zero = zeros_like_carry(self.cell_type, batch, self.hidden, encoded.dtype)
      initial = tuple(zero for _ in self.decoder_cells)
    keys = encoded[:, None]  # [batch, 1 head, src_len, hidden]
    if self.attention in KERNELS:
      keys = KERNELS[self.attention].prepare(keys, self.score_params)
    return Memory(encoded, keys, src_mask, jnp.tanh(self.context_proj(final)), initial)

  def _attend(self, memory: Memory, query: jnp.ndarray, first=0, dropout_key=None):
    """`query [batch, q, hidden]` (steps `first`..) -> context `[.., hidden]`, weights `[.., k]`
    (before dropout: with `dropout_key`, attention dropout acts on the weights the context
    sums)."""
    if self.attention == "none":
      context = jnp.broadcast_to(memory.context[:, None], query.shape)
      return context, jnp.zeros(query.shape[:2] + memory.encoded.shape[1:2], query.dtype)
    dropout = {}
    if dropout_key is not None and self.attention_dropout.rate > 0:
      key = jax.random.fold_in(dropout_key, ATTENTION_DROPOUT_KEY)
      dropout["dropout"] = lambda weights: self.attention_dropout(weights, rngs=key)
    context, weights = KERNELS[self.attention].attend(
        query[:, None], memory.keys, memory.encoded[:, None],
        memory.src_mask.replace(query_offset=first), self.score_params, window=self.window,
        reverse=self.reverse_source, normalizer=bound(*self.normalizer, self.alpha), **dropout)
    return context[:, 0], weights[:, 0]

  def _gates(self, cell: nnx.Module, hoisted: int) -> GateKernels:
    """`cell`'s `GateKernels`, its first `hoisted` input rows multiplied outside the loop."""
    return GateKernels.of(cell, hoisted)

  def _decoder_gates(self) -> list[GateKernels]:
    """The decoder layers' kernels: the first layer's target embedding rows are hoisted."""
    return [self._gates(cell, self.tgt_embed.features if i == 0 else 0)
            for i, cell in enumerate(self.decoder_cells)]

  def _stack(self, gates, carries, projected, rest, dropout_key):
    """One step of the decoder's layers from the first layer's `projected` embedding and
    `rest` inputs; dropout between layers when a key is given."""
    new = []
    for i, layer in enumerate(gates):
      carry, x = layer(carries[i], projected, rest)
      new.append(carry)
      if dropout_key is not None and i + 1 < len(gates):
        x = self.dropout(x, rngs=jax.random.fold_in(dropout_key, i))
      projected, rest = None, [x]  # The next layer's input: this one's output, in the loop.
    return tuple(new), x

  def _output(self, context, h, dropout_key):
    """h~ = tanh(W_c [c; h]), and h~ after dropout, the logits' input."""
    attentional = jnp.tanh(self.combine(jnp.concatenate([context, h], axis=-1)))
    if dropout_key is None:
      return attentional, attentional
    return attentional, self.dropout(attentional, rngs=jax.random.fold_in(dropout_key, 1000))

  def _logits(self, attentional: jnp.ndarray) -> jnp.ndarray:
    if self.logits_dense is None:
      return self.tgt_embed.attend(attentional).astype(jnp.float32)
    return self.logits_dense(attentional).astype(jnp.float32)

  def _step(self, memory: Memory, gates, cache: Cache, projected: jnp.ndarray, dropout_key=None):
    """One target step from the previous token's embedding, `projected` by the first layer's
    gates; returns the logits' input (h~, after dropout), the next cache and the alignment."""
    rest = []
    if self.query_previous:  # Scored with the previous state s_{t-1}, before the stack runs.
      context, weights = self._attend(memory, hidden_of(cache.carries[-1])[:, None], cache.index,
                                      dropout_key)
      rest.append(context[:, 0])
    if self.input_feeding:
      rest.append(cache.feed)
    carries, h = self._stack(gates, cache.carries, projected, rest, dropout_key)
    if not self.query_previous:  # Luong: scored with the current state h_t.
      context, weights = self._attend(memory, h[:, None], cache.index, dropout_key)
    attentional, dropped = self._output(context[:, 0], h, dropout_key)
    return dropped, Cache(carries, attentional, cache.index + 1), weights[:, 0]

  def init_cache(self, memory: Memory, max_len: int) -> Cache:
    """The decoder's first state; `max_len` is unused (the RNN state has a fixed size)."""
    del max_len
    batch = memory.encoded.shape[0]
    feed = jnp.zeros((batch, self.combine.out_features), memory.encoded.dtype)
    return Cache(memory.initial, feed, jnp.zeros((), jnp.int32))

  def decode_step(self, memory: Memory, cache: Cache, token_ids: jnp.ndarray):
    """Feeds `token_ids [batch]`; returns `[batch, vocab]` logits and the next cache."""
    gates = self._decoder_gates()
    attentional, cache, _ = self._step(memory, gates, cache,
                                       gates[0].project(self.tgt_embed(token_ids)))
    return self._logits(attentional), cache

  def decode(self, memory: Memory, tgt_in_ids: jnp.ndarray, *,
             segments: jnp.ndarray | None = None, positions: jnp.ndarray | None = None,
             rngs: nnx.Rngs | None = None) -> jnp.ndarray:
    """Teacher-forced decoding: `tgt_in_ids [batch, t]` -> logits `[batch, t, vocab]`."""
    _refuse_packed(segments, positions)
    return self._teacher_forced(memory, tgt_in_ids, rngs)[0]

  def attention_weights(self, src_ids, tgt_in_ids) -> dict[str, jnp.ndarray]:
    """`cross`: the `[1 layer, batch, 1 head, t, src_len]` alignment of each target step, its
    columns in `src_ids`' order (a reversed source's put back), as every picture labels them."""
    weights = self._teacher_forced(self.encode(src_ids), tgt_in_ids, None)[1].swapaxes(1, 2)
    if self.reverse_source:
      weights = reverse_padded(weights, (src_ids != PAD_ID).sum(1))
    return {"cross": weights.swapaxes(1, 2)[None, :, None]}

  def _teacher_forced(self, memory, tgt_in_ids, rngs):
    embedded = self.dropout(self.tgt_embed(tgt_in_ids), deterministic=rngs is None, rngs=rngs)
    steps = tgt_in_ids.shape[1]
    dropout_key = rngs.dropout() if rngs is not None else None
    if not self.input_feeding and not self.query_previous:
      # The recurrence ignores attention: run it once, then attend for all t at once.
      x, carries = embedded, memory.initial
      valid = jnp.ones(tgt_in_ids.shape, bool)
      for i, cell in enumerate(self.decoder_cells):
        layer = self._gates(cell, x.shape[-1])
        _, x = scan_cell(layer, carries[i], layer.project(time_major(x)), valid)
        if dropout_key is not None and i + 1 < len(self.decoder_cells):
          x = self.dropout(x, rngs=jax.random.fold_in(dropout_key, i))
      context, weights = self._attend(memory, x, dropout_key=dropout_key)
      return self._logits(self._output(context, x, dropout_key)[1]), weights

    step_keys = (jax.random.split(dropout_key, steps) if dropout_key is not None
                 else jnp.zeros((steps,), jnp.uint32))

    def body(cache, xs):
      projected, key = xs
      out, cache, weights = self._step(memory, gates, cache, projected,
                                       key if dropout_key is not None else None)
      return cache, (self._logits(out) if self.LOGITS_IN_LOOP else out, weights)

    gates = self._decoder_gates()
    cache = self.init_cache(memory, steps)
    projected = gates[0].project(time_major(embedded))  # Every step's embedding at once.
    _, (out, weights) = jax.lax.scan(body, cache, (projected, step_keys))
    out = time_major(out)
    return (out if self.LOGITS_IN_LOOP else self._logits(out)), time_major(weights)
