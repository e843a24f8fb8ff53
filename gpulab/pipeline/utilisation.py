"""GPU utilisation as NVML reports it, sampled while work runs, and its CPU analogue (chapter 07).

NVML's ``nvmlDeviceGetUtilizationRates(handle).gpu`` is "the percent of time over the past sample
period during which one or more kernels was executing on the GPU" (NVML API reference,
``nvmlUtilization_t``; the sample period is between 1/6 s and 1 s depending on the product). It is
what ``nvidia-smi`` prints as GPU-Util and ``torch.cuda.utilization()`` returns. It counts time,
not work: one kernel running on one of an H100's 132 SMs reads 100%. MFU (``gpulab.arith.mfu``)
counts work: the model's FLOPs per second over the peak. A GPU can read 100% busy at 1% MFU.

``UtilisationSampler`` polls NVML in a background thread (``gpulab.device.sampler.BackgroundSampler``,
as ``gpulab.device.footprint.FootprintSampler`` does) for utilisation, memory used, power and the SM clock.
Without a GPU it samples nothing and says so. ``cpu_busy`` is the CPU analogue: the share of
wall-clock time this process kept a core busy (process CPU time / wall time), which, like GPU
utilisation, says nothing about how much arithmetic those cores did.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from gpulab.device.health import NoGPU, open_gpu
from gpulab.device.sampler import BackgroundSampler


@dataclass
class Utilisation:
    """What the sampler saw: one list per quantity, one entry per sample."""

    gpu_percent: list[float] = field(default_factory=list)
    memory_percent: list[float] = field(default_factory=list)
    used_bytes: list[int] = field(default_factory=list)
    power_watts: list[float] = field(default_factory=list)
    sm_clock_mhz: list[float] = field(default_factory=list)
    note: str = ""          # why nothing was sampled (no GPU), or the first error

    @property
    def samples(self) -> int:
        return len(self.gpu_percent)

    @property
    def mean_gpu_percent(self) -> float | None:
        return statistics.fmean(self.gpu_percent) if self.gpu_percent else None

    @property
    def median_gpu_percent(self) -> float | None:
        return statistics.median(self.gpu_percent) if self.gpu_percent else None

    def __str__(self) -> str:
        if not self.samples:
            return f"no utilisation samples: {self.note}"
        return (f"GPU utilisation median {self.median_gpu_percent:.0f}% (mean "
                f"{self.mean_gpu_percent:.0f}%), memory busy {statistics.median(self.memory_percent):.0f}%, "
                f"{max(self.used_bytes) / 2**30:.2f} GiB used at most, "
                f"{statistics.median(self.power_watts):.0f} W, SM clock "
                f"{statistics.median(self.sm_clock_mhz):.0f} MHz ({self.samples} samples)")


class UtilisationSampler(BackgroundSampler):
    """Sample one GPU's NVML counters every ``interval`` seconds while a block runs::

        with UtilisationSampler() as sampler:
            ...                                   # the work
        print(sampler.result)

    ``index``: the NVML device index (NVML numbers GPUs physically; ``gpulab.device.physical_gpu``
    maps torch's index to it); None: the GPU behind torch's cuda:0, whatever form
    CUDA_VISIBLE_DEVICES names it in. ``nvml``: the ``pynvml`` module (nvidia-ml-py) or a
    stand-in with the same functions, for tests. Without a driver or a GPU, ``result.note`` says
    so and the block runs unsampled. The first ``skip`` samples are dropped: NVML's figure covers
    its own past sample period (up to 1 s), which at the start includes the time before the work.
    """

    thread_name = "gpu-utilisation"

    def __init__(self, index: int | None = None, interval: float = 0.1, nvml=None, skip: int = 0):
        super().__init__(interval)
        self.index, self.skip = index, skip
        self.result = Utilisation()
        self._nvml, self._handle = nvml, None
        self._seen = 0

    def _open(self) -> bool:
        try:
            self._nvml, self.index, self._handle = open_gpu(self._nvml, self.index)
        except NoGPU as why:
            self.result.note = f"no NVIDIA GPU to sample ({why})"
            self._nvml = None
            return False
        return True

    def _close(self) -> None:
        self._nvml.nvmlShutdown()

    def stop(self) -> Utilisation:
        super().stop()
        return self.result

    def sample(self) -> None:
        """Read NVML once; an error is noted, never raised (the work must not die of it)."""
        nvml, handle = self._nvml, self._handle
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            used = nvml.nvmlDeviceGetMemoryInfo(handle).used
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1e3           # milliwatts -> W
            clock = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        except Exception as error:  # noqa: BLE001
            self.result.note = self.result.note or f"{type(error).__name__}: {error}"
            return
        self._seen += 1
        if self._seen <= self.skip:
            return
        r = self.result
        r.gpu_percent.append(float(rates.gpu))
        r.memory_percent.append(float(rates.memory))
        r.used_bytes.append(int(used))
        r.power_watts.append(float(power))
        r.sm_clock_mhz.append(float(clock))


@dataclass(frozen=True)
class CpuBusy:
    """The CPU analogue of GPU utilisation: process CPU seconds over wall seconds."""

    cpu_seconds: float
    wall_seconds: float

    @property
    def cores_busy(self) -> float:
        """Average number of cores this process kept busy (1.0 = one core all the time)."""
        return self.cpu_seconds / self.wall_seconds

    def __str__(self) -> str:
        return (f"{self.cores_busy:.2f} cores busy on average (process CPU time "
                f"{self.cpu_seconds:.3f} s over {self.wall_seconds:.3f} s of wall time)")


def cpu_busy(fn) -> tuple[CpuBusy, object]:
    """Run ``fn()`` and return (``CpuBusy`` over it, its result). ``time.process_time`` counts the
    CPU time of all of this process's threads."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = fn()
    return CpuBusy(time.process_time() - cpu0, time.perf_counter() - wall0), result
