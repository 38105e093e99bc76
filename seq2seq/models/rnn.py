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
step before, as cuDNN and flax's `OptimizedLSTMCell` arrange it: the products of the inputs
known in advance (the source, the target embeddings) are taken for every step at once before
the loop (`GateKernels.project`), each step's remaining inputs and its state go through one
product with the gates side by side, and teacher forcing takes the logits of every step in one
product after the loop. The parameters are the `nnx` cells' own (same names and initialization);
`seq2seq.performance.rnn_reference` runs them as written, one product per gate in the loop.
"""

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from flax.nnx.nn import dtypes

from seq2seq.data.special_ids import PAD_ID
from seq2seq.models import masks
from seq2seq.models.dropout import Dropout
from seq2seq.models.linear import Linear, matmul
from seq2seq.models.local_rnn import KERNELS
from seq2seq.models.normalizers import bound, learned_alpha, options_of

Carry = jnp.ndarray | tuple[jnp.ndarray, jnp.ndarray]  # GRU: h; LSTM: (c, h)
CELLS = {"lstm": nnx.LSTMCell, "gru": nnx.GRUCell}
# Variants scored with the previous state s_{t-1} when config.model.rnn_query_state is "auto".
PREVIOUS_STATE_QUERIES = ("concat",)


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


def _hidden(carry: Carry) -> jnp.ndarray:
  return carry[1] if isinstance(carry, tuple) else carry


def _zeros_like_carry(cell_type: str, batch: int, size: int, dtype) -> Carry:
  zeros = jnp.zeros((batch, size), dtype)
  return (zeros, zeros) if cell_type == "lstm" else zeros


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


class GateKernels(NamedTuple):
  """An `nnx` LSTM or GRU cell's weights with its gates side by side.

  The cell's first `hoisted` input rows are multiplied outside the recurrence, for every step
  at once (`project`); each step (`__call__`) multiplies the other input rows and the state.
  LSTM: gates i, f, g, o; one product per step, the other rows stacked over the recurrent
  kernel; the bias sits on the recurrent side, as in `nnx.LSTMCell`. GRU: gates r, z, n; the
  state's product stays apart (n scales it by r), the bias sits on the input side.
  """
  lstm: bool
  hoisted: jnp.ndarray  # [hoisted, gates * hidden]
  step: jnp.ndarray  # LSTM: [in - hoisted + hidden, 4 hidden]; GRU: [in - hoisted, 3 hidden]
  recurrent: jnp.ndarray | None  # GRU: [hidden, 3 hidden]
  bias: jnp.ndarray  # [gates * hidden]
  dtype: Any

  @classmethod
  def of(cls, cell: nnx.Module, hoisted: int) -> "GateKernels":
    """`cell`'s kernels, its first `hoisted` input rows apart (call outside the loop)."""
    if isinstance(cell, nnx.LSTMCell):
      inputs = jnp.concatenate([cell.ii.kernel[...], cell.if_.kernel[...], cell.ig.kernel[...],
                                cell.io.kernel[...]], axis=1)
      recurrent = jnp.concatenate([cell.hi.kernel[...], cell.hf.kernel[...], cell.hg.kernel[...],
                                   cell.ho.kernel[...]], axis=1)
      bias = jnp.concatenate([cell.hi.bias[...], cell.hf.bias[...], cell.hg.bias[...],
                              cell.ho.bias[...]])
      return cls(True, inputs[:hoisted], jnp.concatenate([inputs[hoisted:], recurrent]), None,
                 bias, cell.dtype)
    kernel = cell.dense_i.kernel[...]
    return cls(False, kernel[:hoisted], kernel[hoisted:], cell.dense_h.kernel[...],
               cell.dense_i.bias[...], cell.dtype)

  def _product(self, x: jnp.ndarray, kernel: jnp.ndarray) -> jnp.ndarray:
    x, kernel = dtypes.promote_dtype((x, kernel), dtype=self.dtype)
    return matmul(x, kernel)

  def project(self, x: jnp.ndarray) -> jnp.ndarray:
    """The hoisted rows' part of every gate: `x [..., hoisted]` -> `[..., gates * hidden]`."""
    projected = self._product(x, self.hoisted)
    return projected if self.lstm else projected + self.bias.astype(projected.dtype)

  def __call__(self, carry: Carry, projected: jnp.ndarray | None,
               rest: Sequence[jnp.ndarray] = ()) -> tuple[Carry, jnp.ndarray]:
    """One step from `projected` (`project` of this step's hoisted inputs, or None when none
    are hoisted) and `rest`, the other inputs in row order: `(carry, output)`."""
    if self.lstm:
      c, h = carry
      z = self._product(jnp.concatenate([*rest, h], axis=-1), self.step)
      z = z + self.bias.astype(z.dtype)  # In the computation's dtype, as nnx.Linear adds it.
      if projected is not None:
        z = projected + z
      i, f, g, o = jnp.split(z, 4, axis=-1)
      new_c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      new_h = jax.nn.sigmoid(o) * jnp.tanh(new_c)
      return (new_c, new_h), new_h
    h, x = carry, projected
    if rest:
      x = self._product(jnp.concatenate(rest, axis=-1), self.step)
      x = x + (projected if projected is not None else self.bias.astype(x.dtype))
    x_r, x_z, x_n = jnp.split(x, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(self._product(h, self.recurrent), 3, axis=-1)
    r, z = jax.nn.sigmoid(x_r + h_r), jax.nn.sigmoid(x_z + h_z)
    new_h = (1.0 - z) * jnp.tanh(x_n + r * h_n) + z * h
    return new_h, new_h


def _time_major(x: jnp.ndarray) -> jnp.ndarray:
  """`[batch, t, ...]` <-> `[t, batch, ...]`: the scans' layout. Inputs are turned before
  `GateKernels.project`, whose products are several times wider."""
  return x.swapaxes(0, 1)


def _scan_cell(gates, carry: Carry, projected: jnp.ndarray, valid: jnp.ndarray):
  """Runs `gates` over `projected [t, batch, gates * hidden]` (`gates.project` of the
  time-major inputs); the carry stops at the last valid step. Outputs `[batch, t, hidden]`."""

  def body(carry, xs):
    x, ok = xs
    new_carry, y = gates(carry, x)
    carry = jax.tree.map(lambda new, old: jnp.where(ok[:, None], new, old), new_carry, carry)
    return carry, y

  carry, ys = jax.lax.scan(body, carry, (projected, _time_major(valid)))
  return carry, _time_major(ys)


class RNN(nnx.Module):
  """See the module docstring; implements `interface.Seq2SeqModel` (`cfg` is `config.model`)."""

  # The variants the RNN takes: none (Sutskever et al.), any softmax score, a local window.
  ATTENTION_NAMES = ("none", *KERNELS)
  PACKS = False  # One sentence per row: the recurrence would run across packed sentences.
  POSITION_NAMES = ("sinusoidal",)  # The default, ignored: its recurrence orders the words.
  SHARES_KV_HEADS = False  # One attention head: no key/value heads to share.
  NORMALIZED = tuple(KERNELS)  # Whose weights a normalizer gives (all but `none`).
  UNATTENDED = ("none",)  # Whose decoder reads one fixed vector: `cross` weights all 0.
  # Teacher forcing: every step's logits in one product after the loop (not in it).
  LOGITS_IN_LOOP = False

  @staticmethod
  def config_problem(cfg: ml_collections.ConfigDict) -> str | None:
    del cfg  # Every RNN field is range-checked with the base config.
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
      zero = _zeros_like_carry(self.cell_type, batch, self.hidden, x.dtype)
      gates = self._gates(forward, x.shape[-1])
      carry, out = _scan_cell(gates, zero, gates.project(_time_major(x)), valid)
      final = _hidden(carry)
      if self.bidirectional:
        gates = self._gates(self.encoder_backward[i], x.shape[-1])
        back_carry, back = _scan_cell(
            gates, zero, gates.project(_time_major(reverse_padded(x, lengths))), valid)
        out = jnp.concatenate([out, reverse_padded(back, lengths)], axis=-1)
        final = jnp.concatenate([final, _hidden(back_carry)], axis=-1)
      x = self.dropout(out, deterministic=rngs is None, rngs=rngs)
    encoded = self.encoder_out(x) if self.encoder_out is not None else x
    if self.bridge is not None:  # An LSTM's cell starts at zero, its hidden state bridged.
      initial = tuple((jnp.zeros_like(h), h) if self.cell_type == "lstm" else h
                      for h in (jnp.tanh(b(final)) for b in self.bridge))
    else:
      zero = _zeros_like_carry(self.cell_type, batch, self.hidden, encoded.dtype)
      initial = tuple(zero for _ in self.decoder_cells)
    keys = encoded[:, None]  # [batch, 1 head, src_len, hidden]
    if self.attention in KERNELS:
      keys = KERNELS[self.attention].prepare(keys, self.score_params)
    return Memory(encoded, keys, src_mask, jnp.tanh(self.context_proj(final)), initial)

  def _attend(self, memory: Memory, query: jnp.ndarray, first=0):
    """`query [batch, q, hidden]` (steps `first`..) -> context `[.., hidden]`, weights `[.., k]`."""
    if self.attention == "none":
      context = jnp.broadcast_to(memory.context[:, None], query.shape)
      return context, jnp.zeros(query.shape[:2] + memory.encoded.shape[1:2], query.dtype)
    context, weights = KERNELS[self.attention].attend(
        query[:, None], memory.keys, memory.encoded[:, None],
        memory.src_mask.replace(query_offset=first), self.score_params, window=self.window,
        reverse=self.reverse_source, normalizer=bound(*self.normalizer, self.alpha))
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
      context, weights = self._attend(memory, _hidden(cache.carries[-1])[:, None], cache.index)
      rest.append(context[:, 0])
    if self.input_feeding:
      rest.append(cache.feed)
    carries, h = self._stack(gates, cache.carries, projected, rest, dropout_key)
    if not self.query_previous:  # Luong: scored with the current state h_t.
      context, weights = self._attend(memory, h[:, None], cache.index)
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
        _, x = _scan_cell(layer, carries[i], layer.project(_time_major(x)), valid)
        if dropout_key is not None and i + 1 < len(self.decoder_cells):
          x = self.dropout(x, rngs=jax.random.fold_in(dropout_key, i))
      context, weights = self._attend(memory, x)
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
    projected = gates[0].project(_time_major(embedded))  # Every step's embedding at once.
    _, (out, weights) = jax.lax.scan(body, cache, (projected, step_keys))
    out = _time_major(out)
    return (out if self.LOGITS_IN_LOOP else self._logits(out)), _time_major(weights)
