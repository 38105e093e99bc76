"""Pictures: attention heatmaps with subword labels."""

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # Files only: no display is needed (or present on servers).
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def attention_heatmaps(weights: np.ndarray, src_tokens: Sequence[str],
                       tgt_tokens: Sequence[str], path: str | Path, title: str = "") -> Path:
  """Writes a grid of heatmaps, one per layer (rows) and head (columns).

  Args:
    weights: `[layers, heads, tgt_len, src_len]` attention of each target token.
    src_tokens: the source subwords (x axis).
    tgt_tokens: the target subwords (y axis).
    path: the PNG to write.
  """
  layers, heads = weights.shape[:2]
  size = max(2.5, 0.28 * max(len(src_tokens), len(tgt_tokens)))
  fig, axes = plt.subplots(layers, heads, figsize=(size * heads, size * layers), squeeze=False)
  for layer in range(layers):
    for head in range(heads):
      ax = axes[layer, head]
      ax.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
      ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=90, fontsize=7)
      ax.set_yticks(range(len(tgt_tokens)), tgt_tokens, fontsize=7)
      if layers * heads > 1:
        ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
