"""An attentive RNN baseline on Multi30k en->de (Luong et al. 2015), sized for a laptop CPU.

  python scripts/train.py --config=configs/multi30k_rnn.py --workdir=runs/m30k_rnn

Bidirectional LSTM encoder, LSTM decoder with a bridge, `general` attention and
input feeding. Any other variant: --config.model.attention=concat (Bahdanau),
dot, scaled_dot, location or none (Sutskever). Expected result (README's
results table, 2-core CPU, no GPU): validation BLEU 27.5 (greedy, logged at
step 800) in about 25 minutes; with `scripts/evaluate.py --beam_size=4`, 28.5 val
and 29.2 test_2016_flickr sacreBLEU.
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
  c.data.vocab_size = 8000
  c.data.tokens_per_batch = 4096
  c.train.num_steps = 800
  c.train.warmup_steps = 200
  c.train.learning_rate = 2e-3
  c.eval.every_steps = 400
  return c
