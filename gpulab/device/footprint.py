"""A learner's real GPU footprint: what the driver says their processes hold, sampled over time.

``torch.cuda.max_memory_allocated()`` counts only the tensors PyTorch's caching allocator hands
out, in one process, since the last ``reset_peak_memory_stats()``. What a learner takes from a
shared GPU is more: the CUDA context of every process that touched the GPU (a few hundred MiB
each), the allocator's cache (reserved but not allocated), cuBLAS workspaces, NCCL buffers,
and the memory of every rank process a notebook starts. The driver knows all of it, per process:
NVML's ``nvmlDeviceGetComputeRunningProcesses`` lists each process with its used bytes (what
``nvidia-smi`` prints in its process table). ``FootprintSampler`` polls it in a background
thread and sums it over one process tree (a notebook's kernel and its children), keeping the
largest sum seen.

Two limits, stated in every report that uses it: a peak shorter than the sampling interval can
be missed, and inside a container with its own PID namespace NVML may report host PIDs that match
nothing here. For the second case the sampler also keeps the device-wide used memory above its
value when sampling started, which on a machine running nothing else is the same footprint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from gpulab.device.sampler import BackgroundSampler


def process_tree(root: int) -> set[int]:
    """``root`` and all its descendants, now (psutil if installed, else Linux's /proc)."""
    try:
        import psutil
    except ImportError:
        return _tree_from_parents(root, _parents_from_proc())
    try:
        process = psutil.Process(root)
        return {root} | {child.pid for child in process.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _parents_from_proc(proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> parent pid for every process in /proc."""
    parents = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses: split at the last ")".
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _tree_from_parents(root: int, parents: dict[int, int]) -> set[int]:
    """``root`` and its descendants in a pid -> parent table."""
    if root not in parents:
        return set()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def gpu_processes(nvml) -> list[tuple[int, int, int | None]]:
    """(device index, pid, used bytes or None where the driver cannot say) for every compute
    process on every GPU NVML sees. All GPUs, because a learner's ranks may sit on any of them.
    A GPU in MIG mode is asked instance by instance: NVML lists its processes per MIG device
    handle (the GPU's own handle answers only to privileged callers)."""
    listed = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for part in _mig_handles(nvml, handle) or [handle]:
            listed += [(index, p.pid, p.usedGpuMemory) for p in _compute_processes(nvml, part)]
    return listed


def _mig_handles(nvml, handle) -> list:
    """The MIG instances of a GPU in MIG mode; [] for any other GPU (or a stand-in without MIG)."""
    try:
        if nvml.nvmlDeviceGetMigMode(handle)[0] != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception:  # noqa: BLE001 (no MIG support: NVMLError_NotSupported, or no such call)
        return []
    handles = []
    for slot in range(slots):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
        except Exception:  # noqa: BLE001 (an empty slot)
            continue
    return handles


def _compute_processes(nvml, handle):
    # nvidia-ml-py calls the _v3 entry point, which older drivers lack; it then raises
    # NVMLLibraryMismatchError (not an NVMLError). _v2 reads the same pid and used bytes.
    try:
        return nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        if not hasattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v2"):
            raise
        return nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)


def device_used_bytes(nvml) -> int:
    """Used memory summed over all GPUs, as the driver counts it (every process, any PID)."""
    return sum(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used
               for i in range(nvml.nvmlDeviceGetCount()))


def tree_bytes(listed: Iterable[tuple[int, int, int | None]],
               tree: set[int]) -> tuple[int, dict[int, int | None]]:
    """Bytes the processes in ``tree`` hold on all GPUs, and per pid (None: not reported).

    A process appears once per GPU it uses; its entries are added. Processes outside the tree
    (other learners, the checker itself) are left out.
    """
    by_pid: dict[int, int | None] = {}
    for _, pid, used in listed:
        if pid not in tree:
            continue
        if used is None:
            by_pid.setdefault(pid, None)
        else:
            by_pid[pid] = (by_pid.get(pid) or 0) + used
    return sum(v for v in by_pid.values() if v is not None), by_pid


@dataclass
class Footprint:
    """The largest footprint seen while sampling, in bytes (GiB = 2**30 in ``__str__``)."""

    peak_bytes: int = 0                      # largest sum over the tree's processes
    peak_by_pid: dict[int, int | None] = field(default_factory=dict)  # at that moment
    pids_seen: set[int] = field(default_factory=set)  # tree processes that ever held GPU memory
    device_peak_above_start: int = 0         # largest device-wide used memory above the start
    samples: int = 0
    unreported_pids: set[int] = field(default_factory=set)  # listed, but no byte count
    error: str | None = None                 # the first NVML error, if sampling failed

    @property
    def note(self) -> str:
        """What a reader must know to trust (or not) ``peak_bytes``; empty when nothing odd."""
        notes = []
        if self.error:
            notes.append(f"sampling failed: {self.error}")
        if self.unreported_pids:
            notes.append(f"the driver gave no byte count for pids {sorted(self.unreported_pids)}")
        if not self.pids_seen and self.device_peak_above_start > 0:
            notes.append("no process of this run was listed by NVML (PIDs from another PID "
                         "namespace?): the device-wide figure stands in, valid only if nothing "
                         "else ran on the GPU")
        return "; ".join(notes)

    def to_dict(self) -> dict:
        return {"peak_bytes": self.peak_bytes,
                "peak_by_pid": {str(k): v for k, v in sorted(self.peak_by_pid.items())},
                "processes_seen": len(self.pids_seen),
                "device_peak_above_start_bytes": self.device_peak_above_start,
                "samples": self.samples, "note": self.note}

    def __str__(self) -> str:
        return (f"{self.peak_bytes / 2**30:.3f} GiB over {len(self.peak_by_pid)} process(es) "
                f"(device-wide {self.device_peak_above_start / 2**30:.3f} GiB above the start; "
                f"{self.samples} samples)")


class FootprintSampler(BackgroundSampler):
    """Sample a process tree's GPU memory every ``interval`` seconds in a background thread.

        with FootprintSampler(kernel_pid, include_root=True) as sampler:
            ...                                  # run the work
        print(sampler.footprint.peak_bytes)

    ``root``: the tree's root pid; ``include_root=False`` counts only its descendants (the checker
    samples its own children: the notebook kernels and their rank processes, not itself).
    ``nvml``: the ``pynvml`` module (from nvidia-ml-py) or a stand-in with the same functions;
    ``tree``: a function root -> set of pids (``process_tree``), replaceable in tests.
    """

    thread_name = "gpu-footprint"

    def __init__(self, root: int | None = None, include_root: bool = False,
                 interval: float = 0.1, nvml=None, tree: Callable[[int], set[int]] = process_tree):
        if nvml is None:
            import pynvml as nvml
        super().__init__(interval)
        self.root = os.getpid() if root is None else root
        self.include_root, self.nvml, self.tree = include_root, nvml, tree
        self.footprint = Footprint()
        self._start_used = 0

    def _open(self) -> bool:
        self.nvml.nvmlInit()            # raises without a driver: the caller decides what then
        self._start_used = device_used_bytes(self.nvml)
        self.sample()
        return True

    def _close(self) -> None:
        self.sample()  # the last moment counts too
        self.nvml.nvmlShutdown()

    def stop(self) -> Footprint:
        super().stop()
        return self.footprint

    def sample(self) -> None:
        """Read NVML once and update the footprint; an error is recorded, never raised (the
        work being measured must not die of its measurement)."""
        fp = self.footprint
        try:
            tree = self.tree(self.root)
            if not self.include_root:
                tree.discard(self.root)
            listed = gpu_processes(self.nvml)
            used = device_used_bytes(self.nvml)
        except Exception as error:  # noqa: BLE001 (any NVML or /proc failure)
            fp.error = fp.error or f"{type(error).__name__}: {error}"
            return
        total, by_pid = tree_bytes(listed, tree)
        fp.samples += 1
        fp.pids_seen |= set(by_pid)
        fp.unreported_pids |= {pid for pid, b in by_pid.items() if b is None}
        if total > fp.peak_bytes or (total == fp.peak_bytes and len(by_pid) > len(fp.peak_by_pid)):
            fp.peak_bytes, fp.peak_by_pid = total, by_pid
        fp.device_peak_above_start = max(fp.device_peak_above_start, used - self._start_used)
