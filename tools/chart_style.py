"""The project's chart style: one colour for one system on every chart, labelled axes with
units, a width that reads at the docs page's width, and PNGs saved at twice that width.

A reader who learns on one chart that layerfit is dark blue and PyTorch's mmap is red
must find them so on the next one, so the colour of a series comes from its label
through :data:`COLOURS`, a fixed mapping, never from matplotlib's cycle. A label the
mapping lacks (a model's name on a serving chart) gets a colour from its name's hash, so
it too is the same on every chart. Used by ``tools/docs_pages.py`` and
``tools/result_charts.py``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

# The page's content column is about 800 px wide: a figure of PAGE_WIDTH inches at
# SCREEN_DPI fills it, and the PNG is written at twice that many pixels (SAVE_DPI).
PAGE_WIDTH = 8.0
SCREEN_DPI = 100
SAVE_DPI = 2 * SCREEN_DPI

_LAYERFIT = "#1f5aa6"  # dark blue: layerfit as it chooses by itself
_LAYERFIT_LIGHT = "#6baed6"  # light blue: layerfit at a budget a person chose
_LAYERFIT_TEAL = "#17becf"

COLOURS: dict[str, str] = {
    # layerfit itself and its own variants: blues
    "layerfit": _LAYERFIT,
    "layerfit, best hand-chosen budget": _LAYERFIT_LIGHT,
    "layerfit packed (int4)": _LAYERFIT,
    "layerfit dequantized": _LAYERFIT_LIGHT,
    "layerfit float32": "#08306b",
    # the peers: warm colours, each its own
    "PyTorch mmap": "#d1495b",
    "llama.cpp": "#e69f00",
    "Accelerate": "#8e44ad",
    "transformers": "#8c564b",
    # layerfit's pipelines (the papers' configurations)
    "preload": "#2e933c",
    "sequential": "#7f7f7f",
    "sync": _LAYERFIT_LIGHT,
    "async": _LAYERFIT,
    "async-md": _LAYERFIT_TEAL,
    "auto": "#ff7f0e",
    "layerfit async": _LAYERFIT,
    "layerfit auto": "#ff7f0e",
    # bounds drawn beside measurements
    "bound": "#333333",
    "lower bound": "#333333",
    "paper": "#bcbd22",
    "naive": "#c7c7c7",
    # decoding modes
    "plain": "#7f7f7f",
    "lookup": "#2ca02c",
    "draft": "#9467bd",
    "batch 8": "#e377c2",
    "routed": _LAYERFIT,
    "routed, no read-ahead": _LAYERFIT_LIGHT,
    "routed, no cache": _LAYERFIT_TEAL,
    "whole": "#d1495b",
    # schedulers (MASA and its baselines)
    "masa-fair": _LAYERFIT,
    "masa": _LAYERFIT_LIGHT,
    "masa-fcfs": _LAYERFIT_TEAL,
    "bulk": "#d1495b",
    "deepeye": "#e69f00",
    # latency percentiles
    "p50": _LAYERFIT,
    "p95": _LAYERFIT_LIGHT,
    # activation planners
    "layerfit best": _LAYERFIT,
    "paper's best, on its own graphs": "#bcbd22",
}

# For labels the mapping lacks: picked by the label's hash, so stable across charts.
_SPARE = ("#17becf", "#bcbd22", "#8c564b", "#e377c2", "#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e")


def colour(label: str) -> str:
    """The colour of the series called ``label``: the same on every chart."""
    if label in COLOURS:
        return COLOURS[label]
    return _SPARE[zlib.crc32(label.encode()) % len(_SPARE)]


def pyplot():
    """matplotlib's pyplot on the Agg backend with the project's defaults."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "svg.hashsalt": "layerfit",
        "figure.dpi": SCREEN_DPI,
        "font.size": 10,
        "axes.titlesize": 10,
        "axes.labelsize": 10,
        "legend.fontsize": 8.5,
        "xtick.labelsize": 9,
        "ytick.labelsize": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
    })
    return plt


def figure(panels: int = 1, height: float = 3.4, width: float = PAGE_WIDTH):
    """A figure the page's width across with ``panels`` side by side: (fig, axes list)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, panels, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def save(fig, path: Path) -> None:
    """Write ``fig`` as a PNG at twice the page's pixel width, without a timestamp, and
    close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=SAVE_DPI, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)
