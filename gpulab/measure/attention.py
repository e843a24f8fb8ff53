"""Naive vs fused attention, timed (chapter 03, "Why a fused kernel wins").

``naive_attention`` writes causal attention out and materialises the (B, nh, T, T) scores;
``attention_naive_vs_fused`` checks it agrees with PyTorch's fused
``F.scaled_dot_product_attention`` and times the two with ``time_fn``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpulab import arith
from gpulab.device import best_device
from gpulab.measure.throughput import _float_dtype, _label
from gpulab.measure.timing import time_fn


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out: softmax(q·kᵀ/√d with the future masked)·v.

    q, k, v: (B, nh, T, hs). Materialises the (B, nh, T, T) scores and probabilities, which the
    fused kernel never stores. Chapter 03, "Naive vs fused attention".
    """
    T, hs = q.shape[-2], q.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))   # (B, nh, T, T)
    att = att.masked_fill(future, float("-inf"))
    att = torch.softmax(att, dim=-1)                          # (B, nh, T, T)
    return att @ v                                            # (B, nh, T, hs)


def attention_naive_vs_fused(batch: int = 2, heads: int = 4, seq_len: int = 256,
                             head_dim: int = 64, dtype=torch.float32, device=None,
                             backward: bool = False, repeats: int = 10) -> dict:
    """Time ``naive_attention`` against ``F.scaled_dot_product_attention(is_causal=True)``.

    Forward only, or forward + backward with ``backward=True``. First checks that the two agree
    (``torch.testing.assert_close``; atol = rtol = 1e-3 in float32, 3e-2 in 16-bit types, loose
    enough for TF32 and for softmax rounded to 16 bits, tight enough to catch a wrong mask or
    scale). Returns a dict: ``naive_seconds``, ``fused_seconds`` (medians), ``speedup`` =
    naive / fused, ``max_abs_diff``, ``flops`` (forward: the two matmuls over the full T×T
    square, 2 · B·nh · 2·T²·hs; a causal kernel may skip the masked half), ``scores_bytes``
    (one B·nh·T² tensor of scores, which the naive version materialises and the fused one does
    not), the two ``Timing``s, ``device``, ``dtype``, ``backward``.

    Which fused kernel runs depends on the machine: on CUDA with 16-bit inputs,
    FlashAttention-2; on a CPU, PyTorch's own flash-attention-style CPU kernel. Sizes: the
    defaults take well under a second on an idle 2-core CPU; on a GPU use batch 4, heads 16,
    seq_len 2048, head_dim 128 in bfloat16 (one tensor of naive scores: 4·16·2048²·2 bytes =
    512 MiB; the naive version holds a few such, within the course's 4 GiB budget).
    Chapter 03, "Naive vs fused attention".
    """
    arith.check_positive_integers(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim,
                                  repeats=repeats)
    dtype = _float_dtype(dtype)
    device = torch.device(device) if device is not None else best_device()
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, dtype=dtype, device=device,
                           generator=generator, requires_grad=backward) for _ in range(3))
    grad_out = torch.randn(batch, heads, seq_len, head_dim, dtype=dtype, device=device,
                           generator=generator)

    def fused_attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        naive_out, fused_out = naive_attention(q, k, v), fused_attention(q, k, v)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(fused_out, naive_out, atol=tol, rtol=tol)
    max_abs_diff = (fused_out.float() - naive_out.float()).abs().max().item()
    del naive_out, fused_out

    def timed(attention):
        if backward:
            return time_fn(lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), grad_out),
                           device, repeats=repeats)
        with torch.no_grad():
            return time_fn(lambda: attention(q, k, v), device, repeats=repeats)

    naive, fused = timed(naive_attention), timed(fused_attention)
    p = torch.tensor([], dtype=dtype).element_size()
    return {"naive_seconds": naive.median, "fused_seconds": fused.median,
            "speedup": naive.median / fused.median, "max_abs_diff": max_abs_diff,
            "flops": 2 * batch * heads * arith.matmul_flops(seq_len, head_dim, seq_len),
            "scores_bytes": batch * heads * seq_len**2 * p,
            "naive_timing": naive, "fused_timing": fused, "device": str(device),
            "dtype": _label(dtype), "backward": backward}
