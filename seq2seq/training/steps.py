"""The loss and the pure step functions the trainer jits: one optimizer step, one validation loss.

The model crosses the jit boundary as `nnx.split` state (`graphdef` is static, the parameters
are traced), so each step is a pure function of its arguments.
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from seq2seq.data.special_ids import PAD_ID
from seq2seq.registry import Registry
from seq2seq.runs.train_state import TrainState


def cross_entropy(logits, targets, label_smoothing: float):
  """Summed label-smoothed loss and NLL over non-PAD targets, from one log-normalizer.

  Smoothing mixes the one-hot target with the uniform distribution, so the
  smoothed cross-entropy of a token is `(1 - eps) * nll + eps * mean_v(-log p_v)`.
  With `log p_v = z_v - lse(z)` both terms need only `lse(z)`, the target's logit
  and the mean logit: no `[tokens, vocab]` one-hot and no second softmax.

  Args:
    logits: `[batch, t, vocab]` (computed in float32).
    targets: `[batch, t]` ids, PAD_ID where there is no target.

  Returns:
    dict of sums: `loss` (smoothed), `nll` (unsmoothed), `tokens` (count).
  """
  logits = logits.astype(jnp.float32)
  weights = (targets != PAD_ID).astype(jnp.float32)
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)  # [batch, t]
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = log_normalizer - target_logit
  loss = nll
  if label_smoothing:
    uniform = log_normalizer - jnp.mean(logits, axis=-1)  # mean_v(-log p_v)
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  return {"loss": jnp.sum(loss * weights), "nll": jnp.sum(nll * weights),
          "tokens": jnp.sum(weights)}


def _packing(batch: dict, side: str) -> dict:
  """The segment ids and positions of a packed batch's `side` ("src" or "tgt"), if any."""
  return {name: batch[f"{side}_{name}"] for name in ("segments", "positions")
          if f"{side}_{name}" in batch}


# The loss terms that config.train.loss_terms adds to the cross-entropy, by name, each times
# its weight there ("z_loss:1e-4"): `term(logits, targets, weights, params)` -> the term summed
# over the batch's target tokens (`weights`: 1.0 at each, 0.0 at PAD), as the cross-entropy's
# `loss` is, so that the objective is their total over the token count; the train record logs
# each per token under its name. Registered with `@register_loss_term(name)`
# (docs/extending.md, "A loss term"); a name may not be one of the train record's own.
LOSS_TERMS = Registry("loss term", "config.train.loss_terms", "z_loss:1e-4", weighted=True,
                      reserved=("step", "split", "loss", "nll", "tokens", "grad_norm",
                                "learning_rate", "tokens_per_sec", "tokens_per_step"))
register_loss_term = LOSS_TERMS.register


@register_loss_term("z_loss")
def z_loss(logits, targets, weights, params):
  """PaLM's auxiliary z-loss (Chowdhery et al., 2022, section 5): the square of each target
  token's log-normalizer `log Z = logsumexp(logits)`, summed over the target tokens. It draws
  log Z towards 0, which keeps the logits stable (PaLM weighs it 1e-4: "z_loss:1e-4")."""
  del targets, params
  log_normalizer = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)  # [batch, t]
  return jnp.sum(jnp.square(log_normalizer) * weights)


def loss_terms(logits, targets, params, train: ml_collections.ConfigDict) -> dict:
  """The weighted terms that config.train.loss_terms (`train.loss_terms`) chooses, by name:
  sums over the non-PAD `targets`, as `cross_entropy`'s are. None by default."""
  chosen = LOSS_TERMS.chosen(train.loss_terms)
  if not chosen:
    return {}
  weights = (targets != PAD_ID).astype(jnp.float32)
  return {name: weight * LOSS_TERMS[name](logits, targets, weights, params)
          for name, weight in chosen.items()}


def train_step(state: TrainState, batch: dict, dropout_key, *, graphdef, optimizer,
               train: ml_collections.ConfigDict):
  """One optimizer step on a global batch: `(state, batch, key) -> (state, metrics)`, with
  the settings of `train` (config.train): `label_smoothing`, `grad_accum_steps` and
  `loss_terms` (the objective is the cross-entropy plus those terms, each in the metrics).

  The gradient is that of the token-summed loss divided by the batch's token
  count. With `grad_accum_steps` k > 1, rows i, i + k, i + 2k, ... form micro-batch
  i (so every device holds a share of each); their summed gradients give the
  same update as the whole batch at once, in about 1/k of the activation memory.
  """
  # Folding in the step makes dropout a function of the step: resume is exact.
  step_key = jax.random.fold_in(dropout_key, state.step)
  grads, sums = _summed_grads(state.params, batch, step_key, graphdef=graphdef, train=train)
  grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums, grad_norm=optax.tree.norm(grads))
  return TrainState(state.step + 1, params, opt_state), metrics


def _objective(params, batch: dict, key, *, graphdef, train: ml_collections.ConfigDict):
  """The objective of a (micro-)batch, summed over its target tokens, with dropout from
  `key`: the cross-entropy plus the loss terms; and the sums for the metrics (each term's)."""
  model = nnx.merge(graphdef, params)
  rngs = nnx.Rngs(dropout=key)
  memory = model.encode(batch["src"], **_packing(batch, "src"), rngs=rngs)
  logits = model.decode(memory, batch["tgt_in"], **_packing(batch, "tgt"), rngs=rngs)
  sums = cross_entropy(logits, batch["tgt_out"], train.label_smoothing)
  objective = sums["loss"]
  for name, term in loss_terms(logits, batch["tgt_out"], params, train).items():
    sums[name] = term
    objective = objective + term
  return objective, sums


def _summed_grads(params, batch: dict, key, *, graphdef, train: ml_collections.ConfigDict):
  """The gradient of `batch`'s token-summed objective and its sums: `(grads, sums)`. With
  `grad_accum_steps` k > 1, micro-batch i (rows i::k) draws dropout from `key` folded with i,
  and their gradients and sums add up."""
  value_and_grad = jax.value_and_grad(
      functools.partial(_objective, graphdef=graphdef, train=train), has_aux=True)

  def summed_grads(micro_batch, key):
    (_, sums), grads = value_and_grad(params, micro_batch, key)
    return grads, sums

  accum_steps = train.grad_accum_steps
  if accum_steps == 1:
    return summed_grads(batch, key)
  # [rows, ...] -> [k, rows / k, ...] with micro-batch i = rows i::k.
  micro = jax.tree.map(lambda x: x.reshape(-1, accum_steps, *x.shape[1:]).swapaxes(0, 1),
                       batch)

  def accumulate(total, xs):
    i, micro_batch = xs
    part = summed_grads(micro_batch, jax.random.fold_in(key, i))
    return jax.tree.map(jnp.add, total, part), None

  first = jax.tree.map(lambda x: x[0], micro)
  zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                       jax.eval_shape(summed_grads, first, key))
  (grads, sums), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro))
  return grads, sums


def train_steps(state: TrainState, batches: dict, dropout_key, **train_step_kwargs):
  """`train_step` on each of k stacked batches (`[k, rows, L]`), one after the other, in one
  program: `(state, batches, key) -> (state, metrics stacked [k])`. Step i's update is the
  one `train_step` makes alone, dropout included (its key folds in the state's step)."""
  def step(state, batch):
    return train_step(state, batch, dropout_key, **train_step_kwargs)

  return jax.lax.scan(step, state, batches)


def eval_step(params, batch, *, graphdef):
  """Summed NLL and token count of a batch, without dropout or smoothing."""
  model = nnx.merge(graphdef, params)
  memory = model.encode(batch["src"], **_packing(batch, "src"))
  logits = model.decode(memory, batch["tgt_in"], **_packing(batch, "tgt"))
  return cross_entropy(logits, batch["tgt_out"], 0.0)
