"""Tests of seq2seq.data: tokenizer, corpus reading and batching."""

import gzip
import itertools
import subprocess
import sys
from pathlib import Path

import ml_collections
import numpy as np
import pytest
import sentencepiece as spm

from seq2seq.config import base_config
from seq2seq.data import batching, corpus, textio, tokenizer
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.errors import UserError
from tests.helpers import TFDS_EXTRA

MULTI30K = Path(__file__).resolve().parents[1] / "data" / "multi30k"
WORDS = ("ein mann eine frau hund katze läuft sitzt auf dem roten blauen grünen ball"
         " straße wasser springt über spielt mit kind kinder zwei drei").split()


def _sentences(n: int, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(1, 12))) for _ in range(n)]


def _raises(match: str, fn, *args):
  """Calls fn(*args), expecting a one-line UserError containing `match`."""
  with pytest.raises(UserError, match=match) as info:
    fn(*args)
  assert "\n" not in str(info.value)
  return str(info.value)


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> tokenizer.Tokenizer:
  prefix = tmp_path_factory.mktemp("spm") / "spm"
  return tokenizer.train_tokenizer(_sentences(300), prefix, vocab_size=100)


# --- tokenizer ---------------------------------------------------------------


def test_special_ids_are_0_to_3(tmp_path):
  assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
  tokenizer.train_tokenizer(_sentences(200), tmp_path / "m", vocab_size=60)
  sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
  assert (tmp_path / "m.vocab").is_file()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["m.model", "m.vocab"]  # No temp files.


def test_encode_decode_round_trip(tok):
  for text in _sentences(50, seed=1):
    ids = tok.encode(text)
    assert ids and not {PAD_ID, BOS_ID, EOS_ID} & set(ids)
    assert all(4 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    # Decoder output: BOS first, stop at EOS, PAD skipped, numpy input.
    decoded = np.array([BOS_ID, *ids[:1], PAD_ID, *ids[1:], EOS_ID, *ids, PAD_ID], np.int32)
    assert tok.decode(decoded) == text
  assert tok.decode([EOS_ID, *tok.encode("ein mann")]) == ""
  assert tok.decode(tok.encode("ein mann") + [tok.vocab_size + 5]).startswith("ein mann")


def test_training_is_deterministic(tmp_path):
  texts = _sentences(300, seed=2)
  tokenizer.train_tokenizer(texts, tmp_path / "a", vocab_size=80, seed=3)
  tokenizer.train_tokenizer(texts, tmp_path / "b", vocab_size=80, seed=3)
  # The files differ only in the recorded model_prefix: compare the vocabularies.
  a, b = (spm.SentencePieceProcessor(model_file=str(tmp_path / f"{n}.model")) for n in "ab")
  assert a.vocab_size() == b.vocab_size() > 4
  assert all(a.id_to_piece(i) == b.id_to_piece(i) and a.get_score(i) == b.get_score(i)
             for i in range(a.vocab_size()))


def test_load_or_train_trains_once(tmp_path):
  calls = []

  def texts_fn():
    calls.append(1)
    return iter(_sentences(300))

  first = tokenizer.load_or_train(tmp_path / "vocab" / "spm.model", texts_fn, vocab_size=80)
  model = tmp_path / "vocab" / "spm.model"
  mtime = model.stat().st_mtime_ns
  second = tokenizer.load_or_train(tmp_path / "vocab" / "spm.model", texts_fn, vocab_size=80)
  assert len(calls) == 1
  assert model.stat().st_mtime_ns == mtime
  assert second.vocab_size == first.vocab_size
  assert second.encode("zwei kinder spielt") == first.encode("zwei kinder spielt")


# --- corpus ------------------------------------------------------------------


def _data_config(**overrides) -> ml_collections.ConfigDict:
  config = base_config().data
  config.update(overrides)
  return config


def test_multi30k_sizes_and_alignment():
  config = _data_config()
  sizes = {split: len(corpus.read_split(config, split)) for split in corpus.SPLITS}
  assert sizes == {"train": 29000, "val": 1014, "test": 1000}
  train = corpus.read_split(config, "train")
  assert train.src[0] and train.tgt[0]
  val = corpus.read_split(config, "val")
  for lang, side in (("en", val.src), ("de", val.tgt)):
    with gzip.open(MULTI30K / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
      assert side[0] == f.readline().rstrip("\n")
  assert val.src[0].startswith("A group of men") and val.tgt[0].startswith("Eine Gruppe")


def test_multi30k_options():
  config = _data_config(src_lang="fr", tgt_lang="cs", multi30k_dir=str(MULTI30K),
                        max_train_examples=5)
  assert len(corpus.read_split(config, "train")) == 5
  assert len(corpus.read_split(config, "val")) == 1014  # The limit is for training only.
  _raises("split", corpus.read_split, _data_config(), "dev")  # Not a split: a caller's mistake.


def _write(path: Path, data: bytes):
  if path.suffix == ".gz":
    data = gzip.compress(data)
  path.write_bytes(data)


def test_local_directory(tmp_path):
  _write(tmp_path / "train.en", "a b\r\n  spaced  \r\nline\u2028sep\n\nlast".encode())
  _write(tmp_path / "train.de.gz", b"x\ny \nz\n\nw\n")
  text = corpus.read_split(_data_config(corpus=str(tmp_path)), "train")
  assert text.src == ["a b", "  spaced  ", "line\u2028sep", "", "last"]
  assert text.tgt == ["x", "y ", "z", "", "w"]
  assert len(text) == 5


def test_a_byte_order_mark_is_no_part_of_the_first_line(tmp_path):
  """Editors on Windows start UTF-8 files with a BOM: every text file read drops it, so a
  reference's first line scores as the text it holds."""
  _write(tmp_path / "train.en", "\ufeffa b\nc\n".encode())
  _write(tmp_path / "train.de.gz", "\ufeffx\ny\n".encode())
  text = corpus.read_split(_data_config(corpus=str(tmp_path)), "train")
  assert (text.src, text.tgt) == (["a b", "c"], ["x", "y"])
  (tmp_path / "ref.de").write_bytes("\ufeffEin Hund.\n\ufeffzwei\n".encode())
  assert textio.read_lines(tmp_path / "ref.de") == ["Ein Hund.", "\ufeffzwei"]  # Only at the start.


def test_tensorflow_not_imported_without_tfds():
  code = ("import sys; from seq2seq.config import base_config; from seq2seq.data import corpus,"
          " batching; corpus.read_split(base_config().data, 'val');"
          " assert not {'tensorflow', 'tensorflow_datasets'} & set(sys.modules)")
  subprocess.run([sys.executable, "-c", code], check=True)


def test_tfds_mock(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets", reason=TFDS_EXTRA)
  config = _data_config(corpus="tfds:wmt14_translate/de-en", src_lang="en", tgt_lang="de")
  with tfds.testing.mock_data(num_examples=8):
    text = corpus.read_split(config, "train")
    assert len(text) == 8
    assert all(isinstance(s, str) for s in text.src + text.tgt)
    assert len(corpus.read_split(config, "val")) == 8
    config.max_train_examples = 3
    assert len(corpus.read_split(config, "train")) == 3
    message = _raises("fr", corpus.read_split, _data_config(corpus=config.corpus,
                                                            src_lang="fr"), "train")
    assert "de, en" in message

  tok = tokenizer.train_tokenizer(text.src + text.tgt, tmp_path / "spm", vocab_size=50)
  src_ids, tgt_ids = batching.encode_pairs(tok, text)
  batches = batching.TrainBatches(src_ids, tgt_ids, tokens_per_batch=256, max_len=64,
                                  bucket_step=8, seed=0)
  batch = batches(0)
  assert sorted(batch) == ["src", "tgt_in", "tgt_out"]
  assert all(v.dtype == np.int32 and v.ndim == 2 for v in batch.values())
  assert batch["src"].shape == batch["tgt_in"].shape == batch["tgt_out"].shape


def test_tfds_not_prepared_offline_says_how_to_prepare(tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets", reason=TFDS_EXTRA)

  def offline(self, *args, **kwargs):
    raise ConnectionError("Failed to reach statmt.org\n(after 3 retries)")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
  config = _data_config(corpus="tfds:wmt14_translate/de-en", src_lang="en", tgt_lang="de",
                        tfds_data_dir=str(tmp_path))
  message = _raises("not prepared", corpus.read_split, config, "train")
  assert message.startswith(f"TFDS dataset wmt14_translate/de-en is not prepared in {tmp_path}/")
  assert "(ConnectionError: Failed to reach statmt.org); prepare it once" in message
  assert "download_and_prepare()" in message and "config.data.tfds_data_dir" in message
  assert "\n" not in message


# --- batching ----------------------------------------------------------------


def _synthetic(n: int = 300, seed: int = 0):
  """Random pairs whose first two source ids encode the example index."""
  rng = np.random.default_rng(seed)
  src, tgt = [], []
  for i in range(n):
    head = [4 + i // 100, 4 + i % 100]
    src.append(np.array(head + list(rng.integers(4, 200, rng.integers(0, 30))), np.int32))
    tgt.append(np.array(rng.integers(4, 200, rng.integers(1, 35)), np.int32))
  return src, tgt


def _row_index(src_row: np.ndarray) -> int:
  return int((src_row[0] - 4) * 100 + src_row[1] - 4)


def _strip(row: np.ndarray) -> list[int]:
  return row[row != PAD_ID].tolist()


KW = dict(tokens_per_batch=256, max_len=30, bucket_step=8)


def test_train_batches_pure_and_seeded():
  src, tgt = _synthetic()
  a = batching.TrainBatches(src, tgt, seed=1, **KW)
  b = batching.TrainBatches(src, tgt, seed=1, **KW)
  c = batching.TrainBatches(src, tgt, seed=2, **KW)
  steps = [0, 1, 3 * a.batches_per_epoch + 2, 5, a.batches_per_epoch - 1, a.batches_per_epoch]
  for step in steps:
    x, y = a(step), b(step)
    assert all(np.array_equal(x[k], y[k]) for k in x)
  def order(batches):
    return [(batches(s)["src"].shape, batches(s)["src"].tobytes()) for s in range(5)]
  assert order(a) != order(c)


def test_train_batches_cover_epoch_exactly_once():
  src, tgt = _synthetic()
  batches = batching.TrainBatches(src, tgt, seed=0, **KW)
  kept = {i for i in range(len(src)) if len(src[i]) + 1 <= 30 and len(tgt[i]) + 1 <= 30}
  assert batches.num_examples == len(kept) and batches.num_dropped == len(src) - len(kept)
  assert 0 < batches.num_dropped  # The data really has too-long pairs.
  bpe = batches.batches_per_epoch
  orders = []
  for epoch in range(2):
    seen, fillers = [], 0
    for step in range(epoch * bpe, (epoch + 1) * bpe):
      batch = batches(step)
      rows, length = batch["src"].shape
      assert (rows, length) in batches.shapes
      assert length % 8 == 0
      assert rows == max(1, 256 // length)
      for r in range(rows):
        if not batch["src"][r].any():
          assert not batch["tgt_in"][r].any() and not batch["tgt_out"][r].any()
          fillers += 1
          continue
        i = _row_index(batch["src"][r])
        seen.append(i)
        assert _strip(batch["src"][r]) == [*src[i], EOS_ID]
        assert _strip(batch["tgt_in"][r]) == [BOS_ID, *tgt[i]]
        assert _strip(batch["tgt_out"][r]) == [*tgt[i], EOS_ID]
    assert sorted(seen) == sorted(kept)
    assert fillers > 0  # Partial batches exist and are padded with PAD rows.
    orders.append(seen)
  assert orders[0] != orders[1]  # Each epoch is reshuffled.


def test_train_batches_shift_and_eos():
  src, tgt = _synthetic()
  batches = batching.TrainBatches(src, tgt, seed=0, **KW)
  for step in range(10):
    b = batches(step)
    real = b["tgt_in"][:, 1:] != PAD_ID
    np.testing.assert_array_equal(b["tgt_in"][:, 1:][real], b["tgt_out"][:, :-1][real])
    used = b["src"].any(axis=1)
    assert (b["tgt_in"][used, 0] == BOS_ID).all()
    for name in ("src", "tgt_out"):
      last = (b[name] != PAD_ID).sum(axis=1) - 1
      assert (b[name][used, last[used]] == EOS_ID).all()
    assert b["src"].shape[1] <= 32  # max_len 30 rounded up to the bucket step.


def test_train_batches_process_sharding():
  src, tgt = _synthetic()
  kw = dict(KW, seed=4, pad_rows_to=2)
  whole = batching.TrainBatches(src, tgt, **kw)
  parts = [batching.TrainBatches(src, tgt, process_index=p, process_count=2, **kw)
           for p in range(2)]
  assert parts[0].shapes == [(rows // 2, length) for rows, length in whole.shapes]
  for step in range(whole.batches_per_epoch + 3):
    full = whole(step)
    for k in full:
      np.testing.assert_array_equal(np.concatenate([p(step)[k] for p in parts]), full[k])
    assert full["src"].shape[0] % 2 == 0
  with pytest.raises(ValueError, match="pad_rows_to"):
    batching.TrainBatches(src, tgt, process_count=2, **KW, seed=0)


@pytest.mark.parametrize("pack", [False, True])
def test_the_devices_pad_batches_but_do_not_change_them(pack):
  """Rows padded for 4 devices (pad_rows_to=4) hold the examples of one device's batches, in
  the same rows, then filler rows: a run resumed on other hardware sees the same examples."""
  src, tgt = _synthetic()
  one = batching.TrainBatches(src, tgt, **KW, seed=3, pack=pack)
  four = batching.TrainBatches(src, tgt, **KW, seed=3, pack=pack, pad_rows_to=4)
  assert four.batches_per_epoch == one.batches_per_epoch
  assert {rows % 4 for rows, _ in four.shapes} == {0}
  for step in range(one.batches_per_epoch + 2):
    alone, padded = one(step), four(step)
    rows = len(alone["src"])
    for key in alone:
      np.testing.assert_array_equal(padded[key][:rows], alone[key])
      assert (padded[key][rows:] == PAD_ID).all() and len(padded[key]) - rows < 4


def test_train_batches_empty_after_filtering():
  src, tgt = _synthetic(20)
  _raises("max_len=3", lambda: batching.TrainBatches(src, tgt, tokens_per_batch=64, max_len=3,
                                                     bucket_step=8, seed=0))
  empty, ids = np.zeros(0, np.int32), np.array([5, 6], np.int32)
  one = batching.TrainBatches([ids, empty, ids], [empty, ids, ids], seed=0, **KW)
  assert (one.num_examples, one.num_dropped, one.batches_per_epoch) == (1, 2, 1)
  _raises("max_len", lambda: batching.TrainBatches([empty] * 3, [empty] * 3, seed=0, **KW))


def test_eval_batches_cover_split_once():
  src, tgt = _synthetic(103)
  src[5] = np.array([4, 9], np.int32)
  tgt[5] = np.zeros(0, np.int32)  # Empty sides are kept in evaluation.
  batches = batching.eval_batches(src, tgt, batch_size=16, max_len=64)
  assert len(batches) == 7
  seen, lengths = [], []
  for b in batches:
    assert b["index"].dtype == np.int32 and b["index"].shape == (16,)
    assert all(b[k].shape[0] == 16 and b[k].shape[1] in batching.GRID and b[k].dtype == np.int32
               for k in ("src", "tgt_in", "tgt_out"))
    lengths.append(b["src"].shape[1])
    for r, i in enumerate(b["index"]):
      if i < 0:
        assert not b["src"][r].any() and not b["tgt_out"][r].any()
        continue
      seen.append(int(i))
      assert _strip(b["src"][r]) == [*src[i], EOS_ID]
      assert _strip(b["tgt_in"][r]) == [BOS_ID, *tgt[i]]
      assert _strip(b["tgt_out"][r]) == [*tgt[i], EOS_ID]
  assert sorted(seen) == list(range(103))
  assert lengths == sorted(lengths)  # Sorted by length: compact batches.

  truncated = batching.eval_batches(src, tgt, batch_size=16, max_len=10)
  for b in truncated:
    for k in ("src", "tgt_in", "tgt_out"):
      assert b[k].shape[1] in (8, 10) and (b[k] != PAD_ID).sum(axis=1).max() <= 10
  assert sorted(i for b in truncated for i in b["index"] if i >= 0) == list(range(103))


def test_bucket_lengths_waste_the_fewest_padded_tokens():
  lengths = np.array([3, 5, 9, 9, 17, 30])
  assert batching.bucket_lengths(lengths, 8, 0) == [8, 16, 24, 32]  # Every needed multiple.
  assert batching.bucket_lengths(lengths, 8, 1) == [32]
  # Padded to 8, 8, 16, 16, 24, 32; the pairs' totals: 8|32 144, 16|32 128, 24|32 152.
  assert batching.bucket_lengths(lengths, 8, 2) == [16, 32]
  assert batching.bucket_lengths(lengths, 8, 3) == [8, 16, 32]
  assert batching.bucket_lengths(lengths, 8, 9) == [8, 16, 24, 32]
  assert batching.bucket_lengths(np.array([], np.int64), 8, 2) == []

  def padded_total(chosen, lengths, step):
    return sum(min(c for c in chosen if c >= step * -(-n // step)) for n in lengths)

  rng = np.random.default_rng(0)
  for _ in range(200):  # Against every choice of lengths.
    lengths = rng.integers(1, 70, rng.integers(1, 40))
    step, count = int(rng.choice([1, 4, 8])), int(rng.integers(1, 4))
    chosen = batching.bucket_lengths(lengths, step, count)
    needed = sorted(set((step * -(-lengths // step)).tolist()))
    best = min(padded_total([*others, needed[-1]], lengths, step)
               for r in range(min(count, len(needed)))
               for others in itertools.combinations(needed[:-1], r))
    assert len(chosen) <= count and chosen[-1] == needed[-1]
    assert padded_total(chosen, lengths, step) == best


def test_train_batches_have_at_most_num_buckets_shapes():
  src, tgt = _synthetic(300)
  every = batching.TrainBatches(src, tgt, seed=0, **KW)
  two = batching.TrainBatches(src, tgt, seed=0, num_buckets=2, **KW)
  assert len(every.shapes) == 4 and len(two.shapes) == 2
  lengths = {batch_length for _, batch_length in two.shapes}

  def epoch(batches):
    seen = []
    for step in range(batches.batches_per_epoch):
      batch = batches(step)
      assert batch["src"].size <= KW["tokens_per_batch"]
      assert batches is every or batch["src"].shape[1] in lengths
      seen += [_row_index(row) for row in batch["src"] if row.any()]
    return sorted(seen)

  assert epoch(two) == epoch(every) and len(epoch(two)) == two.num_examples  # Each once.


def test_one_length_batches_pad_each_sentence_to_its_own_grid_length():
  """`one_length=True` (one cap per batch): a sentence's batch length is a function of the sentence
  alone, so translating it with any other sentences gives it the same decoding cap."""
  src, _ = _synthetic(103)
  empty = [np.zeros(0, np.int32)] * len(src)
  batches = batching.eval_batches(src, empty, batch_size=16, max_len=64, one_length=True)
  seen = []
  for b in batches:
    rows = [int(i) for i in b["index"] if i >= 0]
    assert {batching.grid_length(len(src[i]) + 1, 64) for i in rows} == {b["src"].shape[1]}
    seen += rows
  assert sorted(seen) == list(range(103))
  # Alone, or with any others, a sentence is padded to the same length.
  alone = batching.eval_batches(src[7:8], empty[7:8], batch_size=16, max_len=64,
                                one_length=True)
  assert alone[0]["src"].shape[1] == next(b["src"].shape[1] for b in batches if 7 in b["index"])
  # Mixed batches (validation's) would have padded some sentences past their own length.
  mixed = batching.eval_batches(src, empty, batch_size=16, max_len=64)
  assert len(mixed) < len(batches)


def test_eval_batches_pad_to_the_grid_so_that_similar_sets_share_shapes():
  assert batching.grid_lengths(64) == [8, 16, 24, 32, 48, 64]
  assert batching.grid_lengths(100) == [8, 16, 24, 32, 48, 64, 96, 100]  # Capped by max_len.
  assert [batching.grid_length(n, 100) for n in (1, 8, 9, 33, 97, 100, 500)] == [
      8, 8, 16, 48, 100, 100, 100]
  src, tgt = _synthetic(103)
  batches = batching.eval_batches(src, tgt, batch_size=16, max_len=256)
  for b in batches:  # Each the shortest grid length that holds its longest pair.
    longest = max(len(src[i]) + 1 if i >= 0 else 0 for i in b["index"])
    longest = max(longest, max(len(tgt[i]) + 1 for i in b["index"] if i >= 0))
    assert b["src"].shape[1] == min(n for n in batching.GRID if n >= longest)
  # Another set of similar lengths (other sentences, other padded lengths): the same shapes.
  other_src, other_tgt = _synthetic(103, seed=1)
  other = batching.eval_batches(other_src, other_tgt, batch_size=16, max_len=256)
  assert [len(s) for s in other_src] != [len(s) for s in src]
  assert ({b["src"].shape for b in other} == {b["src"].shape for b in batches}
          == {(16, 16), (16, 24), (16, 32), (16, 48)})




def test_the_vocabulary_trains_on_the_pair_or_on_the_languages_named():
  data = base_config().data
  data.max_train_examples = 5
  train = corpus.read_split(data, "train")
  assert corpus.vocabulary_text(data, train) == train.src + train.tgt
  data.vocab_languages = "de, en,cs,de"  # Spaces and a repeat: each language once, in order.
  cs = corpus.read_split(ml_collections.ConfigDict({**data.to_dict(), "src_lang": "cs"}),
                         "train")
  assert corpus.vocabulary_text(data, train) == train.tgt + train.src + cs.src
  assert len(set(cs.src) & set(train.src)) == 0 and len(cs.src) == 5


@pytest.mark.parametrize("languages,corpus_name,expected", [
    ("de,cs", "multi30k", "config.data.vocab_languages='de,cs' leaves out en, a language of the"
     " pair; add it: the vocabulary must spell what the run trains on."),
    ("en,de,fr", "tfds:wmt14_translate/de-en", "config.data.vocab_languages='en,de,fr' reads each"
     " language's own training file, which a TFDS corpus has not; drop it, or use Multi30k or a"
     " directory of files."),
])
def test_vocabulary_languages_that_cannot_be_read_are_one_line(languages, corpus_name, expected):
  data = base_config().data
  data.vocab_languages, data.corpus = languages, corpus_name
  with pytest.raises(UserError) as raised:
    corpus.vocabulary_text(data, corpus.ParallelText(["a"], ["b"]))
  assert str(raised.value) == expected
