"""The course GPT on the synthetic language, trained with AdamW at a base batch and at 4× the
batch under each learning-rate rule, with and without warm-up (chapter 10, Experiment 3).

Every run sees the same sequences in the same order (a run at 4× the batch takes them 4 at a
time), and every run is evaluated on the same held-out sequences, so curves drawn against the
sequences seen lie on top of each other exactly when the bigger batch learns as much per example
as the small one. The warm-up is ``torch.optim.lr_scheduler.LinearLR`` (the lines chapter 10's
"In your training script" shows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpulab.batch_size.language import Language, sample_sequences
from gpulab.models import GPT, GPTConfig

SEQ_LEN = 16


def small_gpt(language: Language) -> GPTConfig:
    """A one-block course GPT sized for the language: about 17k parameters."""
    return GPTConfig(vocab_size=language.vocab, block_size=SEQ_LEN, n_layer=1, n_head=2, n_embd=32)


@dataclass
class GPTRun:
    """One training run: its settings, and the held-out loss after each ``eval_every`` steps."""

    batch: int
    lr: float
    warmup: int
    sequences: list[int] = field(default_factory=list)   # sequences seen at each evaluation, from 0
    losses: list[float] = field(default_factory=list)    # held-out loss there, nats per token

    @property
    def final(self) -> float:
        return self.losses[-1]


def sequences(language: Language, n: int, seed: int) -> torch.Tensor:
    """``n`` sequences of SEQ_LEN + 1 tokens (the model reads SEQ_LEN and predicts the next
    token at each), the same for the same seed."""
    return sample_sequences(language, n, SEQ_LEN, torch.Generator().manual_seed(seed))


@torch.no_grad()
def held_out_loss(model: GPT, data: torch.Tensor) -> float:
    model.eval()
    _, loss = model(data[:, :-1].contiguous(), data[:, 1:].contiguous())
    model.train()
    return float(loss)


def train(language: Language, data: torch.Tensor, held_out: torch.Tensor, batch: int, lr: float,
          warmup: int = 0, evaluations: int = 10, seed: int = 0) -> GPTRun:
    """Train a fresh ``small_gpt`` (initialised from ``seed``) with AdamW (β = 0.9, 0.95, as
    GPT-3 and Llama train; no weight decay) on ``data`` in batches of ``batch`` sequences, one
    pass, the learning rate ramped linearly from lr/warmup to lr over the first ``warmup`` steps
    (none for 0). Evaluates on ``held_out`` before the first step and ``evaluations`` times,
    evenly, over the run."""
    torch.manual_seed(seed)
    model = GPT(small_gpt(language))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = (torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup, total_iters=warmup)
                if warmup else None)
    steps = len(data) // batch
    every = max(1, steps // evaluations)
    run = GPTRun(batch, lr, warmup, [0], [held_out_loss(model, held_out)])   # the untrained model
    for step in range(steps):
        chunk = data[step * batch:(step + 1) * batch]
        _, loss = model(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
        if (step + 1) % every == 0:
            run.sequences.append((step + 1) * batch)
            run.losses.append(held_out_loss(model, held_out))
    return run
