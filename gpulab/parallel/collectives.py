"""The collectives data parallelism is built from, run on real processes (chapter 06).

Each function here is a *worker*: ``gpulab.parallel.dist.launch(worker, n_ranks)`` runs it as
``worker(rank, world_size)`` in every process of a fresh process group (gloo on CPUs, NCCL on
GPUs) and returns what each rank returned. They live in a module, not in the notebook, because
a rank imports its worker by name.

Every rank r starts with a small tensor of its own, [10r, 10r + 1, ...], so that each result
shows where its numbers came from.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from gpulab.measure import synchronize
from gpulab.parallel.dist import worker_device

# torch 2.13 renamed the tensor forms of all-gather and reduce-scatter (same arguments); older
# versions have only the old names.
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _own(rank: int, world_size: int, device) -> torch.Tensor:
    """Rank r's tensor: one value per rank, [10r, 10r + 1, ..., 10r + world_size - 1]."""
    return torch.arange(world_size, dtype=torch.float32, device=device) + 10 * rank


def show_collectives(rank: int, world_size: int) -> dict[str, tuple[list, list]]:
    """Run each collective once: {name: (this rank's input, this rank's output)}."""
    device = worker_device(rank)
    shown = {}

    x = _own(rank, world_size, device)
    dist.broadcast(x, src=0)                      # everyone gets rank 0's tensor
    shown["broadcast from 0"] = x

    x = _own(rank, world_size, device)
    dist.reduce(x, dst=0)                         # rank 0 gets the sum; the others' is scratch
    shown["reduce to 0"] = x if rank == 0 else None

    x = _own(rank, world_size, device)
    dist.all_reduce(x)                            # everyone gets the sum
    shown["all_reduce"] = x

    gathered = torch.empty(world_size * world_size, device=device)
    all_gather(gathered, _own(rank, world_size, device))  # everyone gets all
    shown["all_gather"] = gathered

    piece = torch.empty(1, device=device)
    reduce_scatter(piece, _own(rank, world_size, device))  # rank r gets sum of part r
    shown["reduce_scatter"] = piece

    exchanged = torch.empty(world_size, device=device)
    dist.all_to_all_single(exchanged, _own(rank, world_size, device))  # part j goes to rank j
    shown["all_to_all"] = exchanged

    mine = _own(rank, world_size, device).tolist()
    return {name: (mine, out.tolist() if out is not None else None) for name, out in shown.items()}


def time_all_reduce(rank: int, world_size: int, sizes: list[int], repeats: int = 5) -> list[float]:
    """Median seconds of an all-reduce of fp32 buffers of each size in ``sizes`` (bytes per
    rank), timed on every rank between barriers; each rank returns its own medians."""
    device = worker_device(rank)
    medians = []
    for n_bytes in sizes:
        buffer = torch.ones(max(1, n_bytes // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(repeats + 2):              # the first two warm up the connections
            dist.barrier()
            synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(buffer)
            synchronize(device)
            if i >= 2:
                times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return medians


def show_and_time(rank: int, world_size: int, sizes: list[int]) -> dict:
    """Worker: ``show_collectives``, then ``time_all_reduce`` over ``sizes``, in one process
    group: chapter 06 starts its ranks once for both (starting processes costs seconds)."""
    return {"shown": show_collectives(rank, world_size),
            "all-reduce medians": time_all_reduce(rank, world_size, sizes)}
