"""An attentive RNN baseline on Multi30k en->de (Luong et al. 2015), sized for a laptop CPU.

  seq2seq-train --config=configs/multi30k_rnn.py --workdir=runs/m30k_rnn

Bidirectional LSTM encoder, LSTM decoder with a bridge, `general` attention and
input feeding. Any other variant: --config.model.attention=concat (Bahdanau),
dot, scaled_dot, location or none (Sutskever). 3,400 steps of ~3,180 real target tokens
(about 22 epochs) with a linear decay to zero and a checkpoint every 100 steps,
so that `--checkpoint=avg:N` has the last ones to average.

Expected result (README's results table, docs/recipe.md), measured on the 2-core
development CPU, where `seq2seq-benchmark --mode=train --layers=4 --dim=128 --heads=4
--mlp=256 --batch=128 --length=32` takes 0.59 s a step: 39 min 35 s of training;
validation BLEU 36.80 greedy at step 3,400, 37.72 with beam 4 (`avg:3`, chosen on
validation), and 38.21 (38.65 lowercase) on test_2016_flickr. A CPU half as fast
(1.11 s for that benchmark) takes about twice as long; there
`--config.train.num_steps=1700 --config.eval.every_steps=425` fits the hour (20 min
39 s on the faster CPU; 33.73 validation BLEU with beam 4).
"""

from seq2seq.config import base_config


def get_config():
  c = base_config()
  c.model.family = "rnn"
  c.model.attention = "general"
  c.model.rnn_cell = "lstm"
  c.model.emb_dim = 256
  c.model.rnn_hidden_dim = 256
  c.model.num_encoder_layers = 1
  c.model.num_decoder_layers = 1
  c.model.bidirectional = True
  c.model.input_feeding = True
  c.model.dropout_rate = 0.3
  c.data.vocab_size = 5000
  # Two padded lengths (config.data.num_buckets), two train programs to compile: 5,504 padded
  # tokens hold the ~3,180 real target tokens a step that 4,096 hold in 8 length buckets.
  c.data.tokens_per_batch = 5504
  c.train.num_steps = 3400
  c.train.warmup_steps = 300
  c.train.learning_rate = 2e-3
  c.train.schedule = "linear"
  c.eval.every_steps = 850
  c.checkpoint.every_steps = 100
  c.checkpoint.keep = 10
  return c
