"""Matplotlib set-up for the report: the Agg backend (no display, no GPU), one colour per
layout everywhere, and small PNGs (a palette image of a plot is a fraction of its RGBA size,
which keeps the committed report a few hundred KB)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: the report renders on headless CI machines

import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib depends on Pillow)

LAYOUT_COLORS = {"TP": "#4C72B0", "CP": "#DD8452", "DP": "#55A868", "DOP": "#C44E52"}
LAYOUT_MARKERS = {"TP": "o", "CP": "s", "DP": "^", "DOP": "D"}
LAYOUT_NAMES = {"TP": "TP", "CP": "CP", "DP": "DP-attention", "DOP": "DOP"}
DPI = 100
# Most entries one legend may have: past this a plot splits into panels or groups its lines,
# so the legend does not squeeze the axes (the report's tests hold every plot to it).
LEGEND_MAX = 8

plt.rcParams.update({
    "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7,
    "xtick.labelsize": 7, "ytick.labelsize": 7, "figure.dpi": DPI,
})


def figure(rows: int = 1, cols: int = 1, *, width: float = 4.2, height: float = 2.8):
    """A figure of ``rows`` x ``cols`` panels, each about ``width`` x ``height`` inches."""
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             layout="constrained")
    return fig, axes


def save(fig, path: Path) -> Path:
    """Write ``fig`` as a 64-colour palette PNG at ``path`` and close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    buffer.seek(0)
    with Image.open(buffer) as image:
        palette = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
        palette.save(path, format="PNG", optimize=True)
    return path
