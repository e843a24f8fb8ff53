"""The input pipeline of a training loop (chapter 07): how long a step takes when data loading,
the host-to-device copy and the compute run one after another or side by side, synthetic
datasets that cost a known time per sample, and a loop that measures where a step's time goes.

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
state (after the workers' first batches) and while each stage has the resources it assumes: W
workers that wait (I/O-bound loading) run side by side on any number of cores, W workers that
compute (CPU-bound decoding) only on as many cores as are free. Sources: PyTorch Performance
Tuning Guide (Szymon Migacz), "Enable asynchronous data loading and augmentation"; the
DataLoader documentation (torch.utils.data, "Single- and Multi-process Data Loading", "Memory
Pinning"); PyTorch's CUDA semantics notes ("Asynchronous execution", "CUDA streams").
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from gpulab import measure


# ------------------------------------------------------------------------------------------
# The step-time model


def _non_negative(**values) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def step_seconds(load: float, compute: float, workers: int, copy: float = 0.0,
                 copy_overlapped: bool = False) -> float:
    """Seconds per training step in steady state (module docstring).

    ``load``: seconds one process takes to build one batch (per-sample cost x batch size);
    ``compute``: seconds of the device's forward + backward + update; ``copy``: seconds of the
    host-to-device copy of a batch (0 on a CPU: there is no second memory to copy to);
    ``workers``: DataLoader ``num_workers``; ``copy_overlapped``: the copy runs on its own
    stream beside the compute (pinned memory, ``non_blocking=True``), else it sits in the
    compute stream and adds to it.

    >>> step_seconds(0.064, 0.040, workers=0, copy=0.003)       # the sum: 107 ms
    0.107
    >>> step_seconds(0.064, 0.040, workers=4, copy=0.003, copy_overlapped=True)
    0.04
    """
    _non_negative(load=load, compute=compute, copy=copy, workers=workers)
    if workers == 0:
        return load + copy + compute
    device_stage = max(copy, compute) if copy_overlapped else copy + compute
    return max(load / workers, device_stage)


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


# ------------------------------------------------------------------------------------------
# Synthetic datasets: a known cost per sample, nothing downloaded


def _sample(index: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.full(shape, float(index))


class LatencyDataset(Dataset):
    """I/O-bound: each sample waits ``latency`` seconds (``time.sleep``), as a read from network
    storage or a remote object store waits, then returns a (``shape``) tensor filled with its
    index. Waiting takes no core, so workers scale past the core count."""

    def __init__(self, n: int, latency: float, shape: tuple[int, ...] = (64,)):
        self.n, self.latency, self.shape = n, latency, tuple(shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.latency)
        return _sample(index, self.shape)

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        # A batched read: the DataLoader asks for a batch's indices at once, and one wait of
        # latency x batch stands for them (one wake-up per batch, not per sample, so that a busy
        # machine's scheduling delays do not add up sample by sample).
        time.sleep(self.latency * len(indices))
        return [_sample(index, self.shape) for index in indices]


def busy_work(rounds: int) -> int:
    """A fixed amount of pure-Python arithmetic (a linear congruential generator), standing in for
    decoding and augmenting a sample: it needs a core for all of its time."""
    x = 12345
    for _ in range(rounds):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def calibrate_rounds(seconds: float, probe_rounds: int = 20_000) -> int:
    """Rounds of ``busy_work`` that take about ``seconds`` in this process now (the best of three
    probes, so a busy moment on a shared machine does not inflate it)."""
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        busy_work(probe_rounds)
        best = min(best, time.perf_counter() - start)
    return max(1, round(seconds / best * probe_rounds))


class DecodeDataset(Dataset):
    """CPU-bound: each sample does ``rounds`` of ``busy_work`` (a fixed amount of computing, like
    decoding a JPEG), then returns a (``shape``) tensor filled with its index. W workers share the
    free cores: beyond the core count they only take turns."""

    def __init__(self, n: int, rounds: int, shape: tuple[int, ...] = (64,)):
        self.n, self.rounds, self.shape = n, rounds, tuple(shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        busy_work(self.rounds)
        return _sample(index, self.shape)


class TokenDataset(Dataset):
    """Language-model samples: (input ids, targets shifted by one) of ``seq_len`` tokens, random
    but fixed by the index, after ``latency`` seconds of waiting per sample (reading a shard)."""

    def __init__(self, n: int, seq_len: int, vocab_size: int, latency: float = 0.0):
        self.n, self.seq_len, self.vocab_size, self.latency = n, seq_len, vocab_size, latency

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.latency:
            time.sleep(self.latency)
        generator = torch.Generator().manual_seed(index)
        tokens = torch.randint(self.vocab_size, (self.seq_len + 1,), generator=generator)
        return tokens[:-1], tokens[1:]


# ------------------------------------------------------------------------------------------
# The stand-in device step, and the measured loop


class StandInCompute:
    """A device step of a known duration, for checking the pipeline model without a model's noise.

    On a GPU: one kernel that spins for ``seconds`` (``torch.cuda._sleep``, calibrated here in
    clock cycles), then a synchronize, as a loop that reads ``loss.item()`` every step waits for
    its device. On a CPU there is no device to wait for: the host sleeps for ``seconds``, which is
    what a host does while its GPU computes. Call it like a step: ``compute(batch)``.
    """

    def __init__(self, seconds: float, device: torch.device | str = "cpu", synchronize=True):
        _non_negative(seconds=seconds)
        self.seconds, self.device, self.synchronize = seconds, torch.device(device), synchronize
        self.cycles = 0
        if self.device.type == "cuda" and seconds > 0:
            probe = 10_000_000
            timing = measure.time_fn(lambda: torch.cuda._sleep(probe), self.device, repeats=3)
            self.cycles = max(1, round(seconds / timing.median * probe))

    def __call__(self, batch=None) -> None:
        if self.device.type == "cuda":
            if self.cycles:
                torch.cuda._sleep(self.cycles)
            if self.synchronize:
                torch.cuda.synchronize(self.device)
        elif self.seconds:
            time.sleep(self.seconds)


@dataclass(frozen=True)
class LoopTiming:
    """A measured loop: ``steps`` timed steps, their total seconds, and the part spent waiting
    for the next batch (blocked in ``next()``)."""

    steps: int
    seconds: float
    wait_seconds: float
    batch_size: int

    @property
    def step_seconds(self) -> float:
        return self.seconds / self.steps

    @property
    def samples_per_second(self) -> float:
        return self.steps * self.batch_size / self.seconds

    @property
    def wait_share(self) -> float:
        return self.wait_seconds / self.seconds

    def __str__(self) -> str:
        return (f"{self.step_seconds * 1e3:.2f} ms/step, {self.samples_per_second:,.0f} samples/s, "
                f"{self.wait_share:.0%} of the time waiting for data ({self.steps} steps)")


def shutdown(iterator) -> None:
    """Stop a DataLoader iterator's worker processes now, not whenever it is garbage-collected."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def time_loop(loader: DataLoader, step, steps: int, warmup: int | None = None,
              device: torch.device | str = "cpu") -> LoopTiming:
    """Run ``step(batch)`` over ``loader``: ``warmup`` untimed steps, then ``steps`` timed ones.

    The warm-up covers starting the workers, which on a busy machine start hundreds of ms apart,
    and the backlog of ``prefetch_factor`` batches each was handed at the start; by default it is
    (prefetch_factor + 1) x W steps (1 with no workers). A step is timed from one batch's arrival
    (``next()`` returning) to the next one's, so the timed ``steps`` span ``steps`` whole periods
    of the pipeline whichever stage is the slowest; W workers deliver their batches in rounds of
    W, so make ``steps`` a multiple of W. The loader needs ``warmup + steps + 1`` batches. The
    workers are shut down before returning.
    """
    workers = loader.num_workers
    if warmup is None:
        warmup = ((loader.prefetch_factor or 2) + 1) * workers if workers else 1
    iterator = iter(loader)
    try:
        for _ in range(warmup):
            step(next(iterator))
        measure.synchronize(device)
        batch = next(iterator)
        start = time.perf_counter()
        wait = 0.0
        for _ in range(steps):
            step(batch)
            before = time.perf_counter()
            batch = next(iterator)
            arrived = time.perf_counter()
            wait += arrived - before
        seconds = arrived - start
    finally:
        shutdown(iterator)
    return LoopTiming(steps, seconds, wait, loader.batch_size)


def load_seconds(dataset: Dataset, batch_size: int, batches: int = 5) -> float:
    """Median seconds to load one batch in the main process (``num_workers=0``, nothing else
    running): the ``load`` that ``step_seconds`` needs, measured rather than assumed."""
    iterator = iter(make_loader(dataset, batch_size, 0))
    samples = []
    for _ in range(batches):
        start = time.perf_counter()
        next(iterator)
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


def make_loader(dataset: Dataset, batch_size: int, workers: int, pin_memory: bool = False,
                prefetch_factor: int | None = None, persistent_workers: bool = False) -> DataLoader:
    """A DataLoader with the options this chapter varies, the rest at their defaults (no shuffle:
    the same batches in every run)."""
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory,
                      prefetch_factor=prefetch_factor if workers else None,
                      persistent_workers=persistent_workers and workers > 0)


def measure_pipeline(sample_latency: float, batch_size: int, workers: int, compute: float,
                     steps: int = 8, device: torch.device | str = "cpu",
                     compute_step: StandInCompute | None = None) -> LoopTiming:
    """One configuration of the model's experiment: a ``LatencyDataset`` (``sample_latency`` s per
    sample) through ``workers`` workers into a ``StandInCompute(compute)`` step. ``steps`` is
    rounded up to a multiple of the worker count."""
    rounds = max(workers, 1)
    steps = math.ceil(steps / rounds) * rounds
    dataset = LatencyDataset((steps + 3 * rounds + 1) * batch_size, sample_latency)
    step = compute_step if compute_step is not None else StandInCompute(compute, device)
    return time_loop(make_loader(dataset, batch_size, workers), step, steps, device=device)


def loading_rate(dataset: Dataset, batch_size: int, workers: int, batches: int) -> float:
    """Batches per second a DataLoader delivers when the step does nothing (loading alone)."""
    rounds = max(workers, 1)
    batches = math.ceil(batches / rounds) * rounds
    timing = time_loop(make_loader(dataset, batch_size, workers), lambda batch: None, batches)
    return timing.steps / timing.seconds


# ------------------------------------------------------------------------------------------
# Pinned memory and a second stream (GPU only)


def copy_compute_overlap(n_bytes: int, compute_seconds: float, device: torch.device | str,
                         repeats: int = 5) -> dict | None:
    """On a GPU, measure a batch's copy and a compute step one after the other, and side by side.

    - ``serial``: a pageable copy (``non_blocking`` cannot help: the driver stages pageable memory
      through its own pinned buffer, and the call returns when the copy is done), then the step;
    - ``overlapped``: a pinned copy with ``non_blocking=True`` on a side stream while the step
      runs on the default stream; the side stream first waits for the default one (the target
      buffer must be free) and the default stream waits for the copy at the end (the next step
      reads the batch).

    The step is ``StandInCompute(compute_seconds)`` without its synchronize (a kernel of known
    length). Timing with ``measure.time_fn`` (warm-up outside the timed region, CUDA events on the
    default stream, whose last wait covers the side stream). Returns seconds: ``copy_pageable``,
    ``copy_pinned``, ``compute``, ``serial``, ``overlapped``, and the model's predictions
    ``serial_model`` = copy_pageable + compute and ``overlapped_model`` = max(copy_pinned,
    compute). Returns None on a CPU: there is no device memory and no copy engine to overlap.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    pageable = torch.ones(n_bytes, dtype=torch.uint8)
    pinned = torch.ones(n_bytes, dtype=torch.uint8).pin_memory()
    target = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    compute = StandInCompute(compute_seconds, device, synchronize=False)
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)

    def serial():
        target.copy_(pageable)
        compute()

    def overlapped():
        side.wait_stream(main)
        with torch.cuda.stream(side):
            target.copy_(pinned, non_blocking=True)
        compute()
        main.wait_stream(side)

    def timed(fn):
        return measure.time_fn(fn, device, warmup=2, repeats=repeats).median

    result = {"copy_pageable": timed(lambda: target.copy_(pageable)),
              "copy_pinned": timed(lambda: target.copy_(pinned, non_blocking=True)),
              "compute": timed(compute), "serial": timed(serial), "overlapped": timed(overlapped)}
    result["serial_model"] = result["copy_pageable"] + result["compute"]
    result["overlapped_model"] = max(result["copy_pinned"], result["compute"])
    return result


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
