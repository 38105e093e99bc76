"""An attentive RNN baseline on Multi30k en->de (Luong et al. 2015), sized for a laptop CPU.

  seq2seq-train --config=configs/multi30k_rnn.py --workdir=runs/m30k_rnn

Bidirectional LSTM encoder, LSTM decoder with a bridge, `general` attention and
input feeding. Any other variant: --config.model.attention=concat (Bahdanau),
dot, scaled_dot, location or none (Sutskever). 3,400 steps of ~3,180 real target tokens
(about 22 epochs) with a linear decay to zero and a checkpoint every 100 steps,
so that `--checkpoint=avg:N` has the last ones to average.

Expected result (README's results table, docs/recipe.md, "The RNN recipe at four length
buckets"), measured on a 2-core AVX-512 host, two runs at a time (busy), started at
4250d5d: 52 minutes of train steps (3,520 real target tokens a second); greedy validation
BLEU 36.87 at step 3,400, 38.16 with beam 4 (`best`, chosen on validation among
`best,avg:3,avg:5`), and 37.69 (38.07 lowercase) on test_2016_flickr; its seed 1 scores
38.77, and the two seeds as one model 38.97 (39.36 lowercase). A CPU half as fast takes
about twice as long; there `--config.train.num_steps=1700 --config.eval.every_steps=425`
fits the hour (33.73 validation BLEU with beam 4 in an earlier batching, docs/recipe.md
R2).
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
  # Four padded lengths (config.data.num_buckets), four train programs to compile: 4,176 padded
  # tokens a step pay for fewer padded positions than two lengths at 5,504 did, for 1.46x the real
  # target tokens a second (docs/performance.md, "Fewer padded positions: four length buckets").
  c.data.num_buckets = 4
  c.data.tokens_per_batch = 4176
  c.train.num_steps = 3400
  c.train.warmup_steps = 300
  c.train.learning_rate = 2e-3
  c.train.schedule = "linear"
  c.eval.every_steps = 850
  c.checkpoint.every_steps = 100
  c.checkpoint.keep = 10
  return c
