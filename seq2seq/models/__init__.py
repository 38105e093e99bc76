"""Model families behind one interface (`Seq2SeqModel`, `interface`): the Transformer
(`transformer`) and the attentional RNN (`rnn`, with Luong's local windows in `local_rnn`),
built from shared parts: the registries of attention variants (`attention`, with its scores in
`scores`, what it does with heads in `heads`, its sub-quadratic kernels in `kernels` and
differential attention in `differential`), positions (`positions`) and normalizers
(`normalizers`), masks (`masks`), dropout (`dropout`), projections (`linear`) and the RNN's
recurrence (`recurrence`).
`build_model` picks a family by config, and `check_config` says what a config asks of its
family that the family cannot do. `export` (imported on its own: it needs the optional
`[export]` extra) maps a Transformer onto CTranslate2's, and says which configs do not map.

May import: shared, data.
"""

from collections.abc import Iterator, Mapping

import jax.numpy as jnp
import ml_collections
from flax import nnx

from seq2seq.errors import UserError
from seq2seq.models.attention import PAPER_NAMES, SCORES, VARIANTS
from seq2seq.models.interface import Seq2SeqModel
from seq2seq.models.linear import MATRIX_DOTS, cast_kernels, use_matmul_dtype  # noqa: F401 (re-export)
from seq2seq.models.normalizers import NORMALIZERS
from seq2seq.models.positions import POSITIONS
from seq2seq.models.rnn import RNN
from seq2seq.models.transformer import Transformer
from seq2seq.registry import import_extensions

# `config.model.family` name -> the class that builds it.
MODEL_CLASSES: dict[str, type[Seq2SeqModel]] = {"transformer": Transformer, "rnn": RNN}
FAMILY_NAMES = tuple(MODEL_CLASSES)


class _AttentionByFamily(Mapping):
  """`config.model.family` name -> the `config.model.attention` names the family declares it
  takes (its `ATTENTION_NAMES`), read each time: those registered when a command runs."""

  def __getitem__(self, family: str) -> tuple[str, ...]:
    return MODEL_CLASSES[family].ATTENTION_NAMES

  def __iter__(self) -> Iterator[str]:
    return iter(MODEL_CLASSES)

  def __len__(self) -> int:
    return len(MODEL_CLASSES)


ATTENTION_BY_FAMILY: Mapping[str, tuple[str, ...]] = _AttentionByFamily()


def can_pack(family: str) -> bool:
  """Whether `family` takes packed rows (several sentences per row): its declared `PACKS`."""
  return MODEL_CLASSES[family].PACKS


def attends(m: ml_collections.ConfigDict) -> bool:
  """Whether the model of `config.model` `m` attends to the source's words: its family's
  attention names but those it declares `UNATTENDED` (the RNN's fixed-vector `none`)."""
  return m.attention not in MODEL_CLASSES[m.family].UNATTENDED


def build_model(config: ml_collections.ConfigDict, vocab_size: int, *, seed: int | None = None,
                matmul_dtype: str = "float32"):
  """Builds `config.model.family` with freshly initialized parameters.

  Args:
    config: the full run config (validated).
    vocab_size: size of the joint SentencePiece vocabulary.
    seed: parameter seed (default: config.train.seed).
    matmul_dtype: the dtype of the inputs of its dense products, summed in float32 (decoding's
      `--matmul_dtype`: `check_matmul_dtype`); the parameters stay as they are.
  """
  check_matmul_dtype(config, matmul_dtype)
  import_extensions(config.train.get("extensions", ""))  # What they register, the model uses.
  seed = config.train.seed if seed is None else seed
  model = MODEL_CLASSES[config.model.family](config.model, vocab_size,
                                             rngs=nnx.Rngs(params=seed),
                                             dtype=jnp.dtype(config.train.dtype))
  if matmul_dtype != "float32":
    use_matmul_dtype(model, matmul_dtype)
    model.matmul_dtype = matmul_dtype  # The tied output's product (`Transformer._logits`).
  return model


def check_matmul_dtype(config: ml_collections.ConfigDict, matmul_dtype: str) -> None:
  """Raises `UserError` unless the run of `config` can decode with `--matmul_dtype`: a name of
  `linear.MATRIX_DOTS`, which its family takes (`MATMUL_DTYPES`), for a float32 run."""
  if matmul_dtype not in MATRIX_DOTS:
    raise UserError(f"--matmul_dtype={matmul_dtype} is not a product dtype; use one of:"
                    f" {', '.join(MATRIX_DOTS)}.")
  if matmul_dtype == "float32":
    return
  family = config.model.family
  if matmul_dtype not in MODEL_CLASSES[family].MATMUL_DTYPES:
    raise UserError(f"--matmul_dtype={matmul_dtype}: the {family}'s recurrent cells multiply"
                    " outside its dense layers, so it decodes in float32 only; drop"
                    " --matmul_dtype.")
  if config.train.dtype != "float32":
    raise UserError(f"--matmul_dtype={matmul_dtype} rounds a float32 model's products; this run"
                    f" computes in config.train.dtype={config.train.dtype} throughout already;"
                    " drop --matmul_dtype.")


def _composition_problem(m: ml_collections.ConfigDict) -> str | None:
  """What in `config.model` its positions, normalizer or key/value heads cannot go with: the
  family's declared capabilities and each registry entry's own (`Positions.attention`,
  `Variant.normalizes`), as a one-line message with the fix."""
  cls = MODEL_CLASSES[m.family]
  # The decoder's positions, where the config names its own ("": the encoder's).
  for field in ("positions", "decoder_positions") if m.get("decoder_positions") else ("positions",):
    name = m[field]
    if name not in POSITIONS:
      return (f"config.model.{field}={name!r} is not a way of giving positions; use one"
              f" of: {', '.join(POSITIONS)}.")
    if name not in cls.POSITION_NAMES:
      return (f"config.model.{field}={name!r} is not available for the {m.family}; use"
              f" one of: {', '.join(cls.POSITION_NAMES)}.")
    composes = POSITIONS[name].attention
    if composes is not None and m.attention not in composes:
      return (f"config.model.{field}={name!r} works inside {', '.join(composes)}"
              f" attention, not {m.attention!r}; change config.model.attention or {field}.")
  if m.attention_normalizer not in NORMALIZERS:
    return (f"config.model.attention_normalizer={m.attention_normalizer!r} is not a normalizer;"
            f" use one of: {', '.join(NORMALIZERS)}.")
  if m.attention_normalizer != "softmax" and m.attention not in cls.NORMALIZED:
    return (f"config.model.attention_normalizer={m.attention_normalizer!r}: the {m.family}'s"
            f" {m.attention!r} attention takes no normalizer; use softmax, or one of:"
            f" {', '.join(cls.NORMALIZED)}.")
  if NORMALIZERS[m.attention_normalizer].learns_alpha and not m.entmax_alpha < 2:
    return (f"config.model.attention_normalizer={m.attention_normalizer!r} learns alpha in (1,"
            f" 2) from config.model.entmax_alpha={m.entmax_alpha}; start it below 2.")
  if m.num_kv_heads and not cls.SHARES_KV_HEADS:
    return (f"config.model.num_kv_heads={m.num_kv_heads}: the {m.family} has no key/value heads"
            " to share; leave it at 0.")
  if m.num_kv_heads and m.num_kv_heads != m.num_heads and m.attention not in SCORES:
    return (f"config.model.num_kv_heads={m.num_kv_heads} shares key/value heads, which"
            f" {m.attention!r} attention cannot; use one of: {', '.join(SCORES)}, or 0.")
  # Attention dropout where the attention forms no weights to drop (each entry's declared
  # `weight_dropout`): it would be ignored.
  if m.attention_dropout_rate and m.attention not in cls.WEIGHT_DROPOUT:
    return (f"config.model.attention_dropout_rate={m.attention_dropout_rate}: the {m.family}'s"
            f" {m.attention!r} attention takes no dropout on its weights; set it to 0, or use"
            f" one of: {', '.join(cls.WEIGHT_DROPOUT)}.")
  return None


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises `UserError` naming the fix for what `config` asks of its model family that the
  family does not declare it can do: an unknown family, an attention it does not take, sizes
  it cannot build (`config_problem`), packed rows it or its attention cannot keep apart.

  `seq2seq.config.validate` checks the rest, without importing the models; run it first
  (this reads fields whose types and ranges it checks). The run's own Python files
  (`config.train.extensions`) are imported first, so that the entries they register are read
  with the package's.
  """
  import_extensions(config.train.extensions)
  m = config.model
  if m.family not in MODEL_CLASSES:
    raise UserError(f"config.model.family={m.family!r} is not a model family;"
                    f" use one of: {', '.join(FAMILY_NAMES)}.")
  valid = ATTENTION_BY_FAMILY[m.family]
  if m.attention not in valid:
    paper = PAPER_NAMES.get(m.attention.lower())
    hint = f" ({paper[1]} is {paper[0]!r} here.)" if paper and paper[0] in valid else ""
    raise UserError(f"config.model.attention={m.attention!r} is not available for the"
                    f" {m.family}; use one of: {', '.join(valid)}.{hint}")
  problem = _composition_problem(m) or MODEL_CLASSES[m.family].config_problem(m)
  if problem:
    raise UserError(problem)
  if config.data.pack and not can_pack(m.family):
    raise UserError(f"config.data.pack=True packs several sentences per row, which the"
                    f" {m.family} family cannot keep apart; it needs"
                    " --config.data.pack=False.")
  if config.data.pack and not VARIANTS[m.attention].packs:
    raise UserError("config.data.pack=True needs attention that can be masked per sentence;"
                    f" `{m.attention}` cannot: use another config.model.attention or"
                    " pack=False.")
