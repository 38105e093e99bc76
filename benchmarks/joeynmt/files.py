"""JoeyNMT's inputs, written from ours for the JoeyNMT comparison (`anchor`, `budget`): its
config (`joeynmt_config`), a vocabulary file of our SentencePiece model's pieces
(`write_vocabulary`), and our corpus as the plain-text files it reads (`write_corpus`), so
that both sides read the same sentences and segment them alike.
"""

from pathlib import Path

import ml_collections
import sentencepiece as spm

from benchmarks.joeynmt.spec import joeynmt_model
from seq2seq.data import corpus
from seq2seq.data.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.errors import UserError

# Characters at which JoeyNMT's reader (str.splitlines) breaks a line and ours does not.
_LINE_BREAKS = "\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_SPECIALS = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}


def joeynmt_config(config: ml_collections.ConfigDict, *, spm_model: Path, vocab_file: Path,
                   data_dir: Path, model_dir: Path) -> dict:
  """JoeyNMT's whole config for our `config`: data, training (the token budget is set later,
  by the worker) and `joeynmt_model`'s model."""
  d, t, e = config.data, config.train, config.eval

  def side(lang: str) -> dict:
    # Our pairs keep at most max_len subwords with BOS/EOS; JoeyNMT drops what exceeds
    # max_length without them.
    return {"lang": lang, "level": "bpe", "lowercase": False, "normalize": False,
            "max_length": d.max_len - 1, "voc_file": str(vocab_file),
            "tokenizer_type": "sentencepiece", "tokenizer_cfg": {"model_file": str(spm_model)}}

  specials = {"unk_token": _SPECIALS["unk"], "unk_id": 0, "pad_token": _SPECIALS["pad"],
              "pad_id": 1, "bos_token": _SPECIALS["bos"], "bos_id": 2,
              "eos_token": _SPECIALS["eos"], "eos_id": 3}
  return {
      "name": "seq2seq-side-by-side", "model_dir": str(model_dir), "use_cuda": False,
      "random_seed": t.seed,
      "data": {"train": str(data_dir / "train"), "test": str(data_dir / "test"),
               "dataset_type": "plain", "src": side(d.src_lang), "trg": side(d.tgt_lang),
               "special_symbols": specials},
      "training": {
          # torch's AdamW decays weights apart from the gradient, scaled by the rate, as
          # optax's adamw does; its Adam would add the decay to the gradient.
          "optimizer": "adamw" if t.weight_decay else "adam", "adam_betas": [t.adam_b1, t.adam_b2],
          "learning_rate": t.learning_rate, "learning_rate_warmup": max(t.warmup_steps, 1),
          "scheduling": "warmupinversesquareroot", "weight_decay": t.weight_decay,
          "clip_grad_norm": t.clip_norm or None, "label_smoothing": t.label_smoothing,
          "loss": "crossentropy", "normalization": "tokens", "batch_type": "token",
          "batch_size": d.tokens_per_batch, "shuffle": True, "epochs": 1_000_000,
          "logging_freq": 100, "validation_freq": 1000, "keep_best_ckpts": 1},
      "testing": {"beam_size": max(e.test_beam_size, 1), "beam_alpha": e.alpha,
                  "batch_size": e.batch_size, "batch_type": "sentence"},
      "model": joeynmt_model(config.model),
  }


def write_vocabulary(spm_model: Path, path: Path) -> int:
  """JoeyNMT's vocabulary file: our pieces in id order (JoeyNMT puts its specials first, UNK at
  0 and PAD at 1, and skips them here: every other id stays ours). Returns the pieces."""
  processor = spm.SentencePieceProcessor(model_file=str(spm_model))
  pieces = [processor.id_to_piece(i) for i in range(processor.vocab_size())]
  expected = {PAD_ID: _SPECIALS["pad"], UNK_ID: _SPECIALS["unk"], BOS_ID: _SPECIALS["bos"],
              EOS_ID: _SPECIALS["eos"]}
  if any(pieces[i] != piece for i, piece in expected.items()):
    raise UserError(f"{spm_model} names its special pieces {pieces[:4]}, not JoeyNMT's"
                    f" {list(expected.values())}; pass a vocabulary seq2seq trained.")
  path.write_text("".join(f"{p}\n" for p in pieces), encoding="utf-8")
  return len(pieces)


def _plain(line: str) -> str:
  return "".join(" " if c in _LINE_BREAKS else c for c in line)


def _pairs(text: corpus.ParallelText) -> list[tuple[str, str]]:
  return [(_plain(s), _plain(t)) for s, t in zip(text.src, text.tgt, strict=True)
          if s.strip() and t.strip()]


def write_corpus(train: corpus.ParallelText, test_src: list[str], directory: Path,
                 src_lang: str, tgt_lang: str, dev: corpus.ParallelText | None = None) -> int:
  """Plain-text files as JoeyNMT reads them: train.{src,tgt} (the pairs with both sides
  non-empty, as ours trains on them), test.{src} and, given `dev`, dev.{src,tgt} (its pairs
  with both sides non-empty: JoeyNMT refuses an empty line), one sentence a line. Returns the
  training pairs written."""
  pairs = _pairs(train)
  files = {f"train.{src_lang}": [s for s, _ in pairs], f"train.{tgt_lang}": [t for _, t in pairs],
           f"test.{src_lang}": [_plain(s) for s in test_src]}
  if dev is not None:
    files |= {f"dev.{src_lang}": [s for s, _ in _pairs(dev)],
              f"dev.{tgt_lang}": [t for _, t in _pairs(dev)]}
  for name, lines in files.items():
    (directory / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
  return len(pairs)
