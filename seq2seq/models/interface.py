"""The interface every model family provides, and what each declares it can do.

The trainer, the decoders and evaluation use a model only through these
methods, so a new family plugs in by implementing them (with these keyword
arguments) and registering its class in `seq2seq.models.MODEL_CLASSES`. `Memory`
and `Cache` are the family's own pytrees: callers pass them back unchanged.
"""

from typing import Any, ClassVar, Protocol

import jax.numpy as jnp
import ml_collections
from flax import nnx

# A family's encoder output: a pytree the decoder takes back. It may offer
# `for_beams(beam_size)` (see `beams.expand_to_beams`).
Memory = Any
# A family's step-by-step decoding state: a pytree. One with a time axis may offer
# `resized(length)`, the same state with room for `length` tokens: beam search then
# grows it in phases (`beams.cache_lengths`); and `select(rows)`, its own reordering
# by hypothesis (`beams.select_rows`).
Cache = Any


class Seq2SeqModel(Protocol):
  """An encoder-decoder over joint-vocabulary token ids (PAD_ID-padded)."""

  # The `config.model.attention` names the family takes. This and the other names a family
  # draws from the registries are read when a command runs (`seq2seq.registry.live`), so an
  # entry a run's own file registers (`config.train.extensions`) is among them.
  ATTENTION_NAMES: ClassVar[tuple[str, ...]]
  # Whether it takes packed rows (several sentences per row: `segments`, `positions`);
  # read through `seq2seq.models.can_pack(family)`.
  PACKS: ClassVar[bool]
  # The `config.model.positions` names it takes (models.positions.POSITIONS).
  POSITION_NAMES: ClassVar[tuple[str, ...]]
  # Whether its attention may share key/value heads (`config.model.num_kv_heads`).
  SHARES_KV_HEADS: ClassVar[bool]
  # The attention names whose weights come from `config.model.attention_normalizer`.
  NORMALIZED: ClassVar[tuple[str, ...]]
  # The attention names whose weights take `config.model.attention_dropout_rate` (each
  # entry's declared `weight_dropout`); `check_config` refuses the rate beside any other.
  WEIGHT_DROPOUT: ClassVar[tuple[str, ...]]
  # The attention names whose decoder attends to no source word (`cross` weights all zero);
  # read through `seq2seq.models.attends(config.model)`.
  UNATTENDED: ClassVar[tuple[str, ...]]
  # The dtypes its dense products may take their inputs in when it decodes (`--matmul_dtype`,
  # `seq2seq.models.build_model`): float32, and bfloat16 where every such product goes
  # through `linear.Linear` or `linear.matmul`.
  MATMUL_DTYPES: ClassVar[tuple[str, ...]]

  @staticmethod
  def config_problem(cfg: ml_collections.ConfigDict) -> str | None:
    """What in `config.model` the family cannot build, as a one-line message with the fix."""

  def encode(self, src_ids: jnp.ndarray, *, segments: jnp.ndarray | None = None,
             positions: jnp.ndarray | None = None, rngs: nnx.Rngs | None = None) -> Memory:
    """`src_ids [batch, src_len]` -> memory. Packed rows also give `segments`/`positions`
    `[batch, src_len]` (each token's sentence 1, 2, ... and its position in it); `rngs`
    (with a `dropout` stream) switches dropout on."""

  def decode(self, memory: Memory, tgt_in_ids: jnp.ndarray, *,
             segments: jnp.ndarray | None = None, positions: jnp.ndarray | None = None,
             rngs: nnx.Rngs | None = None) -> jnp.ndarray:
    """Teacher-forced: `tgt_in_ids [batch, t]` -> float32 logits `[batch, t, vocab]`."""

  def attention_weights(self, src_ids: jnp.ndarray,
                        tgt_in_ids: jnp.ndarray) -> dict[str, jnp.ndarray]:
    """Every attention of a teacher-forced pass, by kind, `[layers, batch, heads, queries,
    keys]`: at least `cross` (`[layers, batch, heads, t, src_len]`); a family with
    self-attention adds `encoder` (`[..., src_len, src_len]`) and `decoder` (`[..., t, t]`).
    Queries and keys are in the order of `src_ids` and `tgt_in_ids`, whatever order the
    family reads them in: the pictures label them so (`alignment.labels`). A family may add
    what makes a kind's weights as `<kind>_<part>`, `[layers, batch, heads, queries, keys or
    1]` (the Transformer's differential maps and gates: `Transformer.attention_weights`)."""

  def init_cache(self, memory: Memory, max_len: int) -> Cache:
    """The decoding state before the first target token, for up to `max_len` tokens."""

  def decode_step(self, memory: Memory, cache: Cache,
                  token_ids: jnp.ndarray) -> tuple[jnp.ndarray, Cache]:
    """Feeds `token_ids [batch]`: float32 logits `[batch, vocab]` and the next cache."""
