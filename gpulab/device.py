"""Which device the lab runs on, and the preflight report that says whether it can.

Notebooks call ``best_device()``. ``doctor()`` (or ``python -m gpulab doctor``) answers "can this
machine run the lab, and if not, what do I do next?" in three steps kept apart:

    collect_facts()                 -> DeviceFacts    what torch and the NVIDIA driver report
    diagnose(facts)                 -> list[Finding]  pure rules: tests feed it made-up machines
    render_report(facts, findings)  -> str            the text a learner reads

The driver is asked through NVML (the library nvidia-smi itself uses, via the ``pynvml`` module of
nvidia-ml-py), never by parsing nvidia-smi's output, whose layout changes between versions.
Sizes are reported in GiB (2^30 bytes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import torch

GiB = 2**30
LEARNER_BUDGET_BYTES = 4 * GiB  # solution notebooks keep peak GPU memory under this
MIN_FREE_FRACTION = 0.10  # a GPU with less than this share free is taken, whatever its size


def best_device() -> torch.device:
    """The device notebooks use: the first visible GPU if torch can use one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def physical_gpu(cuda_visible_devices: str | None, torch_index: int) -> int:
    """The CUDA device index behind torch's ``cuda:<torch_index>``: torch renumbers the GPUs that
    CUDA_VISIBLE_DEVICES lists from 0, in the listed order, so with "2,3" cuda:1 is GPU 3.
    (CUDA's index matches nvidia-smi's when CUDA_DEVICE_ORDER=PCI_BUS_ID.)"""
    if cuda_visible_devices is None:
        return torch_index  # unset: every GPU visible, nothing renumbered
    listed = []
    for entry in cuda_visible_devices.split(","):
        if not entry.strip().isdigit():
            break  # CUDA ignores everything from the first invalid entry on ("", "-1", UUIDs here)
        listed.append(int(entry))
    if not 0 <= torch_index < len(listed):
        raise IndexError(f"cuda:{torch_index} does not exist with CUDA_VISIBLE_DEVICES="
                         f"{cuda_visible_devices!r} ({len(listed)} GPU(s) visible)")
    return listed[torch_index]


def count_gpus_in_this_process(cuda_visible_devices: str | None, set_after_init: bool) -> int:
    """What ``torch.cuda.device_count()`` says after CUDA_VISIBLE_DEVICES is set to
    ``cuda_visible_devices`` (None: removed) in this process; with ``set_after_init``, only after
    CUDA has been initialised. ``visible_gpu_count`` runs it in a fresh process.

    Before CUDA is initialised, torch (2.13) answers ``device_count()`` from NVML and re-reads the
    variable on every call, so a late change would still show. What is fixed once is CUDA's own
    view: the driver reads the variable when CUDA initialises (``torch.cuda.init()``, or the first
    tensor on a GPU). To show that, initialise CUDA first, then set the variable."""
    if set_after_init and torch.cuda.is_available():
        torch.cuda.init()              # CUDA starts here and reads CUDA_VISIBLE_DEVICES...
    if cuda_visible_devices is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices  # ...so, late, this is ignored
    return torch.cuda.device_count()


_COUNT_GPUS = """
import sys
from gpulab.device import count_gpus_in_this_process
value = None if sys.argv[1] == "unset" else sys.argv[1]
print(count_gpus_in_this_process(value, set_after_init=sys.argv[2] == "late"))
"""


def visible_gpu_counts(settings: dict) -> dict:
    """``torch.cuda.device_count()`` in fresh Python processes, one per entry of ``settings``:
    ``{label: (cuda_visible_devices, set_after_init)}`` -> ``{label: count}``. Each process runs
    with CUDA_VISIBLE_DEVICES set to ``cuda_visible_devices`` (None: unset) either from the start
    or, with ``set_after_init``, only after it has initialised CUDA. Fresh processes because CUDA
    reads the variable once per process; started together because each spends seconds importing
    torch."""
    probes = {}
    for label, (cuda_visible_devices, set_after_init) in settings.items():
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if not set_after_init and cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        elif set_after_init:  # CUDA starts under our own setting; the child changes it afterwards
            env.update({k: v for k, v in os.environ.items() if k == "CUDA_VISIBLE_DEVICES"})
        value = "unset" if cuda_visible_devices is None else cuda_visible_devices
        probes[label] = subprocess.Popen(
            [sys.executable, "-c", _COUNT_GPUS, value, "late" if set_after_init else "early"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    counts = {}
    for label, probe in probes.items():
        out, err = probe.communicate(timeout=120)
        if probe.returncode != 0:
            raise RuntimeError(f"the CUDA_VISIBLE_DEVICES probe {label!r} failed:\n{err}")
        counts[label] = int(out.strip().splitlines()[-1])
    return counts


def visible_gpu_count(cuda_visible_devices: str | None, set_after_init: bool = False) -> int:
    """One probe of ``visible_gpu_counts``."""
    return visible_gpu_counts({0: (cuda_visible_devices, set_after_init)})[0]


# ----------------------------------------------------------------------------- facts

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
                uuid=uuid and _normalise_uuid(uuid),
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


def _text(value):
    return value.decode() if isinstance(value, bytes) else value  # older pynvml returns bytes


def _normalise_uuid(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def _cuda_version_text(version: int | None) -> str | None:
    """NVML's integer CUDA version as text: 12040 -> "12.4"."""
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"


# ----------------------------------------------------------------------------- judgement

@dataclass
class Finding:
    level: str  # "ok", "warn" or "error"; error: the lab cannot use this machine as intended
    message: str
    next_step: str = ""


# CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises; later changes are ignored.
_BEFORE_CUDA_STARTS = ("before CUDA initialises: in the shell before starting Jupyter, or in the "
                       "first cell of a freshly restarted kernel, before any CUDA call")


def diagnose(facts: DeviceFacts) -> list[Finding]:
    """Judge the facts. Pure: it only reads ``facts``, so tests can describe any machine."""
    if not facts.cuda_build:
        return [_cpu_only_build(facts) if facts.nvml_gpus else _no_gpu(facts)]
    if facts.torch_gpus:
        nearly_full = [f for gpu in facts.torch_gpus if (f := _nearly_full(gpu, facts))]
        return nearly_full or [_ready(facts)]
    if facts.cuda_available:  # CUDA started, then a GPU query failed
        return [_torch_cannot_use(facts)]
    if facts.nvml_status == NVML_INIT_FAILED:
        return [Finding(
            "error",
            f"NVIDIA driver installed but not working ({facts.nvml_error}): torch cannot use a GPU.",
            "run `nvidia-smi` to see the driver's own error; after a driver update, reboot; in a "
            "container, start it with GPU access (`docker run --gpus all ...`); or ask an admin.")]
    if not facts.nvml_gpus:
        return [_no_gpu(facts)]  # a CUDA build of torch on a machine without a GPU is fine

    findings = []
    if _hides_all_gpus(facts):
        findings.append(Finding(
            "warn",
            f"CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices!r} hides all {len(facts.nvml_gpus)} "
            "GPU(s) the driver sees, so experiments run on CPU at reduced size.",
            f"unset it or name a GPU (e.g. CUDA_VISIBLE_DEVICES=0) {_BEFORE_CUDA_STARTS}."))
    if _older(facts.driver_cuda, facts.torch_cuda):
        findings.append(Finding(
            "error",
            f"NVIDIA driver too old: driver {facts.driver_version} supports CUDA up to "
            f"{facts.driver_cuda}, but torch {facts.torch_version} needs CUDA {facts.torch_cuda}.",
            f"update the NVIDIA driver to one supporting CUDA {facts.torch_cuda}, or reinstall "
            f"torch with `make lab TORCH=...` choosing the build for your driver's CUDA version "
            f"{facts.driver_cuda} or older."))
    return findings or [_torch_cannot_use(facts)]


def is_usable(findings: list[Finding]) -> bool:
    """Usable means no errors; CPU-only is usable (experiments shrink)."""
    return all(f.level != "error" for f in findings)


def _no_gpu(facts: DeviceFacts) -> Finding:
    why = {NVML_NO_LIBRARY: "no NVIDIA driver found",
           NVML_NOT_INSTALLED: "torch sees none; without pynvml the driver was not asked",
           NVML_INIT_FAILED: f"NVIDIA driver not working: {facts.nvml_error}",
           }.get(facts.nvml_status, "the NVIDIA driver reports no GPUs")
    return Finding(
        "ok",
        f"No GPU: experiments run on CPU at reduced size ({why}).",
        "nothing to fix: notebooks shrink their experiments on CPU, so timings and throughputs "
        "are far below a GPU's. For full-size runs use a machine with an NVIDIA GPU.")


def _cpu_only_build(facts: DeviceFacts) -> Finding:
    names = ", ".join(sorted({gpu.name for gpu in facts.nvml_gpus}))
    release = facts.torch_version.split("+")[0]  # "2.13.0+cpu" -> "2.13.0"
    return Finding(
        "error",
        f"The driver sees {len(facts.nvml_gpus)} GPU(s) ({names}) but torch {facts.torch_version} "
        "is a CPU-only build, so it cannot use them.",
        f"reinstall torch with `make lab TORCH=...` choosing the build for your driver's CUDA "
        f"version {facts.driver_cuda or '(unknown)'} or older, e.g. "
        f'TORCH="torch=={release} --index-url https://download.pytorch.org/whl/cu126" '
        "for a driver supporting CUDA 12.6 or newer.")


def _torch_cannot_use(facts: DeviceFacts) -> Finding:
    return Finding(
        "error",
        f"Torch cannot use the GPU: {facts.torch_cuda_error or 'no reason given'}",
        "run `python -c 'import torch; torch.cuda.init(); torch.cuda.mem_get_info()'` for the "
        "full error; if another process holds the GPU in exclusive mode, wait or pick another.")


def _nearly_full(gpu: TorchGPU, facts: DeviceFacts) -> Finding | None:
    if gpu.free_bytes >= max(LEARNER_BUDGET_BYTES, MIN_FREE_FRACTION * gpu.total_bytes):
        return None
    board = next((g for g in facts.nvml_gpus if gpu.uuid and g.uuid == gpu.uuid), None)
    others = [p for p in (board.processes or []) if p.pid != facts.pid] if board else []
    if others:
        held = sum(p.used_bytes or 0 for p in others)
        who = ", ".join(f"pid {p.pid} {p.name or '?'} ({_gib(p.used_bytes)})" for p in others)
        holders = f"other processes hold {_gib(held)}: {who}"
    else:  # no per-process list from the driver (or no match): say how much is taken
        holders = f"{_gib(gpu.total_bytes - gpu.free_bytes)} in use by other processes or this one"
    return Finding(
        "warn",
        f"cuda:{gpu.index} ({gpu.name}) is nearly full: {_gib(gpu.free_bytes)} free of "
        f"{_gib(gpu.total_bytes)} (the lab needs {_gib(LEARNER_BUDGET_BYTES)}); {holders}.",
        "wait for them to finish, or choose a freer GPU (`nvidia-smi` lists them) with "
        f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=<its index> {_BEFORE_CUDA_STARTS}.")


def _ready(facts: DeviceFacts) -> Finding:
    gpu = facts.torch_gpus[0]
    more = f"; {len(facts.torch_gpus)} GPUs visible" if len(facts.torch_gpus) > 1 else ""
    return Finding(
        "ok",
        f"Ready: experiments run on {gpu.name} (cuda:0, sm_{gpu.capability[0]}{gpu.capability[1]}, "
        f"bf16 {'yes' if gpu.bf16 else 'no'}, {_gib(gpu.free_bytes)} free{more}).")


def _hides_all_gpus(facts: DeviceFacts) -> bool:
    """CUDA reads CUDA_VISIBLE_DEVICES up to its first invalid entry, so it hides every GPU when
    that first entry is invalid: "", "-1" or an index past the last GPU. (UUIDs taken as valid.)"""
    if facts.cuda_visible_devices is None:
        return False
    first = facts.cuda_visible_devices.split(",")[0].strip().lower()
    if first.isdigit():
        return int(first) >= len(facts.nvml_gpus)
    return not first.startswith(("gpu-", "mig-"))


def _older(version: str | None, than: str | None) -> bool:
    """True when CUDA ``version`` is known to be older than ``than``: "12.4" < "12.6" < "12.10"."""
    try:
        return tuple(map(int, version.split("."))) < tuple(map(int, than.split(".")))
    except (AttributeError, ValueError):  # a version is unknown
        return False


def _gib(n: int | None) -> str:
    return "? GiB" if n is None else f"{n / GiB:.1f} GiB"


# ----------------------------------------------------------------------------- report

def render_report(facts: DeviceFacts, findings: list[Finding]) -> str:
    build = f"CUDA build, CUDA runtime {facts.torch_cuda}" if facts.cuda_build else "CPU-only build"
    if facts.nvml_status == NVML_OK:
        driver = f"{facts.driver_version}, supports CUDA up to {facts.driver_cuda}"
    else:
        driver = facts.nvml_status + (f" ({facts.nvml_error})" if facts.nvml_error else "")
    visible = "unset" if facts.cuda_visible_devices is None else repr(facts.cuda_visible_devices)
    lines = [
        "gpulab doctor: can this machine run the lab?  Sizes in GiB (2^30 bytes).",
        "",
        f"  torch                      {facts.torch_version} ({build})",
        f"  torch.cuda.is_available()  {facts.cuda_available}",
        f"  CUDA_VISIBLE_DEVICES       {visible}",
        f"  NVIDIA driver (NVML)       {driver}",
    ]
    if facts.nvml_status == NVML_OK and facts.nvml_error:
        lines.append(f"                             {facts.nvml_error}")
    if facts.torch_cuda_error:
        lines.append(f"  torch CUDA error           {facts.torch_cuda_error}")
    for g in facts.torch_gpus:
        lines.append(f"  {f'torch cuda:{g.index}':<27}{g.name}, sm_{g.capability[0]}{g.capability[1]}, "
                     f"bf16 {'yes' if g.bf16 else 'no'}, "
                     f"{_gib(g.free_bytes)} free of {_gib(g.total_bytes)}")
    for g in facts.nvml_gpus:
        processes = "unknown" if g.processes is None else len(g.processes)
        lines.append(f"  {f'driver GPU {g.index}':<27}{g.name}, {_gib(g.used_bytes)} used of "
                     f"{_gib(g.total_bytes)}, compute processes: {processes}")
        for p in g.processes or []:
            lines.append(f"      pid {p.pid:<8} {p.name or '?':<16} {_gib(p.used_bytes)}")
    lines.append("")
    for f in findings:
        lines.append(f"  {'[' + f.level + ']':<7}  {f.message}")
        if f.next_step:
            lines.append(f"           next: {f.next_step}")
    lines.append("")
    return "\n".join(lines + _verdict(facts, findings))


def _verdict(facts: DeviceFacts, findings: list[Finding]) -> list[str]:
    worst = next((f for level in ("error", "warn") for f in findings if f.level == level), None)
    if worst is None:
        where = facts.torch_gpus[0].name if facts.torch_gpus else "CPU, experiments at reduced size"
        return [f"Verdict: READY on {where}."]
    if worst.level == "warn":
        return ["Verdict: USABLE, with the warning above.", f"Next step: {worst.next_step}"]
    return ["Verdict: BROKEN, the lab cannot use this machine as it is.",
            f"Next step: {worst.next_step}"]


def doctor(file=None) -> DeviceFacts:
    """Print the preflight report to ``file`` (default: sys.stdout at call time, so notebooks and
    pytest's capture see it). From a notebook cell: ``gpulab.device.doctor()``."""
    facts = collect_facts()
    print(render_report(facts, diagnose(facts)), file=file)
    return facts
