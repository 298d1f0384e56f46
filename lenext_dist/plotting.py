"""The matplotlib set-up shared by training and evaluation figures (Agg backend, one save), and the
heatmap of learned head scales that a HeadScale run draws at its end (train/loop.py; also in
eval.plots' public API): below both, so train/ never imports eval/.
"""
from __future__ import annotations

import numpy as np


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return str(path)


def plot_head_scales(scales, path: str, title: str = "HeadScale: learned m_h") -> str:
    """Heatmap of the per-head scales m_h (lambda_h = m_h / sqrt(d)), layers (rows) x heads."""
    plt = pyplot()
    m = np.asarray(scales, dtype=float)
    fig, ax = plt.subplots(figsize=(2.0 + 0.25 * m.shape[1], 1.2 + 0.3 * m.shape[0]))
    im = ax.imshow(m, cmap="viridis", aspect="auto")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{title} (min {m.min():.3f}, mean {m.mean():.3f}, max {m.max():.3f})", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.04, label="m_h")
    return save_figure(fig, path)
