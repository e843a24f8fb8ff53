"""A measured training loop (chapter 07): a stand-in device step of known duration, a
DataLoader with the options the chapter varies, and a loop that times each step and the
part of it spent waiting for the next batch."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from gpulab import measure
from gpulab.pipeline.datasets import DecodeDataset, LatencyDataset
from gpulab.pipeline.step_model import _non_negative, usable_cores


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


def handover_seconds(dataset: Dataset, batch_size: int, batches: int = 8,
                     settle: float = 0.02) -> float:
    """Median seconds the main process takes to receive a batch that a worker already built: the
    ``handover`` of ``step_model.step_seconds``. One worker builds batches of ``dataset`` ahead
    (``prefetch_factor`` of them); before each timed ``next()`` the main process waits ``settle``
    seconds, so the batch is ready and what is timed is only its hand-over (unpickling, and
    receiving its shared memory's file descriptor from the worker, who must get a core to send it:
    on a busy machine that wait is most of it). Use a dataset of the loop's shapes that costs
    nothing to load, e.g. ``LatencyDataset(n, 0.0, shape)``, with ``batches + 1`` batches."""
    iterator = iter(make_loader(dataset, batch_size, 1))
    samples = []
    try:
        next(iterator)                       # the worker has started
        for _ in range(batches):
            time.sleep(settle)
            start = time.perf_counter()
            next(iterator)
            samples.append(time.perf_counter() - start)
    finally:
        shutdown(iterator)
    return sorted(samples)[len(samples) // 2]


def worker_load_seconds(dataset: Dataset, batch_size: int, batches: int = 8) -> float:
    """Seconds one worker takes per batch of ``dataset``, loading alone: the ``load`` of
    ``step_model.step_seconds`` as the workers pay it. For CPU-bound data it is the one to use:
    a worker also collates each batch and moves it into shared memory, and it runs in a process
    of its own, whose speed on a shared machine need not be the training process's."""
    return 1 / loading_rate(dataset, batch_size, 1, batches)


def free_cores(dataset: Dataset, batch_size: int, cores: int | None = None,
               batches: int = 8) -> float:
    """How many cores CPU-bound workers get on this machine now: the rate of ``cores`` workers
    (by default the usable cores) loading ``dataset`` alone, over the rate of one. On an idle
    machine about ``cores``; where other processes compete, the share the scheduler leaves to
    ours (``step_model.step_seconds``'s ``cores``). Use a CPU-bound dataset, such as a
    ``DecodeDataset``, with samples for ``(batches + 4) * cores`` batches. (A dataset that
    waits gives ``cores`` on any machine: waiting needs no core.)"""
    cores = cores or usable_cores()
    one = loading_rate(dataset, batch_size, 1, batches)
    return loading_rate(dataset, batch_size, cores, batches * cores) / one


def make_loader(dataset: Dataset, batch_size: int, workers: int, pin_memory: bool = False,
                prefetch_factor: int | None = None, persistent_workers: bool = False) -> DataLoader:
    """A DataLoader with the options this chapter varies, the rest at their defaults (no shuffle:
    the same batches in every run)."""
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory,
                      prefetch_factor=prefetch_factor if workers else None,
                      persistent_workers=persistent_workers and workers > 0)


def measure_pipeline(sample_latency: float, batch_size: int, workers: int, compute: float,
                     steps: int = 8, device: torch.device | str = "cpu",
                     compute_step: StandInCompute | None = None,
                     decode_rounds: int = 0) -> LoopTiming:
    """One configuration of the model's experiment: a ``LatencyDataset`` (``sample_latency`` s per
    sample), or with ``decode_rounds`` a CPU-bound ``DecodeDataset`` (that much ``busy_work`` per
    sample), through ``workers`` workers into a ``StandInCompute(compute)`` step. ``steps`` is
    rounded up to a multiple of the worker count."""
    rounds = max(workers, 1)
    steps = math.ceil(steps / rounds) * rounds
    n = (steps + 3 * rounds + 1) * batch_size
    dataset = DecodeDataset(n, decode_rounds) if decode_rounds else LatencyDataset(n, sample_latency)
    step = compute_step if compute_step is not None else StandInCompute(compute, device)
    return time_loop(make_loader(dataset, batch_size, workers), step, steps, device=device)


def loading_rate(dataset: Dataset, batch_size: int, workers: int, batches: int) -> float:
    """Batches per second a DataLoader delivers when the step does nothing (loading alone)."""
    rounds = max(workers, 1)
    batches = math.ceil(batches / rounds) * rounds
    timing = time_loop(make_loader(dataset, batch_size, workers), lambda batch: None, batches)
    return timing.steps / timing.seconds
