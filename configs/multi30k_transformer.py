"""The default main job: a small Transformer on Multi30k en->de, sized for a laptop CPU.

  python scripts/train.py --config=configs/multi30k_transformer.py \
      --workdir=runs/m30k_transformer

Expected result: see the README's results table (validation BLEU and wall time,
measured on a 2-core CPU).
"""

from seq2seq.config import base_config


def get_config():
  c = base_config()  # d=256, 3+3 layers, 4 heads, MLP 1024, pre-LN, tied embeddings.
  c.data.vocab_size = 8000
  c.data.tokens_per_batch = 4096
  c.train.num_steps = 800
  c.train.warmup_steps = 400
  c.train.learning_rate = 1e-3
  c.eval.every_steps = 400
  return c
