"""The default main job: a small Transformer on Multi30k en->de, sized for a laptop CPU.

  python scripts/train.py --config=configs/multi30k_transformer.py \
      --workdir=runs/m30k_transformer

Expected result (README's results table, measured on a 2-core CPU, no GPU):
validation BLEU 29.3 (greedy, logged at step 800) in about 37 minutes; with
`scripts/evaluate.py --beam_size=4`, 31.1 val and 30.9 test_2016_flickr sacreBLEU.
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
