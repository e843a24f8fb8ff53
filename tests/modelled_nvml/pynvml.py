"""A modelled NVIDIA driver as nvidia-ml-py's ``pynvml`` shows it, for machines without a GPU.

The tests of CUDA_VISIBLE_DEVICES in every form (tests/test_device.py) and the workshop's hub
(tests/test_workshop.py, which puts this folder first on the hub's PYTHONPATH so that the hub
finds made-up GPUs and their device minor numbers) use it. The machine it models comes from
the environment variable MODELLED_NVML (JSON) when imported as ``pynvml``, or from
``modelled(gpus)``:

    [{"uuid": "GPU-...", "name": "NVIDIA H200", "minor": 0, "total": <bytes>,
      "migs": [{"uuid": "MIG-...", "gi": 1, "ci": 0, "total": <bytes>}, ...],
      "processes": [{"pid": 123, "used": <bytes>}, ...]}, ...]      (a MIG instance's too)

Only the functions gpulab and the workshop call are modelled, with pynvml's signatures and
return shapes (handles are opaque objects; MIG mode is (current, pending)).
"""
from __future__ import annotations

import json
import os
import types

NVML_DEVICE_MIG_ENABLE = 1
NVML_DEVICE_MIG_DISABLE = 0
# nvml.h's clock-event bits (gpulab.device.health reads them when imported)
CLOCK_EVENT_BITS = {"GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4,
                    "HwSlowdown": 0x8, "SyncBoost": 0x10, "SwThermalSlowdown": 0x20,
                    "HwThermalSlowdown": 0x40, "HwPowerBrakeSlowdown": 0x80,
                    "DisplayClockSetting": 0x100}


class NVMLError(Exception):
    def __init__(self, value: int = 999, text: str = "Unknown Error"):
        super().__init__(text)
        self.value = value


class _Handle:
    def __init__(self, spec: dict, parent: "_Handle | None" = None):
        self.spec, self.parent = spec, parent


def modelled(gpus: list[dict]) -> types.SimpleNamespace:
    """A pynvml stand-in for the machine ``gpus`` describes (module docstring)."""
    handles = [_Handle(g) for g in gpus]
    migs = {id(h): [_Handle(m, h) for m in h.spec.get("migs", [])] for h in handles}
    everything = handles + [m for ms in migs.values() for m in ms]

    def memory(handle):
        total = handle.spec.get("total", 80 * 2**30)
        return types.SimpleNamespace(total=total, used=0, free=total)

    def by_uuid(uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for h in everything:
            if h.spec["uuid"] == uuid:
                return h
        raise NVMLError(13, "Not Found")

    def mig_handle(handle, slot):
        try:
            return migs[id(handle)][slot]
        except (KeyError, IndexError):
            raise NVMLError(6, "Not Found") from None

    def not_mig(handle):
        if handle.parent is None:
            raise NVMLError(3, "Not Supported")
        return handle

    return types.SimpleNamespace(
        **{f"nvmlClocksEventReason{name}": bit for name, bit in CLOCK_EVENT_BITS.items()},
        NVMLError=NVMLError, NVML_DEVICE_MIG_ENABLE=NVML_DEVICE_MIG_ENABLE,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "570.00.00",
        nvmlSystemGetCudaDriverVersion=lambda: 12080,
        nvmlDeviceGetCount=lambda: len(handles),
        nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetUUID=lambda h: h.spec["uuid"],
        nvmlDeviceGetName=lambda h: h.spec.get("name", "NVIDIA H200"),
        nvmlDeviceGetMinorNumber=lambda h: h.spec["minor"],
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"])
            for p in h.spec.get("processes", [])],
        nvmlDeviceGetMigMode=lambda h: ([NVML_DEVICE_MIG_ENABLE] * 2 if h.spec.get("migs")
                                        else [NVML_DEVICE_MIG_DISABLE] * 2),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7 if h.spec.get("migs") else 0,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetDeviceHandleFromMigDeviceHandle=lambda h: not_mig(h).parent,
        nvmlDeviceGetGpuInstanceId=lambda h: not_mig(h).spec["gi"],
        nvmlDeviceGetComputeInstanceId=lambda h: not_mig(h).spec["ci"],
    )


if __name__ == "pynvml":     # imported as the driver: become the machine MODELLED_NVML describes
    globals().update(vars(modelled(json.loads(os.environ.get("MODELLED_NVML", "[]")))))
