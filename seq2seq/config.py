"""The base config: every field, one comment each, and its validation.

Experiment files in `configs/` start from `base_config()` and change what they
need. `validate(config)` runs before anything is built or compiled, so a bad
value stops the run with one line that names the field and the fix. It checks
what every config needs without importing the models; what a config asks of its
model family (the family, its attention, packing) `seq2seq.models.check_config`
checks against what the families declare.
"""

import difflib
import json

import ml_collections

from seq2seq.errors import UserError

RNN_CELLS = ("lstm", "gru")
RNN_QUERY_STATES = ("auto", "previous", "current")
# config.train.schedule: after the linear warmup, inverse-square-root decay (Vaswani et al.),
# or a decay to zero at `num_steps`, linear or cosine (which anneals a fixed budget and needs
# no averaging). `seq2seq.runs.train_state.learning_rate_schedule` builds them.
SCHEDULES = ("inverse_sqrt", "linear", "cosine")


def base_config() -> ml_collections.ConfigDict:
  """Returns the config with every field at its default."""
  return ml_collections.ConfigDict({
      "model": _model_defaults(), "data": _data_defaults(), "train": _train_defaults(),
      "eval": _eval_defaults(), "checkpoint": _checkpoint_defaults(),
      "distributed": _distributed_defaults(), "compile": _compile_defaults()})


def _model_defaults() -> ml_collections.ConfigDict:
  """The model family and its architecture."""
  m = ml_collections.ConfigDict()
  m.family = "transformer"  # Model family: one of seq2seq.models.FAMILY_NAMES.
  m.attention = "scaled_dot"  # Attention variant (models.ATTENTION_BY_FAMILY; the README).
  # `local` attention: each query sees keys this many positions away; the RNN's local_m and
  # local_p: D, the half-width of the window around p_t (Luong et al. 2015 used D = 10).
  m.attention_window = 8
  m.attention_globals = 2  # `local_global`: the first N positions see and are seen by all.
  m.emb_dim = 256  # Model width d: embeddings and residual stream.
  m.num_heads = 4  # Attention heads; must divide emb_dim.
  # Transformer: key/value heads, each shared by num_heads / num_kv_heads query heads (1:
  # multi-query, Shazeer 2019; between: grouped-query, Ainslie et al. 2023); 0 = num_heads.
  m.num_kv_heads = 0
  # Transformer: where word order enters (models.positions.POSITIONS): "sinusoidal", "learned",
  # "none", or in self-attention "relative" (Shaw 2018), "rope" (Su 2021), "alibi" (Press 2022;
  # symmetric in the encoder) or "alibi_directional" (a slope for each side).
  m.positions = "sinusoidal"
  m.max_relative_distance = 16  # `relative` positions: distances clipped to +-K (Shaw et al.).
  m.decoder_positions = ""  # Transformer: the decoder's ("none": Kazemnejad 2023; "": the same).
  m.qk_norm = False  # Transformer: unit queries and keys, a learned scale (Henry et al. 2020).
  m.qk_norm_scale = 0.0  # QK-norm's initial scale; 0: log2(L^2 - L) for L = max_len (theirs).
  m.attention_gate = "none"  # Transformer: sigmoid gate, "headwise"/"elementwise" (Qiu 2025).
  # What turns scores into weights (models.normalizers.NORMALIZERS): "softmax", "sparsemax"
  # (Martins & Astudillo 2016), "entmax15" (Peters et al. 2019), "entmax_bisect" (alpha below),
  # "entmax_learned" (Correia et al. 2019) or "sigmoid" (Ramapuram et al. 2025).
  m.attention_normalizer = "softmax"
  m.entmax_alpha = 1.5  # `entmax_bisect`: alpha > 1 (2: sparsemax; towards 1: softmax).
  m.num_encoder_layers = 3  # Encoder blocks.
  m.num_decoder_layers = 3  # Decoder blocks.
  m.mlp_dim = 1024  # Hidden width of each feed-forward block.
  m.dropout_rate = 0.1  # Dropout on embeddings, sublayer outputs and MLP hidden.
  m.attention_dropout_rate = 0.0  # On attention weights (refused where none are formed).
  m.share_embeddings = True  # One table for source, target and output logits.
  m.pre_ln = True  # Pre-LayerNorm blocks (False: post-LN as in Vaswani et al.).
  m.max_len = 256  # Longest source/target sequence (decoding cap; `location` attention span).
  # RNN family only:
  m.rnn_cell = "lstm"  # "lstm" or "gru".
  m.rnn_hidden_dim = 256  # Recurrent state size.
  m.bidirectional = True  # Bidirectional encoder (directions merged for attention).
  m.bridge = True  # Decoder starts from tanh(W h_enc_final); False: from zeros.
  m.input_feeding = True  # Feed h~_{t-1} into step t (Luong et al., 3.3).
  # Which decoder state queries attention: "previous" (s_{t-1}, before the stack, context fed
  # into it: Bahdanau et al.), "current" (h_t, after the stack: Luong et al.), or "auto":
  # previous for concat, current for the other scores.
  m.rnn_query_state = "auto"
  m.reverse_source = False  # Read the source backwards (Sutskever et al., 2014).
  return m


def _data_defaults() -> ml_collections.ConfigDict:
  """The corpus, its vocabulary and how training batches are formed."""
  d = ml_collections.ConfigDict()
  d.corpus = "multi30k"  # "multi30k", a directory of {split}.{lang}[.gz], or "tfds:<name>".
  d.src_lang = "en"  # Source language code.
  d.tgt_lang = "de"  # Target language code.
  d.multi30k_dir = ""  # Where the bundled Multi30k lives ("" = data/multi30k in the repo).
  d.tfds_data_dir = ""  # TFDS data_dir ("" = TFDS default).
  d.vocab_size = 8000  # Joint SentencePiece vocabulary size (soft limit on tiny corpora).
  d.vocab_from = ""  # A run's workdir whose vocabulary this run takes instead of training one.
  d.vocab_languages = ""  # Train it on these languages' training text ("de,en,cs"; "": the pair).
  d.max_len = 64  # Drop training pairs longer than this many subwords (+BOS/EOS).
  d.tokens_per_batch = 4096  # Token budget of one global training batch (padded).
  d.bucket_step = 8  # Padded lengths are multiples of this.
  # Unpacked training pads to at most this many of those lengths, chosen to waste the fewest
  # tokens; each is one compiled train step (0 = every multiple of bucket_step).
  d.num_buckets = 2
  d.max_train_examples = 0  # Use only the first N training pairs (0 = all).
  d.pack = False  # Pack several training pairs per row (Transformer only; one shape, less PAD).
  # Subword regularization (Kudo 2018; docs/training.md): each epoch resegments the training
  # pairs, drawing x with probability ~ P(x) ** alpha (this alpha; 0: off, the best x only) ...
  d.subword_sampling = 0.0
  d.subword_nbest = 64  # ... among each sentence's n best segmentations (2 to 512).
  return d


def _train_defaults() -> ml_collections.ConfigDict:
  """The optimizer, its schedule and the training loop."""
  t = ml_collections.ConfigDict()
  t.num_steps = 10_000  # Optimizer steps in the whole run.
  t.seed = 0  # Seeds parameters, batch order and dropout.
  t.learning_rate = 1e-3  # Peak learning rate, reached at the end of warmup (0: none).
  t.warmup_steps = 1000  # Linear warmup, then the decay `schedule` names.
  t.schedule = "inverse_sqrt"  # After warmup: "inverse_sqrt", or to zero at num_steps: "linear",
  # "cosine".
  t.adam_b1 = 0.9  # Adam beta1.
  t.adam_b2 = 0.98  # Adam beta2.
  t.adam_eps = 1e-9  # Adam epsilon.
  t.weight_decay = 0.0  # Decoupled weight decay (AdamW); 0 = plain Adam.
  t.clip_norm = 1.0  # Global gradient-norm clipping (0 = off).
  t.label_smoothing = 0.1  # Label smoothing of the cross-entropy.
  t.dtype = "float32"  # Computation dtype ("bfloat16": mixed precision); parameters stay fp32.
  t.grad_accum_steps = 1  # Split each batch into k micro-batches; one update from their sum.
  t.fsdp = 1  # Shard parameters and optimizer state over this many devices (1 = replicate).
  # Train steps per call of the compiled program (a lax.scan over that many batches of one
  # shape): less host time per step. Actions still fall on their steps (tested equal to 1).
  t.steps_per_call = 1
  t.log_every_steps = 50  # Training metrics to metrics.jsonl / TensorBoard.
  t.patience = 0  # Stop after N evaluations without a better validation BLEU (0 = never).
  t.extensions = ""  # Own .py files or modules of entries chosen by name (docs/extending.md).
  t.loss_terms = ""  # Loss terms added to the objective: "name:weight,..." (e.g. "z_loss:1e-4").
  t.actions = ""  # Loop actions run after the built-in ones: "name,..." (e.g. "param_norm").
  # Start from a parent run (docs/training.md, "Starting from another run"; checked in
  # runs.parents): its workdir ("": off). Only its parameters by default; once this run has
  # a checkpoint of its own it resumes from that and never reads the parent again.
  t.init_from = ""
  # The parent's checkpoint: best, latest, selected, avg:N or a step. "best" (by validation
  # BLEU, what evaluation decodes by default): fine-tuning wants the parameters chosen on
  # validation, and unlike "selected" every evaluated run has one.
  t.init_checkpoint = "best"
  t.init_keep = ""  # What else comes from the parent: "optimizer", "step" or "optimizer,step".
  t.init_fresh = ""  # Regex on parameter paths left freshly initialized, e.g. "logits_dense".
  return t


def _eval_defaults() -> ml_collections.ConfigDict:
  """Validation: how often, on what, and with which search."""
  e = ml_collections.ConfigDict()
  e.every_steps = 1000  # Validation loss + BLEU (and a checkpoint) every N steps.
  e.split = "val"  # Split used for validation loss and BLEU.
  e.batch_size = 128  # Sentences per decoding / validation batch.
  e.max_sentences = 0  # Decode only the first N validation sentences (0 = all).
  e.beam_size = 1  # Validation decoding: 1 = greedy, else beam search.
  e.alpha = 0.6  # GNMT length-penalty exponent of beam search.
  e.max_decode_len_a = 1.5  # Decode at most a * source_length + b tokens ...
  e.max_decode_len_b = 10  # ... (b tokens slack).
  # The beam of the evaluation commands (seq2seq-evaluate, -translate, -compare --beam_size):
  # the trainer compiles their searches in the background, so that they compile nothing
  # (0: compiles none ahead).
  e.test_beam_size = 4
  return e


def _checkpoint_defaults() -> ml_collections.ConfigDict:
  """Which checkpoints are written and kept."""
  k = ml_collections.ConfigDict()
  k.keep = 3  # Keep the latest N checkpoints (the best by validation BLEU is kept too).
  k.every_steps = 0  # Also checkpoint every N steps between evaluations (0 = only at them).
  return k


def _distributed_defaults() -> ml_collections.ConfigDict:
  """Multi-host: the arguments of jax.distributed.initialize."""
  g = ml_collections.ConfigDict()
  g.num_processes = 1  # Processes in the run; 1 = single process; 0 = all from the environment.
  g.coordinator_address = ""  # "host:port" of process 0 ("" = JAX_COORDINATOR_ADDRESS/cluster).
  g.process_id = -1  # This process's index (-1 = from the environment).
  return g


def _compile_defaults() -> ml_collections.ConfigDict:
  """How the programs are compiled (seq2seq.runtime.compiling): XLA's options for each kind of
  program, as "name=value,..." (such as "xla_gpu_autotune_level=0"; "": XLA's defaults; an
  option that XLA_FLAGS sets is the user's and stays so), and how many compile at once."""
  k = ml_collections.ConfigDict()
  k.train_options = ""  # The train step's (it runs for minutes or hours).
  k.eval_options = ""  # Validation losses' and every search's (they run for seconds).
  k.threads = 0  # Programs compiled at once (0: one per core, up to 8; one on 2 cores; 1: serial).
  return k


def parse_compiler_options(text: str, field: str = "config.compile") -> dict[str, str]:
  """`"name=value,name=value"` as a dict (`""`: none); `UserError` naming `field` if an
  item is empty or not name=value. Whether XLA knows each name and takes its value is
  `compiling.check_options`'s to say (it needs XLA)."""
  options = {}
  if not text.strip():
    return options
  for item in (part.strip() for part in text.split(",")):
    if not item:
      raise UserError(f"{field}={text!r} has an empty item (two commas in a row, or one at an"
                      " end); separate its name=value options by single commas.")
    name, equals, value = item.partition("=")
    if not equals or not name.strip() or not value.strip() or " " in name.strip():
      raise UserError(f"{field}={text!r}: {item!r} is not name=value; pass XLA options such as"
                      f" {field}=xla_gpu_autotune_level=0 (several separated by commas).")
    options[name.strip().lstrip("-")] = value.strip()
  return options


def _suggest(name: str, options) -> str:
  close = difflib.get_close_matches(name, list(options), n=1)
  return f" Did you mean {close[0]!r}?" if close else ""


_BOOL_TEXT = {"true": True, "t": True, "1": True, "false": False, "f": False, "0": False}
# How an error names the type a field takes (also the command line's, commands.cli).
TYPE_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def parse_as(default, text: str):
  """`text` as a value of `default`'s type, as `--config.<field>=` and `--sweep` read it
  (booleans: true/false, t/f, 1/0). Raises `ValueError` naming what it takes."""
  kind = type(default)
  if kind is bool:
    if text.lower() not in _BOOL_TEXT:
      raise ValueError(f"{text!r} is not {TYPE_NAMES[bool]}")
    return _BOOL_TEXT[text.lower()]
  try:
    return kind(text)
  except ValueError:
    raise ValueError(f"{text!r} is not {TYPE_NAMES.get(kind, kind.__name__)}") from None


def _check_types(config: ml_collections.ConfigDict, base: ml_collections.ConfigDict) -> None:
  """Every field holds the base config's type (an int where a float is expected is fine)."""
  for section in base:
    for key, default in base[section].items():
      value = config[section].get(key, default)
      kind = type(default)
      if isinstance(value, bool) and kind is not bool:
        ok = False  # bool is an int subclass, but True is no layer count.
      else:
        ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
      if not ok:
        raise UserError(f"config.{section}.{key}={value!r} is a {type(value).__name__}; it takes"
                        f" {TYPE_NAMES.get(kind, kind.__name__)} (default {default!r}).")


def check_structure(config, where: str = "the config") -> None:
  """Raises `UserError` unless `config` is a ConfigDict with every section and field."""
  fix = "start get_config() from seq2seq.config.base_config() and change what you need."
  if not isinstance(config, ml_collections.ConfigDict):
    raise UserError(f"{where} is of type {type(config).__name__!r}, not an"
                    f" ml_collections.ConfigDict; {fix}")
  base = base_config()
  missing = [name for name in base.keys() if not isinstance(config.get(name), type(base[name]))]
  missing += [f"{section}.{key}" for section in base.keys() if section not in missing
              for key in base[section].keys() if key not in config[section]]
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise UserError(f"{where} lacks config.{missing[0]}{more}; {fix}")


def _check_ranges(config: ml_collections.ConfigDict) -> None:
  """Every field that must be positive, or not negative, is."""
  m, d, t, e = config.model, config.data, config.train, config.eval
  positive = {
      "model.emb_dim": m.emb_dim, "model.num_heads": m.num_heads,
      "model.num_encoder_layers": m.num_encoder_layers,
      "model.num_decoder_layers": m.num_decoder_layers, "model.mlp_dim": m.mlp_dim,
      "model.max_len": m.max_len, "model.attention_window": m.attention_window,
      "model.max_relative_distance": m.max_relative_distance,
      "model.attention_globals": m.attention_globals,
      "model.rnn_hidden_dim": m.rnn_hidden_dim, "data.vocab_size": d.vocab_size,
      "data.max_len": d.max_len,
      "data.tokens_per_batch": d.tokens_per_batch, "data.bucket_step": d.bucket_step,
      "train.num_steps": t.num_steps,
      "train.grad_accum_steps": t.grad_accum_steps, "train.steps_per_call": t.steps_per_call,
      "train.log_every_steps": t.log_every_steps, "eval.every_steps": e.every_steps,
      "eval.batch_size": e.batch_size, "eval.beam_size": e.beam_size,
      "checkpoint.keep": config.checkpoint.keep,
  }
  for name, value in positive.items():
    if not value > 0:
      raise UserError(f"config.{name}={value} must be positive.")
  non_negative = {
      "data.max_train_examples": d.max_train_examples, "data.num_buckets": d.num_buckets,
      "train.warmup_steps": t.warmup_steps, "train.learning_rate": t.learning_rate,
      "train.adam_eps": t.adam_eps, "train.weight_decay": t.weight_decay,
      "train.clip_norm": t.clip_norm, "train.patience": t.patience,
      "eval.max_sentences": e.max_sentences, "model.num_kv_heads": m.num_kv_heads,
      "eval.alpha": e.alpha, "eval.max_decode_len_a": e.max_decode_len_a,
      "eval.max_decode_len_b": e.max_decode_len_b, "eval.test_beam_size": e.test_beam_size,
      "compile.threads": config.compile.threads, "data.subword_sampling": d.subword_sampling,
  }
  for name, value in non_negative.items():
    if not value >= 0:  # Also NaN, which no comparison holds for.
      raise UserError(f"config.{name}={value} " + ("must not be negative." if value < 0 else
                                                   "is not a number; give one of 0 or more."))
  if not m.entmax_alpha > 1.0:
    raise UserError(f"config.model.entmax_alpha={m.entmax_alpha} must be above 1 (1.5: entmax15,"
                    " 2: sparsemax).")
  if not 2 <= d.subword_nbest <= 512:  # SentencePiece's n-best range (data.subword_sampling).
    raise UserError(f"config.data.subword_nbest={d.subword_nbest} is out of range; sample among"
                    " the 2 to 512 best segmentations.")
  if not 0 <= t.seed < 2**32:  # SentencePiece takes an unsigned 32-bit seed.
    raise UserError(f"config.train.seed={t.seed} is out of range; use 0 to {2**32 - 1}.")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises `UserError` naming the first bad field and how to fix it: sections, fields,
  types, ranges and choices. What the model family can build is `models.check_config`'s."""
  check_structure(config)
  base = base_config()
  for section in config.keys():
    if section not in base:
      raise UserError(f"Unknown config section {section!r}.{_suggest(section, base.keys())}"
                      f" Valid sections: {', '.join(base.keys())}.")
    for key in config[section].keys():
      if key not in base[section]:
        raise UserError(f"Unknown config field {section}.{key}."
                        f"{_suggest(key, base[section].keys())}")
  _check_types(config, base)
  m, d, t, e = config.model, config.data, config.train, config.eval
  _check_ranges(config)
  for name in ("adam_b1", "adam_b2"):
    if not 0.0 <= t[name] < 1.0:
      raise UserError(f"config.train.{name}={t[name]} must be in [0, 1).")
  if e.split not in ("train", "val", "test"):
    raise UserError(f"config.eval.split={e.split!r} is not a split; use one of: train, val,"
                    " test.")
  if e.max_decode_len_a == 0 and e.max_decode_len_b == 0:
    raise UserError("config.eval.max_decode_len_a and max_decode_len_b are both 0, so nothing"
                    " would be decoded; make one of them positive.")
  for name in ("train_options", "eval_options"):
    parse_compiler_options(config.compile[name], f"config.compile.{name}")
  if t.dtype not in ("float32", "bfloat16"):
    raise UserError(f"config.train.dtype={t.dtype!r} is not supported; use float32 or bfloat16.")
  if t.schedule not in SCHEDULES:
    raise UserError(f"config.train.schedule={t.schedule!r} is not a schedule; use one"
                    f" of: {', '.join(SCHEDULES)}.")
  if m.rnn_cell not in RNN_CELLS:
    raise UserError(f"config.model.rnn_cell={m.rnn_cell!r} is not a cell; use one of:"
                    f" {', '.join(RNN_CELLS)}.")
  if m.rnn_query_state not in RNN_QUERY_STATES:
    raise UserError(f"config.model.rnn_query_state={m.rnn_query_state!r} is not a choice; use"
                    f" one of: {', '.join(RNN_QUERY_STATES)}.")
  for name in ("dropout_rate", "attention_dropout_rate"):
    if not 0.0 <= m[name] < 1.0:
      raise UserError(f"config.model.{name}={m[name]} must be in [0, 1).")
  if not 0.0 <= t.label_smoothing < 1.0:
    raise UserError(f"config.train.label_smoothing={t.label_smoothing} must be in [0, 1).")
  padded = -(-d.max_len // d.bucket_step) * d.bucket_step
  if padded > m.max_len:
    raise UserError(f"config.data.max_len={d.max_len} pads to {padded} tokens, more than"
                    f" config.model.max_len={m.max_len}; raise model.max_len.")
  if d.src_lang == d.tgt_lang:
    raise UserError(f"config.data.src_lang and tgt_lang are both {d.src_lang!r};"
                    " choose two different languages.")


def to_json(config: ml_collections.ConfigDict) -> str:
  return json.dumps(config.to_dict(), indent=2, sort_keys=True)


def copied(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A deep copy of `config` to change (a sweep's point, a seed group's member): the config
  its saved JSON reads back as, which is what the run it describes will save."""
  return from_json(to_json(config))


# A saved config that lacks a field was trained as with this value of it, where that is not
# the field's default; a lacking field not listed here computes what its default computes.
BEFORE_FIELD = {("data", "num_buckets"): 0}


def from_json(text: str) -> ml_collections.ConfigDict:
  """A saved run config over the base config: fields the saved config lacks take their
  defaults (or `BEFORE_FIELD`'s value, where the default computes something else)."""
  return from_saved(json.loads(text))


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """`from_json` of the parsed JSON."""
  config = base_config()
  for (section, key), value in BEFORE_FIELD.items():
    if key not in saved.get(section, {}):
      config[section][key] = value
  for section, values in saved.items():
    if section not in config:
      config[section] = values
      continue
    for key, value in values.items():
      config[section][key] = value
  return config
