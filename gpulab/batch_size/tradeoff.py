"""Steps against examples, and the critical batch (chapter 10, sections 1 and 3).

Source: McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", arXiv:1812.06162,
§2.3; the conversion of one run's steps into S_min and E_min is Kaplan et al. 2020, "Scaling
Laws for Neural Language Models", arXiv:2001.08361, eq. 5.4.

If every step at batch B makes 1/(1 + B_noise/B) of the progress a step with the exact gradient
makes (``noise_scale.optimal_improvement``), then reaching a target takes

    S = S_min (1 + B_noise/B)   steps,   E = B·S = E_min (1 + B/B_noise)   examples,

with S_min the steps at an infinite batch and E_min = S_min·B_noise the examples at a tiny one.
Eliminating B:  (S/S_min − 1)(E/E_min − 1) = 1, a hyperbola in the (E, S) plane, and its bend,
the critical batch, is B_crit = E_min/S_min. When the noise scale changes during training,
S = S_min + E_min/B still holds step by step, with E_min the sum of B_noise over the steps of the
infinite-batch run: B_crit is the noise scale averaged over that run. At B = B_crit a run takes
2·S_min steps and 2·E_min examples.
"""

from __future__ import annotations

import math


def steps_at_batch(s_min: float, b_crit: float, batch: float) -> float:
    """S(B) = S_min (1 + B_crit/B): optimizer steps to the target at batch B.

    >>> steps_at_batch(1000, 256, 256)
    2000.0
    """
    return s_min * (1 + b_crit / batch)


def examples_at_batch(e_min: float, b_crit: float, batch: float) -> float:
    """E(B) = E_min (1 + B/B_crit): examples (or tokens) processed to reach the target.

    >>> examples_at_batch(1e6, 256, 1024)
    5000000.0
    """
    return e_min * (1 + batch / b_crit)


def critical_batch(s_min: float, e_min: float) -> float:
    """B_crit = E_min / S_min, the bend of the steps-examples hyperbola (same unit as E_min)."""
    return e_min / s_min


def tradeoff(steps: float, examples: float, s_min: float, e_min: float) -> float:
    """(S/S_min − 1)(E/E_min − 1): 1 on the hyperbola of McCandlish et al. 2018, §2.3.

    >>> tradeoff(2000, 512_000, 1000, 256_000)
    1.0
    """
    return (steps / s_min - 1) * (examples / e_min - 1)


def min_steps_and_examples(steps: float, batch: float, b_crit: float) -> tuple[float, float]:
    """S_min and E_min from one run of S steps at batch B, given B_crit: S_min = S/(1 + B_crit/B),
    E_min = B·S/(1 + B/B_crit) (Kaplan et al. 2020, eq. 5.4)."""
    return steps / (1 + b_crit / batch), batch * steps / (1 + batch / b_crit)


def fit_steps_examples(batches: list[float], steps: list[float]) -> tuple[float, float]:
    """(S_min, E_min) that fit S = S_min + E_min/B best to measured (batch, steps) pairs.

    S is linear in 1/B, so this is a straight-line fit of S against 1/B, weighted by 1/S² so that
    every point counts by its relative error (a 10% miss at 20 steps weighs as much as one at
    2000). Needs two or more batch sizes; the critical batch is E_min/S_min."""
    if len(batches) != len(steps) or len(batches) < 2:
        raise ValueError("need two or more (batch, steps) pairs")
    w = [1 / s**2 for s in steps]
    x = [1 / b for b in batches]
    sw, sx, sy = sum(w), sum(wi * xi for wi, xi in zip(w, x)), sum(wi * si for wi, si in zip(w, steps))
    sxx = sum(wi * xi * xi for wi, xi in zip(w, x))
    sxy = sum(wi * xi * si for wi, xi, si in zip(w, x, steps))
    e_min = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    s_min = (sy - e_min * sx) / sw
    return s_min, e_min


def best_learning_rate(lrs: list[float], steps: list[float]) -> tuple[float, float]:
    """(learning rate, steps) at the bottom of a learning-rate sweep: a parabola through the
    fastest grid point and its two neighbours, in log(lr) and log(steps). Grid points a few
    √2 apart would otherwise make the best steps jump by up to ~20% with the grid's placement.
    At the edge of the grid (or next to a run that never arrived) the grid point itself."""
    finite = [i for i, s in enumerate(steps) if math.isfinite(s)]
    if not finite:
        raise ValueError("no learning rate reached the target")
    i = min(finite, key=lambda k: steps[k])
    if i == 0 or i == len(steps) - 1 or not (math.isfinite(steps[i - 1]) and math.isfinite(steps[i + 1])):
        return lrs[i], steps[i]
    x = [math.log(lrs[k]) for k in (i - 1, i, i + 1)]
    y = [math.log(steps[k]) for k in (i - 1, i, i + 1)]
    # vertex of the parabola through three points
    denom = (x[0] - x[1]) * (x[0] - x[2]) * (x[1] - x[2])
    a = (x[2] * (y[1] - y[0]) + x[1] * (y[0] - y[2]) + x[0] * (y[2] - y[1])) / denom
    b = (x[2] ** 2 * (y[0] - y[1]) + x[1] ** 2 * (y[2] - y[0]) + x[0] ** 2 * (y[1] - y[2])) / denom
    if a <= 0:
        return lrs[i], steps[i]
    vertex = min(max(-b / (2 * a), x[0]), x[2])
    c = y[1] - a * x[1] ** 2 - b * x[1]
    return math.exp(vertex), math.exp(a * vertex**2 + b * vertex + c)
