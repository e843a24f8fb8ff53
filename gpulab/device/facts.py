"""What torch and the NVIDIA driver report about this machine: the facts the doctor judges.

``collect_facts()`` asks torch (the GPUs it can use, after CUDA_VISIBLE_DEVICES) and the driver
through NVML (every physical GPU, its memory and compute processes) and returns a DeviceFacts.
A missing or broken driver is recorded in it, never raised.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from gpulab.device.health import GPUHealth, read_health

@dataclass
class TorchGPU:
    """A GPU as torch sees it; ``index`` is its ``cuda:<index>``, after CUDA_VISIBLE_DEVICES."""
    index: int
    name: str
    capability: tuple[int, int]  # (major, minor), e.g. (9, 0) for H100/H200
    total_bytes: int
    free_bytes: int  # free for anyone: NVML's total - used, else torch.cuda.mem_get_info
    bf16: bool  # native bf16 tensor cores: compute capability 8.0 (Ampere) or newer
    uuid: str | None = None  # lower case, no "GPU-" prefix: matches the same board in NVML


@dataclass
class GPUProcess:
    pid: int
    name: str | None  # from /proc/<pid>/comm; None when unreadable (another user or container)
    used_bytes: int | None  # None when the driver does not say


@dataclass
class NvmlGPU:
    """A physical GPU as the driver sees it, whatever CUDA_VISIBLE_DEVICES hides. Numbered in PCI
    bus order like nvidia-smi, which can differ from torch's numbering."""
    index: int
    name: str
    total_bytes: int
    used_bytes: int
    processes: list[GPUProcess] | None = None  # compute processes; None: the driver won't say
    uuid: str | None = None
    health: GPUHealth | None = None  # clocks, power cap, clock events, ECC (chapter 08)


# What happened when we asked the driver through NVML.
NVML_OK = "ok"
NVML_NOT_INSTALLED = "pynvml not installed"  # could not ask; says nothing about the machine
NVML_NO_LIBRARY = "NVML library not found"  # no NVIDIA driver installed
NVML_INIT_FAILED = "NVML found but init failed"  # driver installed but not working


@dataclass
class DeviceFacts:
    torch_version: str
    torch_cuda: str | None  # CUDA runtime torch was built for; None on CPU-only builds
    cuda_available: bool  # torch.cuda.is_available()
    cuda_visible_devices: str | None  # the raw environment value; None when unset
    torch_gpus: list[TorchGPU] = field(default_factory=list)
    torch_cuda_error: str | None = None  # why torch could not start CUDA, when it could not
    nvml_status: str = NVML_NOT_INSTALLED
    nvml_error: str | None = None
    driver_version: str | None = None  # e.g. "550.54.15"
    driver_cuda: str | None = None  # newest CUDA the driver supports, e.g. "12.4"
    nvml_gpus: list[NvmlGPU] = field(default_factory=list)
    pid: int | None = None  # who collected these facts: not one of the "other processes"
    torch_arch_list: list[str] = field(default_factory=list)  # torch.cuda.get_arch_list()
    shm_bytes: int | None = None  # size of /dev/shm (DataLoader workers share batches there)

    @property
    def cuda_build(self) -> bool:
        return self.torch_cuda is not None


def collect_facts() -> DeviceFacts:
    """Ask torch and the driver what they see. A missing or broken driver is recorded, not raised.
    On a GPU this starts CUDA in this process, after which CUDA_VISIBLE_DEVICES can no longer be
    changed here. Free memory comes from the driver (NVML) where it can, so that the report does
    not create a CUDA context (a few hundred MiB) on every GPU of a shared server."""
    facts = DeviceFacts(
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        pid=os.getpid(),
        torch_arch_list=list(torch.cuda.get_arch_list()) if torch.version.cuda else [],
        shm_bytes=_shm_bytes(),
    )
    _collect_nvml(facts)
    _collect_torch_gpus(facts)
    return facts


def _collect_torch_gpus(facts: DeviceFacts) -> None:
    if not facts.cuda_build:
        return
    try:
        if not facts.cuda_available:
            torch.cuda.init()  # is_available() hides the reason; init() raises with it
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            uuid = None if uuid is None else _normalise_uuid(str(uuid))
            board = next((g for g in facts.nvml_gpus if uuid and g.uuid == uuid), None)
            if board:  # the driver's figures: no CUDA context (hundreds of MiB) on every GPU
                free, total = board.total_bytes - board.used_bytes, board.total_bytes
            else:
                free, total = torch.cuda.mem_get_info(i)
            facts.torch_gpus.append(TorchGPU(
                index=i, name=props.name, capability=(props.major, props.minor),
                total_bytes=total, free_bytes=free, bf16=props.major >= 8, uuid=uuid,
            ))
    except Exception as e:  # e.g. a GPU in exclusive mode that another process holds
        facts.torch_cuda_error = " ".join(str(e).split())


def _collect_nvml(facts: DeviceFacts) -> None:
    try:
        import pynvml
    except ImportError:
        facts.nvml_status = NVML_NOT_INSTALLED
        return
    try:
        pynvml.nvmlInit()
    except Exception as e:
        no_library = getattr(e, "value", None) == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12)
        facts.nvml_status = NVML_NO_LIBRARY if no_library else NVML_INIT_FAILED
        facts.nvml_error = str(e)
        return
    facts.nvml_status = NVML_OK
    try:
        facts.driver_version = _text(_ask(pynvml.nvmlSystemGetDriverVersion))
        facts.driver_cuda = _cuda_version_text(_ask(pynvml.nvmlSystemGetCudaDriverVersion))
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = _text(_ask(pynvml.nvmlDeviceGetUUID, handle))
            facts.nvml_gpus.append(NvmlGPU(
                index=i, name=_text(pynvml.nvmlDeviceGetName(handle)),
                total_bytes=memory.total, used_bytes=memory.used,
                processes=_processes(pynvml, handle),
                uuid=uuid and _normalise_uuid(uuid), health=read_health(pynvml, handle),
            ))
    except Exception as e:  # keep what was gathered before the failing query
        facts.nvml_error = f"NVML query failed: {e}"
    finally:
        _ask(pynvml.nvmlShutdown)


def _processes(pynvml, handle) -> list[GPUProcess] | None:
    running = _ask(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if running is None:
        return None
    return [GPUProcess(p.pid, _process_name(p.pid), getattr(p, "usedGpuMemory", None))
            for p in running]


def _process_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _ask(query, *args):
    """One optional NVML query: None when this driver or GPU does not support it."""
    try:
        return query(*args)
    except Exception:
        return None


def _shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:  # no /dev/shm (macOS, Windows)
        return None
    return stat.f_blocks * stat.f_frsize


def _text(value):
    return value.decode() if isinstance(value, bytes) else value  # older pynvml returns bytes


def _normalise_uuid(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def _cuda_version_text(version: int | None) -> str | None:
    """NVML's integer CUDA version as text: 12040 -> "12.4"."""
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"
