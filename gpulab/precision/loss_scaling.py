"""Loss scaling (chapter 04): why fp16 gradients vanish (the gradient of one logit at
initialisation, and the logits' gradients measured under autocast), and how GradScaler's
dynamic loss scale keeps them representable."""

from __future__ import annotations

import torch

from gpulab.models import GPT


# ------------------------------------------------------------------------------------------
# Gradients that underflow


def initial_logit_gradient(vocab_size: int, batch: int, seq_len: int) -> float:
    """The gradient of a mean cross-entropy over the b·s tokens of one backward pass with
    respect to one *wrong* logit at initialisation, where softmax gives p ≈ 1/V everywhere:
    (p − 0)/(b·s) = 1/(V·b·s). The divisor is the micro-batch that one backward sees (a
    per-GPU quantity), not the global batch. Chapter 04, "Gradients that underflow"."""
    return 1 / (vocab_size * batch * seq_len)


def logit_gradients(model: GPT, idx: torch.Tensor, targets: torch.Tensor, scale: float = 1.0,
                    dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of ``scale × loss`` with respect to the logits, as backward computes it under
    ``torch.autocast(dtype)`` (the head's output is low precision, so its gradient is too) and in
    fp32: (low-precision gradient, fp32 gradient). Compare their zeros to see underflow."""
    device_type = idx.device.type
    found = {}
    for autocast in (True, False):
        with torch.autocast(device_type, dtype=dtype, enabled=autocast):
            logits, loss = model(idx, targets)
        logits.register_hook(lambda g, autocast=autocast: found.__setitem__(autocast, g.detach()))
        (loss * scale).backward()
        model.zero_grad(set_to_none=True)
    return found[True], found[False]


# ------------------------------------------------------------------------------------------
# Loss scaling

def loss_scale_after(overflows, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                     backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """GradScaler's dynamic loss scale after a run of steps: (scale, steps skipped).

    ``overflows`` has one bool per step: True when the scaled gradients held an inf or NaN. Such
    a step is skipped (no optimizer step) and the scale is multiplied by ``backoff_factor``;
    after ``growth_interval`` clean steps in a row it is multiplied by ``growth_factor``. The
    defaults are ``torch.amp.GradScaler``'s; the rule is its ``update()`` (the tests run both).
    """
    scale, clean, skipped = float(init_scale), 0, 0
    for overflow in overflows:
        if overflow:
            scale, clean, skipped = scale * backoff_factor, 0, skipped + 1
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * growth_factor, 0
    return scale, skipped


def grad_scaler_scale(overflows, **rule) -> float:
    """The same run of steps on a real ``torch.amp.GradScaler("cpu", **rule)``: one parameter
    whose gradient is inf on an overflowing step and 1 otherwise; returns the final scale.
    What ``loss_scale_after`` predicts, measured. (About 5,000 steps a second on one CPU core.)"""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **rule)
    scaler.scale(torch.ones(()))            # creates the scale tensor, as a first step would
    for overflow in overflows:
        param.grad = torch.full((1,), float("inf") if overflow else 1.0)
        scaler.step(optimizer)
        scaler.update()
    return scaler.get_scale()
