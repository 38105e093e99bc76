"""The train state and its optimizer: what a checkpoint holds, and how it is updated.

It lives with the runs, below training, because reading a checkpoint needs its structure:
choosing and averaging checkpoints (`runs.selection`) restores one without the trainer.
"""

import flax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from seq2seq.models import build_model


@flax.struct.dataclass
class TrainState:
  step: jnp.ndarray  # scalar int32: optimizer steps taken
  params: nnx.State
  opt_state: optax.OptState


def new_train_state(params: nnx.State, optimizer: optax.GradientTransformation) -> TrainState:
  """Step 0: the given parameters and a fresh optimizer state."""
  return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def initial_state(config: ml_collections.ConfigDict, vocab_size: int, seed,
                  optimizer: optax.GradientTransformation | None = None) -> TrainState:
  """A new run's train state: the model of `config` initialized from `seed` (an int, or a
  key), and a fresh state of `optimizer` (by default `make_optimizer(config.train)`)."""
  model = build_model(config, vocab_size, seed=seed)
  return new_train_state(nnx.split(model, nnx.Param)[1],
                         optimizer or make_optimizer(config.train))


def learning_rate_schedule(t: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to `t.learning_rate`, then the decay `t.schedule` names (one of
  `config.SCHEDULES`)."""
  warmup = optax.linear_schedule(0.0, t.learning_rate, t.warmup_steps)
  decay_steps = max(t.num_steps - t.warmup_steps, 1)
  if t.schedule == "linear":
    decay = optax.linear_schedule(t.learning_rate, 0.0, decay_steps)
  elif t.schedule == "cosine":
    decay = optax.cosine_decay_schedule(t.learning_rate, decay_steps)
  else:
    def decay(steps_after_warmup):
      # join_schedules evaluates this before the boundary too (negative steps): keep it finite.
      elapsed = jnp.maximum(t.warmup_steps + steps_after_warmup, 1)
      return t.learning_rate * jnp.sqrt(jnp.maximum(t.warmup_steps, 1) / elapsed)

  return optax.join_schedules([warmup, decay], [t.warmup_steps])


def make_optimizer(t: ml_collections.ConfigDict) -> optax.GradientTransformation:
  adam = optax.adamw(learning_rate_schedule(t), b1=t.adam_b1, b2=t.adam_b2, eps=t.adam_eps,
                     weight_decay=t.weight_decay)
  return optax.chain(optax.clip_by_global_norm(t.clip_norm), adam) if t.clip_norm else adam
