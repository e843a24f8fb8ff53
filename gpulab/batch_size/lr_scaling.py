"""Moving the learning rate with the batch, warm-up, and the schedules big runs published
(chapter 10, section 4 and "In your training script").

Sources:
- the linear scaling rule and gradual warm-up: P. Goyal et al., "Accurate, Large Minibatch SGD:
  Training ImageNet in 1 Hour", arXiv:1706.02677 (2017), §2.1-2.2: "When the minibatch size is
  multiplied by k, multiply the learning rate by k", η = 0.1·kn/256 for ResNet-50, a warm-up
  from η to kη over the first 5 epochs, and minibatches up to 8k;
- the square-root rule for Adam and RMSprop: S. Malladi, K. Lyu, A. Panigrahi, S. Arora, "On the
  SDEs and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022 (arXiv:2205.10287):
  at κ times the batch, η → √κ·η, 1 − β → κ(1 − β) for both betas, ε → ε/√κ;
- the published runs in ``PUBLISHED`` (each row names its source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def linear_rule(lr: float, batch: float, new_batch: float) -> float:
    """The learning rate for ``new_batch`` by the linear rule (SGD): lr × new_batch/batch.

    Why: k steps of SGD at batch B and rate η move the weights by −η/B·(sum of k·B example
    gradients); one step at batch kB and rate kη moves them by the same sum, provided the
    gradient hardly changes over those k steps (Goyal et al. 2017, §2.1). It holds while
    B ≪ B_noise (``noise_scale.optimal_step`` is then linear in B) and breaks beyond it, at the
    curvature's stability limit, and early in training.

    >>> linear_rule(0.1, 256, 8192)
    3.2
    """
    return lr * new_batch / batch


def sqrt_rule(lr: float, batch: float, new_batch: float) -> float:
    """The learning rate for ``new_batch`` by the square-root rule (Adam, RMSprop):
    lr × √(new_batch/batch) (Malladi et al. 2022). Adam divides each step by the root of its
    running mean square gradient; while noise dominates, that mean square falls as 1/B, so at κ
    times the batch the normalised step is √κ larger already per unit of learning rate.

    >>> round(sqrt_rule(3e-4, 512, 4096), 7)
    0.0008485
    """
    return lr * math.sqrt(new_batch / batch)


def adam_sqrt_rule(lr: float, betas: tuple[float, float], eps: float,
                   kappa: float) -> tuple[float, tuple[float, float], float]:
    """Malladi et al.'s full square-root scaling rule for Adam at κ times the batch:
    (√κ·lr, (1 − κ(1 − β₁), 1 − κ(1 − β₂)), ε/√κ). The betas change so that the moving
    averages cover the same number of examples; it needs κ(1 − β) < 1 (κ < 10 for β₁ = 0.9).
    In practice most runs move the learning rate alone."""
    b1, b2 = (1 - kappa * (1 - b) for b in betas)
    if b1 <= 0 or b2 <= 0:
        raise ValueError(f"κ = {kappa} makes a beta non-positive: the rule needs κ(1 − β) < 1")
    return lr * math.sqrt(kappa), (b1, b2), eps / math.sqrt(kappa)


def goyal_lr(batch: float) -> float:
    """Goyal et al.'s reference learning rate for ResNet-50 with SGD: η = 0.1 × B/256."""
    return 0.1 * batch / 256


def warmup_steps(warmup_tokens: float, tokens_per_step: float) -> float:
    """Optimizer steps a warm-up stated in tokens lasts: warm-up tokens / tokens per step
    (``planning.tokens_per_step``). Schedulers count steps, papers often count tokens.

    >>> round(warmup_steps(375e6, 256 * 2048), 1)      # GPT-3 Small at its full batch
    715.3
    """
    return warmup_tokens / tokens_per_step


def warmup_cosine(step: int, warmup: int, total: int, final: float = 0.1) -> float:
    """The factor on the peak learning rate at ``step`` (counting from 0): a linear warm-up from
    1/warmup of the peak at step 0 to the peak at step ``warmup``, then a cosine decay to
    ``final`` × peak at step ``total``, held after: the schedule GPT-3 and Llama 2 describe
    (warm-up, cosine to 10%). Written for ``torch.optim.lr_scheduler.LambdaLR``; the same values
    as ``LinearLR(start_factor=1/warmup, total_iters=warmup)`` then ``CosineAnnealingLR(
    T_max=total − warmup, eta_min=final × peak)`` chained by ``SequentialLR(milestones=[warmup])``
    (tests/test_batch_size.py checks it step by step), up to ``total``: past T_max
    CosineAnnealingLR climbs back up, where this holds ``final``.

    >>> [round(warmup_cosine(s, 4, 8), 4) for s in (0, 2, 4, 6, 8, 9)]
    [0.25, 0.625, 1.0, 0.55, 0.1, 0.1]
    """
    if warmup > 0 and step < warmup:
        start = 1 / warmup
        return start + (1 - start) * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))


# ------------------------------------------------------------------------------------------
# What big runs published: batch, peak learning rate, warm-up, schedule

GPT3 = ("T. Brown et al., \"Language Models are Few-Shot Learners\" (GPT-3), arXiv:2005.14165, "
        "Table 2.1 and appendix B")
LLAMA2 = ("H. Touvron et al., \"Llama 2: Open Foundation and Fine-Tuned Chat Models\", "
          "arXiv:2307.09288, §2.2 and Table 1")
LLAMA3 = ("Llama Team, AI @ Meta (Dubey et al. 2024), \"The Llama 3 Herd of Models\", "
          "arXiv:2407.21783, §3.4.1")


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: its batch in tokens, its peak learning rate (AdamW), its
    warm-up and schedule, as the source states them."""

    model: str
    params: float
    batch_tokens: float
    peak_lr: float
    warmup: str
    schedule: str
    source: str


GPT3_SCHEDULE = "batch ramped from 32k tokens over the first 4-12B tokens; cosine to 10% over 260B"
LLAMA2_SCHEDULE = "cosine to 10% of the peak"
PUBLISHED: tuple[PublishedRun, ...] = (
    PublishedRun("GPT-3 Small", 125e6, 0.5e6, 6.0e-4, "375M tokens", GPT3_SCHEDULE, GPT3),
    PublishedRun("GPT-3 XL", 1.3e9, 1e6, 2.0e-4, "375M tokens", GPT3_SCHEDULE, GPT3),
    PublishedRun("GPT-3 6.7B", 6.7e9, 2e6, 1.2e-4, "375M tokens", GPT3_SCHEDULE, GPT3),
    PublishedRun("GPT-3 175B", 175e9, 3.2e6, 0.6e-4, "375M tokens", GPT3_SCHEDULE, GPT3),
    PublishedRun("Llama 2 7B", 7e9, 4e6, 3.0e-4, "2000 steps", LLAMA2_SCHEDULE, LLAMA2),
    PublishedRun("Llama 2 70B", 70e9, 4e6, 1.5e-4, "2000 steps", LLAMA2_SCHEDULE, LLAMA2),
    PublishedRun("Llama 3 405B", 405e9, 16e6, 8e-5, "8000 steps",
                 "batch 4M tokens in sequences of 4,096, then 8M tokens in sequences of 8,192 after "
                 "252M tokens (both doubled), 16M after 2.87T; cosine to 8e-7 over 1.2M steps", LLAMA3),
)
