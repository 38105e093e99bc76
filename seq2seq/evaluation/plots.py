"""Pictures: attention heatmaps, BLEU comparisons and training curves."""

import logging
import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # Files only: no display is needed (or present on servers).
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from seq2seq.decoding.alignment import alignment, check_attends  # noqa: E402
from seq2seq.errors import UserError  # noqa: E402

log = logging.getLogger("seq2seq")

# What a picture of one run's attention asks of a run that has none (`plot_alignment`).
PICK_A_RUN_WITH_ATTENTION = ("pass the --workdir of a run trained with attention (any"
                             " config.model.attention but none)")


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
  return _save(fig, path)


def plot_alignment(translator, text: str, path: str | Path,
                   fix: str = PICK_A_RUN_WITH_ATTENTION) -> Path:
  """Writes the PNG heatmaps of `alignment(translator, text)`: the RNN's alignment, or
  the Transformer's cross-attention per layer and head, subwords on the axes. A run without
  attention is a `UserError` ending in `fix` (`alignment.check_attends`), before it decodes:
  its map would be blank."""
  from seq2seq.evaluation.plots import (
    attention_heatmaps,  # matplotlib only where pictures are drawn.
  )

  check_attends(translator, fix)
  weights, src, tgt = alignment(translator, text)
  c = translator.config.model
  return attention_heatmaps(weights, src, tgt, path, title=f"{c.family}, {c.attention} attention")


def bleu_chart(names: Sequence[str], bleu: Sequence[float], ci: Sequence[float],
               path: str | Path, ylabel: str = "BLEU") -> Path:
  """Bars of BLEU per run with their confidence intervals as error bars."""
  fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 2), 3.5))
  ax.bar(range(len(names)), bleu, yerr=ci, capsize=4, color="tab:blue")
  ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
  ax.set_ylabel(ylabel)
  for i, value in enumerate(bleu):
    ax.text(i, value / 2, f"{value:.1f}", ha="center", color="white", fontsize=8)
  return _save(fig, path)


def training_curves(curves: dict[str, Sequence[tuple[int, float, float]]],
                    path: str | Path) -> Path:
  """Validation BLEU and loss against step, one line per run: `{run: [(step, bleu, loss)]}`."""
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
  for name, points in curves.items():
    steps, bleu, loss = zip(*points, strict=True)
    left.plot(steps, bleu, marker="o", label=name)
    right.plot(steps, loss, marker="o", label=name)
  left.set(xlabel="step", ylabel="validation BLEU")
  right.set(xlabel="step", ylabel="validation loss")
  left.legend(fontsize=7)
  return _save(fig, path)


def length_chart(lines: dict[str, Sequence[tuple[str, float | None]]], path: str | Path,
                 ylabel: str = "BLEU") -> Path:
  """BLEU by source-length bucket, one line per run: `{run: [(bucket, bleu or None)]}`."""
  fig, ax = plt.subplots(figsize=(6, 3.8))
  for name, points in lines.items():
    buckets = [b for b, _ in points]
    ax.plot(range(len(buckets)), [np.nan if v is None else v for _, v in points], marker="o",
            label=name)
    ax.set_xticks(range(len(buckets)), buckets)
  ax.set(xlabel="source sentence length (words)", ylabel=ylabel)
  ax.legend(fontsize=7)
  return _save(fig, path)


def attention_side_by_side(panels: Sequence[tuple[str, np.ndarray, Sequence[str],
                                                  Sequence[str]]], path: str | Path) -> Path:
  """One heatmap per run: `(name, weights [tgt_len, src_len], src tokens, tgt tokens)`, in a
  grid of about as many rows as columns, so that nine runs read as 3 x 3, not one long row."""
  cols = math.ceil(math.sqrt(len(panels)))
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.4 * rows), squeeze=False)
  for ax in axes.flat[len(panels):]:
    ax.set_axis_off()
  for ax, (name, weights, src, tgt) in zip(axes.flat[:len(panels)], panels, strict=True):
    ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(src)), src, rotation=90, fontsize=6)
    ax.set_yticks(range(len(tgt)), tgt, fontsize=6)
    ax.set_title(panel_title(name, weights), fontsize=8)
  return _save(fig, path)


def panel_title(name: str, weights) -> str:
  """A heatmap's title: the run's name, and "(no attention)" when every weight is zero, as a
  model without attention reports them (each attended row sums to 1)."""
  return name if np.any(np.asarray(weights)) else f"{name} (no attention)"


def image_path(path: str | Path, flag: str) -> Path:
  """The file a picture written to `path` ends up in (matplotlib adds `.png` to a name
  without a suffix); raises `UserError` for a format matplotlib cannot write."""
  path = Path(path)
  if not path.suffix:
    return path.with_name(path.name + ".png")
  formats = plt.figure().canvas.get_supported_filetypes()
  plt.close("all")
  if path.suffix[1:].lower() not in formats:
    raise UserError(f"{flag}={path}: matplotlib cannot write {path.suffix} files; use one of"
                    f" {', '.join('.' + f for f in sorted(formats))} (e.g. {path.stem}.png).")
  return path


_MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from (?:current )?font")


def _save(fig, path: str | Path) -> Path:
  """Writes `fig` to `path`. Characters matplotlib's font lacks (run names in CJK, say) make
  it warn once per character and drawing; here they are one line for the picture."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
  plt.close(fig)
  missing = []
  for warning in caught:
    glyph = _MISSING_GLYPH.search(str(warning.message))
    if glyph is None:
      warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    elif chr(int(glyph[1])) not in missing:
      missing.append(chr(int(glyph[1])))
  if missing:
    log.warning("%s: %d characters are not in matplotlib's font (%s) and show as boxes.", path,
                len(missing), "".join(missing[:10]) + ("..." if len(missing) > 10 else ""))
  return path
