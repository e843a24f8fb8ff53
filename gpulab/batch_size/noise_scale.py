"""The gradient noise scale (chapter 10, sections 1-2): how much of a batch's gradient is signal,
and how to measure it from gradient norms during training.

Source: S. McCandlish, J. Kaplan, D. Amodei and the OpenAI Dota Team, "An Empirical Model of
Large-Batch Training", arXiv:1812.06162 (2018): §2.2 (the noise scale and the best step),
appendix A.1 (the unbiased two-batch estimator).

A batch of B independent examples gives the gradient estimate G_B, whose mean is the true
gradient G and whose covariance is Σ/B (Σ: the covariance of one example's gradient). So

    E|G_B|² = |G|² + tr Σ / B                                        (1)

the signal |G|² plus a noise that shrinks as 1/B. They are equal at B = tr Σ/|G|², the simple
noise scale B_simple. Taking one SGD step −εG_B on a loss with Hessian H, to second order,

    E[ΔL] = −ε|G|² + ½ε²(GᵀHG + tr(HΣ)/B)                           (2)

is smallest at ε_opt(B) = ε_max / (1 + B_noise/B), with ε_max = |G|²/GᵀHG and the noise scale
B_noise = tr(HΣ)/GᵀHG; the best improvement is then ΔL_max / (1 + B_noise/B). B_simple is
B_noise with H replaced by the identity: what one can measure without the Hessian.
"""

from __future__ import annotations


def expected_squared_norm(g2: float, trace: float, batch: float) -> float:
    """E|G_B|² = |G|² + tr Σ / B, eq. (1) of the module docstring."""
    return g2 + trace / batch


def simple_noise_scale(trace: float, g2: float) -> float:
    """B_simple = tr Σ / |G|²: the batch at which the gradient's noise (tr Σ/B) is as large as
    its signal (|G|²). McCandlish et al. 2018, §2.2.

    >>> simple_noise_scale(0.96, 0.0075)
    128.0
    """
    return trace / g2


def two_batch_estimates(g2_small, g2_big, b_small: float, b_big: float):
    """Unbiased estimates of (|G|², tr Σ) from the squared norms of gradients measured at two
    batch sizes, b_small < b_big (McCandlish et al. 2018, appendix A.1): eq. (1) written for both
    sizes is two linear equations in the two unknowns,

        |G|² ≈ (b_big·|G_big|² − b_small·|G_small|²) / (b_big − b_small)
        tr Σ ≈ (|G_small|² − |G_big|²) / (1/b_small − 1/b_big)

    In data-parallel training, |G_small|² is one rank's gradient before the all-reduce and
    |G_big|² the averaged one; with accumulation, one micro-batch's and the accumulated one.
    Each estimate is noisy, and their ratio is biased: average numerator and denominator over
    many steps (the paper uses exponential moving averages) before dividing. Works on floats and
    on tensors alike.

    >>> g2, trace = two_batch_estimates(0.0075 + 0.96 / 16, 0.0075 + 0.96 / 512, 16, 512)
    >>> round(g2, 6), round(trace, 6)
    (0.0075, 0.96)
    """
    if not 0 < b_small < b_big:
        raise ValueError("need 0 < b_small < b_big")
    g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    trace = (g2_small - g2_big) / (1 / b_small - 1 / b_big)
    return g2, trace


def optimal_step(eps_max: float, b_noise: float, batch: float) -> float:
    """The learning rate that lowers the loss most in one SGD step at batch ``batch``:
    ε_opt(B) = ε_max / (1 + B_noise/B) (McCandlish et al. 2018, §2.2). Linear in B while
    B ≪ B_noise (the linear scaling rule), flat at ε_max once B ≫ B_noise.

    >>> optimal_step(1.0, 100, 100)
    0.5
    """
    return eps_max / (1 + b_noise / batch)


def optimal_improvement(dl_max: float, b_noise: float, batch: float) -> float:
    """The best one-step improvement at batch B: ΔL_max / (1 + B_noise/B) (same source). A step
    at B = B_noise makes half the progress of a step with the exact gradient."""
    return dl_max / (1 + b_noise / batch)


class GradientNoiseMeter:
    """The simple noise scale of a real training run, from two squared gradient norms per step.

    Call ``update(small, big)`` once per optimizer step with |G_small|² (the mean squared norm of
    the micro-batch gradients, or of one rank's gradient before the all-reduce) and |G_big|²
    (the squared norm of the step's gradient). It keeps exponential moving averages of the two
    unbiased estimates, |G|² and tr Σ, separately, and ``noise_scale`` is their ratio, as
    McCandlish et al. 2018 (appendix A.1) advise: the ratio of single-step estimates is biased
    and very noisy. ``decay`` 0.95 averages over about the last 20 steps. Batch sizes in one unit
    (sequences or tokens): B_simple comes out in that unit."""

    def __init__(self, b_small: float, b_big: float, decay: float = 0.95):
        if not 0 < b_small < b_big:
            raise ValueError("need 0 < b_small < b_big")
        self.b_small, self.b_big, self.decay = b_small, b_big, decay
        self.g2 = self.trace = 0.0
        self.steps = 0

    def update(self, small: float, big: float) -> None:
        g2, trace = two_batch_estimates(float(small), float(big), self.b_small, self.b_big)
        self.g2 = self.decay * self.g2 + (1 - self.decay) * g2
        self.trace = self.decay * self.trace + (1 - self.decay) * trace
        self.steps += 1

    @property
    def mean_g2(self) -> float:
        """The moving average of the |G|² estimates, bias-corrected (an average of zero-started
        exponential averages is too small by 1 − decay^steps): the signal the meter sees now."""
        return self.g2 / (1 - self.decay ** self.steps) if self.steps else float("nan")

    @property
    def mean_trace(self) -> float:
        """The moving average of the tr Σ estimates, bias-corrected like ``mean_g2``: the noise."""
        return self.trace / (1 - self.decay ** self.steps) if self.steps else float("nan")

    @property
    def noise_scale(self) -> float:
        """B_simple from the averages (their bias corrections cancel in the ratio); NaN before
        the first step or while the |G|² average is not positive."""
        return self.trace / self.g2 if self.steps and self.g2 > 0 else float("nan")
