"""The lines of chapter 04's "In your training script", and what each wrong order of them breaks.

fp16 training with ``torch.autocast`` and ``torch.amp.GradScaler`` needs five lines in order:
scale the loss and backward, ``unscale_`` the gradients, clip them, ``scaler.step`` (which skips
the step when a gradient is inf or NaN), ``scaler.update`` (which halves or doubles the scale).
``ORDERS`` holds that order and the wrong ones learners write; ``measure_order`` runs two steps
of each on a small fixed model and reports what the optimizer really got. The optimizer is SGD
with lr = 1, so that the weights move by exactly the gradient it was given: its norm is the
number to compare with the clip threshold (PyTorch docs, "Automatic Mixed Precision examples:
Working with Unscaled Gradients").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MAX_NORM = 0.5      # below the small model's gradient norm (0.72), so that clipping acts


def right(model, loss, optimizer, scaler) -> float:
    scaler.scale(loss).backward()             # gradients × S: small ones stay in fp16's range
    scaler.unscale_(optimizer)                # ÷ S in place: the true gradients
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    scaler.step(optimizer)                    # skipped if any gradient is inf or NaN
    scaler.update()                           # S × 0.5 after a skip, × 2 after 2000 clean steps
    return float(seen)


def clip_before_unscale(model, loss, optimizer, scaler) -> float:
    scaler.scale(loss).backward()
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)   # still × S
    scaler.step(optimizer)                    # unscales now: after the clip, ÷ S
    scaler.update()
    return float(seen)


def optimizer_step_without_scaler(model, loss, optimizer, scaler) -> float:
    scaler.scale(loss).backward()
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    optimizer.step()                          # never unscaled, and inf is not skipped; with no
    return float(seen)                        # scaler.step(), update() raises ("No inf checks
                                              # were recorded prior to update."): left out


def backward_without_scale(model, loss, optimizer, scaler) -> float:
    loss.backward()                           # not × S: fp16's small gradients underflow
    scaler.unscale_(optimizer)                # and then ÷ S all the same
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    scaler.step(optimizer)
    scaler.update()
    return float(seen)


def no_update(model, loss, optimizer, scaler) -> float:
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    seen = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    scaler.step(optimizer)                    # the next unscale_() raises: update() never came
    return float(seen)


ORDERS = {
    "right": right,
    "clip before unscale_": clip_before_unscale,
    "optimizer.step() for scaler.step()": optimizer_step_without_scaler,
    "loss.backward() unscaled": backward_without_scale,
    "no scaler.update()": no_update,
}


@dataclass
class OrderResult:
    order: str
    true_norm: float        # the gradient's norm in fp32, without any scaling: what clip should see
    clip_saw: float         # the norm clip_grad_norm_ measured in the first step
    applied: float          # the norm of the first step the weights took (SGD, lr = 1)
    finite: bool            # every weight still finite
    scale: float            # GradScaler's scale after the steps
    error: str | None = None


def _model(device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8)).to(device)


def _batch(device):
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(16, 32, generator=generator).to(device),
            torch.randn(16, 8, generator=generator).to(device))


def _loss(model, x, y, device):
    with torch.autocast(device.type, dtype=torch.float16):
        out = model(x)
    return F.mse_loss(out.float(), y)


def measure_order(order: str, device=None, init_scale: float = 2.0 ** 16, steps: int = 2) -> OrderResult:
    """Run ``steps`` training steps of ``ORDERS[order]`` on the same small model and batch, under
    fp16 autocast: the first step's norms, the weights and the scale after all of them, and the
    error a later step raised. A missing ``update()`` shows only in the second step, whose
    ``unscale_()`` raises "unscale_() is being called after step()"; a loop without ``unscale_``
    hears it from ``scaler.step()``, "step() has already been called since the last update()"
    (torch/amp/grad_scaler.py). ``init_scale=2**40`` makes every scaled gradient overflow fp16
    (inf): the right order skips those steps, a wrong one may not."""
    device = torch.device("cpu" if device is None else device)
    model, (x, y) = _model(device), _batch(device)
    reference = _model(device)                # the true gradient: fp32, no autocast, no scale
    F.mse_loss(reference(x), y).backward()
    true_norm = float(torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale)
    seen, error, applied = math.nan, None, math.nan
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        try:
            clip_saw = ORDERS[order](model, _loss(model, x, y, device), optimizer, scaler)
        except (RuntimeError, AssertionError) as exc:   # GradScaler's complaints about order
            error = f"step {step + 1}: {exc}"
            break
        if step == 0:
            seen = clip_saw
            applied = float(torch.linalg.vector_norm(torch.cat([
                (p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])))
        optimizer.zero_grad(set_to_none=True)
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return OrderResult(order, true_norm, seen, applied, finite, scaler.get_scale(), error)
