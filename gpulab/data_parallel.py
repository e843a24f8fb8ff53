"""Data parallelism by hand, next to PyTorch's DDP and its sharded cousins (chapter 06).

Data parallelism in one sentence: every rank holds the whole model, takes its own slice of the
global batch, and before the optimizer step the ranks average their gradients with an
all-reduce, so every rank applies the same update and the replicas stay identical. ``train``
does exactly that by hand (one all-reduce per gradient tensor, or one for all of them flattened
into a bucket), or lets ``DistributedDataParallel`` do it, which buckets the gradients and
starts each bucket's all-reduce while backward is still computing the rest (Li et al. 2020,
"PyTorch Distributed", VLDB).

The functions named as workers run inside ``gpulab.dist.launch``; ``train_one_process`` is the
reference without any parallelism, for the same global batches.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gpulab.dist import worker_device
from gpulab.measure import synchronize
from gpulab.models import GPT, GPTConfig
from gpulab.precision import sample_batch, text_corpus

# A 2-layer byte-level GPT: small enough for 2 CPU processes to train in seconds.
CONFIG = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=64)
MODES = ("by hand, per tensor", "by hand, one bucket", "DDP")


def global_batch(step: int, batch: int, seq_len: int, data: torch.Tensor, device):
    """The same global batch on every rank for a given step (seeded by the step)."""
    return sample_batch(data, batch, seq_len, torch.Generator().manual_seed(1000 + step), device)


def all_reduce_gradients(model: torch.nn.Module, world_size: int, one_bucket: bool) -> None:
    """Average the gradients over the ranks: sum them with all-reduce, divide by the ranks."""
    grads = [p.grad for p in model.parameters()]
    if one_bucket:                     # one large message: pays the per-message latency once
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    else:                              # one message per tensor: simple, latency-bound
        for g in grads:
            dist.all_reduce(g)
    for g in grads:
        g.div_(world_size)


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()


def train(rank: int, world_size: int, mode: str, steps: int = 10, batch: int = 16,
          seq_len: int = 64, lr: float = 0.05, bucket_cap_mb: float = 0.1) -> dict:
    """Worker: train a fresh GPT (same seed on every rank) with SGD for ``steps`` steps, each
    rank on its slice of the global batch, synchronising gradients as ``mode`` says. Returns
    the final parameters (flattened, on the CPU), the median step time and, by hand, the median
    time spent in all-reduce."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if batch % world_size:
        raise ValueError(f"the global batch {batch} must divide evenly over {world_size} ranks")
    device = worker_device(rank)
    data = text_corpus(200_000)
    torch.manual_seed(0)
    model = GPT(CONFIG, device=device)
    if mode == "DDP":
        # Small buckets so that this small model has several, and overlap can happen.
        model = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    else:
        for p in model.parameters():   # start identical, as DDP's constructor ensures
            dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    step_times, comm_times = [], []
    for step in range(steps):
        idx, targets = global_batch(step, batch, seq_len, data, device)
        mine = slice(rank * batch // world_size, (rank + 1) * batch // world_size)
        start = time.perf_counter()
        _, loss = model(idx[mine], targets[mine])
        loss.backward()
        if mode != "DDP":
            comm_start = time.perf_counter()
            all_reduce_gradients(model, world_size, one_bucket=mode == "by hand, one bucket")
            comm_times.append(time.perf_counter() - comm_start)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        step_times.append(time.perf_counter() - start)
    module = model.module if mode == "DDP" else model
    return {"params": _flat_params(module),
            "step_seconds": statistics.median(step_times[1:]),      # the first step warms up
            "comm_seconds": statistics.median(comm_times[1:]) if comm_times else None}


def compare_modes(rank: int, world_size: int, steps: int = 10, batch: int = 16,
                  seq_len: int = 64) -> dict[str, dict]:
    """Worker: ``train`` in every mode, one after the other in the same process group."""
    return {mode: train(rank, world_size, mode, steps, batch, seq_len) for mode in MODES}


def train_one_process(steps: int = 10, batch: int = 16, seq_len: int = 64, lr: float = 0.05,
                      device="cpu") -> torch.Tensor:
    """The reference: one process, the whole global batch each step. Final parameters."""
    data = text_corpus(200_000)
    torch.manual_seed(0)
    model = GPT(CONFIG, device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        idx, targets = global_batch(step, batch, seq_len, data, device)
        model(idx, targets)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return _flat_params(model)


def sharded_state(rank: int, world_size: int) -> dict[str, int]:
    """Worker: what each rank holds when the optimizer state (ZeroRedundancyOptimizer, ZeRO
    stage 1) or the parameters (FSDP2 ``fully_shard``, ZeRO stage 3) are sharded. Counts
    elements, after one training step so that Adam's state exists."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    device = worker_device(rank)
    idx = torch.randint(0, CONFIG.vocab_size, (2, 32), device=device,
                        generator=torch.Generator(device=device).manual_seed(rank))
    torch.manual_seed(0)
    model = GPT(CONFIG, device=device)
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    model(idx, idx)[1].backward()
    zero.step()
    state = sum(t.numel() for s in zero.optim.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)   # exp_avg and exp_avg_sq, not the step count

    torch.manual_seed(0)
    sharded = GPT(CONFIG, device=device)
    for block in sharded.blocks:       # each block its own unit: gathered just before it runs
        fully_shard(block)
    fully_shard(sharded)
    local = sum(p.to_local().numel() for p in sharded.parameters())
    sharded(idx, idx)[1].backward()    # forward and backward gather and re-shard each unit
    return {"params": GPT.count_params(CONFIG), "zero_adam_state": state, "fsdp_params": local}
