"""The default main job: a small Transformer on Multi30k en->de, tuned for an hour on a laptop CPU.

  seq2seq-train --config=configs/multi30k_transformer.py --workdir=runs/m30k_transformer

The recipe (docs/recipe.md has the exploration behind it): d=128, 4+4 pre-LN
layers, 4 heads, MLP 512, dropout 0.1, rotary positions and dropout 0.1 on the
attention weights (what the comparisons found, decided on validation by three
seeds: docs/recipe.md, "The default recipe decided by seeds"), a 5,000-piece
joint vocabulary, 4,096-token packed batches (about 3,800 real target tokens
each, one shape to compile), 4,000 steps (about 30 epochs) at a peak learning
rate of 2e-3 with a linear decay to zero, validation every 1,000 steps, and a
checkpoint every 100 steps so that the last ones can be averaged
(`seq2seq-evaluate --checkpoint=avg:5`).

Expected result (README's results table): 38.16-38.96 validation BLEU (greedy,
logged at step 4,000, seeds 0-2). On a 2-core AVX-512 host seed 1 took 45 min 34 s
for the command above, alone but for its first 4 minutes (379b275; such hosts
differ by 2x, docs/performance.md); then

  seq2seq-evaluate --workdir=runs/m30k_transformer --split=val \
      --checkpoint=best,avg:3,avg:5 --beam_size=4 --alpha=0.6
  seq2seq-evaluate --workdir=runs/m30k_transformer --split=test \
      --checkpoint=selected --beam_size=4 --alpha=0.6

choose on validation (seeds 0, 1, 2: `best` 39.69, `best` 39.51, `avg:3` 40.14,
beam 4) and score 39.42, 39.54 and 39.57 on test_2016_flickr (39.91, 39.92 and
40.01 lowercase). The default before it is configs/multi30k_transformer_sinusoidal.py.
"""

from seq2seq.config import base_config


def get_config():
  c = base_config()
  c.model.emb_dim = 128
  c.model.num_heads = 4
  c.model.num_encoder_layers = 4
  c.model.num_decoder_layers = 4
  c.model.mlp_dim = 512
  c.model.dropout_rate = 0.1
  # What the comparisons found, decided by three seeds a side (docs/recipe.md, "The default
  # recipe decided by seeds"); the default before them: --config.model.positions=sinusoidal
  # --config.model.attention_dropout_rate=0.0.
  c.model.positions = "rope"
  c.model.attention_dropout_rate = 0.1
  c.data.vocab_size = 5000
  c.data.tokens_per_batch = 4096
  c.data.pack = True
  c.train.num_steps = 4000
  c.train.warmup_steps = 400
  c.train.learning_rate = 2e-3
  c.train.schedule = "linear"
  c.eval.every_steps = 1000
  c.checkpoint.every_steps = 100
  c.checkpoint.keep = 10
  return c
