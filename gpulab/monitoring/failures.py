"""The classic failures of a GPU job, as arithmetic and as text to read (chapter 08).

Each function here answers one question a person asks in front of a failed or slow run:

- *Why is the GPU slow, or broken?* ``XID`` and ``DCGM_DIAG_LEVELS`` name what the driver's log and
  NVIDIA's diagnostics report. (The clock-event bits, ECC and row remapping, read from the driver
  and judged by the doctor as well, are in ``gpulab.device.health``.)
- *How often should I checkpoint?* ``cluster_mtbf``, ``young_interval``, ``daly_interval``,
  ``waste_fraction``, ``max_interval_for_loss`` and the Monte Carlo ``simulate_waste`` that
  checks them.
- *What does this out-of-memory message say?* ``cuda_oom_message`` writes PyTorch's message from
  its numbers (the format of c10/cuda/CUDACachingAllocator.cpp), ``parse_oom`` reads one back,
  ``oom_fix`` names the fix; ``parse_cpu_oom`` reads the CPU allocator's message.
- *Why did CUDA raise at the wrong line?* ``cuda_error_message`` writes the text of a CUDA error as
  c10/cuda/CUDAException.cpp composes it. (Whether a torch build has kernels for a GPU, "no kernel
  image is available", is ``gpulab.device.health.kernel_image_available``.)
- *When did my loss go bad?* ``first_nonfinite`` and ``steps_to_overflow``.
- *Will my DataLoader's workers fit in /dev/shm?* ``shm_bytes_needed``.
- *What does a hung collective look like?* ``missing_rank`` makes one, for real, on a CPU, and
  ``missing_rank_at_barrier`` names the missing rank with ``monitored_barrier``.
- *What if one rank has fewer batches?* ``uneven_inputs`` runs DDP's ``join()`` loop on two
  ranks with and without it (``uneven_epoch`` is the loop each rank runs).
- *What does torchrun learn when a rank fails?* ``recorded_error`` writes ``@record``'s error file.

Everything is a pure function of its arguments: the chapter's quizzes, its answer key and the
tests call the same code. GB = 10^9 bytes, GiB = 2^30 bytes throughout.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass


# ----------------------------------------------------------------------------- Xid and DCGM

#: A few Xid codes a training cluster meets most, as NVIDIA's "Xid Errors" documentation
#: (docs.nvidia.com/deploy/xid-errors, and its Xid catalog for Ampere and newer) describes them,
#: with the usual first response. The driver writes them to the kernel log
#: (``dmesg | grep Xid``): "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, ...".
XID = {
    13: ("graphics engine exception", "usually the application (an out-of-range access in a "
         "kernel): rerun it; suspect the GPU only if it repeats with other programs"),
    31: ("GPU memory page fault", "usually the application (an illegal address); debug it "
         "with CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer"),
    43: ("GPU stopped processing", "the application's context was stopped; restart the job"),
    45: ("preemptive cleanup, due to previous errors", "a consequence: find the Xid before it"),
    48: ("double-bit (uncorrectable) ECC error", "drain the GPU and reset it; if it repeats, "
         "replace it"),
    63: ("ECC page retirement or row remapping recorded", "reset the GPU (or reboot) so the "
         "remapping takes effect"),
    64: ("ECC page retirement or row remapping failed", "hardware: take the GPU out of service"),
    74: ("NVLink error", "reset the GPU; if it repeats, check or replace the link or the board"),
    79: ("GPU has fallen off the bus", "the host lost the GPU: reboot the node and have its "
         "power, cooling and seating checked"),
    92: ("high single-bit ECC error rate", "watch it; replace the GPU if it keeps rising"),
    94: ("contained ECC error", "only the affected application died: restart it, reset the "
         "GPU when convenient"),
    95: ("uncontained ECC error", "every application on the GPU is affected: reset the GPU"),
}

#: ``dcgmi diag -r N``: the four suite levels of NVIDIA DCGM's active diagnostics ("dcgmi diag"
#: reference, docs.nvidia.com/datacenter/dcgm). Named here, never run by the course: they take
#: the whole GPU (and levels 3-4 minutes to an hour or more).
DCGM_DIAG_LEVELS = {
    1: "quick: deployment and software checks, seconds (a readiness check before a job)",
    2: "medium: adds short hardware tests, about two minutes (an epilogue after a failure)",
    3: "long: hardware diagnostics under stress, about 15 minutes (post-mortem, by an admin)",
    4: "extended: longer-running hardware diagnostics (post-mortem, by an admin)",
}

# ----------------------------------------------------------------------------- checkpoints


def cluster_mtbf(mtbf_per_device: float, devices: int) -> float:
    """Mean time between failures of a job that stops when any of ``devices`` fails, each failing
    independently at rate 1/``mtbf_per_device``: rates add, so M = M_device / N (same unit)."""
    return mtbf_per_device / devices


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimum time between checkpoints, √(2 δ M) (J. W. Young, "A first order
    approximation to the optimum checkpoint interval", Communications of the ACM 17(9), 1974).
    Derivation: per unit of time, checkpoints cost δ/τ and a failure (rate 1/M) loses on average
    half an interval, τ/(2M); the sum is smallest where δ/τ² = 1/(2M). Any one time unit."""
    return math.sqrt(2 * checkpoint_seconds * mtbf_seconds)


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum: √(2δM)·[1 + ⅓√(δ/2M) + δ/(18M)] − δ for δ < 2M, else M
    (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
    Future Generation Computer Systems 22(3), 2006, eq. 37). Close to Young's when δ ≪ M."""
    delta, m = checkpoint_seconds, mtbf_seconds
    if delta >= 2 * m:
        return m
    x = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def waste_fraction(interval: float, checkpoint_seconds: float, mtbf_seconds: float,
                   restart_seconds: float = 0.0) -> float:
    """First-order share of wall time not spent on new work: δ/τ (writing checkpoints) +
    τ/(2M) (work redone after a failure, half an interval on average) + R/M (restarting). The
    model behind Young's interval; good while τ and δ are small against M."""
    return (checkpoint_seconds / interval + interval / (2 * mtbf_seconds)
            + restart_seconds / mtbf_seconds)


def max_interval_for_loss(mtbf_seconds: float, loss: float) -> float:
    """The longest interval whose expected rework, τ/(2M), stays at most ``loss`` (a fraction):
    τ = 2·loss·M."""
    return 2 * loss * mtbf_seconds


def simulate_waste(work_seconds: float, interval: float, checkpoint_seconds: float,
                   mtbf_seconds: float, runs: int = 400, restart_seconds: float = 0.0,
                   seed: int = 0) -> float:
    """Monte Carlo check of ``waste_fraction``: run a job of ``work_seconds`` of work ``runs``
    times, writing a checkpoint (δ) after every ``interval`` of work, with failures arriving as a
    Poisson process of mean gap M (also during checkpoints and restarts). A failure loses the work
    since the last completed checkpoint and costs ``restart_seconds``. Returns the mean share of
    wall time that was not new work, 1 − work / wall."""
    import numpy as np

    rng = np.random.default_rng(seed)
    wasted = []
    for _ in range(runs):
        wall, done, next_failure = 0.0, 0.0, rng.exponential(mtbf_seconds)
        while done < work_seconds:
            segment = min(interval, work_seconds - done)
            cost = segment + (checkpoint_seconds if done + segment < work_seconds else 0.0)
            if wall + cost <= next_failure:          # the segment and its checkpoint complete
                wall, done = wall + cost, done + segment
                continue
            wall = next_failure + restart_seconds   # lost since the last checkpoint
            next_failure = wall + rng.exponential(mtbf_seconds)
        wasted.append(1 - work_seconds / wall)
    return float(np.mean(wasted))


# ----------------------------------------------------------------------------- out of memory

_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def format_size(n: int) -> str:
    """A byte count as PyTorch's c10 ``format_size`` writes it in its messages: bytes up to
    1 KiB, then KiB, MiB or GiB with two decimals (binary units)."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1024 * 1024:
        return f"{n / 1024:.2f} KiB"
    if n <= 1024**3:
        return f"{n / 1024**2:.2f} MiB"
    return f"{n / 1024**3:.2f} GiB"


def cuda_oom_message(requested: int, total: int, free: int, allocated: int, reserved: int,
                     process_bytes: int | None = None, device: int = 0) -> str:
    """PyTorch's CUDA out-of-memory message for these byte counts, in the format that
    ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator::malloc``) composes: what was
    asked, the device's total and free memory (``cudaMemGetInfo``), this process's memory as the
    driver counts it, then the allocator's allocated bytes and reserved − allocated bytes ("reserved
    by PyTorch but unallocated"). The course builds it from numbers you give: a message written
    here is an illustration of the format, not something measured."""
    process = ("" if process_bytes is None else
               f"Including non-PyTorch memory, this process has {format_size(process_bytes)} "
               "memory in use. ")
    return (f"CUDA out of memory. Tried to allocate {format_size(requested)}. GPU {device} has a "
            f"total capacity of {format_size(total)} of which {format_size(free)} is free. "
            f"{process}Of the allocated memory {format_size(allocated)} is allocated by PyTorch, "
            f"and {format_size(reserved - allocated)} is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


@dataclass(frozen=True)
class OOMReport:
    """The numbers of a CUDA out-of-memory message, in bytes (to the message's 2 decimals)."""

    requested: int
    total: int
    free: int
    allocated: int                 # handed out to tensors by PyTorch's caching allocator
    unallocated: int               # reserved by PyTorch but unallocated (cached, split blocks)
    process: int | None = None     # this process as the driver counts it, if the message says

    @property
    def reserved(self) -> int:
        """What PyTorch's allocator holds from the driver: allocated + unallocated."""
        return self.allocated + self.unallocated

    @property
    def outside_pytorch(self) -> int:
        """Device memory neither free nor reserved by this PyTorch: total − free − reserved. The
        CUDA context (with the kernels of the libraries loaded), NCCL's buffers, other
        processes. Not cuBLAS's workspaces: PyTorch takes those from its own caching allocator
        (``getNewWorkspace`` in aten/src/ATen/cuda/CublasHandlePool.cpp), so they are in
        ``reserved`` (and in ``allocated`` while a handle holds them)."""
        return self.total - self.free - self.reserved


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB)"


def parse_oom(text: str) -> OOMReport:
    """Read the numbers back from a CUDA out-of-memory message (``cuda_oom_message``'s format,
    which recent PyTorch releases print). ValueError if the text is not such a message."""
    pattern = (rf"Tried to allocate {_SIZE}\. GPU \d+ has a total capacity of {_SIZE} of which "
               rf"{_SIZE} is free\..*?Of the allocated memory {_SIZE} is allocated by PyTorch,"
               rf".*?and {_SIZE} is reserved by PyTorch but unallocated")
    match = re.search(pattern, " ".join(text.split()))
    if not match:
        raise ValueError("not a CUDA out-of-memory message of the expected format")
    g = match.groups()
    process = re.search(rf"this process has {_SIZE} memory in use", text)
    return OOMReport(_bytes(g[0], g[1]), _bytes(g[2], g[3]), _bytes(g[4], g[5]),
                     _bytes(g[6], g[7]), _bytes(g[8], g[9]),
                     _bytes(*process.groups()) if process else None)


def oom_fix(report: OOMReport) -> str:
    """The first fix to try for an out-of-memory report, in the course's vocabulary:

    - ``"too_large"``: the one request exceeds the whole GPU: no setting helps; shrink the batch
      or sequence, or shard the tensor across GPUs;
    - ``"expandable_segments"``: the allocator already holds at least the request, reserved but
      unallocated: fragmentation (free blocks split from partly used segments; the allocator has
      released every whole free segment before raising), which
      ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` avoids;
    - ``"other_process"``: memory outside this PyTorch (other processes, above a 1 GiB context)
      would cover the request: find and stop them (``nvidia-smi``, ``python -m gpulab doctor``);
    - ``"smaller_batch"``: the live tensors need it: a smaller micro-batch with gradient
      accumulation, activation checkpointing, or lower precision (chapters 02, 04, 05)."""
    if report.requested > report.total:
        return "too_large"
    if report.unallocated >= report.requested:
        return "expandable_segments"
    if report.outside_pytorch - 2**30 >= report.requested:
        return "other_process"
    return "smaller_batch"


def parse_cpu_oom(text: str) -> int:
    """The bytes a failed CPU allocation asked for, from PyTorch's ``DefaultCPUAllocator``
    message ("... you tried to allocate 4503599627370496 bytes ...")."""
    match = re.search(r"tried to allocate (\d+) bytes", text)
    if not match:
        raise ValueError("not a CPU allocator message of the expected format")
    return int(match.group(1))


# ----------------------------------------------------------------------------- CUDA errors

#: cudaGetErrorName / cudaGetErrorString of the errors this chapter reads (CUDA Runtime API,
#: "Data types", cudaError).
CUDA_ERRORS = {
    "cudaErrorAssert": "device-side assert triggered",
    "cudaErrorNoKernelImageForDevice": "no kernel image is available for execution on the device",
    "cudaErrorIllegalAddress": "an illegal memory access was encountered",
    "cudaErrorECCUncorrectable": "uncorrectable ECC error encountered",
}
#: Kernel failures that surface at a later CUDA call (``get_cuda_async_error_suffix``).
_ASYNCHRONOUS = {"cudaErrorAssert", "cudaErrorIllegalAddress", "cudaErrorLaunchFailure",
                 "cudaErrorIllegalInstruction", "cudaErrorMisalignedAddress"}


def cuda_error_message(error_name: str, launch_blocking: bool = False) -> str:
    """The text of ``torch.AcceleratorError`` for a CUDA error, composed as
    ``c10/cuda/CUDAException.cpp`` (``c10_cuda_check_implementation``) and
    ``c10/cuda/CUDAMiscFunctions.cpp`` do: the error string, where to look it up, then, for a
    kernel failure reported asynchronously and without CUDA_LAUNCH_BLOCKING=1, the warning that the
    stack trace may point at the wrong line. The last line is what a build without device-side
    assertions (the default) adds. Built from the source's format, not captured from a GPU."""
    lines = [f"CUDA error: {CUDA_ERRORS[error_name]}",
             f"Search for `{error_name}' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
             "group__CUDART__TYPES.html for more information."]
    if error_name in _ASYNCHRONOUS:
        if not launch_blocking:
            lines += ["CUDA kernel errors might be asynchronously reported at some other API "
                      "call, so the stacktrace below might be incorrect.",
                      "For debugging consider passing CUDA_LAUNCH_BLOCKING=1"]
    else:
        lines.append("For more detailed error information, run with CUDA_LOG_FILE=stderr")
    lines.append("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- a hung collective


@contextlib.contextmanager
def _fd2_into(file):
    """File descriptor 2 writes into ``file`` meanwhile: gloo's C++ code logs there itself,
    past sys.stderr."""
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _two_gloo_ranks(timeout_seconds: float) -> dict:
    """Two gloo ranks of one group, as two threads of this process on 127.0.0.1 (both must
    connect before any collective): {rank: ProcessGroupGloo}."""
    import datetime
    import threading

    import torch.distributed as dist

    gloo, store, groups = dist.ProcessGroupGloo, dist.HashStore(), {}

    def join(rank: int) -> None:
        options = gloo._Options()
        options._devices = [gloo.create_device(hostname="127.0.0.1")]
        options._timeout = datetime.timedelta(seconds=timeout_seconds)
        groups[rank] = gloo(store, rank, 2, options)

    ranks = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join()
    return groups


def missing_rank(timeout_seconds: float = 1.0, while_waiting=None) -> tuple[float, str]:
    """A collective that one rank never joins, made for real on a CPU: two gloo ranks of one
    group (two threads of this process), rank 0 calls ``all_reduce``, rank 1 never does. Rank 0
    waits for the group's timeout and raises. Returns (seconds it waited, the error text). A gloo
    collective waits in the call; an NCCL one returns at once and the rank waits at its next
    synchronising call, until ``init_process_group(timeout=...)`` (10 min by default for NCCL),
    when the watchdog ends the process (TORCH_NCCL_ASYNC_ERROR_HANDLING).
    ``while_waiting``: called from another thread a quarter of the timeout into the wait (e.g.
    ``faulthandler.dump_traceback``: what a hung rank's stack looks like)."""
    import threading
    import time

    import torch

    groups = _two_gloo_ranks(timeout_seconds)
    if while_waiting is not None:
        threading.Timer(timeout_seconds / 4, while_waiting).start()
    start = time.perf_counter()
    try:
        groups[0].allreduce([torch.ones(4)]).wait()      # rank 1 never arrives
    except RuntimeError as error:
        return time.perf_counter() - start, str(error)
    raise AssertionError("the all_reduce finished without its second rank")


def missing_rank_at_barrier(timeout_seconds: float = 1.0) -> tuple[float, str, str]:
    """``monitored_barrier`` with a rank that never arrives, for real on a CPU: rank 0 of two gloo
    ranks waits at the barrier, rank 1 never comes, and rank 0 raises with the missing ranks'
    numbers (``wait_all_ranks=True``). gloo only: a job on NCCL makes a gloo group for it
    (``dist.new_group(backend="gloo")``). Returns (seconds waited, the error text, what gloo's C++
    code logged to stderr meanwhile, captured here so that it reads as output, not an error)."""
    import datetime
    import tempfile
    import time

    groups = _two_gloo_ranks(timeout_seconds)
    with tempfile.TemporaryFile("w+") as log:
        with _fd2_into(log):
            start = time.perf_counter()
            try:
                groups[0].monitored_barrier(datetime.timedelta(seconds=timeout_seconds),
                                            wait_all_ranks=True)
            except RuntimeError as error:
                waited, message = time.perf_counter() - start, str(error)
            else:
                raise AssertionError("the barrier passed without its second rank")
        log.seek(0)
        return waited, message, log.read()


def uneven_epoch(rank: int, world_size: int, batches_per_rank: tuple[int, ...], use_join: bool,
                 barrier_seconds: float) -> tuple[int, list[float]]:
    """One rank of ``uneven_inputs`` (run by ``gpulab.parallel.dist.launch``): chapter 08's
    ``join()`` loop over a loader of ``batches_per_rank[rank]`` batches, then section 4.4's
    ``monitored_barrier``, which waits ``barrier_seconds`` for the other ranks and then names the
    missing ones. Returns (the steps this rank took, its final weights)."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)                                  # the same start on every rank
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)            # a different shard on every rank
    loader = [torch.randn(4, 8, generator=data) for _ in range(batches_per_rank[rank])]
    steps = 0
    with model.join() if use_join else contextlib.nullcontext():
        for batch in loader:
            loss = model(batch).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    patience = datetime.timedelta(seconds=barrier_seconds)
    # gloo also logs the barrier's error to fd 2, which a notebook shows in red; the error has it
    with open(os.devnull, "w") as quiet, _fd2_into(quiet):
        dist.monitored_barrier(timeout=patience, wait_all_ranks=True)
    return steps, [p.detach().flatten().tolist() for p in model.module.parameters()]


def uneven_inputs(batches_per_rank: tuple[int, ...] = (3, 4), use_join: bool = True,
                  barrier_seconds: float = 2.0) -> dict:
    """DDP on ranks whose loaders differ in length, for real: one gloo process per rank
    (``uneven_epoch``). With ``join()`` every rank ends: {"steps": steps per rank, "weight_gap":
    the largest difference between two ranks' final weights, "weights": each rank's}. Without
    it, the rank with more batches waits in its last backward's all-reduce, and rank 0's barrier
    gives up after ``barrier_seconds``: {"errors": {rank: its error's first sentence},
    "waiting_in": {rank: the line of ``uneven_epoch`` it was in when it failed}, "report":
    launch's whole message}."""
    from gpulab.parallel.dist import LaunchError, launch

    try:
        results = launch(uneven_epoch, n_ranks=len(batches_per_rank),
                         args=(tuple(batches_per_rank), use_join, barrier_seconds))
    except LaunchError as error:
        errors, waiting_in = {}, {}
        for rank, traceback_text in error.tracebacks.items():
            lines = [line for line in traceback_text.splitlines() if line.strip()]
            frame = max(i for i, line in enumerate(lines) if line.endswith("in uneven_epoch"))
            waiting_in[rank] = lines[frame + 1].strip()
            # gloo's errors start with their C++ source location, "[/path/pair.cc:553] ..."
            errors[rank] = re.sub(r"\[/\S+\] ", "", lines[-1]).split(". ")[0]
        return {"errors": errors, "waiting_in": waiting_in, "report": str(error)}
    weights = [[w for tensor in rank_weights for w in tensor] for _, rank_weights in results]
    gap = max(abs(a - b) for other in weights[1:] for a, b in zip(weights[0], other))
    return {"steps": [steps for steps, _ in results], "weight_gap": gap, "weights": weights}


def recorded_error(error: Exception) -> dict:
    """What torchrun's ``@record`` writes when the function it decorates raises ``error``: the
    JSON error file (``TORCHELASTIC_ERROR_FILE``, which torchrun sets for each rank and reads
    to print the first failure), here in a temporary folder of its own, removed afterwards. The
    error is raised, recorded and caught; the environment is left as it was."""
    import json
    import os
    import tempfile

    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        raise error

    before = os.environ.get("TORCHELASTIC_ERROR_FILE")
    with tempfile.TemporaryDirectory(prefix="gpulab-ch08-") as folder:
        path = os.environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(folder, "error.json")
        try:
            main()
        except type(error):
            pass
        finally:
            if before is None:
                del os.environ["TORCHELASTIC_ERROR_FILE"]
            else:
                os.environ["TORCHELASTIC_ERROR_FILE"] = before
        with open(path) as file:
            return json.load(file)


# ----------------------------------------------------------------------------- NaN, /dev/shm


def first_nonfinite(values) -> int | None:
    """Index of the first NaN or ±inf in a sequence of numbers (losses per step), or None."""
    for i, v in enumerate(values):
        if not math.isfinite(float(v)):
            return i
    return None


def steps_to_overflow(start: float, growth: float, limit: float = 65504.0) -> int:
    """The first step t at which start·growth^t exceeds ``limit`` (fp16's largest finite value by
    default, chapter 04), for growth > 1: t = ⌊log(limit/start) / log(growth)⌋ + 1. A value that
    large rounds to inf in fp16, and inf − inf or 0·inf makes NaN in the steps after."""
    if growth <= 1:
        raise ValueError("a value that does not grow never overflows")
    if start > limit:
        return 0
    return math.floor(math.log(limit / start) / math.log(growth)) + 1


def shm_bytes_needed(workers: int, prefetch_factor: int, batch_bytes: int) -> int:
    """Shared memory that DataLoader workers fill at once: each of the W workers keeps up to
    ``prefetch_factor`` batches ready, and a batch travels to the main process through /dev/shm
    (``torch.multiprocessing``'s file-descriptor sharing). Docker's default /dev/shm is 64 MB
    (``docker run --shm-size``); past it a worker dies with a bus error."""
    return workers * prefetch_factor * batch_bytes
