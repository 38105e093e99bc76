"""The default main job: a small Transformer on Multi30k en->de, tuned for an hour on a laptop CPU.

  seq2seq-train --config=configs/multi30k_transformer.py --workdir=runs/m30k_transformer

The recipe (docs/recipe.md has the exploration behind it): d=128, 4+4 pre-LN
layers, 4 heads, MLP 512, dropout 0.1, a 5,000-piece joint vocabulary,
4,096-token packed batches (about 3,800 real target tokens each, one shape to
compile), 4,000 steps (about 30 epochs) at a peak learning rate of 2e-3 with a
linear decay to zero, validation every 1,000 steps, and a checkpoint every 100
steps so that the last ones can be averaged (`seq2seq-evaluate
--checkpoint=avg:5`).

Expected result (README's results table, docs/recipe.md): about 36.4 validation BLEU
(greedy, logged at step 4,000). On 2-core AVX-512 hosts, alone, the command above trained
its 4,000 steps in 24 to 54 minutes, 0.35 to 0.81 s a step (3ef3026, 5c8c61d and 0cd00cc, 40
minutes: the hosts differ by 2x; docs/performance.md compares the AVX2 host, about twice as
slow as the faster); then

  seq2seq-evaluate --workdir=runs/m30k_transformer --split=val \
      --checkpoint=best,avg:3,avg:5 --beam_size=4 --alpha=0.6
  seq2seq-evaluate --workdir=runs/m30k_transformer --split=test \
      --checkpoint=selected --beam_size=4 --alpha=0.6

choose `avg:3` (37.94 validation BLEU with beam 4, seed 0, at 5c8c61d and 0cd00cc) and score
37.51 on test_2016_flickr (37.93 lowercase; 37.62 and 37.95 at earlier commits,
docs/recipe.md). Two seeds (--config.train.seed=1 in another workdir) ensembled with
`--ensemble` score 38.58 (39.03 lowercase, 9008d12).
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
