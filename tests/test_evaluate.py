"""Evaluating and translating with a trained run's checkpoints."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from seq2seq import config as config_lib
from seq2seq.commands import cli
from seq2seq.data import textio
from seq2seq.decoding.alignment import alignment
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation import evaluate, scores
from seq2seq.runs import selection, train_state
from seq2seq.runs.checkpoints import Checkpoints
from seq2seq.training import loop
from tests.helpers import ENV, PNG, ROOT, damage_checkpoint, rescore_one_piece


def script(name, *args, stdin=None):
  return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], input=stdin,
                        capture_output=True, env=ENV, timeout=300)


def test_translate_writes_one_line_per_input_line(run):
  lines = ["A dog runs on the beach.", "", "Ein Mann fährt Fahrrad.", "日本語の文です。",
           "Привет, мир", "   ", "Two girls are playing soccer in a park."]
  result = script("translate.py", f"--workdir={run}", "--beam_size=2",
                  stdin="\n".join(lines).encode() + b"\n")
  assert result.returncode == 0, result.stderr.decode()[-3000:]
  out = result.stdout.decode("utf-8").split("\n")
  assert out[-1] == "" and len(out[:-1]) == len(lines)
  assert out[1] == "" and out[5] == ""


@pytest.mark.parametrize("sig", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])
def test_translate_stopped_while_decoding_ends_at_once_and_keeps_the_old_output(run, tmp_path,
                                                                                sig):
  src, out = tmp_path / "in.en", tmp_path / "out.de"
  src.write_text("A dog runs on the beach.\n", encoding="utf-8")
  out.write_text("an earlier translation\n", encoding="utf-8")
  code = (
      "import os, runpy, signal, sys, time\n"
      "from seq2seq.decoding.translator import Translator\n"
      "def stopped(self, src_ids):\n"
      f"  os.kill(os.getpid(), signal.{sig})\n"
      "  time.sleep(600)\n"
      "Translator.search_ids = stopped\n"
      f"sys.argv = ['translate.py', '--workdir={run}', '--input={src}', '--output={out}']\n"
      "runpy.run_path('scripts/translate.py', run_name='__main__')\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=ENV, timeout=120)
  assert result.returncode == 130, result.stderr[-3000:]
  assert result.stderr.splitlines()[-1] == (
      f"stopped by {sig}; no output was written: the same command starts again.")
  assert out.read_text(encoding="utf-8") == "an earlier translation\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.en", "out.de"]


def test_an_interrupted_write_keeps_the_old_file_and_no_temporary(tmp_path):
  path = tmp_path / "hyp.txt"
  path.write_text("old\n", encoding="utf-8")

  def lines():
    yield "new"
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    textio.write_lines(path, lines())
  assert path.read_text(encoding="utf-8") == "old\n"
  assert [p.name for p in tmp_path.iterdir()] == ["hyp.txt"]
  textio.write_lines(path, ["a", "b\nc"])
  assert path.read_text(encoding="utf-8") == "a\nb c\n"


def test_a_write_is_on_the_disk_before_it_replaces_the_file(tmp_path, monkeypatch):
  """The new text is flushed and synced under a temporary name of its own, then renamed, then
  the folder synced: after a power loss the file is the old one or the new one."""
  path, events = tmp_path / "hyp.txt", []
  real_fsync, real_replace = os.fsync, os.replace
  monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.fstat(fd).st_size)),
                                               real_fsync(fd)))
  monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", Path(a).name)),
                                                   real_replace(a, b)))
  textio.write_lines(path, ["Ein Hund."])
  (_, synced), (_, temporary), (_, folder) = events
  assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
  assert synced == len("Ein Hund.\n") and folder > 0  # The file's bytes, then the folder.
  assert temporary.startswith(".hyp.txt.") and temporary.endswith(".tmp")
  reference = tmp_path / "plain.txt"
  reference.write_text("x")  # The mode any new file gets, not a temporary file's 0600.
  assert path.stat().st_mode == reference.stat().st_mode


def test_writers_of_one_file_at_once_leave_one_whole_text(tmp_path):
  """Each writer has a temporary file of its own: the file ends as one writer's text, whole."""
  import threading
  path = tmp_path / "hyp.txt"
  texts = [[f"{i} " * 2000] * 50 for i in range(4)]
  threads = [threading.Thread(target=lambda t=t: [textio.write_lines(path, t) for _ in range(5)])
             for t in texts]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert path.read_text(encoding="utf-8") in {textio.as_lines(t) for t in texts}
  assert [p.name for p in tmp_path.iterdir()] == ["hyp.txt"]


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_evaluate_bleu_equals_the_sacrebleu_command(run, tmp_path):
  src, ref = tmp_path / "src.en", tmp_path / "ref.de"
  src.write_text("A man rides a bike.\nTwo dogs play.\nA woman is cooking.\n", encoding="utf-8")
  ref.write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen.\nEine Frau kocht.\n",
                 encoding="utf-8")
  result = script("evaluate.py", f"--workdir={run}", f"--src_file={src}", f"--ref_file={ref}",
                  "--beam_size=3", "--checkpoint=latest", "--plot_attention=2")
  assert result.returncode == 0, result.stderr.decode()[-3000:]
  hyp = run / "eval" / "src.en.latest.beam3.hyp"  # the names scripts/evaluate.py documents
  pictures = sorted(p.name for p in (run / "eval").glob("src.en.latest.beam3.attention*.png"))
  assert pictures == ["src.en.latest.beam3.attention1.png", "src.en.latest.beam3.attention2.png"]
  assert all((run / "eval" / p).read_bytes()[:8] == PNG for p in pictures)
  assert all(str(run / "eval" / p) in result.stderr.decode() for p in pictures)  # Named.
  json_file = run / "eval" / "src.en.latest.beam3.json"
  scores = json.loads(json_file.read_text())
  assert len(hyp.read_text(encoding="utf-8").splitlines()) == 3
  for key in ("bleu", "bleu_lowercase", "chrf", "ter"):
    assert key in scores and f"{key}_signature" in scores
  assert scores["checkpoint_steps"] == [4] and scores["beam_size"] == 3
  cli = subprocess.run([sys.executable, "-m", "sacrebleu", str(ref), "-i",
                        str(hyp), "-m", "bleu", "chrf", "-b", "-w", "4"],
                       capture_output=True, text=True, check=True)
  bleu, chrf = json.loads(cli.stdout)  # with two metrics, -b prints a JSON list
  assert bleu == round(scores["bleu"], 4) and chrf == round(scores["chrf"], 4)


def test_a_second_reference_of_one_source_keeps_the_first_ones_scores(run, tmp_path, caplog):
  """Scores of one --src_file against another --ref_file went to the same file name, over the
  first reference's, and the JSON did not say which reference it was scored against."""
  src = tmp_path / "two_refs.en"
  src.write_text("A man rides a bike.\nTwo dogs play.\n", encoding="utf-8")
  refs = {}
  for name, text in (("a.de", "Ein Mann fährt Fahrrad.\nZwei Hunde spielen.\n"),
                     ("b.de", "Ein Mann radelt.\nZwei Hunde toben.\n")):
    refs[name] = tmp_path / name
    refs[name].write_text(text, encoding="utf-8")
  shutil.copy(refs["a.de"], tmp_path / "a_again.de")  # The same reference, elsewhere.
  sha = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in refs.items()}

  def scored(ref):
    _, prefix = evaluate.run_evaluation(run, src_file=str(src), ref_file=str(ref),
                                        checkpoint="latest", beam_size=1)
    return prefix, json.loads(prefix.with_name(prefix.name + ".json").read_text())

  first, a = scored(refs["a.de"])
  assert first == run / "eval" / "two_refs.en.latest.beam1"  # The documented name.
  assert (a["ref_file"], a["ref_sha256"]) == (str(refs["a.de"]), sha["a.de"])
  kept = (run / "eval" / "two_refs.en.latest.beam1.json").read_bytes()
  with caplog.at_level("WARNING", logger="seq2seq"):
    second, b = scored(refs["b.de"])
  assert second == run / "eval" / f"two_refs.en.latest.beam1.ref-{sha['b.de'][:8]}"
  assert (b["ref_file"], b["ref_sha256"]) == (str(refs["b.de"]), sha["b.de"])
  assert (run / "eval" / "two_refs.en.latest.beam1.json").read_bytes() == kept
  assert [r.getMessage() for r in caplog.records] == [
      f"{first}.json holds scores against another reference ({refs['a.de']}); they are kept, and"
      f" these, against --ref_file={refs['b.de']}, go to {second}.json."]
  again, a_again = scored(tmp_path / "a_again.de")  # The same content: scored again, replaced.
  assert again == first and a_again["ref_sha256"] == sha["a.de"]


def test_checkpoint_average_is_the_mean(run):
  translator = Translator(run, "avg:2", beam_size=1)
  assert translator.steps == [2, 4]
  c = translator.config
  checkpoints = Checkpoints(run, 2)
  like = Translator(run, "latest", beam_size=1)
  state_like = train_state.new_train_state(like.params, train_state.make_optimizer(c.train))
  two, four = (checkpoints.restore(s, state_like).params for s in (2, 4))
  for avg, a, b in zip(jax.tree.leaves(translator.params), jax.tree.leaves(two),
                       jax.tree.leaves(four), strict=True):
    np.testing.assert_allclose(avg, (np.asarray(a) + np.asarray(b)) / 2, rtol=1e-6)


@pytest.mark.slow  # Over ~7 s: the default run stays under 8 minutes.
def test_plot_attention_writes_a_png_with_one_panel_per_head(run, tmp_path):
  out = tmp_path / "attention.png"
  command = subprocess.Popen(  # While it runs, the weights it draws are checked here.
      [sys.executable, str(ROOT / "scripts" / "plot_attention.py"), f"--workdir={run}",
       "--text=A dog runs.", f"--out={tmp_path / 'attention'}", "--beam_size=2"],  # .png added.
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
  translator = Translator(run, "best", beam_size=2)
  weights, src, tgt = alignment(translator, "A dog runs.")
  c = translator.config.model
  assert weights.shape == (c.num_decoder_layers, c.num_heads, len(tgt), len(src))
  assert src[-1] == "</s>"
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  stdout, stderr = command.communicate(timeout=300)
  assert command.returncode == 0, stderr.decode()[-3000:]
  assert stdout.decode() == f"wrote {out}\n"
  assert out.read_bytes()[:8] == PNG


@pytest.mark.slow  # Over ~8 s: the default run stays under 8 minutes.
def test_checkpoint_choice_is_made_on_validation_and_reused_for_test(run, tmp_path):
  """Each candidate scores as it would alone; the best is recorded and `selected` restores it."""
  workdir = tmp_path / "run"
  shutil.copytree(run, workdir)
  with pytest.raises(UserError, match="--checkpoint=selected needs .* does not exist"):
    Translator(workdir, "selected")
  with pytest.raises(UserError, match="would choose one on test data"):
    evaluate.select_checkpoint(workdir, ["best", "avg:2"], split="test")

  candidates = ["2", "avg:2"]  # A step and an average: each kind the choice resolves.
  chosen = evaluate.select_checkpoint(workdir, candidates, beam_size=1)
  alone = {spec: evaluate.run_evaluation(workdir, split="val", checkpoint=spec,
                                         beam_size=1)[0]["bleu"] for spec in candidates}
  assert chosen["bleu"] == pytest.approx(alone)
  best = max(alone.values())
  assert chosen["checkpoint"] == next(s for s in candidates if alone[s] == best)
  assert json.loads((workdir / selection.SELECTION).read_text())["checkpoint"] == (
      chosen["checkpoint"])
  translator = Translator(workdir, "selected", beam_size=1)
  reference = Translator(workdir, chosen["checkpoint"], beam_size=1)
  assert translator.steps == reference.steps
  jax.tree.map(np.testing.assert_array_equal, translator.params, reference.params)
  scored, prefix = evaluate.run_evaluation(workdir, split="val", checkpoint="selected",
                                           beam_size=1)
  assert prefix.name == "val.selected.beam1" and scored["bleu"] == pytest.approx(best)
  saved = json.loads(scores.output_files(prefix)[1].read_text())
  assert saved == scored and (saved["checkpoint"], saved["selected_checkpoint"]) == (
      "selected", chosen["checkpoint"])


def test_best_checkpoint_is_known_after_a_restart(tmp_path):
  """orbax writes each evaluation's BLEU to disk, so "best" is not "latest" in a new process."""
  import jax.numpy as jnp
  checkpoints = Checkpoints(tmp_path, keep=1)
  for step, bleu in [(2, 3.0), (4, 9.0), (6, 5.0)]:
    checkpoints.save(step, {"x": jnp.ones(2)}, metrics={"bleu": bleu, "loss": 1.0})
  checkpoints.save(7, {"x": jnp.ones(2)})  # Between evaluations: no metrics.
  checkpoints.close()
  reopened = Checkpoints(tmp_path, keep=1)
  assert reopened.all_steps() == [4, 7]
  assert reopened.best_step() == 4
  assert reopened.resolve("best") == [4]
  reopened.close()


def _save_all(workdir, saves, keep=3) -> list[int]:
  """Saves `saves` [(step, BLEU or None, how)] in one process: how is "wait", "background" or
  "stop" (on a signal); returns the steps kept once all are on disk."""
  import jax.numpy as jnp
  checkpoints = Checkpoints(workdir, keep=keep)
  for step, bleu, how in saves:
    checkpoints.save(step, {"x": jnp.full(2, float(step))},
                     metrics=None if bleu is None else {"bleu": bleu, "loss": 1.0},
                     wait=how != "background", on_stop=how == "stop")
  kept = checkpoints.all_steps()
  checkpoints.close()
  return kept


def test_a_checkpoint_saved_on_a_signal_leaves_the_uninterrupted_runs_checkpoints(tmp_path):
  """A run paused twice (a checkpoint saved on each signal, off the schedule) and resumed in
  new processes keeps the steps that the uninterrupted run keeps, so avg:N averages the same
  ones: each signal's checkpoint is kept while it is the newest, and goes once a later save is
  on disk. Counted among the latest `keep`, as before, they would have pushed out 8 (the
  kept set [4, 9, 10, 12])."""
  schedule = [(2, None, "background"), (4, 9.0, "wait"), (6, None, "background"),
              (8, 1.0, "wait"), (10, None, "background"), (12, 2.0, "wait")]
  whole = _save_all(tmp_path / "whole", schedule)
  assert whole == [4, 8, 10, 12]  # The latest 3 and the best.
  paused = tmp_path / "paused"
  assert _save_all(paused, schedule[:4] + [(9, None, "stop")]) == [4, 6, 8, 9]
  assert _save_all(paused, [(10, None, "background"), (11, None, "stop")]) == [4, 6, 8, 10, 11]
  assert _save_all(paused, schedule[5:]) == whole
  reopened = Checkpoints(paused, keep=3)
  assert reopened.resolve("avg:3") == [8, 10, 12] and reopened.resolve("best") == [4]
  reopened.close()


def test_a_vocabulary_trained_again_from_the_same_text_is_the_runs(run, tmp_path):
  """A sibling run's vocabulary (same text, size and seed: other bytes, since SentencePiece
  writes its own file name into the model) passes the fingerprint check."""
  from seq2seq.data import corpus, tokenizer

  workdir = tmp_path / "run"
  shutil.copytree(run, workdir)
  vocab = workdir / "vocab" / "spm.model"
  config = config_lib.from_json((workdir / "config.json").read_text())
  text = corpus.read_split(config.data, "train")
  again = tokenizer.train_tokenizer(text.src + text.tgt, tmp_path / "sibling" / "spm",
                                    config.data.vocab_size, seed=config.train.seed)
  del again
  sibling = tmp_path / "sibling" / "spm.model"
  assert sibling.read_bytes() != vocab.read_bytes()
  assert tokenizer.fingerprint(sibling) == tokenizer.fingerprint(vocab)
  expected = Translator(workdir, "latest", beam_size=1).translate(["A dog runs."])
  shutil.copy(sibling, vocab)
  assert Translator(workdir, "latest", beam_size=1).translate(["A dog runs."]) == expected


def test_checkpoints_recording_the_vocabularys_bytes_stay_valid(run, tmp_path, monkeypatch):
  """Checkpoints saved before the fingerprint was taken over the content recorded the sha256 of
  the file's bytes; they still read with their vocabulary, and refuse another one."""
  import hashlib

  from seq2seq.data import tokenizer

  monkeypatch.setattr(tokenizer, "fingerprint",
                      lambda path: hashlib.sha256(path.read_bytes()).hexdigest()
                      if path.is_file() else None)
  c = config_lib.from_json((run / "config.json").read_text())
  c.train.num_steps, c.eval.every_steps = 2, 2
  loop.train_and_evaluate(c, tmp_path / "old")
  monkeypatch.undo()
  Translator(tmp_path / "old", "latest").translate(["A dog runs."])
  rescore_one_piece(tmp_path / "old" / "vocab" / "spm.model")
  with pytest.raises(UserError, match="is not the vocabulary the checkpoint at step 2"):
    Translator(tmp_path / "old", "latest")


def test_cut_source_lines_are_counted_in_one_warning(run, caplog):
  translator = Translator(run, "latest", beam_size=1)
  long_line = " ".join(["dog"] * (2 * translator.config.model.max_len))
  with caplog.at_level("WARNING", logger="seq2seq"):
    out = translator.translate(["A dog.", long_line, "", long_line])
  assert len(out) == 4
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  longest = translator.config.model.max_len - 1
  assert warnings == [f"2 of 4 source lines are longer than {longest} subwords"
                      f" (config.model.max_len={longest + 1} with EOS) and were cut to fit;"
                      " their translations cover only the start."]


@pytest.mark.parametrize("damage", ["truncated", pytest.param("missing", marks=pytest.mark.slow)])
def test_a_damaged_checkpoint_is_named_with_the_steps_that_restore(run, tmp_path, capfd, damage):
  workdir = tmp_path / "run"
  shutil.copytree(run, workdir)
  damage_checkpoint(workdir, 4, damage)
  capfd.readouterr()
  with pytest.raises(UserError) as raised:
    Translator(workdir, "latest", beam_size=1)
  message = str(raised.value)
  assert message.startswith(f"Checkpoint 4 in {workdir}/checkpoints cannot be restored (")
  assert message.endswith("); use --checkpoint= one of the steps that do: 2.")
  assert "\n" not in message
  assert len(capfd.readouterr().err.splitlines()) < 5  # Not orbax's hundreds of lines.
  assert (workdir / "checkpoints" / "4").is_dir()  # Evaluation moves nothing.


def test_unknown_characters_are_counted_in_one_warning(run, caplog):
  translator = Translator(run, "latest", beam_size=1)
  with caplog.at_level("WARNING", logger="seq2seq"):
    out = translator.translate(["A dog.", "A 猫 and a 🙂.", "", "🙂"])
  assert len(out) == 4
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warnings == ["2 of 4 source lines hold characters the vocabulary does not know (such"
                      " as '猫' in line 2); the model reads them as unknown words, and its"
                      " output shows them as ⁇."]


def test_translate_at_a_terminal_answers_each_line_as_it_comes(run):
  """Typed input (a pseudo-terminal): the translation of a line arrives before input ends."""
  import pty
  import select

  main, typed = pty.openpty()
  process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "translate.py"),
                              f"--workdir={run}", "--beam_size=1"], stdin=typed,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=ENV)
  os.close(typed)
  try:
    expected = Translator(run, "best", beam_size=1).translate(["A dog runs."])[0][0][0]
    os.write(main, b"A dog runs.\n")
    ready, _, _ = select.select([process.stdout], [], [], 240)
    assert ready, "no translation before the end of input"
    assert process.stdout.readline().decode() == expected + "\n"
    os.write(main, b"\x04")  # Ctrl-D: the end of input.
    assert process.wait(60) == 0
    assert process.stderr.read().decode().splitlines()[-1] == (
        "Type a sentence and Enter; Ctrl-D ends.")
  finally:
    process.kill()
    os.close(main)


def test_an_output_that_is_a_link_stays_a_link(tmp_path):
  """--output=<symbolic link>: the file it points to is replaced, the link stays."""
  target, link = tmp_path / "real.de", tmp_path / "out.de"
  target.write_text("old\n")
  link.symlink_to(target)
  textio.write_lines(link, ["Ein Hund."])
  assert link.is_symlink() and target.read_text() == "Ein Hund.\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.de", "real.de"]


@pytest.mark.slow  # Starts seq2seq-translate at a terminal: about 15 s.
def test_ctrl_c_at_the_terminal_says_which_translations_were_printed(run):
  """Interactive seq2seq-translate answers each line as it comes; stopped after one answer,
  its last line says that answer was printed, not that no output was written."""
  import pty
  import select
  import signal

  leader, follower = pty.openpty()
  process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "translate.py"),
                              f"--workdir={run}", "--checkpoint=latest", "--beam_size=1"],
                             stdin=follower, stdout=follower, stderr=subprocess.PIPE, env=ENV,
                             text=True)
  os.close(follower)
  os.write(leader, b"A dog runs.\n")
  seen = b""
  while seen.count(b"\n") < 2:  # The terminal's echo of the line, then its translation.
    ready, _, _ = select.select([leader], [], [], 120)
    assert ready, seen
    seen += os.read(leader, 4096)
  process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=60)
  os.close(leader)
  assert process.returncode == 130
  assert stderr.splitlines()[-1] == ("stopped by SIGINT; 1 translation was printed, the line in"
                                     " progress was not: the same command starts again.")


@pytest.mark.slow  # Eight decodes of the validation split: over ~8 s.
def test_beam_size_and_alpha_are_chosen_on_validation_with_the_checkpoint(run, tmp_path):
  """Every pair of beam size and alpha scores as it would alone; the best pair is recorded
  with the checkpoint, and `selected` then decodes with it."""
  workdir = tmp_path / "run"
  shutil.copytree(run, workdir)
  chosen = evaluate.select_checkpoint(workdir, ["latest"], beam_size=[1, 2], alpha=[0.6, 1.5])
  alone = {}
  for k in (1, 2):
    for a in (0.6, 1.5):
      scored, prefix = evaluate.run_evaluation(workdir, split="val", checkpoint="latest",
                                               beam_size=k, alpha=a)
      alone[evaluate.search_label("latest", k, a)] = scored["bleu"]
      assert prefix.name == f"val.latest.beam{k}" + ("" if a == 0.6 else ".alpha1.5")
  assert chosen["bleu"] == pytest.approx(alone)
  winner = max(alone, key=alone.get)  # The first listed wins a tie, as max() does.
  assert evaluate.search_label("latest", chosen["beam_size"], chosen["alpha"]) == winner
  assert chosen["searches"] == {"beam_sizes": [1, 2], "alphas": [0.6, 1.5]}
  assert selection.selected_search(workdir) == (chosen["beam_size"], chosen["alpha"])
  # One search, as before: no search is recorded, so the flags say it.
  evaluate.select_checkpoint(workdir, ["latest", "best"], beam_size=1)
  assert selection.selected_search(workdir) is None


class _Flag:
  def __init__(self, value, present=False):
    self.value, self.present = value, present
    self.default = value


def test_a_search_chosen_on_validation_is_the_one_selected_decodes_with(tmp_path):
  (tmp_path / "eval").mkdir()
  record = {"checkpoint": "avg:10", "split": "val", "beam_size": 5, "alpha": 1.0,
            "bleu": {}, "searches": {"beam_sizes": [4, 5], "alphas": [0.6, 1.0]}}
  (tmp_path / "eval" / "selected.json").write_text(json.dumps(record))
  flags_ = {"workdir": _Flag(str(tmp_path)), "checkpoint": _Flag("selected"),
            "beam_size": _Flag(4), "alpha": _Flag(0.6)}
  assert cli.selected_search(flags_, 4, 0.6) == (5, 1.0)  # Flags left out: the choice.
  flags_["beam_size"].present = True
  assert cli.selected_search(flags_, 5, 0.6) == (5, 1.0)  # Given as chosen: the same.
  with pytest.raises(UserError, match=r"^--beam_size=4: --checkpoint=selected was chosen on"
                     r" validation at --beam_size=5 --alpha=1; leave out"):
    cli.selected_search(flags_, 4, 0.6)
  flags_["checkpoint"].value = "best"  # Not the choice: the flags say the search.
  assert cli.selected_search(flags_, 4, 0.6) == (4, 0.6)
  # A released model carries its run's choice where it was released as `selected`.
  released = {"checkpoint": "latest", "released_from": {"checkpoint": "selected",
                                                        "selection": record}}
  (tmp_path / "eval" / "selected.json").write_text(json.dumps(released))
  assert selection.selected_search(tmp_path) == (5, 1.0)
  released["released_from"]["checkpoint"] = "avg:10"
  (tmp_path / "eval" / "selected.json").write_text(json.dumps(released))
  assert selection.selected_search(tmp_path) is None


def test_candidate_searches_are_numbers_named_once():
  flags_ = {"beam_size": _Flag(["4", "5"]), "alpha": _Flag(["0.6", "x"])}
  with pytest.raises(UserError, match=r"^--alpha=0.6,x: 'x' is not a number \(0.6\); pass"):
    cli.search_values(flags_)
  flags_["alpha"].value = ["0.6", "1"]
  assert cli.search_values(flags_) == ([4, 5], [0.6, 1.0])
  with pytest.raises(UserError, match=r"^--beam_size=5,5 names a value twice"):
    evaluate.select_checkpoint("unused", ["best"], beam_size=[5, 5])
