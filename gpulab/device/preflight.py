"""The preflight report: can this machine run the lab, and if not, what to do next.

``diagnose(facts)`` judges a DeviceFacts (pure rules, so tests describe made-up machines),
``render_report(facts, findings)`` writes the text a learner reads, and ``doctor()`` does both for
this machine (``python -m gpulab doctor``).
"""

from __future__ import annotations

import textwrap

from dataclasses import dataclass

from gpulab.device.choosing import GiB, LEARNER_BUDGET_BYTES, MIN_FREE_FRACTION
from gpulab.device.facts import (NVML_INIT_FAILED, NVML_NO_LIBRARY, NVML_NOT_INSTALLED, NVML_OK,
                                 DeviceFacts, NvmlGPU, TorchGPU, collect_facts)
from gpulab.device.health import driver_compatibility, kernel_image_available, slowdowns

# ----------------------------------------------------------------------------- judgement

@dataclass
class Finding:
    level: str  # "ok", "warn" or "error"; error: the lab cannot use this machine as intended
    message: str
    next_step: str = ""


# The torch the course is tested with, and the oldest setup keeps (scripts/setup_venv.sh,
# pyproject.toml and environment.yml say the same; tests/test_setup.py checks). Older torch lacks
# what GPU paths call: torch.backends.cuda.cublas_workspace_size() (chapter 02; pytorch#177912,
# 2026-03), device_count() from CUDA's own view once CUDA has started (chapter 01's late
# CUDA_VISIBLE_DEVICES; pytorch#175355, 2026-02), fp32_precision for TF32 (chapters 04, 07; 2.9).
TORCH_FLOOR = "2.13"

# CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises; later changes are ignored.
_BEFORE_CUDA_STARTS = ("before CUDA initialises: in the shell before starting Jupyter, or in the "
                       "first cell of a freshly restarted kernel, before any CUDA call")


def diagnose(facts: DeviceFacts) -> list[Finding]:
    """Judge the facts. Pure: it only reads ``facts``, so tests can describe any machine."""
    return _torch_too_old(facts) + _device_findings(facts)


def _torch_too_old(facts: DeviceFacts) -> list[Finding]:
    if not _older(facts.torch_version.split("+")[0], TORCH_FLOOR):
        return []
    return [Finding(
        "error",
        f"torch {facts.torch_version} is older than {TORCH_FLOOR}, the torch the course is tested "
        "with: GPU experiments call APIs it lacks (chapter 02's cuBLAS workspace size, TF32's "
        "fp32_precision) and chapter 01's CUDA_VISIBLE_DEVICES experiment reads differently.",
        f'install torch {TORCH_FLOOR} or newer: `make lab TORCH="torch=={TORCH_FLOOR}.0 '
        '--index-url https://download.pytorch.org/whl/cu126"` (the build for your driver).')]


def _device_findings(facts: DeviceFacts) -> list[Finding]:
    if not facts.cuda_build:
        return [_cpu_only_build(facts) if facts.nvml_gpus else _no_gpu(facts)]
    if facts.torch_gpus:
        nearly_full = [f for gpu in facts.torch_gpus if (f := _nearly_full(gpu, facts))]
        no_kernels = [f for gpu in facts.torch_gpus if (f := _no_kernel_image(gpu, facts))]
        health = [f for gpu in facts.nvml_gpus for f in _health_findings(gpu)]
        return no_kernels + (nearly_full or [_ready(facts)]) + health
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


def _no_kernel_image(gpu: TorchGPU, facts: DeviceFacts) -> Finding | None:
    """"no kernel image is available for execution on the device": torch has no machine code
    (and no PTX) for this GPU's architecture (chapter 08). Unknown arch list: no verdict."""
    if not facts.torch_arch_list:
        return None
    ok, why = kernel_image_available(facts.torch_arch_list, gpu.capability)
    if ok:
        return None
    return Finding(
        "error", f"cuda:{gpu.index} ({gpu.name}): {why}.",
        "install a torch build for this GPU with `make lab TORCH=...` (a newer CUDA build lists "
        "newer architectures in torch.cuda.get_arch_list()).")


def _health_findings(gpu: NvmlGPU) -> list[Finding]:
    """What the driver's health figures say before a run (chapter 08): memory errors, a GPU
    already slowed by power or heat, a lowered power cap. None known: nothing said."""
    h, name, found = gpu.health, f"GPU {gpu.index} ({gpu.name})", []
    if h is None:
        return found
    if h.ecc_uncorrected_volatile or h.row_remap_failed:
        found.append(Finding(
            "error", f"{name} has uncorrectable memory errors (ECC uncorrected since reset: "
            f"{h.ecc_uncorrected_volatile or 0}; row remapping failed: {bool(h.row_remap_failed)}).",
            "do not train on it: look for Xid 48/63/64/94/95 in `dmesg`, ask an admin to reset "
            "the GPU, and to replace it if it repeats."))
    elif h.row_remap_pending or h.retired_pages_pending:
        found.append(Finding(
            "warn", f"{name} has a memory row remapping (page retirement) pending.",
            "reset the GPU (or reboot) so that the remapping takes effect."))
    slow = slowdowns(h.clock_events or 0)
    if slow:
        found.append(Finding(
            "warn", f"{name} is already slowed before the run: {', '.join(slow)} "
            f"(SM clock {h.sm_clock_mhz or '?'} of {h.max_sm_clock_mhz or '?'} MHz).",
            "check the cooling and power (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`), or "
            "what else runs on this GPU."))
    if h.power_limit_watts and h.default_power_limit_watts and \
            h.power_limit_watts < 0.95 * h.default_power_limit_watts:
        found.append(Finding(
            "warn", f"{name}'s power cap is {h.power_limit_watts:.0f} W, below its default "
            f"{h.default_power_limit_watts:.0f} W: heavy kernels will run at lower clocks.",
            "ask the admin why it is capped (`nvidia-smi -pl` sets it) if full speed matters."))
    return found


def failure_classes(facts: DeviceFacts) -> list[tuple[str, str, str]]:
    """A plain verdict for each failure class of chapter 08 that can be judged before a run:
    (class, "ok" / "warn" / "error" / "n/a", why). Pure, like ``diagnose``."""
    gpus, rows = facts.torch_gpus, []
    if gpus:
        tight = [g for g in gpus if g.free_bytes < LEARNER_BUDGET_BYTES]
        rows.append(("out of memory", "warn" if tight else "ok", ", ".join(
            f"cuda:{g.index} {_gib(g.free_bytes)} free" for g in gpus)
            + f" (the lab needs {_gib(LEARNER_BUDGET_BYTES)})"))
        if facts.torch_arch_list:
            verdicts = [kernel_image_available(facts.torch_arch_list, g.capability) for g in gpus]
            rows.append(("no kernel image", "ok" if all(ok for ok, _ in verdicts) else "error",
                         "; ".join(why for _, why in verdicts)))
        else:
            rows.append(("no kernel image", "n/a", "torch's architecture list is unknown"))
    else:
        rows += [("out of memory", "n/a", "no GPU"), ("no kernel image", "n/a", "no GPU")]
    # Minor-version compatibility: an older driver of the same CUDA major runs the build (chapter 08).
    rows.append(("driver older than torch's CUDA",
                 *driver_compatibility(facts.driver_version, facts.driver_cuda, facts.torch_cuda)))
    healths = [g for g in facts.nvml_gpus if g.health is not None]
    if healths:
        for label, pick in (("slowdown (power, heat)", lambda f: "slowed" in f.message
                             or "power cap" in f.message),
                            ("memory errors (ECC)", lambda f: "memory" in f.message)):
            hits = [f for g in healths for f in _health_findings(g) if pick(f)]
            rows.append((label, max((f.level for f in hits), default="ok", key=_LEVELS.index),
                         "; ".join(f.message for f in hits) or "none reported by the driver"))
    else:
        rows += [("slowdown (power, heat)", "n/a", "no GPU health figures"),
                 ("memory errors (ECC)", "n/a", "no GPU health figures")]
    if facts.shm_bytes is None:
        rows.append(("DataLoader shared memory", "n/a", "no /dev/shm"))
    else:
        small = facts.shm_bytes < GiB
        rows.append(("DataLoader shared memory", "warn" if small else "ok",
                     f"/dev/shm is {_gib(facts.shm_bytes)}" + (
                         ": workers may die with a bus error; in Docker use --shm-size=8g or "
                         "--ipc=host" if small else "")))
    rows.append(("hung collective", "n/a", "shows only during a run: give init_process_group a "
                 "timeout (chapter 08)"))
    return rows


_LEVELS = ["n/a", "ok", "warn", "error"]


def _hides_all_gpus(facts: DeviceFacts) -> bool:
    """CUDA reads CUDA_VISIBLE_DEVICES up to its first invalid entry, so it hides every GPU when
    that first entry is invalid: "", "-1", an index past the last GPU, or a GPU-<uuid> (or prefix
    of one) that names none of the driver's GPUs. (MIG-<uuid> entries are taken as valid: MIG
    instances are not among the facts.)"""
    if facts.cuda_visible_devices is None:
        return False
    first = facts.cuda_visible_devices.split(",")[0].strip().lower()
    if first.isdigit():
        return int(first) >= len(facts.nvml_gpus)
    if first.startswith("gpu-"):
        prefix = first.removeprefix("gpu-")          # the facts keep UUIDs without it
        return not any(gpu.uuid and gpu.uuid.startswith(prefix) for gpu in facts.nvml_gpus)
    return not first.startswith("mig-")


def _older(version: str | None, than: str | None) -> bool:
    """True when ``version`` (of CUDA or torch) is known to be older than ``than``, compared to
    the precision ``than`` gives: "12.4" < "12.6" < "12.10", "2.4.1" < "2.13"."""
    try:
        given = tuple(map(int, than.split(".")))
        return tuple(map(int, version.split(".")[:len(given)])) < given
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
    from gpulab.gpu_share import share_lines  # a workshop's per-learner cap (make workshop)
    lines += share_lines(facts.torch_gpus[0].total_bytes if facts.torch_gpus else None)
    for g in facts.nvml_gpus:
        processes = "unknown" if g.processes is None else len(g.processes)
        lines.append(f"  {f'driver GPU {g.index}':<27}{g.name}, {_gib(g.used_bytes)} used of "
                     f"{_gib(g.total_bytes)}, compute processes: {processes}")
        for p in g.processes or []:
            lines.append(f"      pid {p.pid:<8} {p.name or '?':<16} {_gib(p.used_bytes)}")
    lines += ["", "  Failure classes checked before a run (chapter 08):"]
    lines += [f"    {'[' + level + ']':<8} {name}: {why}" for name, level, why in failure_classes(facts)]
    lines.append("")
    for f in findings:
        lines.append(f"  {'[' + f.level + ']':<7}  {f.message}")
        if f.next_step:
            # Wrapped between words: a terminal or notebook cuts a long line mid-word.
            lines.append(textwrap.fill(f.next_step, width=92, initial_indent="           next: ",
                                       subsequent_indent=" " * 17, break_on_hyphens=False))
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
