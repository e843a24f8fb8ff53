"""The capstone ladder (chapter 07): one training loop, one change per rung (workers, pinned
memory, the optimizer's kernels, bf16 autocast, TF32, torch.compile), each rung timed."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gpulab import measure
from gpulab.pipeline.datasets import TokenDataset
from gpulab.pipeline.loop import make_loader, shutdown


# ------------------------------------------------------------------------------------------
# The capstone ladder: one training loop, one change per rung


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: a training loop's settings.

    ``optimizer``: "adamw_loop" (AdamW with ``foreach=False``: one small kernel chain per
    parameter tensor), "adamw_foreach" (one multi-tensor kernel chain for all) or "adamw_fused"
    (one fused kernel); ``autocast``: None (fp32) or torch.bfloat16; ``tf32``: float32 matmuls on
    the tensor cores (GPU only); ``compile``: ``torch.compile`` the model.
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


def run_rung(config, rung: Rung, seq_len: int, device: torch.device | str, steps: int = 3,
             sample_latency: float = 0.0) -> dict:
    """Train ``GPT(config)`` (fp32 weights) with ``rung``'s settings; time ``steps`` steps after
    the warm-up (which compiles, when ``rung.compile``). Data: a ``TokenDataset`` waiting
    ``sample_latency`` s per sample, through a DataLoader with ``rung.workers`` workers.

    Returns a dict: ``tokens_per_second``, ``step_seconds``, ``flops_per_token`` (6N + 12·L·h·s,
    N without the embedding tables, as ``measure.training_step_throughput``), ``warmup_seconds``
    (the untimed warm-up steps: on a compiled rung, mostly compilation), ``peak_bytes`` (CUDA
    ``max_memory_allocated``; None on a CPU) and ``wait_share``. TF32 is switched back off after.
    """
    from gpulab import arith
    from gpulab.models import GPT

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    torch.manual_seed(0)
    model = GPT(config, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **_OPTIMIZERS[rung.optimizer])
    forward = torch.compile(model) if rung.compile else model
    warmup = max(rung.workers, 2 if on_gpu else 1)
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

    tf32_before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = rung.tf32
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
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    n_params = GPT.count_params(config) - (config.vocab_size + config.block_size) * config.n_embd
    flops_per_token = arith.training_flops(n_params, 1, n_layer=config.n_layer,
                                           hidden=config.n_embd, seq_len=seq_len)
    return {"tokens_per_second": steps * rung.batch_size * seq_len / seconds,
            "step_seconds": seconds / steps, "flops_per_token": flops_per_token,
            "warmup_seconds": warmup_seconds, "peak_bytes": peak, "wait_share": wait / seconds}
