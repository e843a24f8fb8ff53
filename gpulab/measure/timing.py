"""Timing and copies, right on a CPU and on a GPU alike (chapter 01, "Feeding the GPU" and
"Asynchronous execution: why naive timing lies").

Timing a GPU naively is wrong: CUDA kernels are queued and run asynchronously, so a wall clock
read right after the call measures how long it took to *queue* the work. ``time_fn`` therefore

1. warms up first (the first calls pay for CUDA context creation, cuBLAS handles and
   workspaces, loading each kernel on its first use (CUDA's lazy module loading), caches),
   then waits until the device is idle, so that no earlier work runs into the timed region,
2. on CUDA, records CUDA events around each call, on the stream of the device being timed, and
   synchronises on the end event before reading them (PyTorch docs, "CUDA semantics:
   asynchronous execution"),
3. repeats and reports the median with the spread, because single runs are noisy.

On a CPU the operations are synchronous and ``time.perf_counter`` is right. Every other
measurement in ``gpulab.measure`` is timed with ``time_fn``. Below it: the host-to-device copy
(``host_copy_bandwidth``) and the bytes the allocator hands a tensor (``allocated_bytes``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from gpulab.measure.memory import allocation


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
    """Time ``fn()`` on ``device``: warm-up, then ``repeats`` timed runs (CUDA events on a GPU).

    The device is idle when each timed run starts: after the warm-up by a synchronize, after a
    timed run because its end event was waited for. ``fn`` must queue its work on the device's
    current stream (as PyTorch ops do unless told otherwise).
    """
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            # The events go on `device`'s stream: Event.record() without one uses the current
            # device's, which is another GPU's when `device` is not the current one.
            stream = torch.cuda.current_stream(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
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
    """Bytes the device's allocator counts for the tensor that ``make_tensor()`` returns.

    On CUDA: the change in ``torch.cuda.memory_allocated``, i.e. the size of the block the
    tensor got: the request rounded up to 512 bytes, or, above 1 MiB, possibly a whole segment
    (the allocator keeps a block whole unless more than 1 MiB would be left over:
    ``memory.cuda_block_bytes``). The counter changes on the host when the block is handed out,
    so no synchronize is needed. On a CPU PyTorch keeps no such counter, so we read the size of
    the tensor's storage, which is what the allocator was asked for. Both figures, requested and
    allocated: ``memory.allocation``.
    """
    return allocation(make_tensor, device).allocated
