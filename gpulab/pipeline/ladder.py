"""The capstone ladder (chapter 07): one training loop, one change per rung (workers, pinned
memory, the optimizer's kernels, TF32, bf16 autocast, torch.compile, the micro-batch), each rung
timed, and the course's own ladder for a GPU and for a CPU (``course_ladder``).

A ladder measures what each change buys only while every rung after the workers rung is bound by
its compute: if the loader were slower than a fast rung's step, that rung (and every faster one)
would show the loader's pace, not its own. So the data's cost is set from the machine's own naive
step (``LOAD_SHARE`` of it per batch, whatever the batch size: one read per batch, measured first
with the data in memory), and the workers rung has enough workers (``course_ladder``) that the
data stage, load / W, stays below the fastest step the later rungs are expected to reach; each
rung's measured ``wait_share`` says whether it did.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from gpulab import measure
from gpulab.pipeline.datasets import TokenDataset
from gpulab.pipeline.loop import make_loader, shutdown

#: Loading one batch of the naive rung costs this share of the naive rung's compute: the naive
#: step is 1.5 times its compute, and workers can give at most 1.5x.
LOAD_SHARE = 0.5


# ------------------------------------------------------------------------------------------
# The capstone ladder: one training loop, one change per rung


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: a training loop's settings.

    ``optimizer``: "adamw_loop" (AdamW with ``foreach=False``: one small kernel chain per
    parameter tensor), "adamw_foreach" (one multi-tensor kernel chain for all) or "adamw_fused"
    (one fused kernel); ``autocast``: None (fp32) or torch.bfloat16; ``tf32``: float32 matmuls on
    the tensor cores (GPU only: ``torch.backends.cuda.matmul.fp32_precision = "tf32"``);
    ``compile``: ``torch.compile`` the model.
    """

    name: str
    batch_size: int
    workers: int = 0
    pin_memory: bool = False
    optimizer: str = "adamw_loop"
    autocast: torch.dtype | None = None
    tf32: bool = False
    compile: bool = False


_OPTIMIZERS = {"adamw_loop": {"foreach": False}, "adamw_foreach": {"foreach": True},
               "adamw_fused": {"fused": True}}


def course_ladder(on_gpu: bool):
    """The chapter's ladder: (GPT config, sequence length, rungs), in the order in which each rung
    removes what bounds the step before it.

    On a GPU, a GPT-2-small-sized model (12 layers, 12 heads, width 768; vocabulary 8,192 and
    sequence 256, so that fp32 weights, AdamW state and the written-out attention's activations
    fit the course's 4 GiB: the larger micro-batch is the largest predicted to fit in 2.5 GiB),
    and 8 workers: with a batch's data at ``LOAD_SHARE`` of the naive compute, the data stage is
    1/16 of it, below the fastest later step. The order: the data (workers), then the host
    launching AdamW's per-tensor kernels, about 1,500 small ones per step (fused AdamW), then the
    fp32 matmuls (TF32, then bf16), then the remaining launches and memory round trips
    (torch.compile), then the work per kernel (the larger micro-batch).

    On a CPU, a 2-layer model of width 128 at sequence 64 and 2 workers (a naive step of about
    40 ms on one core, so that a ladder of several timed steps per rung costs a few CPU-seconds;
    its later rungs are at most about 2x faster than its naive one, so the data stage, 1/4 of the
    naive compute, stays below them); TF32, bf16 and torch.compile are left out there (chapter
    07, section 7, says why).
    """
    from gpulab import arith
    from gpulab.models import GPTConfig

    if on_gpu:
        config, seq = GPTConfig(vocab_size=8192, block_size=256, n_layer=12, n_head=12, n_embd=768), 256
        big = max(2, arith.largest_micro_batch(2.5 * 2**30, config, seq, torch.float32, "adamw"))
        small, w, bf16 = max(1, big // 2), 8, torch.bfloat16
        return config, seq, [
            Rung("naive", small),
            Rung(f"+ {w} workers, pinned", small, w, True),
            Rung("+ fused AdamW", small, w, True, "adamw_fused"),
            Rung("+ TF32", small, w, True, "adamw_fused", tf32=True),
            Rung("+ bf16 autocast", small, w, True, "adamw_fused", bf16, tf32=True),
            Rung("+ torch.compile", small, w, True, "adamw_fused", bf16, True, True),
            Rung(f"+ micro-batch {big}", big, w, True, "adamw_fused", bf16, True, True)]
    config, seq, w = GPTConfig(vocab_size=1000, block_size=128, n_layer=2, n_head=4, n_embd=128), 64, 2
    return config, seq, [
        Rung("naive", 4),
        Rung(f"+ {w} workers", 4, w),
        Rung("+ foreach AdamW", 4, w, optimizer="adamw_foreach"),
        Rung("+ fused AdamW", 4, w, optimizer="adamw_fused"),
        Rung("+ micro-batch 8", 8, w, optimizer="adamw_fused")]


def run_rung(config, rung: Rung, seq_len: int, device: torch.device | str, steps: int = 3,
             sample_latency: float = 0.0, warmup: int | None = None) -> dict:
    """Train ``GPT(config)`` (fp32 weights) with ``rung``'s settings; time ``steps`` steps (rounded
    up to a multiple of the workers, who deliver in turn) after the warm-up: one step per worker,
    so each has started and delivered, plus the first steps' one-time costs (compilation, when
    ``rung.compile``); ``warmup`` steps instead, if given. Data: a ``TokenDataset`` waiting
    ``sample_latency`` s per sample (one wait per batch), through a DataLoader with
    ``rung.workers`` workers.

    Returns a dict: ``tokens_per_second``, ``step_seconds``, ``flops_per_token`` (6N + 12·L·h·s,
    N without the embedding tables, as ``measure.training_step_throughput``), ``warmup_seconds``
    (the untimed warm-up steps: on a compiled rung, mostly compilation), ``peak_bytes`` (CUDA
    ``max_memory_allocated``; None on a CPU), ``wait_share`` (the share of the timed steps spent
    waiting in ``next()`` for a batch) and ``steps``. TF32 is set back as it was after.
    """
    from gpulab import arith
    from gpulab.models import GPT

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    torch.manual_seed(0)
    model = GPT(config, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **_OPTIMIZERS[rung.optimizer])
    forward = torch.compile(model) if rung.compile else model
    warmup = rung.workers + (2 if on_gpu else 1) if warmup is None else warmup
    steps = math.ceil(steps / max(rung.workers, 1)) * max(rung.workers, 1)
    dataset = TokenDataset((warmup + steps + 1) * rung.batch_size, seq_len, config.vocab_size,
                           sample_latency)
    loader = make_loader(dataset, rung.batch_size, rung.workers, pin_memory=rung.pin_memory and on_gpu)
    non_blocking = rung.pin_memory and on_gpu

    def step(batch):
        idx, targets = (t.to(device, non_blocking=non_blocking) for t in batch)
        with torch.autocast(device.type, dtype=rung.autocast or torch.bfloat16,
                            enabled=rung.autocast is not None):
            loss = forward(idx, targets)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    precision_before = torch.backends.cuda.matmul.fp32_precision     # torch >= 2.9's API
    torch.backends.cuda.matmul.fp32_precision = "tf32" if rung.tf32 else "ieee"
    try:
        if on_gpu:
            # Hand the previous rung's cached blocks back, so that what the driver sees of this
            # process (the learner's footprint) is this rung's, not the sum of all of them.
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        iterator = iter(loader)
        try:
            start = time.perf_counter()
            for _ in range(warmup):
                step(next(iterator))
            measure.synchronize(device)
            warmup_seconds = time.perf_counter() - start
            wait = 0.0
            batch = next(iterator)
            start = time.perf_counter()
            for _ in range(steps):
                step(batch)
                before = time.perf_counter()
                batch = next(iterator)
                wait += time.perf_counter() - before
            measure.synchronize(device)       # a GPU may still be running the queued steps
            seconds = time.perf_counter() - start
        finally:
            shutdown(iterator)
        peak = torch.cuda.max_memory_allocated(device) if on_gpu else None
    finally:
        torch.backends.cuda.matmul.fp32_precision = precision_before
    n_params = GPT.count_params(config) - (config.vocab_size + config.block_size) * config.n_embd
    flops_per_token = arith.training_flops(n_params, 1, n_layer=config.n_layer,
                                           hidden=config.n_embd, seq_len=seq_len)
    return {"tokens_per_second": steps * rung.batch_size * seq_len / seconds,
            "step_seconds": seconds / steps, "flops_per_token": flops_per_token,
            "warmup_seconds": warmup_seconds, "peak_bytes": peak, "wait_share": wait / seconds,
            "steps": steps}
