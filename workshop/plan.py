"""The workshop's plan: its settings, which GPU each learner gets, and each learner's walls.

Pure functions (no JupyterHub, no torch), so the hub's config, `make workshop-check` and the
tests compute the same plan. workshop/walls.py applies each learner's ``Limits``. The host sets
everything through environment variables, which `make workshop VAR=value` passes on:

    WORKSHOP_DEVICES          GPU or MIG UUIDs, comma-separated; "auto" (default): every MIG
                              instance the driver lists, else every GPU; "none": CPU only
    WORKSHOP_LEARNERS         how many learners the plan is for (default 30); at most that many
                              servers run at once (JupyterHub's active_server_limit)
    WORKSHOP_SIGNUPS          how many may sign up with the workshop code alone (default:
                              WORKSHOP_LEARNERS); later sign-ups wait until the host adds their
                              name on the Admin page; 0: every sign-up waits for the host
    WORKSHOP_GPU_MEMORY_FRACTION  each learner's cap, a fraction of their device's memory
                              (default: 0.85 / learners per device, see ``memory_fraction``)
    WORKSHOP_THREADS          CPU threads per learner (default: cores / learners, at least 1)
    WORKSHOP_KERNEL_IDLE_S    an idle kernel is shut down after this many seconds (1200)
    WORKSHOP_SERVER_IDLE_S    an idle learner server is stopped after this many seconds (3600)
    WORKSHOP_MEMORY           RAM for all of a learner's processes and scratch files together,
                              e.g. 4G (default: the machine's RAM less HUB_RESERVE, shared out)
    WORKSHOP_TASKS            processes and threads per learner (512)
    WORKSHOP_SCRATCH          size of each of a learner's own /tmp, /var/tmp and /dev/shm
                              (default: half their memory; the files count in it)
    WORKSHOP_DISK             size of each learner's home, a disk of their own (workshop/homes.py;
                              default: the free space of the homes' disk less 10%, shared out)
    WORKSHOP_WALLS            "auto" (default): the walls with the tools this machine has
                              (workshop/walls.py); "off": none, on a machine that has no way

Sizes take K, M, G, T suffixes, powers of 1024 as systemd reads them. GiB = 2^30 bytes.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

GiB = 2**30
# What one learner needs on the GPU: the course's budget per learner (gpulab.device's
# LEARNER_BUDGET_BYTES; every solution notebook keeps its peak under it), against which
# `make gpu-check` measures each chapter's footprint as the driver counts it, CUDA context
# included. A measured report in reports/ replaces it when there is one (workshop/check.py).
LEARNER_FOOTPRINT_BYTES = 4 * GiB
# Share of each device left outside the learners' caps: each process's CUDA context (a few
# hundred MiB, outside the caching allocator and so outside its cap) and the allocator's rounding.
CONTEXT_RESERVE = 0.15
# RAM kept outside the learners' limits: the hub, its proxy and services (320 MiB measured with
# 30 learners, docs/workshop.md), the system, the page cache. The larger of 2 GiB and a tenth of the RAM.
HUB_RESERVE_MIN_BYTES = 2 * GiB
HUB_RESERVE_SHARE = 0.10
DISK_RESERVE_SHARE = 0.10     # of the homes' disk, kept free for the system, the hub's state
TASKS_PER_LEARNER = 512       # a server, kernels with their threads, DataLoader workers, ranks
CPU_WEIGHT = 100              # every learner the same: systemd's default CPUWeight


@dataclass(frozen=True)
class Settings:
    devices: tuple[str, ...]     # UUIDs; () = CPU only
    learners: int
    memory_fraction: float | None
    threads: int
    kernel_idle_s: int
    server_idle_s: int
    memory_bytes: int = 4 * GiB  # per learner, everything they run and write to scratch
    tasks: int = TASKS_PER_LEARNER
    scratch_bytes: int = 2 * GiB
    walls: bool = True
    signups: int = 30            # sign-ups without the host (WORKSHOP_SIGNUPS)
    disk_bytes: int = 10 * GiB   # each learner's home


@dataclass(frozen=True)
class Limits:
    """One learner's walls, as workshop/walls.py applies them."""
    memory_bytes: int          # RAM, swap included, their tmpfs scratch included
    cpu_weight: int            # share of the CPU under contention, however many processes
    tasks: int                 # processes and threads
    scratch_bytes: int         # size of each of their /tmp, /var/tmp, /dev/shm
    device: str | None         # the one GPU or MIG UUID their processes may open; None: no GPU


def learner_limits(settings: Settings, device: str | None) -> Limits:
    return Limits(settings.memory_bytes, CPU_WEIGHT, settings.tasks, settings.scratch_bytes,
                  device)


def machine_memory_bytes(proc: Path = Path("/proc")) -> int:
    """The RAM the room may have: /proc/meminfo's MemTotal, or the memory limit of the hub's
    own cgroup when a container sets a smaller one."""
    from gpulab.gpu_share import own_cgroup_limit          # light: no torch
    found = re.search(r"^MemTotal:\s+(\d+) kB", (proc / "meminfo").read_text(), re.M)
    total = int(found.group(1)) * 1024
    return min(total, own_cgroup_limit("memory") or total)


def memory_per_learner(total_bytes: int, learners: int) -> int:
    """Each learner's memory: the RAM less the hub's reserve, shared out, in whole MiB. 30
    learners on a 24 GiB machine: 0.7 GiB each; on 512 GiB: 15.4 GiB."""
    reserve = max(HUB_RESERVE_MIN_BYTES, int(HUB_RESERVE_SHARE * total_bytes))
    return max(0, total_bytes - reserve) // learners // 2**20 * 2**20


def disk_per_learner(free_bytes: int, learners: int) -> int:
    """Each learner's home disk: the homes' free space less DISK_RESERVE_SHARE, shared out, in
    whole MiB. 30 learners with 70 GiB free: 2.1 GiB each; with 2 TiB: 61.4 GiB."""
    return int(free_bytes * (1 - DISK_RESERVE_SHARE)) // learners // 2**20 * 2**20


def parse_size(name: str, text: str) -> int:
    """"768M", "4G", "4GiB", "1073741824" as bytes (K, M, G, T: powers of 1024)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not found:
        raise ValueError(f"{name}={text!r}: give a size such as 768M or 4G")
    power = " KMGT".index(found.group(2).upper() or " ")
    return int(float(found.group(1)) * 1024**power)


def learners_per_device(learners: int, devices: int) -> int:
    """Learners sharing one device when ``learners`` are spread evenly over ``devices``."""
    return math.ceil(learners / devices) if devices else 0


def memory_fraction(learners: int, devices: int) -> float:
    """Each learner's cap as a fraction of their device: the device shared by its learners
    after CONTEXT_RESERVE, rounded down to 3 decimals. 30 learners on one H200 (139.8 GiB as
    the driver reports it, gpulab.device.hardware): 0.028 each, 3.9 GiB."""
    share = (1 - CONTEXT_RESERVE) / learners_per_device(learners, devices)
    return math.floor(share * 1000 + 1e-9) / 1000    # + 1e-9: 0.85 / 5 is 0.16999... in floats


def threads_per_learner(learners: int, cores: int) -> int:
    """CPU threads each learner's PyTorch may use: the cores shared out, at least one. More
    threads than cores make OpenMP's spinning threads slow every learner down several-fold."""
    return max(1, cores // max(1, learners))


def assign_device(devices: tuple[str, ...], taken: dict[str, str], learner: str) -> str | None:
    """The device for ``learner``: the one they hold already, else the least-loaded one (the
    first listed among equals), so learners spread evenly. ``taken``: learner -> device of the
    servers running or starting now. None on a CPU-only workshop."""
    if not devices:
        return None
    if taken.get(learner) in devices:
        return taken[learner]
    load = {d: 0 for d in devices}
    for device in taken.values():
        if device in load:
            load[device] += 1
    return min(devices, key=lambda d: (load[d], devices.index(d)))


def learners_that_fit(free_bytes: int, footprint_bytes: int = LEARNER_FOOTPRINT_BYTES) -> int:
    """How many learners fit in ``free_bytes`` at ``footprint_bytes`` each."""
    return max(0, free_bytes // footprint_bytes)


def _int(environ, name: str, default: int, least: int = 1) -> int:
    value = environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) < least:
        raise ValueError(f"{name}={value!r}: give a whole number, {least} or more")
    return int(value)


def parse_devices(text: str) -> tuple[str, ...] | None:
    """WORKSHOP_DEVICES as a tuple of UUIDs; None for "auto" (ask the driver)."""
    text = text.strip()
    if text in ("", "auto"):
        return None
    if text == "none":
        return ()
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    for d in devices:
        if not d.upper().startswith(("GPU-", "MIG-")):
            raise ValueError(f"WORKSHOP_DEVICES: {d!r} is not a GPU or MIG UUID (GPU-... or "
                             "MIG-...; `make workshop-check` lists them). Indices are not "
                             "accepted: they change with CUDA_DEVICE_ORDER.")
    return devices


def settings_from_env(environ=os.environ, cores: int | None = None,
                      ram: int | None = None, disk_free: int | None = None) -> Settings:
    """The host's settings (module docstring); "auto" devices are asked from the driver.
    ``ram`` and ``disk_free`` (the homes' disk): this machine's unless given."""
    devices = parse_devices(environ.get("WORKSHOP_DEVICES", "auto"))
    if devices is None:
        devices = tuple(d.uuid for d in nvml_devices())
    learners = _int(environ, "WORKSHOP_LEARNERS", 30)
    fraction = None
    if devices:
        text = environ.get("WORKSHOP_GPU_MEMORY_FRACTION", "").strip()
        fraction = float(text) if text else memory_fraction(learners, len(devices))
        if not 0 < fraction <= 1:
            raise ValueError(f"WORKSHOP_GPU_MEMORY_FRACTION={text!r}: give a number in (0, 1]")
    cores = cores or os.cpu_count() or 1
    text = environ.get("WORKSHOP_MEMORY", "").strip()
    memory = (parse_size("WORKSHOP_MEMORY", text) if text else
              memory_per_learner(machine_memory_bytes() if ram is None else ram, learners))
    if memory < 256 * 2**20:
        raise ValueError(f"{memory // 2**20} MiB per learner is too little for a Jupyter server "
                         "and a kernel: plan fewer learners (WORKSHOP_LEARNERS) or give "
                         "WORKSHOP_MEMORY")
    text = environ.get("WORKSHOP_DISK", "").strip()
    if text:
        disk = parse_size("WORKSHOP_DISK", text)
    else:
        if disk_free is None:
            import shutil
            homes = Path(environ.get("WORKSHOP_HOMES", "/home"))
            disk_free = shutil.disk_usage(homes if homes.exists() else homes.parent).free
        disk = disk_per_learner(disk_free, learners)
    if disk < 64 * 2**20:
        raise ValueError(f"{disk // 2**20} MiB of disk per learner is too little for their copy "
                         "of the course and their files: free the homes' disk, plan fewer "
                         "learners (WORKSHOP_LEARNERS) or give WORKSHOP_DISK")
    text = environ.get("WORKSHOP_SCRATCH", "").strip()
    walls = environ.get("WORKSHOP_WALLS", "auto").strip()
    if walls not in ("auto", "off"):
        raise ValueError(f"WORKSHOP_WALLS={walls!r}: give auto or off")
    return Settings(
        devices=devices, learners=learners, memory_fraction=fraction,
        threads=_int(environ, "WORKSHOP_THREADS", threads_per_learner(learners, cores)),
        kernel_idle_s=_int(environ, "WORKSHOP_KERNEL_IDLE_S", 1200),
        server_idle_s=_int(environ, "WORKSHOP_SERVER_IDLE_S", 3600),
        memory_bytes=memory, tasks=_int(environ, "WORKSHOP_TASKS", TASKS_PER_LEARNER),
        scratch_bytes=parse_size("WORKSHOP_SCRATCH", text) if text else memory // 2,
        walls=walls == "auto", signups=_int(environ, "WORKSHOP_SIGNUPS", learners, least=0),
        disk_bytes=disk)


def learner_env(settings: Settings, device: str | None) -> dict[str, str]:
    """The environment a learner's server (and every kernel it starts) gets."""
    threads = str(settings.threads)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           "OPENBLAS_NUM_THREADS": threads,
           "GPULAB_WORKSHOP_SCRATCH_BYTES": str(settings.scratch_bytes)}
    if device is None:
        env["CUDA_VISIBLE_DEVICES"] = ""          # a CPU-only workshop hides any GPU
    else:
        env["CUDA_VISIBLE_DEVICES"] = device
        env["GPULAB_GPU_MEMORY_FRACTION"] = f"{settings.memory_fraction:g}"
    return env


# --------------------------------------------------------------------------------------------
# What the driver reports (nvidia-ml-py, never nvidia-smi's text)


@dataclass(frozen=True)
class Device:
    uuid: str          # what CUDA_VISIBLE_DEVICES takes: GPU-... or MIG-...
    name: str          # e.g. "NVIDIA H200" or "NVIDIA H200 MIG 1g.18gb"
    total_bytes: int
    free_bytes: int
    parent: str | None = None   # a MIG instance's GPU


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_devices() -> list[Device]:
    """Every MIG instance of GPUs in MIG mode, and every other GPU, as NVML lists them; [] when
    there is no driver or no pynvml."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # no pynvml, no driver: a CPU machine
        return []
    devices = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            gpu = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpu_uuid = _text(pynvml.nvmlDeviceGetUUID(gpu))
            try:
                mig_on = pynvml.nvmlDeviceGetMigMode(gpu)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:  # a GPU without MIG support
                mig_on = False
            handles = []
            if mig_on:
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
                    try:
                        handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, j))
                    except pynvml.NVMLError:  # an empty slot
                        continue
            for handle in handles or [gpu]:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                devices.append(Device(_text(pynvml.nvmlDeviceGetUUID(handle)),
                                      _text(pynvml.nvmlDeviceGetName(handle)), memory.total,
                                      memory.free, gpu_uuid if handles else None))
    finally:
        pynvml.nvmlShutdown()
    return devices
