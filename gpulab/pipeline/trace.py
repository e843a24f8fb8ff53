"""Reading a torch.profiler trace (chapter 07, "Profiling"): where a step's time went.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes the Chrome trace-event format
(JSON: ``{"traceEvents": [...]}``, optionally gzipped), which Perfetto (ui.perfetto.dev) and
chrome://tracing display. Each complete event (``"ph": "X"``) has a category ``cat``, a ``name``,
a start ``ts`` and a duration ``dur`` in microseconds. The categories used here:

- ``user_annotation``: ``record_function`` ranges, including ``ProfilerStep#N``, which
  ``prof.step()`` adds for each step when the profiler has a ``schedule``;
- ``kernel`` (GPU kernels), ``gpu_memcpy`` / ``gpu_memset`` (copies and fills on the device);
- ``cuda_runtime`` / ``cuda_driver``: host-side CUDA calls, e.g. ``cudaLaunchKernel``;
- ``cpu_op``: ATen operators on the host.

The idle share of the device is computed from the trace, not assumed: within the profiled steps,
the share of time no busy interval covers. On a GPU the busy intervals are the kernels (what the
device does; a copy keeps the copy engine busy but no SM computes). On a CPU there is no device:
the busy intervals are the ranges a ``record_function`` name marks as the compute (the stand-in
device step of ``gpulab.pipeline.StandInCompute``). Sources: PyTorch profiler recipe and API docs
(torch.profiler.profile, schedule, export_chrome_trace, key_averages); Chrome Trace Event Format.

Writing the trace. ``export_chrome_trace`` hands the path to the profiler's C++ exporter
(Kineto), which reports a file it could not write only on the process's stderr (a Jupyter
server's log), not as an exception: reading the path back afterwards could read a stale file, or
another user's at a fixed name in a shared /tmp. ``new_trace_path`` names a file in a fresh
folder of this user's own, and ``export`` writes there and raises if nothing was written.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

STEP_PREFIX = "ProfilerStep#"
DEVICE_BUSY_CATEGORIES = ("kernel",)
LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def new_trace_path(prefix: str = "gpulab-trace-") -> Path:
    """A path for a trace in a new folder that only this user can open (``tempfile.mkdtemp``:
    mode 0700, a name no one else holds), so no one else's file can stand at it."""
    return Path(tempfile.mkdtemp(prefix=prefix)) / "trace.json"


def export(prof, path: str | Path) -> Path:
    """Write ``prof``'s Chrome trace (``prof.export_chrome_trace``) to ``path``, which must not
    exist yet, and check that it was written: a path that exists raises FileExistsError (what
    would be read back might be someone else's), and no file, or an empty one, afterwards raises
    RuntimeError. Use it as ``on_trace_ready=lambda p: trace.export(p, path)``."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists already: write each trace to a new path "
                              "(trace.new_trace_path()), so that what is read back is this trace")
    prof.export_chrome_trace(str(path))
    if not path.is_file() or path.stat().st_size == 0:
        raise RuntimeError(f"torch.profiler wrote no trace to {path}: its exporter says why only "
                           "on this process's stderr (in Jupyter, the server's log). Is the "
                           "folder there and writable?")
    return path


def load_events(path: str | Path) -> list[dict]:
    """The complete ("X") events of a Chrome trace file (``.json`` or ``.json.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def _interval(event: dict) -> tuple[float, float]:
    start = float(event["ts"])
    return start, start + float(event["dur"])


def merged(intervals) -> list[tuple[float, float]]:
    """Union of (start, end) intervals as sorted, disjoint intervals (overlaps counted once)."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def covered(intervals, window: tuple[float, float]) -> float:
    """Microseconds of ``window`` covered by the union of ``intervals``."""
    lo, hi = window
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in merged(intervals))


def step_windows(events: list[dict]) -> list[tuple[float, float]]:
    """The (start, end) of each ``ProfilerStep#N`` range, in order."""
    return sorted(_interval(e) for e in events
                  if e.get("cat") == "user_annotation" and e["name"].startswith(STEP_PREFIX))


@dataclass(frozen=True)
class IdleShare:
    """The device's idle share over the profiled steps, and what counted as busy."""

    share: float
    step_us: float          # total length of the steps
    busy_us: float          # covered by busy intervals
    steps: int
    busy_from: str          # "GPU kernels" or the annotation name used on a CPU

    def __str__(self) -> str:
        return (f"device idle {self.share:.1%} of {self.steps} steps ({self.step_us / 1e3:.1f} ms; "
                f"busy {self.busy_us / 1e3:.1f} ms, from {self.busy_from})")


def idle_share(events: list[dict], compute_annotation: str = "compute") -> IdleShare:
    """Share of the profiled steps' time during which the device computed nothing.

    Busy = GPU kernels when the trace has any; else the ``compute_annotation`` ranges (a CPU run
    whose device step is marked with ``record_function(compute_annotation)``). Raises if the trace
    has no ``ProfilerStep#`` ranges (profile with a ``schedule`` and call ``prof.step()``).
    """
    windows = step_windows(events)
    if not windows:
        raise ValueError("no ProfilerStep# ranges in the trace: give the profiler a schedule "
                         "and call prof.step() at the end of every step")
    kernels = [_interval(e) for e in events if e.get("cat") in DEVICE_BUSY_CATEGORIES]
    if kernels:
        busy, source = kernels, "GPU kernels"
    else:
        busy = [_interval(e) for e in events
                if e.get("cat") == "user_annotation" and e["name"] == compute_annotation]
        source = f"'{compute_annotation}' ranges (no GPU in this trace)"
    total = sum(hi - lo for lo, hi in windows)
    busy_us = sum(covered(busy, w) for w in windows)
    return IdleShare(1 - busy_us / total if total else 0.0, total, busy_us, len(windows), source)


def top_ops(events: list[dict], n: int = 5, categories=("kernel",)) -> list[tuple[str, float, int]]:
    """The ``n`` names with the most total time in ``categories``: (name, total µs, calls).
    Nested host ops each count their whole duration (a parent includes its children), as the
    "total" columns of ``prof.key_averages().table()`` do."""
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") in categories:
            total[e["name"]] += float(e["dur"])
            calls[e["name"]] += 1
    ranked = sorted(total, key=total.get, reverse=True)[:n]
    return [(name, total[name], calls[name]) for name in ranked]


@dataclass(frozen=True)
class LaunchOverhead:
    """Kernel launches in a trace: how many, the host time they took, the kernels' own time."""

    launches: int
    launch_us: float
    kernels: int
    kernel_us: float

    @property
    def us_per_launch(self) -> float:
        return self.launch_us / self.launches if self.launches else 0.0

    @property
    def us_per_kernel(self) -> float:
        return self.kernel_us / self.kernels if self.kernels else 0.0

    @property
    def launch_bound(self) -> bool:
        """True when launching a kernel takes the host longer than the kernel takes the GPU:
        the GPU then waits between kernels however fast it is."""
        return self.launches > 0 and self.us_per_launch > self.us_per_kernel

    def __str__(self) -> str:
        if not self.launches:
            return "no kernel launches in this trace (no GPU)"
        return (f"{self.launches} launches, {self.us_per_launch:.1f} µs each on the host; "
                f"{self.kernels} kernels, {self.us_per_kernel:.1f} µs each on the GPU"
                + (": launch-bound" if self.launch_bound else ""))


def launch_overhead(events: list[dict]) -> LaunchOverhead:
    """Count ``cudaLaunchKernel`` (and driver-level launch) calls and the kernels they queued."""
    launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e["name"] in LAUNCH_NAMES]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    return LaunchOverhead(len(launches), sum(float(e["dur"]) for e in launches),
                          len(kernels), sum(float(e["dur"]) for e in kernels))
