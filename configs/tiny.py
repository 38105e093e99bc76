"""A seconds-scale model for tests and smoke runs (Transformer; RNN with family=rnn).

  seq2seq-train --config=configs/tiny.py --workdir=runs/tiny
  seq2seq-train --config=configs/tiny.py --workdir=runs/tiny_rnn \
      --config.model.family=rnn --config.model.attention=general

Trains on the first 2,000 Multi30k en->de pairs for 40 steps in well under a
minute on a laptop CPU. Expected result: the loss falls (BLEU stays near 0).
"""

from seq2seq.config import base_config


def get_config():
  c = base_config()
  c.model.emb_dim = 32
  c.model.num_heads = 2
  c.model.num_encoder_layers = 1
  c.model.num_decoder_layers = 1
  c.model.mlp_dim = 64
  c.model.rnn_hidden_dim = 32  # Used with --config.model.family=rnn.
  c.model.max_len = 64
  c.data.vocab_size = 500
  c.data.max_len = 32
  c.data.tokens_per_batch = 512
  c.data.max_train_examples = 2000
  c.train.num_steps = 40
  c.train.warmup_steps = 10
  c.train.learning_rate = 3e-3
  c.train.log_every_steps = 10
  c.eval.every_steps = 20
  c.eval.batch_size = 32
  c.eval.max_sentences = 64
  c.eval.max_decode_len_b = 5
  c.checkpoint.keep = 2
  return c
