"""Word alignments from attention: the subword-to-word merge, the AER against a gold file,
`seq2seq-translate --alignment` and `seq2seq-evaluate --gold_alignment` on tiny trained runs."""

import json
import re
import subprocess
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.data.special_ids import BOS_ID, EOS_ID
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding import alignment
from seq2seq.decoding import word_alignment as wa
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from seq2seq.evaluation import alignment_error, evaluate
from seq2seq.models import build_model
from tests.helpers import ENV, ROOT, shared_run_config

# Three sentences of a hand-made gold file (0-based, `?` and `p` mark possible links) and the
# links an aligner gave them:
#   1: S = {0-0, 1-1}, P = S + {2-2}; A = {0-0, 1-2, 2-2}: |A| 3, |S| 2, |A∩S| 1, |A∩P| 2
#   2: S = {0-1},      P = S + {1-0}; A = {0-1, 1-0}:      |A| 2, |S| 1, |A∩S| 1, |A∩P| 2
#   3: no gold link;                   A = {0-0}:           |A| 1, |S| 0, |A∩S| 0, |A∩P| 0
# Summed: |A| 6, |S| 3, |A∩S| 2, |A∩P| 4, so AER = 1 - (2 + 4) / (6 + 3) = 1/3; precision
# |A∩P| / |A| = 4/6, recall |A∩S| / |S| = 2/3.
GOLD = "0-0 1-1 2?2\n0-1 1p0\n\n"
PREDICTED = [{(0, 0), (1, 2), (2, 2)}, {(0, 1), (1, 0)}, {(0, 0)}]
SOURCES = ["a b c", "d e", "f"]
REFERENCES = ["x y z", "u v", "w"]


def test_the_aer_of_a_hand_made_gold_file(tmp_path):
  path = tmp_path / "gold.txt"
  path.write_text(GOLD, encoding="utf-8")
  _, sure, possible = alignment_error.read_gold(path, SOURCES, REFERENCES)
  assert sure == [{(0, 0), (1, 1)}, {(0, 1)}, set()]
  assert possible == [{(2, 2)}, {(1, 0)}, set()]
  scores = wa.aer(PREDICTED, sure, possible)
  assert scores == pytest.approx({"aer": 1 / 3, "precision": 4 / 6, "recall": 2 / 3, "links": 6})
  # A perfect alignment (the sure links) has AER 0; the possible ones alone cost recall.
  assert wa.aer(sure, sure, possible)["aer"] == 0
  # A = the possible links alone: |A| 2, |S| 3, |A∩S| 0, |A∩P| 2: AER 1 - 2 / 5.
  assert wa.aer(possible, sure, possible)["aer"] == pytest.approx(1 - 2 / 5)


def test_gold_links_counted_from_one_are_read_as_from_zero():
  assert wa.parse_gold("1-1 2p3 4?2", one_based=True) == ({(0, 0)}, {(1, 2), (3, 1)})
  with pytest.raises(ValueError, match="holds a 0"):
    wa.parse_gold("0-1", one_based=True)
  with pytest.raises(ValueError, match="'1:2' is not a link"):
    wa.parse_gold("0-0 1:2")


def test_pieces_merge_into_the_words_of_the_text():
  assert wa.word_indices(["▁Ein", "▁Hund", "▁renn", "t", "."]) == [0, 1, 2, 2, 2]
  # A lone '▁' begins the word after it; one at the end has none.
  assert wa.word_indices(["▁", "(", "a", "▁b", "▁"]) == [0, 0, 0, 1, None]
  assert wa.word_indices(["a", "▁b"]) == [0, 1]  # The first piece begins a word regardless.
  # In detokenized output an unknown piece reads ' ⁇ ': a word, and the next piece begins one.
  pieces = ["▁a", "<unk>", "b", "▁c"]
  assert wa.word_indices(pieces) == [0, 0, 0, 1]
  assert wa.word_indices(pieces, unknown_is_word=True) == [0, 1, 2, 3]


def test_each_target_subword_links_its_argmax_and_words_take_every_link_of_their_subwords():
  # Target subwords of words [0, 0, 1] over source subwords of words [0, 1, 1, 2].
  weights = np.array([[0.1, 0.2, 0.6, 0.1],   # -> source subword 2: word 1
                      [0.5, 0.3, 0.1, 0.1],   # -> source subword 0: word 0
                      [0.1, 0.1, 0.3, 0.5]])  # -> source subword 3: word 2
  links = wa.word_links(weights, [0, 1, 1, 2], [0, 0, 1])
  assert links == [(0, 0), (1, 0), (2, 1)]
  assert wa.pharaoh(links) == "0-0 1-0 2-1"
  assert wa.word_links(weights, [0, 0, 0, 0], [0, 0, 0]) == [(0, 0)]  # One word each: one link.
  assert wa.word_links(weights, [0, 1, 1, None], [0, 0, 1]) == [(0, 0), (1, 0)]  # None: no word.
  assert wa.word_links(np.zeros((0, 2)), [0, 1], []) == []
  no_attention = weights.copy()
  no_attention[1] = 0  # The RNN without attention (`none`) gives all-zero rows: no link.
  assert wa.word_links(no_attention, [0, 1, 1, 2], [0, 0, 1]) == [(1, 0), (2, 1)]


def test_the_layer_is_the_penultimate_by_default_and_a_missing_one_is_refused():
  assert wa.layer_index(-2, 6) == 4
  assert wa.layer_index(-2, 1) == 0  # The only layer of a 1-layer model.
  assert wa.layer_index(5, 6) == 5
  with pytest.raises(ValueError, match="--alignment_layer=6 is not a layer"):
    wa.layer_index(6, 6)
  with pytest.raises(ValueError, match="--alignment_layer=-1"):
    wa.layer_index(-1, 0)


@pytest.mark.slow  # Over ~7 s: builds a model, compiles its batches and runs it op by op.
@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_batched_links_equal_the_argmax_of_each_sentence_alone(run, family):
  """`word_alignments` pads sentences into batches; its links are those of the op-by-op
  attention of each sentence alone, `</s>` left out on both sides (for the Transformer the
  penultimate of 2 layers, heads averaged)."""
  c = shared_run_config()
  c.model.family, c.model.num_decoder_layers = family, 2
  c.model.attention = "general" if family == "rnn" else c.model.attention
  tokenizer = Tokenizer.load(run / "vocab" / "spm.model")
  model = build_model(c, tokenizer.vocab_size)
  graphdef, params = nnx.split(model, nnx.Param)
  # Batches of 2: the last is completed with a filler row.
  fake = types.SimpleNamespace(graphdef=graphdef, params=params, config=c, batch_size=2,
                               tokenizer=tokenizer)
  texts = ["A dog runs on the beach.", "", "Two men are playing football in a long park.", "Hi",
           "A woman is cooking."]
  sources = [np.asarray(tokenizer.encode(t), np.int32) for t in texts]
  rng = np.random.default_rng(0)
  outputs = [np.concatenate([rng.integers(4, 60, n), [EOS_ID]]).astype(np.int32)
             for n in (5, 3, 9, 0, 4)]
  links = alignment.word_alignments(fake, sources, outputs, layer=-2)
  assert links[1] == [] and links[3] == []  # An empty source; an output of `</s>` alone.
  for src, out, found in zip(sources, outputs, links, strict=True):
    if not len(src) or len(out) == 1:
      continue
    tgt_in = np.concatenate([[BOS_ID], out[:-1]])[None]
    weights = model.attention_weights(jnp.asarray(np.append(src, EOS_ID)[None]),
                                      jnp.asarray(tgt_in))["cross"]
    assert weights.shape[0] == (2 if family == "transformer" else 1)
    # Layer 0: the penultimate of the Transformer's 2, the RNN's only one.
    mean = np.asarray(weights[0, 0].mean(0))[:-1, :-1]
    src_words = wa.word_indices(tokenizer.pieces(src))
    tgt_words = wa.word_indices(tokenizer.pieces(out[:-1]))
    assert found == wa.word_links(mean, src_words, tgt_words)
    assert found and all(0 <= i <= max(src_words) and 0 <= j <= max(tgt_words)
                         for i, j in found)


def translate(run, *args, stdin: str):
  return subprocess.run([sys.executable, str(ROOT / "scripts" / "translate.py"),
                         f"--workdir={run}", "--alignment", *args], input=stdin.encode(),
                        capture_output=True, env=ENV, timeout=300)


def check_pharaoh_lines(lines, out: str):
  """One output line per input line: the translation, a tab and links within its words, each
  target word linked (each of its subwords is)."""
  rows = out.split("\n")
  assert rows[-1] == "" and len(rows) - 1 == len(lines), out
  for line, row in zip(lines, rows, strict=False):
    text, links = row.split("\t")
    if not line.strip():
      assert (text, links) == ("", "")
      continue
    pairs = [tuple(map(int, link.split("-"))) for link in links.split()]
    assert pairs == sorted(set(pairs))
    assert all(0 <= i < len(line.split()) for i, _ in pairs)
    assert {j for _, j in pairs} == set(range(len(text.split())))


LINES = ["A dog runs on the beach.", "", "Two men are playing football in a long green park.",
         "   ", "Zwei XYZ Männer."]


def test_translate_writes_a_line_of_links_for_each_input_line(run):
  result = translate(run, "--beam_size=2", stdin="\n".join(LINES) + "\n")
  assert result.returncode == 0, result.stderr.decode()[-3000:]
  check_pharaoh_lines(LINES, result.stdout.decode("utf-8"))


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory):
  from seq2seq.training import loop
  c = shared_run_config()
  c.model.family, c.model.attention = "rnn", "general"
  workdir = tmp_path_factory.mktemp("rnn") / "run"
  loop.train_and_evaluate(c, workdir)
  return workdir


@pytest.mark.slow  # Over ~7 s: trains an RNN run, then translates in a new process.
def test_translate_with_an_rnn_writes_a_line_of_links_for_each_input_line(rnn_run):
  result = translate(rnn_run, "--nbest=2", "--beam_size=2", stdin="\n".join(LINES) + "\n")
  assert result.returncode == 0, result.stderr.decode()[-3000:]
  rows = result.stdout.decode("utf-8").splitlines()
  assert len(rows) == 2 * len(LINES)
  for row in rows:
    index, text, _, links = row.split(" ||| ")
    line = LINES[int(index)]
    assert all(0 <= int(i) < len(line.split()) and 0 <= int(j) < len(text.split())
               for i, j in (link.split("-") for link in links.split()))


def gold_files(tmp_path, gold: str):
  src, ref, path = tmp_path / "test.en", tmp_path / "test.de", tmp_path / "gold.txt"
  src.write_text("A dog runs on the beach .\nA woman is cooking .\n\n", encoding="utf-8")
  ref.write_text("Ein Hund rennt am Strand .\nEine Frau kocht .\n\n", encoding="utf-8")
  path.write_text(gold, encoding="utf-8")
  return {"src_file": str(src), "ref_file": str(ref), "gold_alignment": str(path)}


@pytest.mark.parametrize("family", ["transformer", pytest.param("rnn", marks=pytest.mark.slow)])
def test_evaluate_reports_the_aer_of_the_attention_on_the_reference(run, family, request,
                                                                    tmp_path):
  workdir = run if family == "transformer" else request.getfixturevalue("rnn_run")
  files = gold_files(tmp_path, "0-0 1-1 2-2 3?3 4-3 5-4 6-5\n0-0 1-1 2p2 3-2 4-3\n\n")
  result, prefix = evaluate.run_evaluation(workdir, checkpoint="latest", beam_size=1, **files)
  assert 0 <= result["aer"] <= 1 and result["alignment_layer"] == 0
  assert json.loads(prefix.with_suffix(".beam1.json").read_text())["aer"] == result["aer"]
  # The AER is that of the links of the attention on the references, from the pure function.
  translator = Translator(workdir, "latest")
  sources = ["A dog runs on the beach .", "A woman is cooking .", ""]
  refs = ["Ein Hund rennt am Strand .", "Eine Frau kocht .", ""]
  links = alignment.word_alignments(
      translator, [translator.source_ids(s) for s in sources],
      [np.asarray(translator.tokenizer.encode(r) + [EOS_ID], np.int32) for r in refs])
  # Och & Ney's AER of those links, counted here from the gold file's text: sure links '-',
  # possible links '?' or 'p' (the sure ones are possible too), over the whole test set.
  sure, possible = set(), set()
  for n, line in enumerate(["0-0 1-1 2-2 3?3 4-3 5-4 6-5", "0-0 1-1 2p2 3-2 4-3", ""]):
    for link in line.split():
      i, mark, j = re.fullmatch(r"(\d+)([-?p])(\d+)", link).groups()
      possible.add((n, int(i), int(j)))
      if mark == "-":
        sure.add((n, int(i), int(j)))
  found = {(n, i, j) for n, sentence in enumerate(links) for i, j in sentence}
  expected = 1 - (len(found & sure) + len(found & possible)) / (len(found) + len(sure))
  assert result["aer"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("gold,kwargs,expected", [
    ("0-0\n", {}, "--gold_alignment={gold} has 1 line but the test set has 3 sentences; pass the"
     " gold alignment of this test set, one line per sentence (empty for none)."),
    ("0-0\n1-5\n\n", {}, "--gold_alignment={gold} line 2: the link 1-5 is outside the sentence's"
     " 5 source and 4 target words (counted from 0); align the test set's own text, tokenized as"
     " the gold set is."),
    ("1-1\n4-7\n\n", {"gold_one_based": True}, "--gold_alignment={gold} line 2: the link 4-7 is"
     " outside the sentence's 5 source and 4 target words (counted from 1); align the test"
     " set's own text, tokenized as the gold set is."),
    ("0-0 1=1\n\n\n", {}, "--gold_alignment={gold} line 1: '1=1' is not a link: write i-j (sure)"
     " or i?j or ipj (possible), with i the source word and j the target word."),
    ("0-0\n\n\n", {"alignment_layer": 1}, "--alignment_layer=1 is not a layer of this model,"
     " which has 1 cross-attention layer; pass one from -1 to 0 (-2: the penultimate)."),
    ("0-0\n\n\n", {"ensemble": ["{run}"]}, "--gold_alignment scores one model's attention, not an"
     " ensemble's; drop one of them."),
])
def test_a_wrong_gold_file_or_layer_is_one_line(run, tmp_path, gold, kwargs, expected):
  files = gold_files(tmp_path, gold)
  kwargs = {k: [a.format(run=run) for a in v] if k == "ensemble" else v for k, v in kwargs.items()}
  with pytest.raises(UserError) as raised:
    evaluate.run_evaluation(run, checkpoint="latest", **files, **kwargs)
  assert str(raised.value) == expected.format(gold=files["gold_alignment"])
  assert not (run / "eval" / "test.en.latest.beam4.json").exists()


def val_gold(run, tmp_path, lines: int | None = None):
  """A gold alignment of the run's validation sentences: word 0 to word 0 where both have words
  (the first `lines` sentences' lines only, when given)."""
  from seq2seq.data import corpus
  from seq2seq.runs import workdirs

  text = corpus.read_split(workdirs.read_run_config(run).data, "val")
  gold = ["0-0" if s.split() and t.split() else "" for s, t in zip(text.src, text.tgt,
                                                                    strict=True)]
  path = tmp_path / "gold.txt"
  path.write_text("".join(f"{line}\n" for line in gold[:lines]), encoding="utf-8")
  return path


@pytest.mark.slow  # A comparison and an evaluation of the run: over ~7 s.
def test_compare_shows_the_aer_that_evaluate_reports(run, tmp_path):
  from seq2seq.compare import comparison

  gold = val_gold(run, tmp_path)
  rows = comparison.compare_runs([run], tmp_path / "out", split="val", beam_size=2,
                                 n_samples=20, gold_alignment={"gold_alignment": str(gold)})
  result, _ = evaluate.run_evaluation(run, split="val", checkpoint="best", beam_size=1,
                                      gold_alignment=str(gold))
  assert rows[0]["val_aer"] == result["aer"]
  header = (tmp_path / "out" / "comparison.csv").read_text().splitlines()[0].split(",")
  assert header[-1] == "val_aer"


def test_compare_refuses_a_wrong_gold_file_before_it_decodes(run, tmp_path):
  from seq2seq.compare import comparison

  gold = val_gold(run, tmp_path, lines=1)
  with pytest.raises(UserError, match=r"^--gold_alignment=.*gold.txt has 1 line but the test set"):
    comparison.compare_runs([run], tmp_path / "out", split="val",
                            gold_alignment={"gold_alignment": str(gold)})
  assert not (tmp_path / "out").exists()


@pytest.mark.slow  # About 12 s: compare decodes a run.
def test_compare_reads_the_gold_file_once(run, tmp_path, monkeypatch):
  """The gold alignment is read and checked before anything decodes, and those links score
  every run: it was read again for each run's score, so a file changed meanwhile scored the
  runs against other links than the ones checked."""
  from seq2seq.compare import comparison

  gold, reads, read = val_gold(run, tmp_path), [], alignment_error.read_lines
  monkeypatch.setattr(alignment_error, "read_lines",
                      lambda path, *args: reads.append(str(path)) or read(path, *args))
  rows = comparison.compare_runs([run], tmp_path / "out", split="val", beam_size=1,
                                 n_samples=20, gold_alignment={"gold_alignment": str(gold)})
  assert reads == [str(gold)]
  assert 0 <= rows[0]["val_aer"] <= 1


def test_compare_refuses_a_layer_the_runs_lack_before_it_decodes(run, tmp_path, monkeypatch):
  """As a wrong gold file: it was refused only once every run had been decoded on every set."""
  from seq2seq.compare import comparison, scoring

  decoded = []
  monkeypatch.setattr(scoring, "evaluation", lambda *args: decoded.append(args))
  with pytest.raises(UserError) as raised:
    comparison.compare_runs([run], tmp_path / "out", split="val", gold_alignment={
        "gold_alignment": str(val_gold(run, tmp_path)), "alignment_layer": 1})
  assert str(raised.value) == ("--alignment_layer=1 is not a layer of this model, which has 1"
                               " cross-attention layer; pass one from -1 to 0 (-2: the"
                               " penultimate).")
  assert not decoded and not (tmp_path / "out").exists()
