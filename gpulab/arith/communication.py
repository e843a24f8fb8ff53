"""Data parallelism (chapter 06): collectives, ZeRO, scaling, the pipeline bubble.

Part of ``gpulab.arith`` (see its docstring for the conventions); import it as
``from gpulab import arith`` and call ``arith.<name>``, as the notebooks do.
"""

from __future__ import annotations

from .training_memory import RECIPES, ZERO_STAGES, _positive, check_positive_integers


# Conventions: n ranks joined in a ring; B is one rank's link bandwidth in one direction
# (bytes/s); S is a collective's size in bytes as nccl-tests counts it: the per-rank buffer for
# all-reduce, broadcast and reduce (input and output are the same size), the FULL buffer for
# all-gather (its output, n x each rank's share) and reduce-scatter (its input), each rank's whole
# send buffer for all-to-all (n pieces, one per rank, itself included). Times are the
# bandwidth-optimal bound plus an optional per-step latency (Hockney's alpha-beta model, as in
# ``transfer_seconds``); real NCCL adds protocol overheads and picks trees for small messages.

# Per-direction link bandwidths, bytes/s. Datasheets quote NVLink as the two directions added.
LINKS: dict[str, float] = {
    # PCI-SIG, PCIe 4.0: 16 GT/s x 16 lanes x 128/130 encoding / 8 = 31.5 GB/s per direction
    "PCIe 4.0 x16": 32e9,
    # PCI-SIG, PCIe 5.0: 32 GT/s per lane, twice PCIe 4.0: about 63 GB/s per direction
    "PCIe 5.0 x16": 64e9,
    # NVIDIA A100 datasheet: NVLink 3, 12 links, 600 GB/s total = 300 GB/s per direction
    "NVLink 3 (A100)": 300e9,
    # NVIDIA H100 SXM datasheet: NVLink 4, 18 links, 900 GB/s total = 450 GB/s per direction.
    "NVLink 4 (H100)": 450e9,
    # NVIDIA ConnectX-7 / Quantum-2: NDR 400 Gb/s per port = 50 GB/s per direction
    "InfiniBand NDR 400Gb/s": 50e9,
    # NVIDIA ConnectX-6 / Quantum: HDR 200 Gb/s per port = 25 GB/s per direction
    "InfiniBand HDR 200Gb/s": 25e9,
    # IEEE 802.3ba/bj: 100 Gb/s = 12.5 GB/s per direction (before protocol overhead)
    "Ethernet 100GbE": 12.5e9,
}

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def _non_negative(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def _check_link(n_bytes: float, n_ranks: int, bandwidth: float, latency: float) -> None:
    _non_negative(n_bytes=n_bytes)
    check_positive_integers(n_ranks=n_ranks)
    _positive(bandwidth=bandwidth)
    _non_negative(latency=latency)


def _check_op(op: str) -> None:
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {', '.join(COLLECTIVES)}; got {op!r}")


def allreduce_seconds(n_bytes: float, n_ranks: int, bandwidth: float,
                      latency: float = 0.0) -> float:
    """Ring all-reduce time: 2·(n−1)·latency + 2·(n−1)/n · S/B.

    A reduce-scatter then an all-gather, each n−1 steps in which every rank sends S/n bytes to
    its neighbour: each rank sends 2·(n−1)/n·S bytes in all, the least any all-reduce built from
    point-to-point sends can (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms
    for clusters of workstations", JPDC 69(2)). ``n_bytes`` (S) is each rank's buffer, ``bandwidth``
    (B) one rank's link in one direction. One rank costs nothing. Sources: nccl-tests
    doc/PERFORMANCE.md ("AllReduce"); book/formulas.md, "Data parallelism". Chapter 06.

    Worked example: 1 GB over 8 ranks at 100 GB/s: 2·7/8 · 1e9/1e11 = 17.5 ms.

    >>> round(allreduce_seconds(1e9, 8, 100e9) * 1e3, 6)
    17.5
    """
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    steps = n_ranks - 1
    return 2 * steps * latency + 2 * steps / n_ranks * n_bytes / bandwidth


def allgather_seconds(n_bytes: float, n_ranks: int, bandwidth: float,
                      latency: float = 0.0) -> float:
    """Ring all-gather time: (n−1)·latency + (n−1)/n · S/B, with S the FULL gathered buffer.

    Convention: ``n_bytes`` is the size of the output (each rank contributes S/n), as nccl-tests
    sizes all-gather ("S is the size in bytes of the total array ... sendcount·sizeof·n",
    doc/PERFORMANCE.md). Each rank receives the n−1 shares it lacks, (n−1)/n·S bytes. Half of a
    ring all-reduce (Patarasuk & Yuan 2009). Chapter 06, "Collectives".

    Worked example: gathering 1 GB over 8 ranks at 100 GB/s: 7/8 · 10 ms = 8.75 ms.

    >>> round(allgather_seconds(1e9, 8, 100e9) * 1e3, 6)
    8.75
    """
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    steps = n_ranks - 1
    return steps * latency + steps / n_ranks * n_bytes / bandwidth


def reduce_scatter_seconds(n_bytes: float, n_ranks: int, bandwidth: float,
                           latency: float = 0.0) -> float:
    """Ring reduce-scatter time: (n−1)·latency + (n−1)/n · S/B, with S the FULL input buffer.

    Convention: ``n_bytes`` is each rank's whole input (each rank ends with a reduced S/n
    share), as nccl-tests sizes reduce-scatter ("recvcount·sizeof·n", doc/PERFORMANCE.md). The
    first half of a ring all-reduce (Patarasuk & Yuan 2009), so
    reduce_scatter + all_gather = all_reduce. Chapter 06, "Collectives".

    >>> round(reduce_scatter_seconds(1e9, 8, 100e9) * 1e3, 6)
    8.75
    """
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    steps = n_ranks - 1
    return steps * latency + steps / n_ranks * n_bytes / bandwidth


def alltoall_seconds(n_bytes: float, n_ranks: int, bandwidth: float,
                     latency: float = 0.0) -> float:
    """All-to-all time through a switch: (n−1)·latency + (n−1)/n · S/B, with S each rank's whole
    send buffer.

    Each rank cuts its S bytes into n pieces and sends piece j to rank j: (n−1)/n·S bytes leave
    it and as many arrive, over its own link. NCCL runs it as a send and a receive with every
    peer at once (nccl-tests src/alltoall.cu, ``AlltoAllRunColl``), so when a non-blocking
    switch joins the ranks (NVSwitch in an NVLink server, a fat-tree network) each rank's link
    is the bottleneck, and nccl-tests reports busbw = algbw·(n−1)/n (``AlltoAllGetBw``), which
    is B at that speed. The latency term counts the n − 1 peers one after the other, as a
    pairwise exchange does; NCCL overlaps them. Not a ring collective: on a ring of links a
    piece for the rank d hops away crosses d links, and each link carries
    (S/n)·(1 + 2 + … + (n−1)) = (n−1)/2·S bytes, n/2 times as long. Mixture-of-experts layers
    use it twice per layer, to send tokens to their experts and back. Chapter 06, "Collectives".

    Worked example: 1 GB per rank over 8 ranks at 100 GB/s: 7/8 · 10 ms = 8.75 ms, the time of
    an all-gather of a 1 GB result.

    >>> round(alltoall_seconds(1e9, 8, 100e9) * 1e3, 6)
    8.75
    """
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    steps = n_ranks - 1
    return steps * latency + steps / n_ranks * n_bytes / bandwidth


def collective_seconds(op: str, n_bytes: float, n_ranks: int, bandwidth: float,
                       latency: float = 0.0) -> float:
    """Time of collective ``op`` ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
    "reduce", "all_to_all") on a ring (all-to-all: through a switch), sizes as in nccl-tests
    (see the section's conventions).

    all-reduce: ``allreduce_seconds``; all-gather, reduce-scatter: ``allgather_seconds``;
    all-to-all: ``alltoall_seconds``.
    Broadcast and reduce, pipelined along the ring: ≈ (n−1)·latency + S/B, since all S bytes
    must leave (broadcast) or reach (reduce) the root through its one link (nccl-tests
    doc/PERFORMANCE.md, "Broadcast", "Reduce": t = S/B). One rank costs nothing.
    Chapter 06, "Collectives".

    >>> collective_seconds("broadcast", 1e9, 8, 100e9)
    0.01
    """
    _check_op(op)
    if op == "all_reduce":
        return allreduce_seconds(n_bytes, n_ranks, bandwidth, latency)
    if op == "all_gather":
        return allgather_seconds(n_bytes, n_ranks, bandwidth, latency)
    if op == "reduce_scatter":
        return reduce_scatter_seconds(n_bytes, n_ranks, bandwidth, latency)
    if op == "all_to_all":
        return alltoall_seconds(n_bytes, n_ranks, bandwidth, latency)
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    if n_ranks == 1:
        return 0.0
    return (n_ranks - 1) * latency + n_bytes / bandwidth


def algorithm_bandwidth(n_bytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: algbw = S / t, bytes/s (doc/PERFORMANCE.md).

    Size as nccl-tests counts it (see the section's conventions). It falls as ranks are added;
    ``bus_bandwidth`` corrects for that. Chapter 06, "Measuring a collective".

    >>> algorithm_bandwidth(1e9, 0.0175)
    57142857142.85714
    """
    _non_negative(n_bytes=n_bytes)
    _positive(seconds=seconds)
    return n_bytes / seconds


_BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
                "reduce": lambda n: 1.0, "all_to_all": lambda n: (n - 1) / n}


def bus_bandwidth(algbw: float, op: str, n_ranks: int) -> float:
    """nccl-tests' bus bandwidth: busbw = algbw × factor, comparable to one link's bandwidth
    whatever the number of ranks.

    Factors: all_reduce 2(n−1)/n; all_gather, reduce_scatter (n−1)/n; broadcast, reduce 1.
    Source: NVIDIA nccl-tests, doc/PERFORMANCE.md ("Bus bandwidth", "Summary"); all_to_all
    (n−1)/n, from src/alltoall.cu (``AlltoAllGetBw``; S each rank's whole buffer). A ring run at
    full speed has busbw = B, the per-rank link bandwidth of ``allreduce_seconds``. Chapter 06,
    "Measuring a collective".

    Worked example: 1 GB all-reduced over 8 ranks in 17.5 ms: algbw = 57.1 GB/s,
    busbw = 57.1 × 2·7/8 = 100 GB/s.

    >>> round(bus_bandwidth(1e9 / 0.0175, "all_reduce", 8) / 1e9, 9)
    100.0
    """
    _non_negative(algbw=algbw)
    _check_op(op)
    check_positive_integers(n_ranks=n_ranks)
    return algbw * _BUS_FACTORS[op](n_ranks)


def zero_bytes_per_gpu(n_params: float, n_gpus: int, stage: int,
                       recipe: str = "mixed_adam") -> float:
    """Per-GPU model-state bytes under ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory
    Optimizations Toward Training Trillion Parameter Models", §5, Figure 1).

    With w, g, o the recipe's bytes per parameter for weights, gradients and optimizer state
    (``RECIPES``), Ψ = ``n_params``, N = ``n_gpus``:

        stage 0 (plain data parallelism)   (w + g + o)·Ψ
        stage 1 (optimizer states sharded) (w + g + o/N)·Ψ
        stage 2 (+ gradients)              (w + (g + o)/N)·Ψ
        stage 3 (+ parameters)             (w + g + o)·Ψ/N

    The same numbers as ``zero_sharded(model_state_bytes(Ψ, recipe), N, stage)["total"]``.
    Activations, buffers and fragmentation are extra. Worked example (the paper's Figure 1,
    mixed_adam, K = 12): Ψ = 7.5B, N = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB. Chapter 06, "ZeRO".

    >>> [round(zero_bytes_per_gpu(7.5e9, 64, s) / 1e9, 1) for s in ZERO_STAGES]
    [120.0, 31.4, 16.6, 1.9]
    """
    _positive(n_params=n_params)
    check_positive_integers(n_gpus=n_gpus)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3; got {stage!r}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}; got {recipe!r}")
    w, g, o = RECIPES[recipe]
    per_param = {0: w + g + o, 1: w + g + o / n_gpus, 2: w + (g + o) / n_gpus,
                 3: (w + g + o) / n_gpus}[stage]
    return per_param * n_params


def zero_comm_bytes(n_params: float, stage: int, bytes_per_value: int = 2,
                    n_gpus: int | None = None) -> float:
    """Bytes each GPU sends per training step under ZeRO stage ``stage`` (Rajbhandari et al.
    2020, §7, "Communication analysis of ZeRO-DP").

    Stages 0, 1, 2: 2Ψ values: the gradients' all-reduce (plain DP), or the same volume split
    into a reduce-scatter of gradients and an all-gather of updated parameters (stages 1-2).
    Stage 3: 3Ψ, 1.5 times as much: parameters are all-gathered in forward and again in
    backward, and gradients reduce-scattered. Returns values × ``bytes_per_value`` (2 for the
    16-bit gradients and parameters of mixed precision).

    Without ``n_gpus`` this is the paper's asymptotic "≈ 2Ψ"; with it, the exact ring volume
    2(N−1)/N·Ψ for N ranks (``allreduce_seconds``), likewise 3(N−1)/N·Ψ for stage 3.
    Worked example: 7.5B parameters in bf16: 30 GB per step for stages 0-2, 45 GB for stage 3;
    on N = 64 GPUs exactly 63/64 of that, 44.3 GB. Chapter 06, "ZeRO".

    >>> zero_comm_bytes(7.5e9, 0) / 1e9, zero_comm_bytes(7.5e9, 3) / 1e9
    (30.0, 45.0)
    >>> round(zero_comm_bytes(7.5e9, 3, n_gpus=64) / 1e9, 4)
    44.2969
    """
    _positive(n_params=n_params)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3; got {stage!r}")
    check_positive_integers(bytes_per_value=bytes_per_value)
    values = 3 * n_params if stage == 3 else 2 * n_params
    if n_gpus is not None:
        check_positive_integers(n_gpus=n_gpus)
        values *= (n_gpus - 1) / n_gpus
    return values * bytes_per_value


def dp_step_seconds(compute_seconds: float, comm_seconds: float,
                    overlapped_fraction: float = 0.0) -> float:
    """Data-parallel step time: compute + exposed communication, with
    exposed = max(0, comm − overlapped_fraction·compute).

    PyTorch DDP buckets gradients and all-reduces each bucket as soon as backward has filled
    it, so communication hides behind the rest of backward (Li et al. 2020, "PyTorch
    Distributed: Experiences on Accelerating Data Parallel Training", PVLDB 13(12), §3.2:
    gradient bucketing, overlapping computation with communication).
    Backward is about 2/3 of a step's compute (4·N of 6·N FLOPs per token,
    ``training_flops``), so ``overlapped_fraction`` = 2/3 is the ideal; 0 = no overlap
    (all-reduce after backward). Chapter 06, "Overlap".

    Worked example: 300 ms of compute and 150 ms of all-reduce: 450 ms without overlap,
    300 ms with ideal overlap (150 < 2/3 · 300 = 200: all of it hidden).

    >>> round(dp_step_seconds(0.3, 0.15), 9), round(dp_step_seconds(0.3, 0.15, 2 / 3), 9)
    (0.45, 0.3)
    """
    _non_negative(compute_seconds=compute_seconds, comm_seconds=comm_seconds,
                  overlapped_fraction=overlapped_fraction)
    if overlapped_fraction > 1:
        raise ValueError(f"overlapped_fraction must be between 0 and 1, got "
                         f"{overlapped_fraction!r}")
    exposed = max(0.0, comm_seconds - overlapped_fraction * compute_seconds)
    return compute_seconds + exposed


def min_tokens_compute_bound(n_ranks: int, bandwidth: float, flops_per_second: float,
                             bytes_per_grad: float = 2) -> float:
    """Tokens per GPU per step at which backward compute equals the gradients' ring all-reduce:

        T = (n−1)/n · p·F / (2·B)

    Backward costs 4·N·T FLOPs (``training_flops``: 2/3 of 6·N·T), so 4·N·T/F seconds at the
    achieved ``flops_per_second`` F; all-reducing N·p bytes of gradients takes
    2(n−1)/n · N·p/B (``allreduce_seconds``). Setting them equal, the parameter count N
    cancels: the threshold depends only on the hardware (F/B) and the gradient dtype (p), not
    on the model. With fewer tokens per GPU the all-reduce cannot hide behind backward
    (``dp_step_seconds`` with overlap 2/3). Sources: Li et al. 2020 (DDP overlap); Patarasuk &
    Yuan 2009 (the ring's 2(n−1)/n); book/formulas.md, "Data parallelism".
    Chapter 06, "When does data parallelism scale?".

    Worked example: F = 400 TFLOP/s achieved, B = 50 GB/s (a 400 Gb/s InfiniBand NIC),
    bf16 gradients (p = 2), many ranks: T ≈ 2·400e12 / (2·50e9) = 8000 tokens per GPU.

    >>> min_tokens_compute_bound(1024, 50e9, 400e12) > 7990
    True
    """
    check_positive_integers(n_ranks=n_ranks)
    _positive(bandwidth=bandwidth, flops_per_second=flops_per_second,
              bytes_per_grad=bytes_per_grad)
    return (n_ranks - 1) / n_ranks * bytes_per_grad * flops_per_second / (2 * bandwidth)


def pipeline_bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """Idle fraction of a pipeline-parallel step: (p − 1)/(m + p − 1) for p stages and m
    micro-batches.

    Each stage waits p − 1 micro-batch slots while the pipeline fills and drains, out of
    m + p − 1 slots in all; more micro-batches shrink the bubble. Sources: Huang et al. 2019,
    "GPipe", §2.2 (bubble overhead O((K−1)/(M+K−1)) for K partitions, M micro-batches);
    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", §2.2.1, whose "bubble time fraction" (p − 1)/m is the same bubble measured
    against the ideal time m slots instead of the whole step; book/formulas.md,
    "Data parallelism".
    Chapter 06.

    >>> pipeline_bubble_fraction(4, 8)
    0.2727272727272727
    """
    check_positive_integers(n_stages=n_stages, n_microbatches=n_microbatches)
    return (n_stages - 1) / (n_microbatches + n_stages - 1)
