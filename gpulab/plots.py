"""The few plot shapes the chapters share: predicted next to measured, and a quantity vs size.

Each function draws on a fresh matplotlib figure and returns the Axes, so a notebook can add a
line or a note before the figure is shown.
"""

from __future__ import annotations

import matplotlib.pyplot as plt


def bars(labels: list[str], series: dict[str, list[float]], ylabel: str, title: str,
         log: bool = False):
    """Grouped bars: one group per label, one bar per series (e.g. 'predicted', 'measured')."""
    fig, ax = plt.subplots(figsize=(max(5.5, 1.4 * len(labels) * len(series)), 3.2))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        positions = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(positions, values, width, label=name)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    return ax


def by_size(sizes: list[float], series: dict[str, list[float]], xlabel: str, ylabel: str,
            title: str):
    """Lines of a quantity against a size on a log x axis (e.g. bandwidth vs copy size)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for name, values in series.items():
        ax.plot(sizes, values, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)  # a rate axis that starts at zero does not exaggerate differences
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return ax
