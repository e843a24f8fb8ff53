"""`make workshop-check`: can this machine carry the planned room? Preflight for the host.

Prints the GPUs and MIG instances the driver lists (through NVML, nvidia-ml-py, never
nvidia-smi's text), their free memory, the driver and torch, the plan (workshop/plan.py, the
same variables as `make workshop`), the walls this machine gives each learner and with which
tool (workshop/walls.py), whether a learner account could list the instructor's folders of the
checkout (tried as one), and how many learners fit at the chapters' per-learner
footprint. That footprint is the largest one a `make gpu-check` report in reports/ measured
(the driver's count for a chapter's kernel and its children, CUDA context included), or, with
no report, the course's budget of 4 GiB per learner that every solution notebook is designed to
stay under. Sizes in GiB (2^30 bytes).
"""
from __future__ import annotations

import grp
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import homes  # noqa: E402
import plan  # noqa: E402
import walls  # noqa: E402

# The NVIDIA MIG User Guide's profiles ("Supported MIG Profiles",
# https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): the
# smallest slice, seven per GPU, already holds a chapter (under 4 GiB) with room to spare.
MIG_LAYOUTS = {
    "H200": "7 x 1g.18gb (one to three learners per slice with the cap; 4 x 1g.35gb for more headroom)",
    "H100": "7 x 1g.10gb on the 80 GB model (one or two learners per slice; 4 x 1g.20gb for more room)",
    "A100-SXM4-80GB": "7 x 1g.10gb (one or two learners per slice)",
    "A100": "7 x 1g.5gb on the 40 GB model: one learner per slice, just above a chapter's 4 GiB",
}


def gib(n: float) -> str:
    return f"{n / plan.GiB:.1f} GiB"


def measured_footprint(reports: Path = ROOT / "reports") -> tuple[int, str]:
    """(bytes, where the figure comes from): the largest chapter footprint of the newest
    gpu-check report, else the course's 4 GiB budget."""
    for path in sorted(reports.glob("gpu-check-*.json"), reverse=True):
        try:
            chapters = json.loads(path.read_text()).get("chapters", [])
            peaks = [(c.get("footprint") or {}).get("peak_bytes") for c in chapters]
            peaks = [p for p in peaks if p]
        except (OSError, ValueError, AttributeError):
            continue
        if peaks:
            return max(peaks), f"the largest chapter footprint measured in {path.name}"
    return plan.LEARNER_FOOTPRINT_BYTES, ("the course's budget per learner (every solution "
                                          "notebook is designed to peak under it; no gpu-check "
                                          "report measured it on this GPU yet)")


# A learner's wall must hold a chapter's peak (RSS and tmpfs, their server's included) and some
# code pages their kernel keeps touching. In a 723 MiB wall (2 cores, 2026-12-03, make bench):
# chapters peaking at 494-576 MiB (up to 1/1.26 of it) ran within 25% of their time outside;
# chapter 05 (764 MiB) was stopped; chapter 07 at 590 MiB (1/1.23) with torch's pages counted in
# the learner's memory took 2.7 times as long, at 678 MiB (1/1.07) it thrashed and never ended.
MEMORY_HEADROOM = 1.25
TASKS_HEADROOM = 2.0          # a chapter's peak tasks, twice: DataLoader workers, a terminal
NEEDS = HERE / "chapter_needs.json"


def needs_lines(settings: plan.Settings, needs: Path = NEEDS) -> list[str]:
    """Each chapter the plan's walls are too small for, by the needs `make bench` measured inside
    one learner's walls (workshop/chapter_needs.json), or one line saying they all fit."""
    try:
        measured = json.loads(needs.read_text())
    except (OSError, ValueError):
        return [f"  chapter needs         not measured ({needs.name} missing): sudo make bench"]
    chapters = measured["chapters"]
    memory = {c: n["peak_memory_bytes"] for c, n in chapters.items()}
    tasks = {c: n["peak_tasks"] for c, n in chapters.items()}
    short = [c for c, m in memory.items() if m * MEMORY_HEADROOM > settings.memory_bytes]
    few = [c for c, t in tasks.items() if t * TASKS_HEADROOM > settings.tasks]
    where = f"measured {measured['date']} on {measured['machine']}, {needs.name}"
    largest = max(memory, key=memory.get)
    lines = [f"  chapter needs         largest {gib(memory[largest])} ({largest}, server included) "
             f"and {max(tasks.values())} tasks ({where})"]
    if short:
        lines.append(f"  ! memory per learner  {gib(settings.memory_bytes)} is below {MEMORY_HEADROOM:g} x "
                     f"the peak of {', '.join(short)}: past it a chapter slows several-fold as its "
                     "code is read from disk again and again, or its kernel is stopped. Plan "
                     "fewer learners or give WORKSHOP_MEMORY.")
    if few:
        lines.append(f"  ! tasks per learner   {settings.tasks} is below {TASKS_HEADROOM:g} x the peak "
                     f"of {', '.join(few)}: raise WORKSHOP_TASKS.")
    if not short and not few:
        lines.append(f"  the plan's walls      hold every chapter ({MEMORY_HEADROOM:g} x its memory, "
                     f"{TASKS_HEADROOM:g} x its tasks)")
    if not measured.get("gpu"):
        lines.append("  (measured on a CPU: on a GPU each kernel's CUDA runtime adds some hundreds "
                     "of MiB of host memory; `make gpu-check` measures the GPU side)")
    return lines


def fit_lines(devices: list[plan.Device], chosen: tuple[str, ...], settings: plan.Settings,
              footprint: int) -> tuple[list[str], int]:
    """The per-device lines of the report and how many learners fit on the chosen devices."""
    lines, fits = [], 0
    per_device = plan.learners_per_device(settings.learners, len(chosen))
    for d in devices:
        use = d.uuid in chosen
        n = plan.learners_that_fit(d.free_bytes, footprint)
        fits += n if use else 0
        lines.append(f"  {'*' if use else ' '} {d.uuid}  {d.name}: {gib(d.free_bytes)} free of "
                     f"{gib(d.total_bytes)}; {n} learner(s) fit")
        if use and settings.memory_fraction is not None:
            capped = settings.memory_fraction * d.total_bytes
            if capped < footprint:
                lines.append(f"      the cap, {settings.memory_fraction:g} x {gib(d.total_bytes)} = "
                             f"{gib(capped)}, is below a learner's {gib(footprint)}: chapters may "
                             "stop with OutOfMemoryError. Plan fewer learners per device.")
            if n < per_device:
                lines.append(f"      the plan puts {per_device} learners here; only {n} fit")
    missing = [u for u in chosen if u not in {d.uuid for d in devices}]
    lines += [f"  ! {u}: listed in WORKSHOP_DEVICES but not found by the driver" for u in missing]
    return lines, fits


def node_lines(chosen: tuple[str, ...], nvml) -> list[str]:
    """Each device's nodes as the walls will open them to its learners, or why they cannot be
    found (a MIG instance whose capability nodes the driver does not list: no learner given it
    could start)."""
    lines = []
    for uuid in chosen:
        try:
            nodes = walls.device_nodes(uuid, nvml)
            lines.append(f"    {uuid}: {', '.join(n.path for n in nodes)}")
        except Exception as error:  # noqa: BLE001 (NVMLError_NotFound, LookupError, OSError)
            lines.append(f"  ! {uuid}: its device nodes cannot be found ({error}): a learner "
                         "given it could not start")
    return lines


def walls_lines(settings: plan.Settings, group: str, root: Path = ROOT) -> tuple[list[str], bool]:
    """The report's lines on the walls and the instructor's folders; False when the room would
    run without walls it asked for."""
    applier, why = walls.detect(group)
    if not settings.walls:
        lines = ["  walls                 OFF (WORKSHOP_WALLS=off): nothing stops one learner "
                 "starving the others"]
    else:
        lines = [f"  walls                 {applier.name if applier else 'NONE'}: {why}"]
    lines.append(f"  per learner           {gib(settings.memory_bytes)} of memory (swap and their "
                 f"/tmp, /var/tmp, /dev/shm files included), {settings.tasks} tasks, CPU weight "
                 f"{plan.CPU_WEIGHT} (the same for all), scratch {gib(settings.scratch_bytes)} "
                 "each; their own GPU or MIG slice only")
    home_root = Path(os.environ.get("WORKSHOP_HOMES", "/home"))
    no_disk = homes.why_not(home_root)
    lines.append(f"  disk per learner      {gib(settings.disk_bytes)} home, a disk of its own "
                 "(an ext4 image, loop-mounted: ENOSPC past it)" if no_disk is None else
                 f"  disk per learner      WARNING: NO CAP ({no_disk}): homes are plain folders of "
                 f"{home_root}, and one learner can fill its disk for everyone")
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = None
    if os.geteuid() != 0:
        lines.append("  instructor folders    not tried: run it as root (sudo make workshop-check) "
                     "to try them as a learner account")
        return lines, applier is not None or not settings.walls
    readable = walls.readable_by_learners(root, gid)
    names = ", ".join(f"{Path(p).relative_to(root)}/" for p in readable)
    lines.append("  instructor folders    " + (f"READABLE by a learner account: {names} "
                 "(`make workshop` closes them)" if readable else "closed to learner accounts "
                 f"({', '.join(walls.INSTRUCTOR_PATHS)}: tried as one)"))
    return lines, applier is not None or not settings.walls


def main() -> int:
    settings = plan.settings_from_env()
    devices = plan.nvml_devices()
    footprint, source = measured_footprint()
    print("make workshop-check: can this machine carry the room?  Sizes in GiB (2^30 bytes).\n")
    try:
        import pynvml
        pynvml.nvmlInit()
        driver = (f"{pynvml.nvmlSystemGetDriverVersion()}, supports CUDA up to "
                  f"{pynvml.nvmlSystemGetCudaDriverVersion() / 1000:g}")
        pynvml.nvmlShutdown()
    except Exception as error:  # no driver: a CPU machine
        driver = f"not available ({error})"
    import torch
    print(f"  NVIDIA driver (NVML)  {driver}")
    print(f"  torch                 {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    print(f"  CPU                   {os.cpu_count()} cores; {settings.threads} thread(s) per learner")
    print(f"  learner footprint     {gib(footprint)}: {source}")
    print(f"  plan                  {settings.learners} learners on {len(settings.devices)} device(s)"
          + (f", memory cap {settings.memory_fraction:g} of the device each" if settings.devices else ""))
    lines, walled = walls_lines(settings, os.environ.get("WORKSHOP_GROUP", "gpulab-learners"))
    needs = needs_lines(settings)
    print("\n".join(lines + needs))
    print("\n  devices (* = the workshop's, WORKSHOP_DEVICES or all by default):")
    lines, fits = fit_lines(devices, settings.devices, settings, footprint)
    print("\n".join(lines) if lines else "    none: the driver lists no GPU; learners run on the CPU")
    if settings.devices:
        import pynvml
        print("\n  device nodes each learner may open (all other GPUs' are closed to them):")
        print("\n".join(node_lines(settings.devices, pynvml)))
    for model, layout in MIG_LAYOUTS.items():
        if any(model in d.name and d.parent is None for d in devices):
            print(f"\n  MIG on {model}: {layout} isolates learners in hardware (docs/workshop.md).")
            break
    if not walled:
        print("\nVerdict: NO WALLS: this machine has neither systemd nor writable cgroups, so one "
              "learner could starve the room. Run it elsewhere, or accept it with WORKSHOP_WALLS=off.")
        return 1
    if any(line.startswith("  !") for line in needs):
        print(f"\nVerdict: TOO LITTLE PER LEARNER: the walls of a room of {settings.learners} are "
              "smaller than some chapters need (the ! lines). Plan fewer learners, or give "
              "WORKSHOP_MEMORY / WORKSHOP_TASKS.")
        return 1
    if not settings.devices:
        print(f"\nVerdict: a CPU workshop for {settings.learners} learners; experiments shrink on the CPU.")
        return 0
    if fits >= settings.learners:
        print(f"\nVerdict: READY: {fits} learners fit at {gib(footprint)} each; {settings.learners} planned.")
        return 0
    print(f"\nVerdict: TOO FULL: {fits} learners fit at {gib(footprint)} each, {settings.learners} planned. "
          "Free the GPUs (nvidia-smi shows who holds them), add devices, or plan fewer learners "
          "(WORKSHOP_LEARNERS).")
    return 1


if __name__ == "__main__":
    sys.exit(main())
