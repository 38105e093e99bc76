"""The published small-Transformer recipe for Multi30k en->de (Wu et al., ACL 2021;
`configs/multi30k_transformer_wu2021.py`, kept as the paper wrote it) with what this project's
comparisons found for small Transformers on Multi30k (docs/recipe.md, "The default recipe
decided by seeds"): rotary positions and dropout 0.1 on the attention weights.

  seq2seq-train --config=configs/multi30k_transformer_wu2021_plus.py --workdir=runs/m30k_plus
  seq2seq-evaluate --workdir=runs/m30k_plus --split=val \
      --checkpoint=best,avg:5,avg:10 --beam_size=4,5,6 --alpha=0.6,1.0
  seq2seq-evaluate --workdir=runs/m30k_plus --split=test --checkpoint=selected

The checkpoint, the beam and the length penalty are chosen together on validation (the second
command scores every pair of each checkpoint), then test is scored once with that choice.
Everything else is the published recipe's: 4+4 layers, d=128, FFN 256, 4 heads, dropout 0.3,
shared embeddings, 10,000 subwords, Adam at 5e-3 with 2,000 warmup steps and
inverse-square-root decay, label smoothing 0.1, 8,000 packed steps of about 6,100 target tokens.
"""

from seq2seq.config_files import sibling


def get_config():
  c = sibling(__file__, "multi30k_transformer_wu2021.py")
  c.model.positions = "rope"
  c.model.attention_dropout_rate = 0.1
  return c
