"""Transformer base on WMT14 English->German (Vaswani et al., 2017, Table 3 "base").

  seq2seq-train --config=configs/wmt14_ende_transformer_base.py \
      --workdir=runs/wmt14_ende_base
  seq2seq-evaluate --workdir=runs/wmt14_ende_base --split=test --checkpoint=avg:5 \
      --beam_size=4 --alpha=0.6

Target: 27.3 BLEU on newstest2014 (the paper's number: tokenized BLEU after
splitting German compounds, with the average of the last 5 checkpoints, beam 4,
alpha 0.6; sacreBLEU on detokenized text, which seq2seq-evaluate reports, comes out
somewhat lower). Not reproduced here: it needs the full 100k steps on GPUs
(the paper: 12 hours on 8 P100s).

Data: TFDS `wmt14_translate/de-en` (4.5M pairs, downloaded and prepared by TFDS
on first use) read en->de; validation is newstest2013, test newstest2014. One
joint 32k SentencePiece vocabulary, tied source/target/output embeddings.
Packed rows of 128 tokens, 200 rows: 25,600 target slots per step, about 25k
real target tokens if packing fills them as in simulation (~97%; the paper:
~25k source + 25k target tokens). metrics.jsonl logs the real count as
`tokens_per_step`. If a step does not fit in accelerator
memory, add `--config.train.grad_accum_steps=2` (or 4): the same update from
smaller micro-batches.

Model and optimization as in the paper: d=512, 6+6 layers, 8 heads, MLP 2048,
post-LN, dropout 0.1, label smoothing 0.1, Adam(0.9, 0.98, 1e-9), learning
rate d^-0.5 * min(step^-0.5, step * 4000^-1.5): linear warmup over 4000 steps
to 7.0e-4, then inverse-square-root decay; no gradient clipping. bfloat16
compute with float32 parameters. A checkpoint every 1000 steps and the last 5
kept, for `--checkpoint=avg:5` (the paper averages 5 written 10 minutes apart).
"""

from seq2seq.config import base_config


def get_config():
  c = base_config()
  c.model.emb_dim = 512
  c.model.num_heads = 8
  c.model.num_encoder_layers = 6
  c.model.num_decoder_layers = 6
  c.model.mlp_dim = 2048
  c.model.dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.0
  c.model.share_embeddings = True
  c.model.pre_ln = False
  c.model.max_len = 256

  c.data.corpus = "tfds:wmt14_translate/de-en"
  c.data.src_lang = "en"
  c.data.tgt_lang = "de"
  c.data.vocab_size = 32_000
  c.data.max_len = 128
  c.data.pack = True
  c.data.tokens_per_batch = 200 * 128  # Rows x row length.

  c.train.num_steps = 100_000
  c.train.warmup_steps = 4000
  c.train.learning_rate = 512**-0.5 * 4000**-0.5  # The schedule's peak, at step 4000.
  c.train.adam_b1, c.train.adam_b2, c.train.adam_eps = 0.9, 0.98, 1e-9
  c.train.weight_decay = 0.0
  c.train.clip_norm = 0.0
  c.train.label_smoothing = 0.1
  c.train.dtype = "bfloat16"
  c.train.log_every_steps = 100

  c.eval.every_steps = 5000
  c.eval.beam_size = 4
  c.eval.alpha = 0.6
  c.eval.max_decode_len_a = 1.0  # Output length at most input length + 50, as in the paper.
  c.eval.max_decode_len_b = 50

  c.checkpoint.every_steps = 1000
  c.checkpoint.keep = 5
  return c
