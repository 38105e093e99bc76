"""The default main job: a small Transformer on Multi30k en->de, tuned for an hour on a laptop CPU.

  python scripts/train.py --config=configs/multi30k_transformer.py \
      --workdir=runs/m30k_transformer

The recipe (docs/recipe.md has the exploration behind it): d=128, 4+4 pre-LN
layers, 4 heads, MLP 512, dropout 0.1, a 5,000-piece joint vocabulary,
4,096-token batches, 1,800 steps (about 11.5 epochs) at a peak learning rate of
2e-3, and a checkpoint every 200 steps so that the last ones can be averaged
(`scripts/evaluate.py --checkpoint=avg:3`). On a 2-core CPU, d=128 trains about
1.7x the tokens per second of d=256, which buys more epochs in the hour.

Expected result (README's results table, 2-core CPU, no GPU): 32.7 validation
BLEU (greedy, logged at step 1,800) in about 52 minutes; then

  python scripts/evaluate.py --workdir=runs/m30k_transformer --split=val \
      --checkpoint=best,avg:3,avg:5 --beam_size=4 --alpha=0.6
  python scripts/evaluate.py --workdir=runs/m30k_transformer --split=test \
      --checkpoint=selected --beam_size=4 --alpha=0.6

choose avg:3 (33.8 validation BLEU) and score 35.1 on test_2016_flickr (35.4
lowercase).
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
  c.train.num_steps = 1800
  c.train.warmup_steps = 600
  c.train.learning_rate = 2e-3
  c.eval.every_steps = 600
  c.checkpoint.every_steps = 200
  c.checkpoint.keep = 10
  return c
