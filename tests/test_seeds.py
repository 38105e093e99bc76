"""Seeds in one program: a seed group trains the runs of several train.seed values as one
vmapped program, and each member is the run that seed trains alone."""

import logging
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from seq2seq.compare import comparison, sweep
from seq2seq.data import batching, corpus
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation import evaluate
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.runs.claim import shared_step
from seq2seq.training import loop, seeds, steps
from seq2seq.training.seeds import SeedGroup
from seq2seq.training.trainer import Trainer
from tests.helpers import ENV, ROOT, read_metrics, shared_run_config

SEEDS = (0, 1)


@pytest.fixture(scope="module")
def group(tmp_path_factory):
  """`seq2seq-sweep --sweep=train.seed=0,1` on shared_run_config: (root, status, how many
  times the train step was traced, the sweep's log)."""
  root = tmp_path_factory.mktemp("group")
  traced, train_step = [], steps.train_step
  logger, records = logging.getLogger("seq2seq"), []
  handler = logging.Handler()
  handler.emit = lambda record: records.append(record.getMessage())

  def counted(*args, **kwargs):
    traced.append(1)
    return train_step(*args, **kwargs)

  logger.addHandler(handler)
  level = logger.level
  logger.setLevel(logging.INFO)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(steps, "train_step", counted)
    status = sweep.run_sweep(shared_run_config(), ["train.seed=0,1"], root)
  logger.removeHandler(handler)
  logger.setLevel(level)
  return root, status, len(traced), records


@pytest.fixture(scope="module")
def alone(run, tmp_path_factory):
  """The runs of seeds 0 and 1 trained one by one: the session's run, and its seed 1."""
  c = shared_run_config()
  c.train.seed = 1
  workdir = tmp_path_factory.mktemp("alone") / "seed-1"
  loop.train_and_evaluate(c, workdir)
  return {0: run, 1: workdir}


def _params(workdir, step: int):
  c = shared_run_config()
  trainer_like = Trainer(c, workdir).new_state()
  return jax.tree.leaves(Checkpoints(workdir, keep=2).restore(step, trainer_like).params)


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_a_two_seed_sweep_lowers_one_train_program_whose_members_equal_the_runs_alone(group,
                                                                                      alone):
  """One trace of the train step (one batch shape), not one per seed; each member has the
  losses and BLEU of its seed trained alone, its parameters to float32 rounding (the vmapped
  step batches its matrix products, which may sum in another order: on this CPU a few units
  in the last place after 4 steps), and the same greedy translations of 50 sentences."""
  root, status, traced, messages = group
  assert status == {"seed-0": "trained", "seed-1": "trained"}
  assert traced == 1
  assert any("2 to train; seeds as one program: seed-0 + seed-1."  in m
             for m in messages)
  compiled = [p["program"] for r in read_metrics(root / "seed-0") if r["split"] == "compile"
              for p in r["programs"]]
  assert compiled[0] == "train step of 2 seeds"
  sentences = corpus.read_split(shared_run_config().data, "val").src[:50]
  for seed in SEEDS:
    member = root / f"seed-{seed}"
    records = [(r["step"], r["split"]) for r in read_metrics(member) if r["split"] != "compile"]
    assert records == [(r["step"], r["split"]) for r in read_metrics(alone[seed])
                       if r["split"] != "compile"]
    for got, want in zip(read_metrics(member), read_metrics(alone[seed]), strict=True):
      if got["split"] == "train":
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
      elif got["split"] == "val":
        assert got["bleu"] == want["bleu"]
    for a, b in zip(_params(member, 4), _params(alone[seed], 4), strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    translations = [Translator(w, "latest", beam_size=1).translate(sentences)
                    for w in (member, alone[seed])]
    assert [n[0][0] for n in translations[0]] == [n[0][0] for n in translations[1]]
    assert (member / "config.json").read_text() == (alone[seed] / "config.json").read_text()


@pytest.mark.slow  # Decodes with an ensemble, then compares: about 20 s.
def test_members_are_runs_for_evaluate_ensemble_and_compare(group, tmp_path):
  root = group[0]
  members = [root / f"seed-{seed}" for seed in SEEDS]
  scores, _ = evaluate.run_evaluation(members[0], split="val", checkpoint="best", beam_size=2,
                                      ensemble=[str(members[1])])
  assert 0.0 <= scores["bleu"] <= 100.0
  rows = comparison.compare_runs(members, tmp_path / "report", split="val", beam_size=1,
                              n_samples=20)
  assert [row["run"] for row in rows] == ["seed-0", "seed-1"]
  assert rows[0]["train.seed"] == 0 and rows[1]["train.seed"] == 1


@pytest.mark.slow  # Trains a group twice: about 20 s.
def test_an_interrupted_seed_group_saves_every_member_and_resumes_exactly(group, tmp_path,
                                                                         monkeypatch):
  """A SIGTERM during the first step: both members save step 1, and the same call resumes
  both, to the checkpoints of the uninterrupted group bit for bit."""
  to_device = Trainer.to_device

  def sigterm_once(self, *args):
    monkeypatch.setattr(Trainer, "to_device", to_device)
    os.kill(os.getpid(), signal.SIGTERM)
    return to_device(self, *args)

  monkeypatch.setattr(Trainer, "to_device", sigterm_once)
  workdirs = {seed: tmp_path / f"seed-{seed}" for seed in SEEDS}
  config = shared_run_config()
  config.checkpoint.keep = 3  # Room for the signal's step 1 beside 2 and 4, were it kept.
  stopped = seeds.train_seeds(config, workdirs)
  assert [r["interrupted"] for r in stopped.values()] == ["SIGTERM", "SIGTERM"]
  step = stopped[0]["step"]
  assert [Checkpoints(w, keep=2).all_steps() for w in workdirs.values()] == [[step], [step]]
  resumed = seeds.train_seeds(config, workdirs)
  assert [r["step"] for r in resumed.values()] == [4, 4]
  for seed, workdir in workdirs.items():
    # The signal's checkpoint went once step 2 was saved: the uninterrupted group's steps.
    assert Checkpoints(workdir, keep=10).all_steps() == [2, 4] == Checkpoints(
        group[0] / f"seed-{seed}", keep=10).all_steps()
    for a, b in zip(_params(workdir, 4), _params(group[0] / f"seed-{seed}", 4), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class Killed(BaseException):
  """A SIGKILL, as the process sees it: nothing after runs but the `finally` blocks."""


@pytest.mark.slow  # Trains a group twice: about 20 s.
def test_a_group_killed_during_its_save_resumes_its_members_from_one_step(group, tmp_path,
                                                                         monkeypatch, caplog):
  """Killed while its members save step 3 one after another: seed 0 saved it, seed 1 did not.
  The same call says so, takes seed 0 back to step 2, the step both have, and trains both as
  one program: the uninterrupted group's checkpoints, bit for bit (trained one by one, a
  member ended 1.3e-3 away)."""
  c = shared_run_config()
  c.checkpoint.every_steps = 1  # Periodic saves at 1 and 3 between the validations at 2 and 4.
  workdirs = {seed: tmp_path / f"seed-{seed}" for seed in SEEDS}
  save = Checkpoints.save

  def killed_at_seed_1s_save_of_3(self, step, *args, **kwargs):
    if step == 3 and self.directory.parent == workdirs[1]:
      raise Killed()
    return save(self, step, *args, **kwargs)

  monkeypatch.setattr(Checkpoints, "save", killed_at_seed_1s_save_of_3)
  with pytest.raises(Killed):
    seeds.train_seeds(c, workdirs)
  monkeypatch.undo()
  assert [Checkpoints(w, keep=2).all_steps() for w in workdirs.values()] == [[2, 3], [1, 2]]
  caplog.set_level(logging.INFO, logger="seq2seq")
  resumed = seeds.train_seeds(c, workdirs)
  assert ("Seeds 0, 1 are at steps 3, 2 (a stop during the group's save leaves them so): they"
          " resume as one program from step 2, the last step they all have (the later"
          " checkpoints of seed 0 are removed, to be trained again).") in caplog.messages
  assert f"Resumed {workdirs[0]}, {workdirs[1]} at step 2." in caplog.messages
  assert [r["step"] for r in resumed.values()] == [4, 4]
  for seed, workdir in workdirs.items():
    for a, b in zip(_params(workdir, 4), _params(group[0] / f"seed-{seed}", 4), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [(r["step"], r["split"]) for r in read_metrics(workdir) if r["split"] == "val"] == [
        (2, "val"), (4, "val")]


def test_members_at_different_steps_resume_from_the_last_step_they_all_have(tmp_path):
  assert shared_step([tmp_path / "a", tmp_path / "b"], [[2, 4, 6], [2, 4]]) == 4
  assert shared_step([tmp_path / "a", tmp_path / "b"], [[4, 6], [2, 4, 5]]) == 4
  with pytest.raises(UserError) as raised:  # One is new: nothing to resume from together.
    shared_step([tmp_path / "a", tmp_path / "b"], [[2, 4], []])
  assert str(raised.value) == (
      f"The runs {tmp_path / 'a'} (checkpoints 2, 4), {tmp_path / 'b'} (no checkpoint) share no"
      " checkpoint step and cannot resume as one program; train them one by one (seq2seq-sweep"
      " --one_by_one).")


@pytest.mark.slow  # Compiles a group's call and step: about 12 s.
def test_a_group_trains_several_steps_per_call(tmp_path):
  """config.train.steps_per_call=2 in a seed group: a call of 2 steps (the vmapped scan) gives
  the group's two single steps, to float32 rounding."""
  c = shared_run_config()
  c.train.steps_per_call = 2
  trainer = SeedGroup(c, tmp_path / "run", list(SEEDS))
  trainer.compile()  # The call of 2, and (in the background) the single step.
  called, metrics = trainer.train(trainer.new_state(), 0, 2)
  stepped = trainer.new_state()
  for step in range(2):
    stepped, one = trainer.train(stepped, step, 1)
    np.testing.assert_allclose(metrics["loss"][:, step], one["loss"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(called), jax.tree.leaves(stepped), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_seeds_of_a_point_share_the_shape_of_every_batch():
  """Bucketed batches: the order of the lengths is the data's, the examples the seed's."""
  rng = np.random.default_rng(0)
  src = [rng.integers(4, 50, size=rng.integers(1, 30)) for _ in range(300)]
  tgt = [rng.integers(4, 50, size=rng.integers(1, 30)) for _ in range(300)]
  batches = [batching.TrainBatches(src, tgt, tokens_per_batch=256, max_len=32, bucket_step=8,
                                   seed=seed) for seed in SEEDS]
  steps_ = range(2 * batches[0].batches_per_epoch)
  assert len({batches[0].length(i) for i in steps_}) > 1
  assert [batches[0](i)["src"].shape for i in steps_] == [batches[1](i)["src"].shape
                                                          for i in steps_]
  assert any(not np.array_equal(batches[0](i)["src"], batches[1](i)["src"]) for i in steps_)
  reseeded = batches[0].reseeded(1)  # What a group's members share: all but the seed's order.
  for i in steps_:
    for key, value in batches[1](i).items():
      np.testing.assert_array_equal(reseeded(i)[key], value)


def test_the_sweep_groups_the_seeds_of_each_point_that_start_together():
  c = shared_run_config()
  runs = sweep.expand(c, ["model.attention=dot,general", "train.seed=0,1"])
  new = {name: [] for name, _ in runs}
  names = lambda groups: [[name for name, _ in g] for g in groups]  # noqa: E731
  assert names(sweep._seed_groups(runs, new, one_by_one=False)) == [
      ["attention-dot_seed-0", "attention-dot_seed-1"],
      ["attention-general_seed-0", "attention-general_seed-1"]]
  assert names(sweep._seed_groups(runs, new, one_by_one=True)) == [[n] for n, _ in runs]
  # A seed resumed alone (at another step than its point's other seed, none shared) trains
  # alone; seeds that share a step (a stop during the group's save) train as one program.
  assert names(sweep._seed_groups(runs, dict(new, **{"attention-dot_seed-1": [2]}),
                                  one_by_one=False)) == [
      ["attention-dot_seed-0"], ["attention-dot_seed-1"],
      ["attention-general_seed-0", "attention-general_seed-1"]]
  assert names(sweep._seed_groups(runs, dict(new, **{"attention-dot_seed-0": [2, 4],
                                                     "attention-dot_seed-1": [2]}),
                                  one_by_one=False)) == [
      ["attention-dot_seed-0", "attention-dot_seed-1"],
      ["attention-general_seed-0", "attention-general_seed-1"]]


@pytest.mark.slow  # Builds the RNN recipe's data and state: about 30 s.
def test_the_rnn_recipes_seed_group_is_initialized(tmp_path):
  """XLA:CPU never finished the vmapped initialization of this group (train state and Adam's
  moments of 2 seeds): the sweep of issue 43 waited at its first step for as long as it ran.
  The members are now initialized one after another in the program; each equals its seed's
  run alone (test_a_two_seed_sweep_..._equal_the_runs_alone)."""
  script = ("import sys; from pathlib import Path; from tests.helpers import load_config;"
            " from seq2seq.training.seeds import SeedGroup;"
            " t = SeedGroup(load_config('multi30k_rnn'), Path(sys.argv[1]), [0, 1]);"
            " print(int(t.new_state().step[0]))")
  done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=ENV, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr[-2000:]


def test_a_member_that_ends_drops_its_metrics_and_gathers_no_more(tmp_path):
  """A group's member that has ended (diverged, or its workdir refused) while the others
  train on keeps none of the group's metrics: they would pile up until the group ends."""
  from seq2seq.errors import UserError
  from seq2seq.training import actions
  from tests.helpers import fast_tiny_config

  group = SeedGroup(fast_tiny_config(), tmp_path / "seed-0", list(SEEDS))
  runs = [(Checkpoints(w / "checkpoints", keep=1), w)
          for w in [tmp_path / f"seed-{seed}" for seed in SEEDS]]
  with actions.LoopActions(group, 0, lambda progress, compile_log: seeds.Members(
      group, runs, 0, progress, compile_log)) as loop_actions:
    members = loop_actions.run
    metrics = {"loss": jax.numpy.zeros(len(SEEDS)), "tokens": jax.numpy.ones(len(SEEDS))}
    loop_actions.dispatched(metrics)
    members.runs[1].end(UserError("the disk is full"))
    loop_actions.dispatched(metrics)
    loop_actions.dispatched(metrics)
    assert [len(one.interval.calls) for one in members.runs] == [3, 0]
    assert [one.training for one in members.runs] == [True, False] and members.training
