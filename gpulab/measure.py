"""Measurements that are right on a CPU and on a GPU alike.

Timing a GPU naively is wrong: CUDA kernels are queued and run asynchronously, so a wall clock
read right after the call measures how long it took to *queue* the work. ``time_fn`` therefore

1. warms up first (the first calls pay for CUDA context creation, cuBLAS handles and
   workspaces, loading each kernel on its first use (CUDA's lazy module loading), caches),
   then waits until the device is idle, so that no earlier work runs into the timed region,
2. on CUDA, records CUDA events around each call, on the stream of the device being timed, and
   synchronises on the end event before reading them (PyTorch docs, "CUDA semantics:
   asynchronous execution"),
3. repeats and reports the median with the spread, because single runs are noisy.

On a CPU the operations are synchronous and ``time.perf_counter`` is right.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from gpulab.memory import allocation


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


# ------------------------------------------------------------------------------------------
# Peak memory (chapter 02). The storage tracker, the CUDA allocator path and the GPT training
# step live in gpulab.memory; these are the names the notebooks use:
#   peak_memory(fn, device=None, *, model=None, optimizer=None, inputs=()) -> MemoryPeak
#   training_step_peak(config, batch_size, seq_len, dtype, optimizer,
#                      checkpointing=False | True | k, device=None, fake=False,
#                      micro_batches=1) -> MemoryPeak   (.peak in bytes)

from gpulab.memory import MemoryPeak, peak_memory, training_step_peak  # noqa: E402, F401


# ------------------------------------------------------------------------------------------
# Throughput (chapter 03, "Timing a GPU correctly"). Every figure below is measured with
# time_fn (warm-up, CUDA events, median); the FLOPs and bytes come from gpulab.arith, so the
# learner's numbers and the formulas meet in one place. Default sizes (float32) run in well
# under a second each on an idle 2-core CPU; each docstring gives the sizes to use on a GPU,
# where small problems measure launch overhead rather than the hardware.

import math  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from gpulab import arith  # noqa: E402
from gpulab.device import best_device  # noqa: E402
from gpulab.memory import make_optimizer, train_step  # noqa: E402
from gpulab.models import GPT, GPTConfig  # noqa: E402


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
    On a GPU use n = 8192 in bfloat16 (2n³ = 1.1 TFLOP per call): formulas.md quotes about
    770-800 TFLOP/s measured on an H200 and ml-engineering's best H100 SXM figure 794.5 of
    989 TFLOP/s; n = 512 there measures mostly launch overhead. float32 on a GPU runs on the
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


def training_step_throughput(config: GPTConfig | None = None, batch_size: int = 4,
                             seq_len: int = 64, dtype=torch.float32, device=None,
                             optimizer: str = "adamw", steps: int = 3) -> dict:
    """Tokens per second and FLOP/s of full training steps of ``GPT(config)``.

    Warm-up steps (one on a CPU, two on a GPU: ``training_step_timing`` says why), then
    ``steps`` timed steps (``gpulab.memory.train_step``: forward, backward, optimizer step, zero
    grads; the model built in ``dtype``). Returns a dict:

    - ``seconds_per_step``: the median step; ``tokens_per_step`` = batch_size · seq_len
    - ``tokens_per_second`` = tokens_per_step / seconds_per_step
    - ``n_params``: the parameters that do matmuls, ``GPT.count_params(config)`` less the two
      embedding tables (a lookup does no arithmetic; the untied head is a real matmul)
    - ``flops_per_token`` = ``arith.training_flops(n_params, 1, n_layer=L, hidden=n_embd,
      seq_len=seq_len)`` = 6·N + 12·L·h·s (model FLOPs, PaLM appendix B)
    - ``achieved_flops_per_second`` = flops_per_token · tokens_per_second; divide by
      ``hardware.peak_flops(spec, dtype)`` for the MFU (``arith.mfu``)
    - ``timing`` (the ``Timing``), ``device``, ``dtype``

    Sizes: the default GPTConfig (4 layers, n_embd 256, vocab 1000) with batch 4, seq 64 takes
    about 0.1-0.3 s a step in float32 on an idle 2-core CPU (bfloat16 is several times slower
    on CPUs without native bf16 instructions: the matmuls are emulated). On a CPU shared with
    other work, steps can take 10x longer (PyTorch's OpenMP threads wait for each other at every
    op): look at ``timing.spread`` before trusting a median. On a GPU use e.g. GPTConfig(vocab_size=32000,
    block_size=1024, n_layer=12, n_head=12, n_embd=768) with batch 4, seq 512, in bfloat16
    (``arith.predict_training_memory``: about 2.0 GiB peak, inside the course's 4 GiB budget);
    this model writes attention out, so expect an MFU well below the fused-attention figures.
    Chapter 03, "MFU".
    """
    config = config if config is not None else GPTConfig()
    timing = training_step_timing(config, batch_size, seq_len, dtype, optimizer, device=device,
                                  steps=steps)
    n_params = GPT.count_params(config) - (config.vocab_size + config.block_size) * config.n_embd
    flops_per_token = arith.training_flops(n_params, 1, n_layer=config.n_layer,
                                           hidden=config.n_embd, seq_len=seq_len)
    tokens_per_step = batch_size * seq_len
    tokens_per_second = tokens_per_step / timing.median
    return {"seconds_per_step": timing.median, "tokens_per_step": tokens_per_step,
            "tokens_per_second": tokens_per_second, "n_params": n_params,
            "flops_per_token": flops_per_token,
            "achieved_flops_per_second": flops_per_token * tokens_per_second,
            "timing": timing, "device": timing.device, "dtype": _label(_float_dtype(dtype))}


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out: softmax(q·kᵀ/√d with the future masked)·v.

    q, k, v: (B, nh, T, hs). Materialises the (B, nh, T, T) scores and probabilities, which the
    fused kernel never stores. Chapter 03, "Naive vs fused attention".
    """
    T, hs = q.shape[-2], q.shape[-1]
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))   # (B, nh, T, T)
    att = att.masked_fill(future, float("-inf"))
    att = torch.softmax(att, dim=-1)                          # (B, nh, T, T)
    return att @ v                                            # (B, nh, T, hs)


def attention_naive_vs_fused(batch: int = 2, heads: int = 4, seq_len: int = 256,
                             head_dim: int = 64, dtype=torch.float32, device=None,
                             backward: bool = False, repeats: int = 10) -> dict:
    """Time ``naive_attention`` against ``F.scaled_dot_product_attention(is_causal=True)``.

    Forward only, or forward + backward with ``backward=True``. First checks that the two agree
    (``torch.testing.assert_close``; atol = rtol = 1e-3 in float32, 3e-2 in 16-bit types, loose
    enough for TF32 and for softmax rounded to 16 bits, tight enough to catch a wrong mask or
    scale). Returns a dict: ``naive_seconds``, ``fused_seconds`` (medians), ``speedup`` =
    naive / fused, ``max_abs_diff``, ``flops`` (forward: the two matmuls over the full T×T
    square, 2 · B·nh · 2·T²·hs; a causal kernel may skip the masked half), ``scores_bytes``
    (one B·nh·T² tensor of scores, which the naive version materialises and the fused one does
    not), the two ``Timing``s, ``device``, ``dtype``, ``backward``.

    Which fused kernel runs depends on the machine: on CUDA with 16-bit inputs,
    FlashAttention-2; on a CPU, PyTorch's own flash-attention-style CPU kernel. Sizes: the
    defaults take well under a second on an idle 2-core CPU; on a GPU use batch 4, heads 16,
    seq_len 2048, head_dim 128 in bfloat16 (one tensor of naive scores: 4·16·2048²·2 bytes =
    512 MiB; the naive version holds a few such, within the course's 4 GiB budget).
    Chapter 03, "Naive vs fused attention".
    """
    arith.check_positive_integers(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim,
                                  repeats=repeats)
    dtype = _float_dtype(dtype)
    device = torch.device(device) if device is not None else best_device()
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, dtype=dtype, device=device,
                           generator=generator, requires_grad=backward) for _ in range(3))
    grad_out = torch.randn(batch, heads, seq_len, head_dim, dtype=dtype, device=device,
                           generator=generator)

    def fused_attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        naive_out, fused_out = naive_attention(q, k, v), fused_attention(q, k, v)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(fused_out, naive_out, atol=tol, rtol=tol)
    max_abs_diff = (fused_out.float() - naive_out.float()).abs().max().item()
    del naive_out, fused_out

    def timed(attention):
        if backward:
            return time_fn(lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), grad_out),
                           device, repeats=repeats)
        with torch.no_grad():
            return time_fn(lambda: attention(q, k, v), device, repeats=repeats)

    naive, fused = timed(naive_attention), timed(fused_attention)
    p = torch.tensor([], dtype=dtype).element_size()
    return {"naive_seconds": naive.median, "fused_seconds": fused.median,
            "speedup": naive.median / fused.median, "max_abs_diff": max_abs_diff,
            "flops": 2 * batch * heads * arith.matmul_flops(seq_len, head_dim, seq_len),
            "scores_bytes": batch * heads * seq_len**2 * p,
            "naive_timing": naive, "fused_timing": fused, "device": str(device),
            "dtype": _label(dtype), "backward": backward}


# ------------------------------------------------------------------------------------------
# What recomputation costs (chapter 05): the time of a training step with and without
# activation checkpointing, measured like training_step_throughput.


def training_step_timing(config: GPTConfig | None = None, batch_size: int = 8,
                         seq_len: int = 128, dtype=torch.float32, optimizer: str = "adamw",
                         checkpointing: bool | int = False, device=None, steps: int = 3,
                         micro_batches: int = 1) -> Timing:
    """Time full training steps of ``GPT(config, checkpointing=...)``: warm-up steps, then
    ``steps`` timed ones (``gpulab.memory.train_step``, with ``micro_batches`` > 1 for gradient
    accumulation). Returns the ``Timing``; look at its spread before trusting the median on a
    busy CPU. Chapter 05, "What recomputation costs".

    Warm-up: the first step creates the optimizer's state (and on a GPU the cuBLAS handle and
    workspace, and loads each kernel on first use). On a GPU a second warm-up step: it is the
    first to hold that state through forward and backward, so its peak is higher and the caching
    allocator grows its cache with cudaMalloc, which is slow and synchronises the device; from
    the third step on, every block comes from the cache.
    """
    config = config if config is not None else GPTConfig()
    arith.check_positive_integers(batch_size=batch_size, seq_len=seq_len, steps=steps,
                                  micro_batches=micro_batches)
    if seq_len > config.block_size:
        raise ValueError(f"seq_len={seq_len} is longer than config.block_size="
                         f"{config.block_size}")
    dtype = _float_dtype(dtype)
    device = torch.device(device) if device is not None else best_device()
    torch.manual_seed(0)
    model = GPT(config, dtype=dtype, device=device, checkpointing=checkpointing)
    opt = make_optimizer(model, optimizer)
    idx = torch.randint(config.vocab_size, (batch_size, seq_len), device=device)
    targets = torch.randint(config.vocab_size, (batch_size, seq_len), device=device)
    return time_fn(lambda: train_step(model, opt, idx, targets, micro_batches), device,
                   warmup=2 if device.type == "cuda" else 1, repeats=steps)


def step_seconds(config: GPTConfig | None = None, batch_size: int = 8, seq_len: int = 128,
                 dtype=torch.float32, optimizer: str = "adamw", checkpointing: bool | int = False,
                 device=None, steps: int = 3, micro_batches: int = 1) -> float:
    """Median seconds of a training step: ``training_step_timing(...).median``.

    Checkpointing every block runs the blocks' forward twice: expect about
    ``arith.training_flops_with_checkpointing`` / ``arith.training_flops``, a third more for a
    model that is mostly blocks, and the same for any segment size. The course GPT (batch 8,
    seq 128, float32, AdamW) on a shared 2-core CPU: 0.18-0.20 s a step without checkpointing,
    0.23-0.27 s with it, every block, every 2 or one segment alike (1.25-1.4x, noisy; the FLOP
    ratio is 1.31). Chapter 05, "What recomputation costs".
    """
    return training_step_timing(config, batch_size, seq_len, dtype, optimizer, checkpointing,
                                device, steps, micro_batches).median
