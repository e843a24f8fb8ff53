"""Watching a run: a background sampler of what the GPU (or, without one, this process) is doing,
the phases of the loop it watched, the energy it used, and one plot of it all (chapter 08).

On a GPU, every ``interval`` seconds ``Monitor`` asks the driver through NVML (nvidia-ml-py's
``pynvml``; never by parsing ``nvidia-smi``, whose text changes between versions) for

====================  ===========================================  ===========================
series                NVML call                                    nvidia-smi shows it as
====================  ===========================================  ===========================
``util_percent``      ``nvmlDeviceGetUtilizationRates(h).gpu``      GPU-Util
``memory_used_bytes`` ``nvmlDeviceGetMemoryInfo(h).used``           Memory-Usage (MiB)
``power_watts``       ``nvmlDeviceGetPowerUsage(h)`` (mW)           Pwr:Usage/Cap
``temperature_c``     ``nvmlDeviceGetTemperature(h, GPU)``          Temp
``sm_clock_mhz``      ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``  -q -d CLOCK
``clock_events``      ``nvmlDeviceGetCurrentClocksEventReasons(h)`` -q -d PERFORMANCE
``energy_mj``         ``nvmlDeviceGetTotalEnergyConsumption(h)``    (not shown)
====================  ===========================================  ===========================

(NVML API reference, docs.nvidia.com/deploy/nvml-api, "Device Queries".) A query this GPU or
driver does not support is left out of the trace, not faked. Without a GPU (no driver, a
CPU-only machine) the monitor says so and samples what it can, labelled as such: this process's
CPU use (``cpu_percent``, 100 = one core busy, from psutil) and resident memory (``rss_bytes``).

Two limits belong beside every trace: a phase shorter than the interval can fall between two
samples, and NVML's figures are themselves averages over the recent past. Utilisation is the
share of the driver's own sample period (1/6 s to 1 s, ``nvmlUtilization_t``) in which a kernel
ran; power, on Ampere (except GA100) and newer GPUs, is "averaged over 1 sec interval" (nvml.h,
``nvmlDeviceGetPowerUsage``; nvidia-smi's "Average Power Draw"), so on an H100 or H200 samples
50 ms apart are overlapping 1-second averages. The instantaneous reading is the field
``NVML_FI_DEV_POWER_INSTANT`` (``nvmlDeviceGetFieldValues``); the energy counter misses nothing.

What the doctor judges once before a run (clocks, power cap, clock-event reasons, temperatures,
ECC) is ``gpulab.device.health.read_health``, read with the same never-raise rule.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpulab.device.health import NoGPU, ask, clock_events, open_gpu
from gpulab.device.sampler import BackgroundSampler

GPU_SERIES = ("util_percent", "memory_used_bytes", "power_watts", "temperature_c",
              "sm_clock_mhz", "clock_events", "energy_mj")
CPU_SERIES = ("cpu_percent", "rss_bytes")
LABELS = {"util_percent": "GPU utilisation (%)", "memory_used_bytes": "GPU memory used (GiB)",
          "power_watts": "power (W)", "temperature_c": "temperature (°C)",
          "sm_clock_mhz": "SM clock (MHz)", "clock_events": "clock-event bits",
          "cpu_percent": "process CPU (% of one core)", "rss_bytes": "process RSS (GiB)"}


# ----------------------------------------------------------------------------- formulas

def energy_per_step(power_watts: float, step_seconds: float) -> float:
    """Joules per step: mean power × step time (1 W = 1 J/s)."""
    return power_watts * step_seconds


def tokens_per_kwh(tokens_per_step: float, joules_per_step: float) -> float:
    """Tokens trained per kilowatt-hour: 1 kWh = 1000 W × 3600 s = 3.6e6 J."""
    return tokens_per_step * 3.6e6 / joules_per_step


# ----------------------------------------------------------------------------- the trace

@dataclass
class Trace:
    """What a Monitor saw: sample times (seconds since start), one list per series, the phases
    marked with ``Monitor.phase`` as (name, start, end), and where the numbers came from."""

    source: str = ""
    times: list[float] = field(default_factory=list)
    series: dict[str, list[float]] = field(default_factory=dict)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    note: str = ""               # why there is no GPU, the first error, what was left out

    @property
    def on_gpu(self) -> bool:
        return "util_percent" in self.series

    @property
    def samples(self) -> int:
        return len(self.times)

    def between(self, start: float, end: float, name: str) -> list[float]:
        """The values of series ``name`` sampled in [start, end]."""
        return [v for t, v in zip(self.times, self.series.get(name, [])) if start <= t <= end]

    def in_phase(self, phase: str, name: str) -> list[float]:
        """The values of series ``name`` sampled during every span of ``phase``."""
        return [v for p, a, b in self.phases if p == phase for v in self.between(a, b, name)]

    def energy_joules(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        """Energy used in [start, end]: the difference of NVML's energy counter where it exists
        (Volta and newer), else power integrated over time (trapezoids between samples, which
        misses what happens between them). None without power readings (a CPU)."""
        counter = self.between(start, end, "energy_mj")
        if len(counter) >= 2:
            return (counter[-1] - counter[0]) / 1e3
        pairs = [(t, p) for t, p in zip(self.times, self.series.get("power_watts", []))
                 if start <= t <= end]
        if len(pairs) < 2:
            return None
        return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pairs, pairs[1:]))

    def __str__(self) -> str:
        span = f"{self.times[-1] - self.times[0]:.2f} s" if self.samples > 1 else "no time"
        text = f"{self.samples} samples over {span} from {self.source}"
        return text + (f" ({self.note})" if self.note else "")


# ----------------------------------------------------------------------------- NVML reads


def read_gpu_sample(nvml, handle) -> dict[str, float]:
    """One reading of every series in GPU_SERIES that this GPU supports."""
    rates = ask(getattr(nvml, "nvmlDeviceGetUtilizationRates", None), handle)
    memory = ask(getattr(nvml, "nvmlDeviceGetMemoryInfo", None), handle)
    power = ask(getattr(nvml, "nvmlDeviceGetPowerUsage", None), handle)       # milliwatts
    values = {
        "util_percent": None if rates is None else rates.gpu,
        "memory_used_bytes": None if memory is None else memory.used,
        "power_watts": None if power is None else power / 1e3,
        "temperature_c": ask(getattr(nvml, "nvmlDeviceGetTemperature", None), handle,
                              getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
        "sm_clock_mhz": ask(getattr(nvml, "nvmlDeviceGetClockInfo", None), handle,
                             getattr(nvml, "NVML_CLOCK_SM", 1)),
        "clock_events": clock_events(nvml, handle),
        "energy_mj": ask(getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None), handle),
    }
    return {k: float(v) for k, v in values.items() if v is not None}



# ----------------------------------------------------------------------------- the monitor

class Monitor(BackgroundSampler):
    """Sample one GPU (or this process, without a GPU) every ``interval`` seconds::

        with monitor.Monitor(interval=0.1) as watch:
            with watch.phase("train"):
                ...                                   # the work
        print(watch.trace); monitor.plot(watch.trace)

    ``index``: the NVML device index (physical numbering; ``gpulab.device.physical_gpu`` maps
    torch's index to it); None: the GPU behind torch's cuda:0, whatever form
    CUDA_VISIBLE_DEVICES names it in. ``nvml``: the ``pynvml`` module or a stand-in with its
    functions (tests). ``gpu=False`` watches the process even where a GPU exists. Sampling never
    raises into the work: an error is noted in ``trace.note``.
    """

    thread_name = "gpulab-monitor"

    def __init__(self, index: int | None = None, interval: float = 0.1, nvml=None,
                 gpu: bool = True):
        super().__init__(interval)
        self.index, self.gpu = index, gpu
        self.trace = Trace()
        self._nvml, self._handle, self._process = nvml, None, None
        self._t0 = 0.0

    # -- choosing what to watch

    def _open_gpu(self) -> str | None:
        """Open NVML and the GPU; None on success, else why not (the CPU fallback says it)."""
        if not self.gpu:
            return "GPU monitoring switched off"
        try:
            self._nvml, self.index, self._handle = open_gpu(self._nvml, self.index)
        except NoGPU as why:
            self._nvml = None
            return f"no NVIDIA GPU to monitor ({why})"
        name = ask(self._nvml.nvmlDeviceGetName, self._handle) or f"GPU {self.index}"
        name = name.decode() if isinstance(name, bytes) else name
        self.trace.source = f"NVML, GPU {self.index} ({name})"
        return None

    def _open_process(self, why: str) -> None:
        import psutil
        self._process = psutil.Process(os.getpid())
        self._process.cpu_percent(None)           # the first call starts psutil's CPU clock
        self.trace.source = "this process's CPU and memory (psutil), not a GPU"
        self.trace.note = why

    # -- lifecycle (gpulab.device.sampler.BackgroundSampler runs the thread)

    def _open(self) -> bool:
        why_not = self._open_gpu()
        if why_not:
            self._open_process(why_not)
        self._t0 = time.perf_counter()
        self.sample()
        return True

    def _close(self) -> None:
        self.sample()                              # the end of the run counts too
        if self._nvml is not None:
            ask(self._nvml.nvmlShutdown)

    def stop(self) -> Trace:
        super().stop()
        return self.trace

    def now(self) -> float:
        """Seconds since the monitor started (the trace's clock)."""
        return time.perf_counter() - self._t0

    @contextmanager
    def phase(self, name: str):
        """Mark a phase of the loop (data, compute, checkpoint...) on the trace's clock."""
        start = self.now()
        try:
            yield
        finally:
            self.trace.phases.append((name, start, self.now()))

    def sample(self) -> None:
        """Take one sample now; an error is noted, never raised."""
        try:
            if self._handle is not None:
                values = read_gpu_sample(self._nvml, self._handle)
            else:
                values = {"cpu_percent": self._process.cpu_percent(None),
                          "rss_bytes": float(self._process.memory_info().rss)}
        except Exception as error:  # noqa: BLE001
            self.trace.note = self.trace.note or f"sampling failed: {type(error).__name__}: {error}"
            return
        t = self.now()
        self.trace.times.append(t)
        for name, value in values.items():
            column = self.trace.series.setdefault(name, [])
            column.extend([float("nan")] * (len(self.trace.times) - 1 - len(column)))
            column.append(value)


# ----------------------------------------------------------------------------- the plot

def plot(trace: Trace, names: tuple[str, ...] | None = None, title: str = ""):
    """One panel per series against time, the phases shaded and named, each sample a dot (so the
    gaps between samples show). Bytes are drawn in GiB. Returns the figure."""
    import matplotlib.pyplot as plt

    wanted = names or tuple(n for n in (*GPU_SERIES, *CPU_SERIES)
                            if n in trace.series and n not in ("energy_mj", "clock_events"))
    fig, axes = plt.subplots(len(wanted), 1, sharex=True, figsize=(9, 1.9 * len(wanted) + 0.6),
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    phase_names = list(dict.fromkeys(p for p, _, _ in trace.phases))
    for ax, name in zip(axes[:, 0], wanted):
        scale = 2**30 if name.endswith("_bytes") else 1
        values = [v / scale for v in trace.series[name]]
        ax.plot(trace.times[:len(values)], values, "-o", markersize=3, color="black", lw=1)
        ax.set_ylabel(LABELS.get(name, name), fontsize=8)
        for phase, start, end in trace.phases:
            ax.axvspan(start, end, alpha=0.18, lw=0,
                       color=colours[phase_names.index(phase) % len(colours)])
    if phase_names:                             # one legend entry per phase, beside the panels
        from matplotlib.patches import Patch
        axes[0, 0].legend(handles=[Patch(color=colours[i % len(colours)], alpha=0.3, label=phase)
                                   for i, phase in enumerate(phase_names)],
                          loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="phase",
                          title_fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the monitor started")
    fig.suptitle(title or f"Monitored: {trace.source}", fontsize=10)
    fig.tight_layout()
    return fig
