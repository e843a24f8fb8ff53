"""The step-time model of an input pipeline (chapter 07): how long a step takes when data
loading, the host-to-device copy and the compute run one after another or side by side.

The model. A training step has three stages: load a batch (read, decode, augment, collate), copy
it to the device, compute (forward, backward, optimizer). With ``num_workers=0`` the main process
does all three in turn, so their times add. With W worker processes the loading of the next
batches runs in parallel with the current step; each worker builds whole batches, so W workers
deliver a batch every ``load / W`` seconds, and the slowest stage sets the pace:

    workers = 0:   step = load + copy + compute
    workers = W:   step = max(load / W, copy + compute)          copy in the compute stream
                   step = max(load / W, copy, compute)            pinned, non_blocking copy
                                                                  on its own stream (overlapped)

This is the throughput of a pipeline whose slowest stage is the bottleneck; it holds in steady
state (after the workers' first batches) and while each stage has the resources it assumes. Two
of those resources are the machine's, and ``step_seconds`` takes both when they matter:

- **cores** (``cores``): W workers that wait (I/O-bound loading: a read from network storage)
  wait side by side on any number of cores, so the data stage is load / W; W workers that
  compute (CPU-bound loading: decoding, augmenting) run only on the C cores that are free, so
  at most min(W, C) batches are built at once and the data stage is load / min(W, C).
- **the hand-over** (``handover``): a batch built by a worker reaches the main process through
  shared memory, and taking it (``next()``: unpickling, receiving the shared memory's file
  descriptor from the worker) is the main process's own work, done between two steps: it adds
  to the device stage, and it grows when a busy machine makes each process wait for a core.
  ``gpulab.pipeline.handover_seconds`` measures it.

Sources: PyTorch Performance Tuning Guide (Szymon Migacz), "Enable asynchronous data loading and
augmentation"; the DataLoader documentation (torch.utils.data, "Single- and Multi-process Data
Loading", "Memory Pinning"); PyTorch's CUDA semantics notes ("Asynchronous execution", "CUDA
streams"); torch/multiprocessing/reductions.py (a tensor's storage travels as a file descriptor).
"""

from __future__ import annotations

import math
import os


# ------------------------------------------------------------------------------------------
# The step-time model


def _non_negative(**values) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def step_seconds(load: float, compute: float, workers: int, copy: float = 0.0,
                 copy_overlapped: bool = False, cores: float | None = None,
                 handover: float = 0.0) -> float:
    """Seconds per training step in steady state (module docstring).

    ``load``: seconds one process takes to build one batch (per-sample cost x batch size);
    ``compute``: seconds of the device's forward + backward + update; ``copy``: seconds of the
    host-to-device copy of a batch (0 on a CPU: there is no second memory to copy to);
    ``workers``: DataLoader ``num_workers``; ``copy_overlapped``: the copy runs on its own
    stream beside the compute (pinned memory, ``non_blocking=True``), else it sits in the
    compute stream and adds to it. ``cores``: None when loading waits (I/O-bound: W workers
    load W batches at once on any number of cores), else the cores free for CPU-bound workers
    (they build at most min(W, cores) batches at once; a measured share such as 1.4 is fine,
    ``loop.free_cores``). ``handover``: the main process's
    seconds to take one batch from a worker (with ``workers`` > 0), part of its own stage.

    >>> round(step_seconds(0.064, 0.040, workers=0, copy=0.003), 9)       # the sum: 107 ms
    0.107
    >>> step_seconds(0.064, 0.040, workers=4, copy=0.003, copy_overlapped=True)
    0.04
    >>> step_seconds(0.080, 0.005, workers=4), step_seconds(0.080, 0.005, workers=4, cores=2)
    (0.02, 0.04)
    """
    _non_negative(load=load, compute=compute, copy=copy, workers=workers, handover=handover)
    if workers == 0:
        return load + copy + compute
    if cores is not None and not cores > 0:
        raise ValueError(f"cores must be > 0, got {cores!r}")
    parallel = workers if cores is None else min(workers, cores)
    device_stage = max(copy, compute) if copy_overlapped else copy + compute
    return max(load / parallel, handover + device_stage)


def device_idle_share(load: float, compute: float, workers: int, copy: float = 0.0,
                      copy_overlapped: bool = False) -> float:
    """Share of a step the device runs no compute: 1 - compute / step. It waits for data (or for
    the copy, which the compute kernels wait for too). What a profile's idle share shows."""
    step = step_seconds(load, compute, workers, copy, copy_overlapped)
    return 1 - compute / step if step else 0.0


def bottleneck(load: float, compute: float, workers: int, copy: float = 0.0,
               copy_overlapped: bool = False) -> str:
    """The stage that sets the pace with ``workers`` > 0: "data", "copy" or "compute" (ties go to
    the device stage: adding workers would not help). With 0 workers every stage adds: "serial"."""
    if workers == 0:
        return "serial"
    device_stage = max(copy, compute) if copy_overlapped else copy + compute
    if load / workers > device_stage:
        return "data"
    return "copy" if copy_overlapped and copy > compute else "compute"


def workers_needed(load: float, compute: float, copy: float = 0.0,
                   copy_overlapped: bool = False) -> int:
    """The fewest workers for which loading is no longer the slowest stage:
    ceil(load / device stage). Beyond it, more workers buy nothing."""
    device_stage = max(copy, compute) if copy_overlapped else copy + compute
    if device_stage <= 0:
        raise ValueError("the device stage takes no time: no number of workers keeps up")
    return max(1, math.ceil(load / device_stage - 1e-12))


def loading_speedup(workers: int, cores: int, io_bound: bool) -> float:
    """Batches per second with ``workers`` over those with ``num_workers=0``, loading alone.

    An I/O-bound worker spends its time waiting (a read from network storage, here a sleep), and
    a waiting process needs no core: W workers wait side by side, so W times the rate, past the
    core count. A CPU-bound worker computes, and W of them share the free cores: at most
    ``cores`` times the rate. (``workers = 0`` and ``1`` both load one batch at a time.)
    """
    _non_negative(workers=workers)
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores!r}")
    parallel = max(workers, 1)
    return float(parallel if io_bound else min(parallel, cores))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or batch system may
    limit), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def compile_break_even_steps(compile_seconds: float, step_before: float,
                             step_after: float) -> float:
    """Steps after which a one-time cost (``torch.compile``'s compilation, capturing a CUDA graph)
    is paid back by the time each step saves: compile_seconds / (step_before - step_after)."""
    saving = step_before - step_after
    if saving <= 0:
        return math.inf
    return compile_seconds / saving
