"""Transformer big on WMT14 English->German (Vaswani et al., 2017, Table 3 "big").

  seq2seq-train --config=configs/wmt14_ende_transformer_big.py \
      --workdir=runs/wmt14_ende_big
  seq2seq-evaluate --workdir=runs/wmt14_ende_big --split=test --checkpoint=avg:20 \
      --beam_size=4 --alpha=0.6

Target: 28.4 BLEU on newstest2014 (the paper's number: tokenized BLEU after
splitting German compounds, with the average of the last 20 checkpoints, beam
4, alpha 0.6; sacreBLEU on detokenized text comes out somewhat lower). Not
reproduced here: it needs 300k steps on GPUs (the paper: 3.5 days on 8 P100s).

Everything is `configs/wmt14_ende_transformer_base.py` (data, vocabulary, ~25k
target tokens per step, Adam, schedule, label smoothing, beam search) except
the model: d=1024, 16 heads, MLP 4096, dropout 0.3, so the schedule's peak is
1024^-0.5 * 4000^-0.5 = 4.9e-4. If a step does not fit in accelerator memory,
add `--config.train.grad_accum_steps=2` (or 4): the same update from smaller
micro-batches. The last 20 checkpoints, 1000 steps apart, are kept for
`--checkpoint=avg:20` (the paper averages 20 written 10 minutes apart).
"""

from seq2seq.config_files import sibling


def get_config():
  c = sibling(__file__, "wmt14_ende_transformer_base.py")
  c.model.emb_dim = 1024
  c.model.num_heads = 16
  c.model.mlp_dim = 4096
  c.model.dropout_rate = 0.3
  c.train.learning_rate = 1024**-0.5 * 4000**-0.5  # The schedule's peak, at step 4000.
  c.train.num_steps = 300_000
  c.checkpoint.keep = 20
  return c
