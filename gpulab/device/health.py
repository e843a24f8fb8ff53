"""What the driver says about a GPU's health, read through NVML: the clock-event (throttle) bits,
power, temperatures, ECC and row remapping, and whether a torch build has kernels for the GPU.

The doctor (``gpulab.device.preflight``) judges these before a run; chapter 08 teaches them
(``gpulab.monitoring``). Every NVML query is optional (``ask``): an old driver or a consumer
GPU without ECC gives None, never an exception. pynvml's constants need no driver, so the tables
here import on any machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pynvml  # nvidia-ml-py: its constants name the clock-event bits

# ----------------------------------------------------------------------------- clock events

#: NVML's clock-event reasons: (bit, pynvml constant, what it means, is it a slowdown the job
#: suffers from). The bits are ``nvmlClocksEventReason*`` in nvml.h, as pynvml defines them; the
#: meanings paraphrase nvml.h's comments and the nvidia-smi documentation, "Clocks Event
#: Reasons" (docs.nvidia.com/deploy/nvidia-smi; docs.nvidia.com/deploy/nvml-api,
#: ``nvmlDeviceGetCurrentClocksEventReasons``). NVML renamed "throttle reasons" to "clock event
#: reasons" in driver 535; the bits did not change.
CLOCK_EVENTS = [
    (pynvml.nvmlClocksEventReasonGpuIdle, "GpuIdle",
     "nothing is running, so the clocks are low", False),
    (pynvml.nvmlClocksEventReasonApplicationsClocksSetting, "ApplicationsClocksSetting",
     "clocks held at the application clocks someone set (nvidia-smi -ac)", False),
    (pynvml.nvmlClocksEventReasonSwPowerCap, "SwPowerCap",
     "the power draw reached the power limit: the driver lowers clocks to stay under it", True),
    (pynvml.nvmlClocksEventReasonHwSlowdown, "HwSlowdown",
     "hardware slowdown, core clocks cut by a factor of 2 or more: active whenever "
     "HwThermalSlowdown or HwPowerBrakeSlowdown is, and alone when the power draw trips the "
     "hardware's fast protection", True),
    (pynvml.nvmlClocksEventReasonSyncBoost, "SyncBoost",
     "held to the clocks of the other GPUs in its sync-boost group", False),
    (pynvml.nvmlClocksEventReasonSwThermalSlowdown, "SwThermalSlowdown",
     "the GPU or its memory is above its maximum operating temperature: the driver lowers "
     "clocks", True),
    (pynvml.nvmlClocksEventReasonHwThermalSlowdown, "HwThermalSlowdown",
     "temperature past the hardware limit: core clocks cut by a factor of 2 or more", True),
    (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, "HwPowerBrakeSlowdown",
     "an external power brake (the chassis or power supply asked for less): core clocks cut "
     "by a factor of 2 or more", True),
    (pynvml.nvmlClocksEventReasonDisplayClockSetting, "DisplayClockSetting",
     "held to the display clock setting", False),
]

#: The hardware slowdowns that always come with HwSlowdown (0x8): the nvidia-smi documentation
#: says HW Slowdown "is active if either HW Thermal Slowdown or HW Power Brake are active".
HW_SLOWDOWN_CAUSES = (pynvml.nvmlClocksEventReasonHwThermalSlowdown
                      | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)


def reported_clock_events(reasons: int) -> int:
    """The mask a GPU reports while ``reasons`` (OR-ed bits) are active: HwSlowdown (0x8) is set
    too whenever HwThermalSlowdown (0x40) or HwPowerBrakeSlowdown (0x80) is. So the power cap
    and the hardware thermal slowdown read 0x4 | 0x40 | 0x8 = 0x4C, not 0x44."""
    if reasons & HW_SLOWDOWN_CAUSES:
        return reasons | pynvml.nvmlClocksEventReasonHwSlowdown
    return reasons


def decode_clock_events(mask: int) -> list[str]:
    """The names of the reasons set in an ``nvmlDeviceGetCurrentClocksEventReasons`` bitmask,
    in bit order; bits NVML's table does not know are named ``unknown(0x...)``. ``0`` means no
    reason: the clocks run as high as the GPU allows."""
    names = [name for bit, name, _, _ in CLOCK_EVENTS if mask & bit]
    unknown = mask & ~sum(bit for bit, *_ in CLOCK_EVENTS)
    return names + ([f"unknown({unknown:#x})"] if unknown else [])


def slowdowns(mask: int) -> list[str]:
    """Only the reasons that slow a running job: power and thermal limits, hardware brakes."""
    return [name for bit, name, _, slows in CLOCK_EVENTS if slows and mask & bit]


def explain_clock_events(mask: int) -> str:
    """One line per reason set, in plain words."""
    if not mask:
        return "0x0: no reason, the clocks run as high as the GPU allows"
    return "\n".join(f"{bit:#06x} {name}: {says}" for bit, name, says, _ in CLOCK_EVENTS
                     if mask & bit) or f"{mask:#x}: bits unknown to this table"


# ----------------------------------------------------------------------------- NVML reads

class NoGPU(Exception):
    """NVML could not be opened, or has no such GPU; the message says why."""


def open_gpu(nvml=None, index: int | None = None):
    """Initialise NVML and find one GPU: NVML's ``index``, or by default the GPU behind torch's
    cuda:0 (wherever CUDA_VISIBLE_DEVICES puts it). Returns (nvml, index, handle), NVML left
    initialised for the caller to shut down; raises NoGPU with the reason (no library, no driver,
    no such GPU), NVML shut down again. ``nvml``: the ``pynvml`` module or a stand-in (tests)."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 (no library, no driver: NVMLError_*)
        raise NoGPU(f"NVML: {type(error).__name__}: {error}") from error
    try:
        if index is None:
            from gpulab.device.choosing import physical_gpu
            index = physical_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"), 0, nvml)
        if nvml.nvmlDeviceGetCount() <= index:
            raise IndexError(f"NVML sees no GPU {index}")
        return nvml, index, nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as error:  # noqa: BLE001
        nvml.nvmlShutdown()
        raise NoGPU(f"{type(error).__name__}: {error}") from error


def ask(query, *args):
    """One optional NVML (or psutil) query: None where this GPU or driver does not support it."""
    try:
        return query(*args)
    except Exception:  # noqa: BLE001 (NVMLError_NotSupported, an old driver's missing symbol...)
        return None


def clock_events(nvml, handle) -> int | None:
    """The clock-event bitmask; drivers older than 535 only have the old name of the call."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        if hasattr(nvml, name) and (mask := ask(getattr(nvml, name), handle)) is not None:
            return int(mask)
    return None



@dataclass
class GPUHealth:
    """What the driver says about one GPU before a run; None where it does not say."""

    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None          # enforced now
    default_power_limit_watts: float | None = None  # as shipped
    temperature_c: float | None = None
    slowdown_temperature_c: float | None = None
    clock_events: int | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected_volatile: int | None = None     # since the last driver load / reset
    ecc_corrected_volatile: int | None = None
    retired_pages_pending: bool | None = None       # pre-Ampere: page retirement
    row_remap_pending: bool | None = None           # Ampere and newer: row remapping
    row_remap_failed: bool | None = None
    persistence_mode: bool | None = None
    mig_enabled: bool | None = None


def read_health(nvml, handle) -> GPUHealth:
    """Read a GPUHealth; every query optional (``ask``), so an old driver or a consumer GPU
    without ECC gives Nones, never an exception. Sources: NVML API reference, "Device Queries"
    (clocks, power, temperature thresholds, ECC counters, ``nvmlDeviceGetRemappedRows``)."""
    h = GPUHealth()
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    h.sm_clock_mhz = ask(getattr(nvml, "nvmlDeviceGetClockInfo", None), handle, sm)
    h.max_sm_clock_mhz = ask(getattr(nvml, "nvmlDeviceGetMaxClockInfo", None), handle, sm)
    for attr, query in (("power_watts", "nvmlDeviceGetPowerUsage"),
                        ("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit"),
                        ("default_power_limit_watts", "nvmlDeviceGetPowerManagementDefaultLimit")):
        milliwatts = ask(getattr(nvml, query, None), handle)
        setattr(h, attr, None if milliwatts is None else milliwatts / 1e3)
    h.temperature_c = ask(getattr(nvml, "nvmlDeviceGetTemperature", None), handle,
                           getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    h.slowdown_temperature_c = ask(getattr(nvml, "nvmlDeviceGetTemperatureThreshold", None),
                                    handle, getattr(nvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1))
    h.clock_events = clock_events(nvml, handle)
    ecc = ask(getattr(nvml, "nvmlDeviceGetEccMode", None), handle)        # [current, pending]
    h.ecc_enabled = None if ecc is None else bool(ecc[0])
    if h.ecc_enabled:
        errors = getattr(nvml, "nvmlDeviceGetTotalEccErrors", None)
        volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
        h.ecc_uncorrected_volatile = ask(errors, handle,
                                          getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                                          volatile)
        h.ecc_corrected_volatile = ask(errors, handle,
                                        getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
                                        volatile)
    pending = ask(getattr(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", None), handle)
    h.retired_pages_pending = None if pending is None else bool(pending)
    remapped = ask(getattr(nvml, "nvmlDeviceGetRemappedRows", None), handle)
    if remapped is not None:       # (corrected rows, uncorrected rows, pending, failure)
        h.row_remap_pending, h.row_remap_failed = bool(remapped[2]), bool(remapped[3])
    persistence = ask(getattr(nvml, "nvmlDeviceGetPersistenceMode", None), handle)
    h.persistence_mode = None if persistence is None else bool(persistence)
    mig = ask(getattr(nvml, "nvmlDeviceGetMigMode", None), handle)       # [current, pending]
    h.mig_enabled = None if mig is None else bool(mig[0])
    return h



# ----------------------------------------------------------------------------- driver and CUDA

#: The oldest driver branch that runs every CUDA toolkit of a major release, through CUDA's
#: minor-version compatibility (NVIDIA, "CUDA Compatibility", Minor Version Compatibility,
#: Table 1: CUDA 11.x >= 450, 12.x >= 525, 13.x >= 580).
MINOR_COMPATIBLE_DRIVER = {11: 450, 12: 525, 13: 580}


def _version(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in text.split("."))
    except (AttributeError, ValueError):
        return None


def driver_compatibility(driver_version: str | None, driver_cuda: str | None,
                         torch_cuda: str | None) -> tuple[str, str]:
    """Can this driver run a torch built for CUDA ``torch_cuda``? (level, why), level "ok",
    "warn", "error" or "n/a" (a version unknown). Since CUDA 11 a build runs on any driver of
    the same major release's branch or newer (minor-version compatibility: a CUDA 12.8 build of
    torch runs on driver 535, whose CUDA is 12.2), "with limited feature-set": a feature the
    newer toolkit added needs the newer driver, and PTX the newer toolkit made cannot be
    compiled by the older driver. Older than that branch, or another major release: no."""
    driver, built, version = _version(driver_cuda), _version(torch_cuda), _version(driver_version)
    if driver is None or built is None:
        return "n/a", "no driver or no CUDA build"
    says = f"driver {driver_version or '?'} supports CUDA {driver_cuda}, torch was built for {torch_cuda}"
    if driver >= built:
        return "ok", says
    minimum = MINOR_COMPATIBLE_DRIVER.get(built[0])
    if driver[0] == built[0] and version and minimum and version[0] >= minimum:
        return "warn", (f"{says}: it runs by CUDA's minor-version compatibility (driver >= "
                        f"{minimum} for CUDA {built[0]}.x), with a limited feature set")
    return "error", (f"{says}: too old (CUDA {built[0]}.x needs driver >= {minimum or '?'}); "
                     "update the driver or install the torch build for its CUDA")


# ----------------------------------------------------------------------------- kernels for this GPU


def kernel_image_available(arch_list: list[str], capability: tuple[int, int]) -> tuple[bool, str]:
    """Can a torch build whose ``torch.cuda.get_arch_list()`` is ``arch_list`` run kernels on a
    GPU of compute ``capability``? Rules of the CUDA C++ Programming Guide ("Binary
    Compatibility", "PTX Compatibility"): machine code built for sm_XY runs on capability X.Z for
    Z ≥ Y (same major version only; the ``a`` variants such as sm_90a only on X.Y itself); PTX
    built for compute_XY is compiled by the driver for any capability ≥ X.Y. Returns (yes or no,
    why)."""
    major, minor = capability
    want = f"sm_{major}{minor}"
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        exact_only = digits.endswith(("a", "f"))
        digits = digits.rstrip("af")
        if not digits.isdigit():
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and (a_minor == minor or
                                                  (a_minor < minor and not exact_only)):
            return True, f"{arch} machine code runs on {want}"
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True, f"{arch} PTX is compiled by the driver for {want} (slow first start)"
    if not arch_list:
        return False, "this torch has no CUDA kernels at all (a CPU-only build)"
    return False, (f"no kernels for {want}: this torch was built for {' '.join(arch_list)}; "
                   "install a torch build that lists your GPU's architecture")
