"""Training runs on the synthetic language (chapter 10, experiments 1 and 2): many runs of the
bigram table at once, with plain SGD, counted in steps to a target loss, and the gradient noise
scale measured along a run with the two-batch estimator.

Runs are vectorised: a stack of tables W (runs, V, V) trains in one tensor, each run with its own
learning rate and its own random batches, so a sweep of learning rates × seeds costs about what
one run costs. The loss that decides "target reached" is the exact expected loss
(``language.loss``), not a noisy batch loss, so a small batch is not declared done by a lucky
batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpulab.batch_size import language as lang
from gpulab.batch_size.noise_scale import two_batch_estimates


def sgd_steps_to_target(language: lang.Language, batch: int, lrs: list[float], seeds: int,
                        target: float, max_steps: int, seed: int = 0,
                        patience: float = 2.0) -> torch.Tensor:
    """Steps each SGD run of the bigram table (from W = 0) needs before its exact loss first
    reaches ``target``: a tensor (len(lrs), seeds), ``inf`` for a run that did not get there.

    The step is read between the two steps around the crossing (the loss interpolated linearly
    between them), so a run that arrives after 9.3 steps' worth of progress counts 9.3, not 10:
    at large batches, where runs take few steps, whole steps would hide the trend.

    All runs share nothing but the language: run (i, j) has learning rate ``lrs[i]`` and its own
    batches. To save time, the sweep stops once every run has arrived, or once ``patience``
    times the fastest run's steps have passed (a run that slow cannot be the best learning rate),
    or at ``max_steps``."""
    runs = len(lrs) * seeds
    generator = torch.Generator().manual_seed(seed * 1_000_003 + batch)
    rate = torch.tensor(lrs, dtype=torch.float32).repeat_interleave(seeds)[:, None, None]
    W = lang.zeros(runs, vocab=language.vocab)
    sampler = lang.PairSampler(language, runs)
    steps = torch.full((runs,), float("inf"))
    before = lang.loss(W, language)
    for step in range(1, max_steps + 1):
        W -= rate * lang.batch_gradient(W, sampler.counts(batch, generator))
        now = lang.loss(W, language)
        arrived = (now <= target) & steps.isinf()
        steps[arrived] = step - ((now - target) / (now - before))[arrived]
        before = now
        done = steps.isfinite()
        if done.all() or (done.any() and step >= patience * steps[done].min()):
            break
    return steps.view(len(lrs), seeds)


@dataclass(frozen=True)
class NoiseWindow:
    """The noise scale over a window of steps of one run: estimated from gradient norms at two
    batch sizes (``estimated``), and exact from the closed forms at the same weights
    (``exact``); both are ratios of window means (mean tr Σ / mean |G|²)."""

    first_step: int
    last_step: int
    loss: float          # exact loss at the end of the window, nats per token
    estimated: float     # B_simple from the two-batch estimator
    exact: float         # B_simple from language.gradient_statistics


def noise_along_run(language: lang.Language, batch: int, micro_batch: int, lr: float,
                    steps: int, window: int, seed: int = 0, runs: int = 1) -> list[NoiseWindow]:
    """Train the bigram table with SGD at ``batch`` (split into micro-batches of
    ``micro_batch``, as gradient accumulation or data-parallel ranks split it) and measure the
    simple noise scale in windows of ``window`` steps.

    At every step: |G_small|² is the mean squared norm of the micro-batches' gradients,
    |G_big|² the squared norm of their mean (the gradient the optimizer steps with); the
    two-batch estimator turns them into unbiased estimates of |G|² and tr Σ (McCandlish et al.
    2018, appendix A.1), whose window means give B_simple. ``runs`` > 1 trains that many
    independent runs and pools their estimates (a steadier measurement)."""
    if batch % micro_batch or batch == micro_batch:
        raise ValueError("batch must be a multiple (≥ 2) of micro_batch")
    parts = batch // micro_batch
    generator = torch.Generator().manual_seed(seed * 7_919 + batch)
    W = lang.zeros(runs, vocab=language.vocab, dtype=torch.float64)
    sampler = lang.PairSampler(language, runs * parts)
    windows, sums = [], None
    for step in range(steps):
        counts = sampler.counts(micro_batch, generator, torch.float64)
        micro = lang.batch_gradient(W.repeat_interleave(parts, 0), counts).view(runs, parts, *W.shape[1:])
        small = (micro ** 2).sum((-2, -1)).mean(1)             # |G_small|², per run
        full = micro.mean(1)                                    # the batch's gradient
        big = (full ** 2).sum((-2, -1))                         # |G_big|²
        g2_est, trace_est = two_batch_estimates(small, big, micro_batch, batch)
        g2, trace = lang.gradient_statistics(W, language)
        now = torch.stack([g2_est.mean(), trace_est.mean(), g2.mean(), trace.mean()])
        sums = now if sums is None else sums + now
        W = W - lr * full
        if (step + 1) % window == 0:
            windows.append(NoiseWindow(step + 2 - window, step + 1, float(lang.loss(W, language).mean()),
                                       float(sums[1] / sums[0]), float(sums[3] / sums[2])))
            sums = None
    return windows
