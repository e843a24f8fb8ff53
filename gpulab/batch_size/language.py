"""A synthetic language with a known entropy floor, and the smallest model that learns it
(chapter 10, "Batch size and learning", experiments 1-3).

The language is a Markov chain over ``vocab`` tokens: after token a comes a + 1, a + 2, a + 5 or
a + 11 (mod vocab) with Zipf weights 1, 1/2, 1/3, 1/4, 90% of the time, and any token 10% of the
time. Every row of the transition matrix P is the same distribution, shifted (P is circulant), so
the chain's stationary distribution π is uniform and every token is followed by a distribution of
the same entropy. No model can predict the next token better than that entropy, the **floor**:

    floor = H(P_a) = −Σ_b P_ab ln P_ab   (nats per token, the same for every a)

The model is the smallest language model there is, a **bigram table**: logits W
(vocab × vocab), and after token a it predicts p_a = softmax(W_a) (one linear layer on the
one-hot vector of the previous token). It is multinomial logistic regression, so its loss, its
gradient and the statistics of its per-example gradients have closed forms (below), against
which the chapter checks what it measures on training runs. Everything here works on a stack of
tables W of shape (..., vocab, vocab), one per run, so that many runs train at once
(``gpulab.batch_size.runs``).

Per example (a, b) (token a followed by token b), the loss is −ln p_ab and its gradient is
r = p_a − e_b in row a and zero elsewhere. Averaged over the language (pairs drawn with
probability J_ab = π_a P_ab):

    loss      L(W)   = Σ_a π_a Σ_b P_ab (−ln p_ab)
    gradient  G_a    = π_a (p_a − P_a)                         (row a)
    |G|²             = Σ_a π_a² |p_a − P_a|²
    E|g|²            = Σ_a π_a (|p_a|² − 2 p_a·P_a + 1)
    tr Σ             = E|g|² − |G|²      (Σ: covariance of one example's gradient)
    B_simple         = tr Σ / |G|²       (McCandlish et al. 2018, §2.2)

The Hessian is block-diagonal, H_a = π_a (diag p_a − p_a p_aᵀ): row a sees only the share π_a of
the examples, so the curvature is small (at most π_a/2) and plain SGD takes learning rates in the
hundreds before it becomes unstable (``stability_limit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUCCESSORS = (1, 2, 5, 11)           # the likely next tokens: a + 1, a + 2, a + 5, a + 11
WEIGHTS = (1.0, 1 / 2, 1 / 3, 1 / 4)  # Zipf weights of those successors
STRUCTURED = 0.9                      # the share of tokens that follow the structure


@dataclass(frozen=True)
class Language:
    """The synthetic language: ``vocab`` tokens, P circulant (``transition_matrix``)."""

    vocab: int = 32

    def __post_init__(self):
        if self.vocab <= max(SUCCESSORS):
            raise ValueError(f"vocab must exceed {max(SUCCESSORS)} so the successors are distinct")

    def transition_matrix(self) -> torch.Tensor:
        """P (vocab × vocab, float64): row a is the distribution of the token after a."""
        V = self.vocab
        row = torch.full((V,), (1 - STRUCTURED) / V, dtype=torch.float64)
        weights = torch.tensor(WEIGHTS, dtype=torch.float64)
        row[list(SUCCESSORS)] += STRUCTURED * weights / weights.sum()
        return torch.stack([row.roll(a) for a in range(V)])      # P[a, (a + s) % V] = row[s]

    def stationary(self) -> torch.Tensor:
        """π, uniform: P is circulant, so each column sums to 1 as each row does."""
        return torch.full((self.vocab,), 1 / self.vocab, dtype=torch.float64)

    def joint(self) -> torch.Tensor:
        """J_ab = π_a P_ab, the probability of the pair (a, b) at any position."""
        return self.stationary()[:, None] * self.transition_matrix()

    def floor(self) -> float:
        """The entropy floor in nats per token: −Σ_b P_ab ln P_ab (the same for every a)."""
        row = self.transition_matrix()[0]
        return float(-(row * row.log()).sum())

    def uniform_loss(self) -> float:
        """The loss of the untrained table (all logits 0): ln vocab."""
        return math.log(self.vocab)


# ------------------------------------------------------------------------------------------
# Exact quantities of the model, for any stack of models θ (..., V + 1, V)

def zeros(*runs: int, vocab: int = 32, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Untrained tables W = 0 (all logits 0: uniform predictions, loss ln vocab)."""
    return torch.zeros(*runs, vocab, vocab, dtype=dtype)


def loss(W: torch.Tensor, language: Language) -> torch.Tensor:
    """The expected loss L(W) over the language (nats per token), one per table."""
    J = language.joint().to(W.dtype)
    return -(J * W.log_softmax(-1)).sum((-2, -1))


def gradient(W: torch.Tensor, language: Language) -> torch.Tensor:
    """The true gradient G of L at W (same shape as W): row a is π_a (p_a − P_a)."""
    pi, P = language.stationary().to(W.dtype), language.transition_matrix().to(W.dtype)
    return pi[:, None] * (W.softmax(-1) - P)


def gradient_statistics(W: torch.Tensor, language: Language) -> tuple[torch.Tensor, torch.Tensor]:
    """(|G|², tr Σ) at W, exactly: the true gradient's squared norm and the trace of one
    example's gradient covariance (module docstring)."""
    pi, P = language.stationary().to(W.dtype), language.transition_matrix().to(W.dtype)
    p = W.softmax(-1)
    g2 = (gradient(W, language) ** 2).sum((-2, -1))
    mean_example_g2 = (pi * ((p * p).sum(-1) - 2 * (p * P).sum(-1) + 1)).sum(-1)
    return g2, mean_example_g2 - g2


def simple_noise_scale(W: torch.Tensor, language: Language) -> torch.Tensor:
    """B_simple = tr Σ / |G|² at W, exactly (McCandlish et al. 2018, §2.2)."""
    g2, trace = gradient_statistics(W, language)
    return trace / g2


def initial_simple_noise_scale(language: Language) -> float:
    """B_simple of the untrained table (W = 0, p_a uniform u), by hand: each example's gradient
    is u − e_b in one row, so E|g|² = |u|² − 2/V + 1 = 1 − 1/V; the true gradient is π_a (u − P_a)
    in row a, so |G|² = Σ_a π_a² (|P_a|² − 1/V) = (|P_0|² − 1/V)/V (π = 1/V, every row alike).
    Chapter 10, Experiment 1's prediction."""
    V = language.vocab
    row = language.transition_matrix()[0]
    g2 = (float((row * row).sum()) - 1 / V) / V
    return (1 - 1 / V - g2) / g2


def stability_limit(language: Language) -> float:
    """2/λ_max at the optimum (p_a = P_a): the largest learning rate at which gradient descent
    with the exact gradient still converges there. λ_max is the largest eigenvalue of the
    Hessian's blocks π_a (diag P_a − P_a P_aᵀ), all alike here."""
    row = language.transition_matrix()[0]
    block = torch.diag(row) - torch.outer(row, row)
    return 2 / (float(language.stationary()[0]) * float(torch.linalg.eigvalsh(block)[-1]))


# ------------------------------------------------------------------------------------------
# Sampling: batches of pairs for the bigram table, texts for the course GPT

class PairSampler:
    """Batches of pairs (a, b) for ``runs`` runs at once, as counts N (runs, V, V): N[r, a, b] is
    how often the pair (a, b) is in run r's batch. Pairs are drawn independently with
    probability J_ab (positions of a long text, far apart)."""

    def __init__(self, language: Language, runs: int):
        self.vocab, self.runs = language.vocab, runs
        self.cdf = language.joint().flatten().cumsum(0)
        self.cdf[-1] = 1.0
        self.offsets = (torch.arange(runs) * self.vocab**2)[:, None]

    def counts(self, batch: int, generator: torch.Generator, dtype=torch.float32) -> torch.Tensor:
        u = torch.rand(self.runs, batch, generator=generator, dtype=torch.float64)
        pairs = torch.searchsorted(self.cdf, u).clamp_(max=self.vocab**2 - 1) + self.offsets
        counts = torch.bincount(pairs.flatten(), minlength=self.runs * self.vocab**2)
        return counts.view(self.runs, self.vocab, self.vocab).to(dtype)


def batch_gradient(W: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The mean gradient of the batch that ``counts`` (..., V, V) describes: row a is
    (n_a p_a − N_a)/B, with n_a the pairs that start with a and B all pairs."""
    batch = counts.sum((-2, -1), keepdim=True)
    return (counts.sum(-1, keepdim=True) * W.softmax(-1) - counts) / batch


def sample_sequences(language: Language, n: int, length: int,
                     generator: torch.Generator) -> torch.Tensor:
    """``n`` texts of ``length`` + 1 tokens (int64, (n, length + 1)), the first token drawn from
    π: the course GPT reads tokens 0..length−1 and predicts 1..length. The chain has order 1, so
    the floor is the same at every position."""
    cdf = language.transition_matrix().cumsum(1)
    cdf[:, -1] = 1.0
    tokens = torch.empty(n, length + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, language.vocab, (n,), generator=generator)
    u = torch.rand(length, n, 1, generator=generator, dtype=torch.float64)
    for t in range(length):
        tokens[:, t + 1] = torch.searchsorted(cdf[tokens[:, t]], u[t]).squeeze(1).clamp_(max=language.vocab - 1)
    return tokens
