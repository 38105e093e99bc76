"""Several seeds' runs trained as one program (a seed group), the seed axis's one module.

`SeedGroup` is a `Trainer` whose train programs run the one run's step (`jax.vmap`) over the
members' states, batches and dropout keys stacked; member i is the run of seed seeds[i].
`Members` fans each step's actions out to the members' own `RunActions`. The driver is the
one run's (`loop`); each member is an ordinary run in its workdir. A wrapper, not every run a
group of one: one run's programs stay those of one run, and its reader meets no seed axis.
"""

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from seq2seq import config as config_lib
from seq2seq.data.batching import stack
from seq2seq.errors import UserError
from seq2seq.runs import parents, vocabulary
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.claim import Claim, claim_each, restore_together, writing_in
from seq2seq.runs.full_disk import write_fault_is_user_error
from seq2seq.runs.train_state import TrainState
from seq2seq.runtime import distributed
from seq2seq.training import actions, loop
from seq2seq.training.reports import CompileLog, Progress
from seq2seq.training.trainer import Trainer

log = logging.getLogger("seq2seq")


def _with_seed(config: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
  """A copy of `config` with config.train.seed `seed`: a member's own run."""
  member = config_lib.copied(config)
  member.train.seed = seed
  return member


def _stacked(*trees):
  """Pytrees of one structure (the members' states) stacked on a new leading axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


class SeedGroup(Trainer):
  """The `Trainer` of a seed group: every train program input gains a leading axis of members,
  never split over devices. Validation's programs are one member's (`run_abstract`)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: Path, seeds: list[int]):
    self.seeds = tuple(seeds)
    self.label = f" of {len(self.seeds)} seeds"
    # The one run's parts (batches, init) are member 0's.
    super().__init__(_with_seed(config, self.seeds[0]), workdir)
    # Every member's batches have one shape at every step (`TrainBatches._plan`).
    self.member_batches = [self.train_batches,
                           *map(self.train_batches.reseeded, self.seeds[1:])]

  def _input_sharding(self, *spec) -> NamedSharding:
    return NamedSharding(self.mesh, P(None, *spec))

  def _input_shape(self, *shape: int) -> tuple[int, ...]:
    return (len(self.seeds), *shape)

  def _local_input(self, step: int, size: int) -> dict:
    return stack([member.steps(step, size) for member in self.member_batches])

  def _vectorized(self, step_function):
    return jax.vmap(step_function)

  def _new_dropout_key(self):
    return jax.vmap(jax.random.key)(jnp.asarray(self.seeds, jnp.int32))

  def _make_state(self) -> None:
    super()._make_state()
    self.state_sharding = jax.tree.map(lambda s: NamedSharding(self.mesh, P(None, *s.spec)),
                                       self.run_sharding)
    # The members one after another inside the program, not vmapped: XLA:CPU (jaxlib 0.10.2)
    # never finished the vmapped initialization of the RNN recipe's group (it waited forever).
    self.init_state = jax.jit(
        lambda: _stacked(*[self._init(jax.random.key(seed)) for seed in self.seeds]),
        out_shardings=self.state_sharding)
    self.abstract_state = distributed.with_shardings(jax.eval_shape(self.init_state),
                                                     self.state_sharding)
    # Member i's train state out of the group's, and the group's from its members'.
    self.member_state = jax.jit(lambda state, i: jax.tree.map(lambda x: x[i], state),
                                out_shardings=self.run_sharding)
    self.group_state = jax.jit(lambda states: _stacked(*states),
                               out_shardings=self.state_sharding)


class Member(actions.RunActions):
  """A member's own run's actions, on its slice of the group's state and metrics."""

  def __init__(self, group: SeedGroup, index: int, checkpoints: Checkpoints, workdir: Path,
               start: int, progress: Progress, compile_log: CompileLog):
    self.group, self.index = group, index
    self.label = f"seed {group.seeds[index]}: "
    super().__init__(group, checkpoints, workdir, start, progress, compile_log)

  def own_state(self, state):
    return self.group.member_state(state, self.index)

  def own_metrics(self, metrics: dict) -> dict:
    return {key: value[self.index] for key, value in metrics.items()}


class Members:
  """The members' actions, driven as a `RunActions`. A member whose actions fail (a full disk
  or a read-only workdir at its save or its records, its divergence) ends alone; the group
  trains on while any member does."""

  def __init__(self, group: SeedGroup, runs: list[tuple[Checkpoints, Path]], start: int,
               progress: Progress, compile_log: CompileLog):
    self.runs = []
    try:
      for i, (checkpoints, workdir) in enumerate(runs):
        self.runs.append(Member(group, i, checkpoints, workdir, start, progress, compile_log))
    except BaseException:  # Those built are closed.
      self.close()
      raise

  @property
  def training(self) -> bool:
    return any(run.training for run in self.runs)

  @property
  def results(self) -> list[dict | Exception]:
    return [result for run in self.runs for result in run.results]

  def due(self, done: int) -> actions.Due:  # The same for every member: one config.
    return self.runs[0].due(done)

  def dispatched(self, metrics: dict, size: int) -> None:
    for run in self.runs:
      run.dispatched(metrics, size)

  def after_step(self, state, done: int, due: actions.Due, stopping: str | None) -> None:
    for run in self.runs:
      if run.training:
        try:  # A write its workdir refuses is the member's alone, too.
          with write_fault_is_user_error(f"writing in {run.workdir}", run.checkpoints.latest_step):
            run.after_step(state, done, due, stopping)
        except UserError as error:
          log.error("%s%s", run.label, error)  # The other members train on.
          run.end(error)

  def close(self) -> None:
    for run in self.runs:
      run.close()


def train_seeds(config: ml_collections.ConfigDict,
                runs: Mapping[int, str | Path]) -> dict[int, dict | Exception]:
  """Trains the run of `config` with each config.train.seed in `runs` (seed -> its workdir)
  as one program: the members with steps left, from one step (members a save ahead of the
  others go back to their step, `claim.restore_together`). Each is the run
  `loop.train_and_evaluate` trains with that seed (to float rounding).

  Returns:
    Per seed: what `train_and_evaluate` returns, or the `UserError` that ended that member
    alone while the others trained on: its workdir in use or holding another run, its
    divergence, a full disk or a read-only workdir at its writes. Errors of the whole group
    are raised.
  """
  runs = {seed: Path(workdir) for seed, workdir in runs.items()}
  claims, results = {}, {}

  def last_step() -> int | None:  # The group's: that of every member.
    steps = [claim.latest_step() for claim in claims.values()]
    return None if not steps or None in steps else min(steps)

  with (loop.started(config), contextlib.ExitStack() as stack,
        write_fault_is_user_error(writing_in(next(iter(runs.values()))), last_step)):
    claims.update(claim_each({seed: (_with_seed(config, seed), workdir)
                              for seed, workdir in runs.items()}, stack, results))
    if claims:
      members = list(claims.values())
      parent = parents.of(config, members[0].workdir, members[0].latest_step())
      group = SeedGroup(config, members[0].workdir, list(claims))
      vocabulary.share(members[0].workdir, [claim.workdir for claim in members[1:]])
      log.info("Seeds %s train as one program.", ", ".join(map(str, group.seeds)))
      state, step = loop.compile_and_restore(group, members,
                                             lambda: _restore(group, claims, parent))
      opened = [(claim.checkpoints, claim.workdir) for claim in members]
      trained = loop.run_loop(group, state, step, lambda progress, compile_log: Members(
          group, opened, step, progress, compile_log))
      results.update(zip(claims, trained, strict=True))
  return {seed: results[seed] for seed in runs}


def _restore(group: SeedGroup, claims: dict[int, Claim],
             parent: parents.Parent | None) -> tuple[int | None, TrainState]:
  """The step restored (None: new) and the group's state to train from: its members' latest
  good checkpoints, at one step (`claim.restore_together`), or a new one (from `parent`, if
  any)."""
  step, states = restore_together(claims, group.run_abstract)
  if step is None:
    return None, parents.starter(group, parent, [claim.workdir for claim in claims.values()])()
  return step, group.group_state(states)
