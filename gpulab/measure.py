"""Measurements that are right on a CPU and on a GPU alike.

Timing a GPU naively is wrong: CUDA kernels are queued and run asynchronously, so a wall clock
read right after the call measures how long it took to *queue* the work. ``time_fn`` therefore

1. warms up first (the first calls pay for CUDA context creation, cuBLAS handles, caches),
2. on CUDA, records CUDA events around each call and synchronises before reading them
   (PyTorch docs, "CUDA semantics: asynchronous execution"),
3. repeats and reports the median with the spread, because single runs are noisy.

On a CPU the operations are synchronous and ``time.perf_counter`` is right.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one operation, in seconds."""

    samples: tuple[float, ...]
    device: str

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> tuple[float, float]:
        """(fastest, slowest) run."""
        return min(self.samples), max(self.samples)

    def __str__(self) -> str:
        low, high = self.spread
        return (f"{self.median * 1e3:.3f} ms median of {len(self.samples)} on {self.device} "
                f"(range {low * 1e3:.3f}-{high * 1e3:.3f} ms)")


def synchronize(device: torch.device | str) -> None:
    """Wait until all queued work on ``device`` has finished (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, device: torch.device | str, warmup: int = 2, repeats: int = 10) -> Timing:
    """Time ``fn()`` on ``device``: warm-up, then ``repeats`` timed runs (CUDA events on a GPU)."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)  # elapsed_time is in milliseconds
        else:
            start_s = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start_s)
    return Timing(tuple(samples), str(device))


@dataclass(frozen=True)
class CopyBandwidth:
    """A measured copy: what was copied, how many bytes, how long it took."""

    what: str
    n_bytes: int
    timing: Timing

    @property
    def bytes_per_second(self) -> float:
        return self.n_bytes / self.timing.median

    def __str__(self) -> str:
        return (f"{self.what}: {self.n_bytes / 1e6:.1f} MB in {self.timing.median * 1e3:.3f} ms "
                f"= {self.bytes_per_second / 1e9:.2f} GB/s (GB = 10^9 bytes)")


def host_copy_bandwidth(n_bytes: int, device: torch.device | str, pinned: bool,
                        repeats: int = 10) -> CopyBandwidth:
    """Measure copying ``n_bytes`` from host memory to ``device``.

    On CUDA this is the host-to-device copy over PCIe (or NVLink-C2C), from pageable or pinned
    (page-locked) memory; ``non_blocking=True`` lets a pinned copy run asynchronously, so we time
    it with CUDA events. On a CPU there is no second device: the same call measures a
    host-to-host memory copy, which is what the learner's machine can actually do, and the label
    says so. Pinning needs a CUDA driver, so ``pinned`` is ignored on a CPU.
    """
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    pinned = pinned and on_gpu
    source = torch.empty(n_bytes, dtype=torch.uint8, pin_memory=pinned)
    source.fill_(1)
    target = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    timing = time_fn(lambda: target.copy_(source, non_blocking=pinned), device, repeats=repeats)
    if on_gpu:
        what = f"{'pinned' if pinned else 'pageable'} host -> GPU"
    else:
        what = "host -> host copy (CPU only, no PCIe link)"
    return CopyBandwidth(what, n_bytes, timing)


def allocated_bytes(make_tensor, device: torch.device | str) -> int:
    """Bytes the device's allocator hands out for the tensor that ``make_tensor()`` returns.

    On CUDA: the change in ``torch.cuda.memory_allocated`` (includes the 512-byte rounding of the
    caching allocator). On a CPU PyTorch keeps no such counter, so we read the size of the
    tensor's storage, which is what the allocator was asked for.
    """
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        tensor = make_tensor()
        synchronize(device)
        used = torch.cuda.memory_allocated(device) - before
        del tensor
        return used
    return make_tensor().untyped_storage().nbytes()


# ------------------------------------------------------------------------------------------
# Peak memory (chapter 02). The storage tracker, the CUDA allocator path and the GPT training
# step live in gpulab.memory; these are the names the notebooks use:
#   peak_memory(fn, device=None, *, model=None, optimizer=None, inputs=()) -> MemoryPeak
#   training_step_peak(config, batch_size, seq_len, dtype, optimizer, checkpointing=False,
#                      device=None, fake=False) -> MemoryPeak   (.peak in bytes)

from gpulab.memory import MemoryPeak, peak_memory, training_step_peak  # noqa: E402, F401
