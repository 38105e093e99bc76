"""The default main job: a small Transformer on Multi30k en->de, tuned for an hour on a laptop CPU.

  python scripts/train.py --config=configs/multi30k_transformer.py \
      --workdir=runs/m30k_transformer

The recipe (docs/recipe.md has the exploration behind it): d=256, 3+3 pre-LN
layers, dropout 0.2, a 5,000-piece joint vocabulary, 4,096-token batches,
2,000 steps (about 12 epochs), a checkpoint every 200 steps so that the last
ones can be averaged (`scripts/evaluate.py --checkpoint=avg:5`).
"""

from seq2seq.config import base_config


def get_config():
  c = base_config()  # d=256, 3+3 layers, 4 heads, MLP 1024, pre-LN, tied embeddings.
  c.model.dropout_rate = 0.2
  c.data.vocab_size = 5000
  c.data.tokens_per_batch = 4096
  c.train.num_steps = 2000
  c.train.warmup_steps = 500
  c.train.learning_rate = 1e-3
  c.eval.every_steps = 500
  c.checkpoint.every_steps = 200
  c.checkpoint.keep = 10
  return c
