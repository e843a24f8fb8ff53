"""The few plot shapes the chapters share: predicted next to measured, and a quantity vs size.

Each function draws on a fresh matplotlib figure and returns the Axes, so a notebook can add a
line or a note before the figure is shown.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib import ticker


def bars(labels: list[str], series: dict[str, list[float]], ylabel: str, title: str,
         log: bool = False):
    """Grouped bars: one group per label, one bar per series (e.g. 'predicted', 'measured')."""
    # Wider for more bars, up to a page's width (an 18-bar chart was drawn 25 inches wide).
    fig, ax = plt.subplots(figsize=(min(10.0, max(5.5, 0.8 * len(labels) * len(series) + 1.5)), 3.2))
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        positions = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
        ax.bar(positions, values, width, label=name)
    ax.set_xticks(range(len(labels)), labels)
    if max(len(label) for label in labels) > 14:  # long labels: slant them so they do not collide
        plt.setp(ax.get_xticklabels(), rotation=25, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    if len(series) > 1:   # one series needs no legend (the axis label names it)
        # Outside the axes, to the right: inside, it covered the tallest bars.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    return ax


def by_size(sizes: list[float], series: dict[str, list[float]], xlabel: str, ylabel: str,
            title: str):
    """Lines of a quantity against a size on a log x axis (e.g. bandwidth vs copy size)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for name, values in series.items():
        ax.plot(sizes, values, marker="o", label=name)
    ax.set_xscale("log")
    # A tick at each measured size, written out (1, 4, 16, 64), not only at the powers of ten
    # (a 1-64 range would show just 10^0 and 10^1).
    ax.set_xticks(sizes, [f"{size:g}" for size in sizes])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    # A rate axis that starts at zero does not exaggerate differences; the top quarter is
    # headroom for the legend, so that it never covers a curve.
    highest = max((v for values in series.values() for v in values), default=0.0)
    ax.set_ylim(0, 1.35 * highest if highest > 0 else 1.0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, ncol=min(len(series), 2))
    fig.tight_layout()
    return ax


# Labelled capacities of common cards, decimal GB (the vendor's "80 GB" = 80 * 10**9 bytes; the
# datacenter rows match gpulab.device.hardware.GPUS). What a training process can use is less: see the
# memory_bytes note in gpulab.device.hardware. Chapter 02, "VRAM arithmetic".
CARDS_GB: dict[str, float] = {
    "24 GB (e.g. RTX 4090, L4)": 24,
    "40 GB (A100 40GB)": 40,
    "80 GB (A100/H100 80GB)": 80,
    "141 GB (H200)": 141,
}


def stacked_memory_bar(breakdown: dict[str, float], cards: dict[str, float] | None = CARDS_GB,
                       title: str = "Training memory per GPU", ax=None):
    """One stacked bar of a memory breakdown in bytes (its 'total' key is skipped), in decimal GB,
    with a dashed line per card. The y axis reaches the first card the total fits on, so cards far
    above are left out. ``cards=None`` draws no lines."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.4, 3.6))
    bottom = 0.0
    for name, value in breakdown.items():
        if name != "total":
            ax.bar(0, value / 1e9, 0.5, bottom=bottom, label=name)
            bottom += value / 1e9
    cards = cards or {}
    fitting = [gb for gb in cards.values() if gb >= bottom]
    top = 1.1 * max(bottom, min(fitting, default=0))
    shown = sorted((gb, label) for label, gb in cards.items() if gb <= top)
    for gb, _ in shown:
        ax.axhline(gb, color="gray", ls="--", lw=1)
    for group in _crowded_groups(shown, min_gap=0.07 * top):
        # Lines closer than a label's height share one label, at the group's top line, so the
        # labels do not overlap when a large total squeezes the cards together.
        gb = group[-1][0]
        label = group[0][1] if len(group) == 1 else (
            ", ".join(f"{g:g}" for g, _ in group) + " GB cards")
        ax.text(0.3, gb, label, va="bottom", fontsize=8)
    ax.set(xlim=(-0.5, 1.4), ylim=(0, top), xticks=[], title=title,
           ylabel="memory per GPU (GB = 10^9 bytes)")
    handles, names = ax.get_legend_handles_labels()  # reversed: the legend reads like the stack
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return ax


def _crowded_groups(lines: list[tuple[float, str]], min_gap: float) -> list[list[tuple[float, str]]]:
    """Sorted (height, label) lines split into runs whose neighbours are closer than min_gap."""
    groups: list[list[tuple[float, str]]] = []
    for line in lines:
        if groups and line[0] - groups[-1][-1][0] < min_gap:
            groups[-1].append(line)
        else:
            groups.append([line])
    return groups


def stacked_bars(labels: list[str], stacks: dict[str, dict[str, list[float]]], ylabel: str,
                 title: str, ax=None):
    """Stacked bars side by side: one group per label (e.g. a batch size), one bar per stack
    (e.g. 'predicted', 'measured'), each bar split into components ({'params': [...], ...}).
    A component keeps its colour across stacks; stacks differ by hatching."""
    if ax is None:
        _, ax = plt.subplots(figsize=(max(5.5, 1.2 * len(labels) * len(stacks)), 3.4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / len(stacks)
    for i, (stack, parts) in enumerate(stacks.items()):
        positions = [x + (i - (len(stacks) - 1) / 2) * width for x in range(len(labels))]
        bottom = [0.0] * len(labels)
        for j, (part, values) in enumerate(parts.items()):
            ax.bar(positions, values, width, bottom=bottom, color=colours[j % len(colours)],
                   hatch=("", "//", "..", "xx")[i % 4], edgecolor="white",
                   label=f"{part} ({stack})")
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(labels)), labels)
    ax.set(ylabel=ylabel, title=title)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.4)  # headroom: the legend sits above the bars
    ax.legend(fontsize=8, ncol=len(stacks), loc="upper left")
    return ax


def memory_timeline(timeline: list[tuple[str, int]], predicted_peak: float | None = None,
                    title: str = "Bytes alive during one step"):
    """Bytes alive after each operation (from ``measure.peak_memory(..., record=True)``), in MiB,
    with the predicted peak as a dashed line."""
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot([nbytes / 2**20 for _, nbytes in timeline], label="measured")
    if predicted_peak is not None:
        ax.axhline(predicted_peak / 2**20, color="tab:red", linestyle="--", label="predicted peak")
    ax.set_xlabel("operation number in the step")
    ax.set_ylabel("bytes alive (MiB, 2^20 B)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return ax


def roofline(points: dict[str, tuple[float, float]], roofs: dict[str, tuple[float, float]],
             title: str = "Roofline"):
    """Measured operations on the roofline (Williams, Waterman and Patterson 2009), log-log.

    ``points``: name -> (arithmetic intensity in FLOPs/byte, achieved FLOP/s).
    ``roofs``: name -> (peak FLOP/s, bandwidth in bytes/s); each draws min(peak, bandwidth · x).
    """
    import numpy as np

    intensities = [x for x, _ in points.values()]
    criticals = [peak / bandwidth for peak, bandwidth in roofs.values()]
    x = np.logspace(np.log10(min(intensities + criticals) / 4), np.log10(max(intensities + criticals) * 4), 200)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, (peak, bandwidth) in roofs.items():
        ax.plot(x, np.minimum(peak, bandwidth * x), linestyle="--", label=f"{name} roof")
    for name, (intensity, achieved) in points.items():
        ax.scatter([intensity], [achieved], zorder=3)
        ax.annotate(name, (intensity, achieved), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set(xscale="log", yscale="log", title=title,
           xlabel="arithmetic intensity (FLOPs per byte moved)", ylabel="achieved FLOP/s")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return ax
