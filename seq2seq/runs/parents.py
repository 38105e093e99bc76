"""Starting a run from a parent run (config.train.init_from): what a new run takes from the
parent's checkpoint, checked before anything compiles, and the train state built from it.

By default only the parameters come from the parent; the optimizer state, the learning-rate
schedule, the step counter, the data order and the best-checkpoint record start fresh
(fairseq's --finetune-from-model). config.train.init_keep keeps the optimizer state
("optimizer": Adam's moments and their count) and/or the step ("step": the step counter, and
with it the schedule's position and the data order's: the run trains on from that step to
config.train.num_steps). config.train.init_fresh, a regex on parameter names, leaves those it
matches freshly initialized: neither checked nor loaded (big_vision's dont_load). The new run
takes the parent's vocabulary (`vocabulary.source`), and its workdir records the parent in
parent.json. A run with a checkpoint of its own resumes from it and never reads the parent.
"""

import functools
import json
import logging
import re
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
import orbax.checkpoint as ocp

from seq2seq.data import tokenizer
from seq2seq.data.textio import write_atomically
from seq2seq.errors import UserError
from seq2seq.runs import match, released, vocabulary, workdirs
from seq2seq.runs.checkpoints import CheckpointRemoved, Checkpoints, read_again_if_removed
from seq2seq.runs.selection import selected_checkpoint
from seq2seq.runs.train_state import TrainState, initial_state

log = logging.getLogger("seq2seq")
KEEPS = ("optimizer", "step")  # What config.train.init_keep may name.
SHOWN = 3  # The mismatched leaves a refusal names (then how many in all).
_UNSET = (("init_checkpoint", "best"), ("init_keep", ""), ("init_fresh", ""))


class Parent(NamedTuple):
  """A checked parent: its workdir, config.train.init_checkpoint, the steps that names (several
  are averaged) and the names (`match.leaf_name`) of the run's state leaves taken from it."""
  workdir: Path
  checkpoint: str
  steps: list[int]
  loads: tuple[str, ...]


def keeps(t: ml_collections.ConfigDict) -> set[str]:
  """What config.train.init_keep names (`UserError` for anything but KEEPS)."""
  items = {item.strip() for item in t.init_keep.split(",")} if t.init_keep.strip() else set()
  for item in sorted(items - set(KEEPS)):
    raise UserError(f"config.train.init_keep={t.init_keep!r}: {item!r} is not something a run"
                    " keeps from its parent; use optimizer, step or optimizer,step.")
  return items


def check_fields(config: ml_collections.ConfigDict) -> None:
  """Raises `UserError` in one line for a bad init_checkpoint, init_keep or init_fresh, or one
  set without config.train.init_from."""
  t = config.train
  if not t.init_from:
    for name, default in _UNSET:
      if t[name] != default:
        raise UserError(f"config.train.{name}={t[name]!r} is for a run started from another,"
                        " and config.train.init_from is empty; pass"
                        f" --config.train.init_from=PARENT_WORKDIR, or drop {name}.")
    return
  spec = t.init_checkpoint
  if not (spec in ("best", "latest", "selected") or spec.isdigit()
          or (spec.startswith("avg:") and spec[4:].isdigit() and int(spec[4:]) > 0)):
    raise UserError(f"config.train.init_checkpoint={spec!r} names no checkpoint; use best,"
                    " latest, selected, avg:N or a step number.")
  keeps(t)
  try:
    re.compile(t.init_fresh)
  except re.error as e:
    raise UserError(f"config.train.init_fresh={t.init_fresh!r} is not a regular expression"
                    f" ({e}); e.g. logits_dense|decoder_layers.3") from None


def of(config: ml_collections.ConfigDict, workdir: Path,
       latest: int | None) -> Parent | None:
  """The parent that the new run in `workdir` starts from: None without
  config.train.init_from, or once the run has a checkpoint (`latest`). Checks, before anything
  compiles, that the parent is a run, names the checkpoint, has the vocabulary this config asks
  for, and fits this config's model where it loads (`UserError` in one line otherwise)."""
  if not config.train.init_from or latest is not None:
    return None
  parent = Path(config.train.init_from)
  _check_is_run(parent, workdir)
  if released.is_released(parent) and "optimizer" in keeps(config.train):
    raise UserError(f"config.train.init_from={parent} is a released model, which holds no"
                    f" optimizer state; drop optimizer from config.train.init_keep="
                    f"{config.train.init_keep}, or start from the run it was released from.")

  def inspect():  # The parent's chosen steps, checked; chosen again if training removes one.
    checkpoints = Checkpoints(parent, config.checkpoint.keep)
    try:
      steps = _resolve(checkpoints, parent, config.train.init_checkpoint)
      pieces = _check_vocabulary(config, parent, workdir, checkpoints, steps)
      abstract = jax.eval_shape(lambda: initial_state(config, pieces, seed=0))
      _check_fresh_matches(abstract, config.train)
      loads = _loads(abstract, config.train, released.is_released(parent))
      for step in steps:
        saved = checkpoints.guarded(step, functools.partial(checkpoints.shapes, step))
        _check_fit(parent, step, saved, abstract, loads, config.train)
    finally:
      checkpoints.close()
    return steps, loads

  steps, loads = read_again_if_removed(inspect, _field(config.train))
  if "step" in keeps(config.train) and steps[-1] >= config.train.num_steps:
    raise UserError(f"config.train.init_keep={config.train.init_keep}: the parent's checkpoint is"
                    f" at step {steps[-1]}, and config.train.num_steps={config.train.num_steps}"
                    " leaves nothing to train; pass a larger --config.train.num_steps (the run"
                    f" trains on from step {steps[-1]} to it).")
  return Parent(parent.resolve(), config.train.init_checkpoint, steps, tuple(loads))


def _check_is_run(parent: Path, workdir: Path) -> None:
  field = f"config.train.init_from={parent}"
  if parent.resolve() == Path(workdir).resolve():
    raise UserError(f"{field} is this run's own workdir; pass another run's, or drop init_from"
                    " to resume this one.")
  if not parent.exists():
    run, colon, spec = str(parent).rpartition(":")
    if colon and Path(run).is_dir():  # RUN:100, as seq2seq-evaluate's ensembles name steps.
      raise UserError(f"{field} does not exist, and {run} does: a checkpoint of the parent is"
                      f" chosen apart, --config.train.init_from={run}"
                      f" --config.train.init_checkpoint={spec}.")
    raise UserError(f"{field} does not exist; pass the workdir of a trained run.")
  if not (parent / workdirs.CONFIG).is_file() or not (parent / workdirs.CHECKPOINTS).is_dir():
    raise UserError(f"{field} is not a trained run (no {workdirs.CONFIG} and"
                    f" {workdirs.CHECKPOINTS}/); pass the workdir of one.")


def _resolve(checkpoints: Checkpoints, parent: Path, spec: str) -> list[int]:
  """The parent's steps that `spec` names, its refusals said of config.train.init_checkpoint."""
  if spec == "selected":  # Its refusal names seq2seq-evaluate's --checkpoint, as it is.
    spec = selected_checkpoint(parent, f"config.train.init_from={parent}: its"
                               " config.train.init_checkpoint")
  try:
    return checkpoints.resolve(spec)
  except UserError as e:
    raise UserError(str(e).replace("--checkpoint=", "config.train.init_checkpoint=")) from None


def _check_vocabulary(config, parent: Path, workdir: Path, checkpoints: Checkpoints,
                      steps: list[int]) -> int:
  """Refuses a config that asks for another vocabulary than the parent's (another
  data.vocab_size, data.vocab_from of another vocabulary, or one already in `workdir`), or a
  parent whose vocabulary is not its checkpoints'; returns the parent's number of pieces."""
  vocab = parent / workdirs.VOCAB
  vocabulary.check_source(parent, config.data, "config.train.init_from")
  if not vocab.is_file():
    raise UserError(f"config.train.init_from={parent}: {vocab} is missing; put it back from a"
                    " copy of the run.")
  for step in steps:
    checkpoints.guarded(step, functools.partial(checkpoints.check_vocab, step))
  ours = tokenizer.fingerprint(vocab)
  vocab_from = config.data.vocab_from and Path(config.data.vocab_from) / workdirs.VOCAB
  for other, what in ((vocab_from, f"config.data.vocab_from={config.data.vocab_from}"),
                      (Path(workdir) / workdirs.VOCAB, f"{workdir / workdirs.VOCAB}")):
    if other and Path(other).is_file() and tokenizer.fingerprint(other) != ours:
      raise UserError(f"{what} is another vocabulary than the parent's"
                      f" (config.train.init_from={parent}), and a run started from a parent"
                      " takes the parent's; drop vocab_from, or pass a new --workdir.")
  return match.vocab_size(vocab)


def _leaves(tree) -> dict[str, object]:
  """{name: leaf} of a pytree, named as `match.flat_shapes` names a checkpoint's."""
  return {match.leaf_name(path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _schedule_leaves(state) -> set[str]:
  """The names of the optimizer state's schedule counts (the learning rate's position)."""
  is_schedule = lambda node: isinstance(node, optax.ScaleByScheduleState)  # noqa: E731
  found = set()
  for path, node in jax.tree_util.tree_flatten_with_path(state, is_leaf=is_schedule)[0]:
    if is_schedule(node):
      found |= {match.leaf_name((*path, *inner))
                for inner, _ in jax.tree_util.tree_flatten_with_path(node)[0]}
  return found


def _check_fresh_matches(abstract: TrainState, t: ml_collections.ConfigDict) -> None:
  """Refuses a config.train.init_fresh that matches none of this run's parameters: it would
  leave nothing fresh, and parent.json would record it as if it had."""
  names = [name.removeprefix("params.") for name in _leaves(abstract.params)]
  if t.init_fresh and not any(re.search(t.init_fresh, name) for name in names):
    parts = [name.split(".") for name in names]
    examples = ", ".join(sorted({p[0] + (f".{p[1]}" if len(p) > 1 and p[1].isdigit() else "")
                                 for p in parts}))
    raise UserError(f"config.train.init_fresh={t.init_fresh!r} matches none of this run's"
                    f" parameters, so it would leave none fresh; give a regex on their names"
                    f" (such as {examples}), or drop it.")


def _loads(abstract: TrainState, t: ml_collections.ConfigDict,
           from_release: bool = False) -> list[str]:
  """The leaves of the state taken from the parent: the parameters not matching
  config.train.init_fresh, and what config.train.init_keep keeps (the optimizer's leaves of
  the fresh parameters excepted). A released parent holds no optimizer state: keeping its
  step keeps the step alone, and `start` sets the schedule's counts to it."""
  keep, schedule = keeps(t), _schedule_leaves(abstract)
  fresh = {name for name in _leaves(abstract.params) if t.init_fresh
           and re.search(t.init_fresh, name)}
  loads = []
  for name in _leaves(abstract):
    if name == "step" or name in schedule:
      wanted = "step" in keep and not (from_release and name in schedule)
    elif name.startswith("params."):
      wanted = name.removeprefix("params.") not in fresh
    else:
      wanted = "optimizer" in keep and not any(name.endswith(f".{p}") for p in fresh)
    if wanted:
      loads.append(name)
  return loads


def _check_fit(parent: Path, step: int, saved_tree: dict, abstract, loads: list[str],
               t: ml_collections.ConfigDict) -> None:
  """Refuses in one line leaves to load that the checkpoint at `step` lacks or holds in
  another shape, and (not matching config.train.init_fresh) parameters it alone has."""
  saved, ours = match.flat_shapes(saved_tree), _leaves(abstract)
  differ = []
  for name in loads:
    shape = tuple(ours[name].shape)
    if name not in saved:
      differ.append((name, f"{name.removeprefix('params.')} is only in this run"))
    elif saved[name] != shape:
      differ.append((name, f"{name.removeprefix('params.')} is {saved[name]} in the parent but"
                           f" {shape} here"))
  differ += [(name, f"{name.removeprefix('params.')} is only in the parent") for name in saved
             if name.startswith("params.") and name not in ours
             and not (t.init_fresh and re.search(t.init_fresh, name.removeprefix("params.")))]
  params = [text for name, text in differ if name.startswith("params.")]
  others = [text for name, text in differ if not name.startswith("params.")]
  where = f"config.train.init_from={parent}: the checkpoint at step {step}"
  if params:
    raise UserError(f"{where} does not fit this run's model ({_listed(params, 'parameter')});"
                    " give this run the parent's config.model, or leave those parameters"
                    " freshly initialized with --config.train.init_fresh=REGEX (a regex on"
                    " their names).")
  if others:
    raise UserError(f"{where} holds an optimizer state that does not fit this run's"
                    f" ({_listed(others, 'leaf')}); give this run the parent's optimizer"
                    " fields (config.train.clip_norm), or drop optimizer from"
                    f" config.train.init_keep={t.init_keep}.")


def _listed(texts: list[str], noun: str) -> str:
  plural = "leaves" if noun == "leaf" else f"{noun}s"
  more = f"; and {len(texts) - SHOWN} more" if len(texts) > SHOWN else ""
  return (f"{len(texts)} {noun if len(texts) == 1 else plural} differ: "
          + "; ".join(texts[:SHOWN]) + more)


def starter(trainer, parent: Parent | None, run_dirs: list[Path]):
  """What makes a new run's state: `trainer.new_state`, or from `parent` (`start`). `trainer`
  is training's `Trainer` (or a seed group's), read for its config and its state's shapes."""
  if parent is None:
    return trainer.new_state
  return functools.partial(start, trainer, parent, run_dirs)


def start(trainer, parent: Parent, run_dirs: list[Path]) -> TrainState:
  """`trainer.new_state()` (one run's, or a seed group's) with the leaves `parent.loads` from
  the parent's checkpoint: averaged over several steps (floats; integers are the last
  step's). Sets `trainer.start_step` where the step is kept, and writes parent.json in each
  of `run_dirs` (process 0)."""
  like = _leaves(trainer.run_abstract)
  wanted = {name: like[name] for name in parent.loads}
  # The steps `of` chose, unless the parent's training has rotated one away since: then the
  # same config.train.init_checkpoint chooses again among those on disk (the same run's
  # checkpoints, so the same shapes).
  chosen = [parent.steps]

  def read():
    try:
      return _read(parent._replace(steps=chosen[0]), wanted)
    except CheckpointRemoved:
      chosen[0] = _chosen_again(parent, trainer.config)
      raise

  loaded = read_again_if_removed(read, _field(trainer.config.train))
  parent = parent._replace(steps=chosen[0])
  if "step" in parent.loads and released.is_released(parent.workdir):
    # Its schedule goes on from the release's step, as a run's from its checkpoint's.
    for name in _schedule_leaves(trainer.run_abstract):
      loaded[name] = loaded["step"]
  state = jax.jit(_merged, out_shardings=trainer.state_sharding, donate_argnums=0)(
      trainer.new_state(), loaded)
  if "step" in keeps(trainer.config.train):
    trainer.start_step = parent.steps[-1]
  if jax.process_index() == 0:
    record = {"workdir": str(parent.workdir), "checkpoint": parent.checkpoint,
              "step": parent.steps[-1], "steps": parent.steps,
              "keep": sorted(keeps(trainer.config.train)),
              "fresh": trainer.config.train.init_fresh}
    for run_dir in run_dirs:
      write_atomically(Path(run_dir) / workdirs.PARENT, json.dumps(record, indent=2) + "\n")
  params = sum(name.startswith("params.") for name in parent.loads)
  log.info("Starting from %s, checkpoint %s (step %s): %d of %d parameter arrays%s%s.",
           parent.workdir, parent.checkpoint, ", ".join(map(str, parent.steps)), params,
           len(jax.tree.leaves(trainer.run_abstract.params)),
           ", the optimizer state" if "optimizer" in keeps(trainer.config.train) else "",
           ", the step" if "step" in keeps(trainer.config.train) else "")
  return state


def _merged(fresh, loaded: dict):
  """`fresh` with the leaves `loaded` names replaced (broadcast over a seed group's axis)."""
  def take(path, leaf):
    value = loaded.get(match.leaf_name(path))
    return leaf if value is None else jnp.broadcast_to(value, leaf.shape).astype(leaf.dtype)
  return jax.tree_util.tree_map_with_path(take, fresh)


def _field(t: ml_collections.ConfigDict) -> str:
  return f"config.train.init_checkpoint={t.init_checkpoint} of {t.init_from}"


def _chosen_again(parent: Parent, config: ml_collections.ConfigDict) -> list[int]:
  """The steps the parent's checkpoint spec names now."""
  checkpoints = Checkpoints(parent.workdir, config.checkpoint.keep)
  try:
    return _resolve(checkpoints, parent.workdir, parent.checkpoint)
  finally:
    checkpoints.close()


def _read(parent: Parent, like: dict) -> dict:
  """The leaves `like` names ({name: ShapeDtypeStruct with its sharding}) of the parent's
  steps, read alone (the others are not read), averaged where several; a step that the
  parent's training removes meanwhile is `CheckpointRemoved` (`Checkpoints.guarded`)."""
  checkpoints = Checkpoints(parent.workdir, 1)
  try:
    return _averaged(parent, like, checkpoints)
  finally:
    checkpoints.close()


def _averaged(parent: Parent, like: dict, checkpoints: Checkpoints) -> dict:
  total = {}
  for step in parent.steps:
    path = parent.workdir / workdirs.CHECKPOINTS / str(step) / "default"
    handler = ocp.PyTreeCheckpointHandler()

    def restore(path=path, handler=handler):
      metadata = dict(ocp.StandardCheckpointHandler().metadata(path))
      target = jax.tree_util.tree_map_with_path(
          lambda p, _: like.get(match.leaf_name(p), ocp.PLACEHOLDER), metadata)
      args = jax.tree.map(lambda x: x if x is ocp.PLACEHOLDER else ocp.ArrayRestoreArgs(
          sharding=x.sharding, global_shape=x.shape, dtype=x.dtype), target)
      return _leaves(handler.restore(path, args=ocp.args.PyTreeRestore(target, args)))
    try:
      read = checkpoints.guarded(step, restore)
    finally:
      handler.close()
    for name in like:
      value = read[name]
      floating = jnp.issubdtype(value.dtype, jnp.floating)
      total[name] = total[name] + value if floating and name in total else value
  return {name: value / len(parent.steps) if jnp.issubdtype(value.dtype, jnp.floating)
          and len(parent.steps) > 1 else value for name, value in total.items()}
