"""Throughput of single kernels (chapter 03, "Arithmetic intensity and the roofline" and
"Compute-, memory- and overhead-bound").

Every figure below is measured with ``time_fn`` (warm-up, CUDA events, median); the FLOPs and
bytes come from ``gpulab.arith``, so the learner's numbers and the formulas meet in one place.
Default sizes (float32) run in well under a second each on an idle 2-core CPU; each docstring
gives the sizes to use on a GPU, where small problems measure launch overhead rather than the
hardware. A matmul's FLOP/s and an elementwise op's bytes per second are the two roofs of the
roofline; ``launch_overhead`` shows the third regime, where the fixed cost of each op wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpulab import arith
from gpulab.device import best_device
from gpulab.measure.timing import Timing, time_fn


def _float_dtype(dtype) -> torch.dtype:
    dtype = arith._dtype(dtype)
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype (float32, bfloat16, float16), "
                         f"got {dtype}")
    return dtype


def _label(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Throughput:
    """One timed kernel: the work it does (FLOPs, bytes moved) and how long it took.

    ``seconds`` is the median of ``timing``; the rates are derived from it, so
    ``flops_per_second == flops / seconds`` and ``bytes_per_second == bytes_moved / seconds``
    hold exactly. Bytes are the minimum traffic the formulas count (``arith.matmul_bytes``;
    read + write for elementwise ops), not what the hardware counters would show.
    """

    what: str
    flops: int
    bytes_moved: int
    dtype: str
    timing: Timing

    @property
    def seconds(self) -> float:
        return self.timing.median

    @property
    def device(self) -> str:
        return self.timing.device

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_moved / self.seconds

    @property
    def arithmetic_intensity(self) -> float:
        return arith.arithmetic_intensity(self.flops, self.bytes_moved)

    def __str__(self) -> str:
        return (f"{self.what} ({self.dtype}, {self.device}): {self.seconds * 1e3:.3f} ms median, "
                f"{self.flops_per_second / 1e12:.3f} TFLOP/s, "
                f"{self.bytes_per_second / 1e9:.2f} GB/s (GB = 10^9 bytes), "
                f"{self.arithmetic_intensity:.1f} FLOPs/byte")


def matmul_throughput(n: int = 512, dtype=torch.float32, device=None,
                      repeats: int = 10) -> Throughput:
    """Time an [n, n] x [n, n] matmul (random data, output preallocated): FLOP/s achieved.

    FLOPs: ``arith.matmul_flops(n, n, n)`` = 2n³; bytes: ``arith.matmul_bytes(n, n, n, p)`` =
    3n²p. ``device`` None means ``best_device()``. Sizes: n = 512 takes about 2 ms in float32 on
    a 2-core CPU, but about 200 ms in bfloat16 on CPUs without native bf16 instructions.
    On a GPU use n = 8192 in bfloat16 (2n³ = 1.1 TFLOP per call): ml-engineering (Stas Bekman,
    "Maximum Achievable Matmul FLOPS") reports a best of 794.5 of the datasheet's 989 TFLOP/s on
    an H100 SXM; n = 512 there measures mostly launch overhead. float32 on a GPU runs on the
    CUDA cores (``hardware.peak_flops(spec, torch.float32)``) unless TF32 is switched on.
    Chapter 03, "Timing a GPU correctly".
    """
    arith.check_positive_integers(n=n, repeats=repeats)
    dtype = _float_dtype(dtype)
    device = torch.device(device) if device is not None else best_device()
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=generator)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=generator)
    out = torch.empty(n, n, dtype=dtype, device=device)
    timing = time_fn(lambda: torch.mm(a, b, out=out), device, repeats=repeats)
    return Throughput(f"matmul {n}x{n}x{n}", arith.matmul_flops(n, n, n),
                      arith.matmul_bytes(n, n, n, a.element_size()), _label(dtype), timing)


def elementwise_throughput(n_elements: int = 2**24, dtype=torch.float32, device=None,
                           repeats: int = 10) -> Throughput:
    """Time ``y = x * 2.0`` on ``n_elements`` values: the bandwidth a memory-bound op achieves.

    Out of place (``torch.mul(x, 2.0, out=y)``, y allocated once so the allocator is not timed):
    n FLOPs and 2·n·p bytes (read x, write y; counted as formulas.md counts the H200's copy,
    read + write). Its intensity, 1/(2p) FLOPs per byte, is far below any GPU's ridge point, so
    ``bytes_per_second`` is the figure to compare with the memory bandwidth. On a CPU the write
    also reads the target line into cache first (write-allocate), so the real traffic is nearer
    3·n·p. Sizes: 2^24 float32 values (64 MiB each way, well past the CPU's caches) take 5-15 ms
    on a 2-core CPU; on a GPU use 2^28 (1 GiB in float32, far past the 50-60 MiB L2).
    Chapter 03, "The roofline".
    """
    arith.check_positive_integers(n_elements=n_elements, repeats=repeats)
    dtype = _float_dtype(dtype)
    device = torch.device(device) if device is not None else best_device()
    x = torch.ones(n_elements, dtype=dtype, device=device)
    y = torch.empty_like(x)
    timing = time_fn(lambda: torch.mul(x, 2.0, out=y), device, repeats=repeats)
    p = x.element_size()
    return Throughput(f"y = x * 2.0 on {n_elements:,} values", n_elements,
                      2 * n_elements * p, _label(dtype), timing)


@dataclass(frozen=True)
class LaunchOverhead:
    """``n_ops`` tiny ops one after another vs one op over ``n_ops`` elements.

    ``seconds_per_op``: the time of one tiny op, i.e. its fixed cost (Python, dispatcher, kernel
    launch), since its one element of work is nothing. ``seconds_per_element``: the large op's
    time per element, the same work with that cost paid once.
    """

    n_ops: int
    tiny: Timing  # all n_ops tiny ops
    one: Timing   # the one op over n_ops elements

    @property
    def device(self) -> str:
        return self.tiny.device

    @property
    def seconds_per_op(self) -> float:
        return self.tiny.median / self.n_ops

    @property
    def seconds_per_element(self) -> float:
        return self.one.median / self.n_ops

    @property
    def ratio(self) -> float:
        """How many times slower the same work is as tiny ops."""
        return self.tiny.median / self.one.median

    def __str__(self) -> str:
        return (f"{self.n_ops} tiny adds: {self.seconds_per_op * 1e6:.2f} µs per op; one add "
                f"over {self.n_ops} elements: {self.one.median * 1e6:.2f} µs "
                f"({self.seconds_per_element * 1e9:.3f} ns per element); "
                f"{self.ratio:.0f}x slower as tiny ops, on {self.device}")


def launch_overhead(n_ops: int = 1000, device=None, repeats: int = 10) -> LaunchOverhead:
    """Time ``n_ops`` in-place adds on a 1-element tensor, then one add on ``n_ops`` elements.

    Both do the same arithmetic; the first pays a fixed cost per op. On a GPU that cost is the
    kernel launch (a few µs), and the GPU sits idle between tiny kernels: CUDA events around the
    loop measure the GPU's wall time, which the CPU's launch rate sets. This is what "overhead-
    bound" means, and why CUDA graphs and fused kernels exist. The same call works on a GPU as
    is (1000 ops take a few ms). Chapter 03, "Timing a GPU correctly".
    """
    arith.check_positive_integers(n_ops=n_ops, repeats=repeats)
    device = torch.device(device) if device is not None else best_device()
    scalar = torch.zeros(1, device=device)
    vector = torch.zeros(n_ops, device=device)

    def tiny_ops():
        for _ in range(n_ops):
            scalar.add_(1.0)

    tiny = time_fn(tiny_ops, device, repeats=repeats)
    one = time_fn(lambda: vector.add_(1.0), device, repeats=repeats)
    return LaunchOverhead(n_ops, tiny, one)
