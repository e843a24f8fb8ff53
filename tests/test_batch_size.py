"""Chapter 10, checked: the noise scale's closed forms against per-example gradients from
autograd, the estimator against the exact values, the trade-off formulas against McCandlish et
al.'s closed forms, the learning-rate rules and schedules against torch's schedulers, and the
chapter's measured B_simple and fitted B_crit stable across seeds the notebook does not use.
"""
import doctest
import math

import pytest
import torch

from gpulab.batch_size import language as L
from gpulab.batch_size import lr_scaling, noise_scale, planning, runs, tradeoff

LANG = L.Language(32)
TARGET = LANG.floor() + 0.05                          # the chapter's target loss


@pytest.mark.parametrize("module", [noise_scale, tradeoff, lr_scaling, planning])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


# ------------------------------------------------------------------------------------------
# The language and the bigram table's closed forms

def test_the_language_is_a_circulant_chain_with_a_uniform_stationary_distribution():
    P, pi = LANG.transition_matrix(), LANG.stationary()
    assert torch.allclose(P.sum(1), torch.ones(32, dtype=torch.float64))
    assert torch.allclose(pi @ P, pi)                                   # π is stationary
    assert torch.allclose(P[5], P[0].roll(5))                          # every row the same, shifted
    assert LANG.floor() == pytest.approx(float(-(P[7] * P[7].log()).sum()))
    assert LANG.floor() == pytest.approx(1.72558, abs=1e-5)
    with pytest.raises(ValueError):
        L.Language(8)


def per_example_statistics(W: torch.Tensor):
    """Loss, G, |G|² and tr Σ from autograd: the Jacobian of every pair (a, b)'s own loss
    −ln p_ab with respect to W is the stack of the per-example gradients, weighted by J_ab."""
    def pair_losses(w):
        return -w.log_softmax(-1).flatten()                      # (V²,): pair (a, b) at a·V + b

    g = torch.autograd.functional.jacobian(pair_losses, W, vectorize=True).flatten(1)   # (V², V²)
    weights = LANG.joint().flatten()
    G = (weights[:, None] * g).sum(0)
    second = (weights * (g * g).sum(1)).sum()
    return (weights * pair_losses(W)).sum(), G, (G @ G), second - G @ G


def test_closed_forms_equal_per_example_gradients_from_autograd():
    W = torch.randn(32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    loss, G, g2, trace = per_example_statistics(W)
    assert float(L.loss(W, LANG)) == pytest.approx(float(loss), rel=1e-12)
    torch.testing.assert_close(L.gradient(W, LANG).flatten(), G)
    exact_g2, exact_trace = L.gradient_statistics(W, LANG)
    assert float(exact_g2) == pytest.approx(float(g2), rel=1e-10)
    assert float(exact_trace) == pytest.approx(float(trace), rel=1e-10)
    # the true gradient is also the gradient of the expected loss
    w = W.clone().requires_grad_(True)
    L.loss(w, LANG).backward()
    torch.testing.assert_close(w.grad, L.gradient(W, LANG))


def test_the_hand_calculation_at_initialisation():
    """Experiment 1's prediction: 127.97 pairs, (1 − 1/V − |G|²)/|G|² with |G|² = (|P_0|² − 1/V)/V."""
    assert L.initial_simple_noise_scale(LANG) == pytest.approx(127.969, abs=1e-3)
    assert float(L.simple_noise_scale(L.zeros(vocab=32, dtype=torch.float64), LANG)) == \
        pytest.approx(L.initial_simple_noise_scale(LANG), rel=1e-12)


def test_gradient_descent_is_stable_just_below_the_stability_limit_and_not_above():
    limit = L.stability_limit(LANG)
    assert limit == pytest.approx(199.48, abs=0.01)
    optimum = LANG.transition_matrix().log()                 # p_a = P_a: the floor
    kick = 1e-3 * torch.randn(32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for lr, converges in ((0.9 * limit, True), (1.1 * limit, False)):
        W = optimum + kick
        for _ in range(300):
            W = W - lr * L.gradient(W, LANG)
        assert (float(L.loss(W, LANG)) - LANG.floor() < 1e-9) == converges, lr


def test_batches_of_pairs_are_drawn_with_the_languages_probabilities():
    counts = L.PairSampler(LANG, runs=2).counts(200_000, torch.Generator().manual_seed(1), torch.float64)
    assert counts.sum((-2, -1)).tolist() == [200_000, 200_000]
    assert (counts[0] / 200_000 - LANG.joint()).abs().max() < 0.002
    W = torch.randn(2, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(L.batch_gradient(W, counts), L.gradient(W, LANG), atol=3e-3, rtol=0)


def test_sequences_follow_the_chain():
    tokens = L.sample_sequences(LANG, 2000, 16, torch.Generator().manual_seed(4))
    assert tokens.shape == (2000, 17) and tokens.max() < 32
    pairs = torch.zeros(32, 32, dtype=torch.float64)
    pairs.index_put_((tokens[:, :-1].flatten(), tokens[:, 1:].flatten()), torch.ones(2000 * 16, dtype=torch.float64),
                     accumulate=True)
    assert (pairs / pairs.sum(1, keepdim=True) - LANG.transition_matrix()).abs().max() < 0.05


# ------------------------------------------------------------------------------------------
# The noise scale and the trade-off (McCandlish et al. 2018)

def test_two_batch_estimator_inverts_equation_1_and_is_unbiased_on_samples():
    g2, trace = 0.0075, 0.96
    small, big = (noise_scale.expected_squared_norm(g2, trace, b) for b in (16, 512))
    assert noise_scale.two_batch_estimates(small, big, 16, 512) == pytest.approx((g2, trace))
    with pytest.raises(ValueError):
        noise_scale.two_batch_estimates(small, big, 512, 16)
    # on sampled batches at W = 0: the estimate of one step (256 micro-batches) within 5%
    first = runs.noise_along_run(LANG, 4096, 64, lr=128.0, steps=1, window=1, seed=5, runs=4)[0]
    assert first.exact == pytest.approx(L.initial_simple_noise_scale(LANG), rel=1e-9)
    assert first.estimated == pytest.approx(first.exact, rel=0.05)


def test_gradient_noise_meter_returns_the_noise_scale_of_exact_norms():
    meter = noise_scale.GradientNoiseMeter(b_small=8, b_big=64)
    assert math.isnan(meter.noise_scale)
    for _ in range(5):
        meter.update(noise_scale.expected_squared_norm(0.01, 2.0, 8), noise_scale.expected_squared_norm(0.01, 2.0, 64))
    assert meter.noise_scale == pytest.approx(200.0)
    assert (meter.mean_g2, meter.mean_trace) == (pytest.approx(0.01), pytest.approx(2.0))   # bias-corrected


def test_the_best_step_is_linear_below_the_noise_scale_and_saturates_above():
    assert noise_scale.optimal_step(2.0, 1000, 1) == pytest.approx(2.0 / 1001)
    assert noise_scale.optimal_step(2.0, 1000, 2) / noise_scale.optimal_step(2.0, 1000, 1) == pytest.approx(2, rel=1e-3)
    assert noise_scale.optimal_step(2.0, 1000, 1e9) == pytest.approx(2.0, rel=1e-5)
    assert noise_scale.optimal_improvement(1.0, 500, 500) == 0.5


@pytest.mark.parametrize("batch", [1, 37, 256, 1024, 10**6])
def test_every_batch_lies_on_the_hyperbola(batch):
    s_min, e_min = 2_000, 2_048_000
    b_crit = tradeoff.critical_batch(s_min, e_min)
    S, E = tradeoff.steps_at_batch(s_min, b_crit, batch), tradeoff.examples_at_batch(e_min, b_crit, batch)
    assert E == pytest.approx(batch * S)
    assert tradeoff.tradeoff(S, E, s_min, e_min) == pytest.approx(1.0)
    assert tradeoff.min_steps_and_examples(S, batch, b_crit) == pytest.approx((s_min, e_min))


def test_the_fit_recovers_s_min_and_e_min():
    batches = [32, 128, 512, 2048, 8192]
    exact = [tradeoff.steps_at_batch(5.5, 1450, b) for b in batches]
    assert tradeoff.fit_steps_examples(batches, exact) == pytest.approx((5.5, 5.5 * 1450))
    assert tradeoff.fit_steps_examples([256, 1024], [10_000, 4_000]) == pytest.approx((2_000, 2_048_000))
    with pytest.raises(ValueError):
        tradeoff.fit_steps_examples([256], [10_000])


def test_best_learning_rate_finds_the_vertex_between_grid_points():
    lrs = [2 ** (k / 2) for k in range(8)]
    steps = [100 * math.exp(0.3 * (math.log(lr) - math.log(3.0)) ** 2) for lr in lrs]   # minimum at 3.0
    lr, s = tradeoff.best_learning_rate(lrs, steps)
    assert lr == pytest.approx(3.0, rel=1e-6) and s == pytest.approx(100, rel=1e-6)
    # at the grid's edge, or beside a run that never arrived, the grid point itself
    assert tradeoff.best_learning_rate([1, 2, 4], [30, 20, 10]) == (4, 10)
    assert tradeoff.best_learning_rate([1, 2, 4], [30, 20, math.inf]) == (2, 20)
    with pytest.raises(ValueError):
        tradeoff.best_learning_rate([1, 2], [math.inf, math.inf])


# ------------------------------------------------------------------------------------------
# Learning-rate rules and schedules

def test_learning_rate_rules():
    assert lr_scaling.linear_rule(0.1, 256, 2048) == pytest.approx(0.8)
    assert lr_scaling.goyal_lr(8192) == pytest.approx(3.2)              # Goyal et al.: 0.1 · 8192/256
    assert lr_scaling.sqrt_rule(3e-4, 512, 4096) == pytest.approx(3e-4 * math.sqrt(8))
    lr, (b1, b2), eps = lr_scaling.adam_sqrt_rule(1e-3, (0.9, 0.999), 1e-8, 4)
    assert (lr, b1, b2, eps) == pytest.approx((2e-3, 0.6, 0.996, 5e-9))
    with pytest.raises(ValueError):
        lr_scaling.adam_sqrt_rule(1e-3, (0.9, 0.999), 1e-8, 20)          # 1 − 20 · 0.1 < 0
    assert lr_scaling.warmup_steps(375e6, 256 * 2048) == pytest.approx(715.26, abs=0.01)


def test_warmup_cosine_is_sequential_linear_then_cosine_step_by_step():
    warmup, total, peak = 20, 200, 1.2e-3
    a = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    sequential = torch.optim.lr_scheduler.SequentialLR(a, [
        torch.optim.lr_scheduler.LinearLR(a, start_factor=1 / warmup, total_iters=warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(a, T_max=total - warmup, eta_min=0.1 * peak)],
        milestones=[warmup])
    b = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    lam = torch.optim.lr_scheduler.LambdaLR(b, lambda s: lr_scaling.warmup_cosine(s, warmup, total))
    for step in range(total + 1):
        assert a.param_groups[0]["lr"] == pytest.approx(b.param_groups[0]["lr"], rel=1e-9), step
        a.step(), sequential.step(), b.step(), lam.step()
    assert lr_scaling.warmup_cosine(total + 50, warmup, total) == pytest.approx(0.1)   # held after


def test_published_runs_as_their_papers_state_them():
    rows = {run.model: run for run in lr_scaling.PUBLISHED}
    # GPT-3 Table 2.1; Llama 2 Table 1 and §2.2; Llama 3 §3.4.1
    assert (rows["GPT-3 Small"].batch_tokens, rows["GPT-3 Small"].peak_lr) == (0.5e6, 6.0e-4)
    assert (rows["GPT-3 175B"].batch_tokens, rows["GPT-3 175B"].peak_lr) == (3.2e6, 0.6e-4)
    assert (rows["Llama 2 70B"].peak_lr, rows["Llama 2 70B"].warmup) == (1.5e-4, "2000 steps")
    assert (rows["Llama 3 405B"].peak_lr, rows["Llama 3 405B"].warmup) == (8e-5, "8000 steps")


def test_planning():
    assert planning.tokens_per_step(4, 8, 64, 4096) == 8_388_608
    assert planning.gpus_for_batch(4_194_304, 8, 4096) == 128
    assert planning.doubling_speedup(1e-6, 1.0) == pytest.approx(2, rel=1e-5)
    assert planning.doubling_speedup(1e6, 1.0) == pytest.approx(1, rel=1e-5)
    common = dict(micro_batch=8, seq_len=2048, min_batch_tokens=2**20, s_min=6000, b_crit_tokens=2**20,
                  n_params=1.3e9, peak_flops=989.4e12, mfu=0.4, link_bandwidth=450e9)
    small, at_bcrit, big = (planning.plan(n, **common) for n in (8, 64, 128))
    assert (small.accumulation, at_bcrit.accumulation, big.accumulation) == (8, 1, 1)
    assert small.steps == at_bcrit.steps == pytest.approx(12_000)        # 2 S_min at B = B_crit
    assert big.steps == pytest.approx(9_000) and big.tokens == pytest.approx(3 * 6000 * 2**20)
    assert small.gpu_hours == pytest.approx(at_bcrit.gpu_hours, rel=0.05)
    assert big.gpu_hours > 1.4 * at_bcrit.gpu_hours


# ------------------------------------------------------------------------------------------
# The chapter's measurements, stable across seeds (the notebook runs seed 0)

LRS = [2 ** (k / 2) for k in range(-2, 16)]


def chapter_measurements(seed: int) -> tuple[float, float, float]:
    """(B_crit fitted to the five-batch sweep, B_simple measured and averaged over the steps to
    the target, B_simple measured at step 1), as the notebook's experiments 1 and 2 take them."""
    batches, steps = [32, 128, 512, 2048, 8192], []
    for batch in batches:
        mean = runs.sgd_steps_to_target(LANG, batch, LRS, seeds=4, target=TARGET, max_steps=20_000,
                                        seed=seed).mean(1).tolist()
        steps.append(tradeoff.best_learning_rate(LRS, mean)[1])
    s_min, e_min = tradeoff.fit_steps_examples(batches, steps)
    windows = runs.noise_along_run(LANG, 4096, 64, lr=128.0, steps=20, window=1, seed=seed, runs=4)
    arrived = next(w.last_step for w in windows if w.loss <= TARGET)
    measured = [w.estimated for w in windows if w.last_step <= arrived]
    return e_min / s_min, sum(measured) / len(measured), windows[0].estimated


NOTEBOOK_B_CRIT = 1447.6                              # what the notebook's seed 0 fits (pairs)


@pytest.fixture(scope="module")
def other_seed():
    return chapter_measurements(seed=1)               # one seed: the sweep costs about 3 s


def test_the_fitted_critical_batch_is_stable_across_seeds(other_seed):
    b_crit, _, _ = other_seed
    # seeds 1 and 2 give 1,417 and 1,506; whole steps in place of the interpolated crossing 1,242
    assert abs(b_crit / NOTEBOOK_B_CRIT - 1) < 0.1


def test_the_prediction_from_the_measured_noise_scale_holds_within_the_chapters_tolerance(other_seed):
    """The chapter judges B_crit ≈ the average measured B_simple within ±50%; the measured
    B_simple at step 1 within ±10% of the hand calculation (Experiment 1's tolerance)."""
    b_crit, noise, first = other_seed
    assert abs(b_crit / noise - 1) < 0.5
    assert abs(first / L.initial_simple_noise_scale(LANG) - 1) < 0.1
