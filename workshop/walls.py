"""The walls around each learner: memory, CPU share, tasks and devices, applied with what the
host has (docs/workshop.md). One plan (plan.Limits), two ways to apply it:

- **systemd** (every real GPU server; sd_booted(3): /run/systemd/system exists): the learner's
  server starts inside ``systemd-run --scope`` with the plan as unit properties
  (systemd.resource-control(5)): MemoryMax, MemorySwapMax=0, CPUWeight, TasksMax,
  DevicePolicy=closed and a DeviceAllow= per device node the learner may open. A scope runs
  the command in systemd-run's own process, with the caller's environment (systemd-run(1)), so
  the hub keeps the server's pid. Scopes take no execution settings such as PrivateTmp=: the
  private scratch below does that job, /dev/shm and size caps included.
- **cgroupfs** (containers and CI machines without systemd, root allowed to write
  /sys/fs/cgroup): the hub writes the same plan into cgroups of the learner's own, under the
  hub's own cgroup. v1: memory.limit_in_bytes and memory.memsw.limit_in_bytes (swap counted),
  pids.max, cpu.shares, devices.deny/devices.allow; v2: memory.max, memory.swap.max, pids.max,
  cpu.weight, and, because v2 controls devices only through BPF programs, the nodes of the
  other GPUs covered in the learner's mount namespace instead (opening one: EACCES).

Either way the learner's processes are in their cgroups before the learner's identity is
taken (start_learner.sh joins them as root, or systemd-run creates the scope), and cgroup.procs
belongs to root, so no learner process starts outside them or moves out. Private /tmp, /var/tmp
and /dev/shm are the same for both: size-capped tmpfs in the learner's mount namespace, whose
pages count in the learner's memory. The hub, its proxy and its services keep oom_score_adj
-1000 (run.py), learners' processes get +500, set as root so that they cannot lower it.

Standard library only: `make workshop-check` and the tests use it without JupyterHub.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

HUB_OOM_SCORE_ADJ = -1000     # never chosen by the OOM killer (proc(5), oom_score_adj)
LEARNER_OOM_SCORE_ADJ = 500   # chosen before anything else on the machine
NVIDIA_MAJOR = 195            # /dev/nvidia<minor> and /dev/nvidiactl (minor 255), fixed by the driver
# What systemd's DevicePolicy=closed lets through besides DeviceAllow= (src/core/bpf-devices.c,
# bpf_devices_allow_list_static), mirrored for cgroup v1: (path, major, minor).
PSEUDO_DEVICES = [("/dev/null", 1, 3), ("/dev/zero", 1, 5), ("/dev/full", 1, 7),
                  ("/dev/random", 1, 8), ("/dev/urandom", 1, 9), ("/dev/tty", 5, 0),
                  ("/dev/ptmx", 5, 2)]


@dataclass(frozen=True)
class Node:
    """A device node a learner may open: its path, and its numbers for cgroup v1's rules (major
    None when the driver that owns it is not loaded, minor None for every minor)."""
    path: str
    major: int | None
    minor: int | None
    access: str = "rw"


# --------------------------------------------------------------------------------------------
# Device nodes


def char_majors(name: str, proc: Path = Path("/proc")) -> list[int]:
    """The major numbers /proc/devices gives the character driver ``name`` (e.g. "pts")."""
    try:
        text = (proc / "devices").read_text()
    except OSError:
        return []
    chars = text.split("Block devices:")[0]
    return [int(major) for major, driver in re.findall(r"^\s*(\d+)\s+(\S+)$", chars, re.M)
            if driver == name]


def mig_minors(proc: Path = Path("/proc")) -> dict[str, int]:
    """The driver's table of MIG capability nodes, /proc/driver/nvidia-caps/mig-minors: lines
    such as "gpu0/gi1/access 12" and "gpu0/gi1/ci0/access 13" (MIG User Guide, "Device Nodes and
    Capabilities": each is /dev/nvidia-caps/nvidia-cap<minor>)."""
    table = {}
    for line in (proc / "driver" / "nvidia-caps" / "mig-minors").read_text().splitlines():
        if len(parts := line.split()) == 2 and parts[1].isdigit():
            table[parts[0]] = int(parts[1])
    return table


def nvml():
    """The driver's NVML (nvidia-ml-py), or None on a machine without it."""
    try:
        import pynvml
        return pynvml
    except ImportError:
        return None


def device_nodes(uuid: str | None, nvml, proc: Path = Path("/proc"),
                 dev: Path = Path("/dev")) -> list[Node]:
    """The NVIDIA nodes a learner given ``uuid`` (a GPU or MIG UUID, None for no GPU) needs and
    no other: the control node and unified memory (MIG User Guide, "Device Nodes and
    Capabilities"), their GPU's node, and for a MIG instance its two capability nodes (GPU
    instance and compute instance access, read-only). ``nvml``: the pynvml module or a stand-in."""
    if uuid is None:
        return []
    if nvml is None:
        raise LookupError(f"{uuid} is assigned, but NVML (nvidia-ml-py) is not installed: "
                          "its device nodes cannot be found")
    uvm = (char_majors("nvidia-uvm", proc) or [None])[0]
    nodes = [Node(f"{dev}/nvidiactl", NVIDIA_MAJOR, 255), Node(f"{dev}/nvidia-uvm", uvm, 0),
             Node(f"{dev}/nvidia-uvm-tools", uvm, 1)]
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        mig = uuid.startswith("MIG-")
        gpu = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if mig else handle
        minor = nvml.nvmlDeviceGetMinorNumber(gpu)
        if mig:
            gi = nvml.nvmlDeviceGetGpuInstanceId(handle)
            ci = nvml.nvmlDeviceGetComputeInstanceId(handle)
    finally:
        nvml.nvmlShutdown()
    nodes.append(Node(f"{dev}/nvidia{minor}", NVIDIA_MAJOR, minor))
    if mig:
        caps, major = mig_minors(proc), (char_majors("nvidia-caps", proc) or [None])[0]
        for key in (f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"):
            if key not in caps:
                raise LookupError(f"{uuid}: the driver lists no capability {key} in "
                                  f"{proc}/driver/nvidia-caps/mig-minors")
            nodes.append(Node(f"{dev}/nvidia-caps/nvidia-cap{caps[key]}", major, caps[key], "r"))
    return nodes


def other_nvidia_nodes(own: list[Node], dev: Path = Path("/dev")) -> list[str]:
    """Every GPU and MIG capability node on this machine that is not in ``own``."""
    present = sorted([*map(str, dev.glob("nvidia[0-9]*")), *map(str, dev.glob("nvidia-caps/*"))])
    return [path for path in present if path not in {n.path for n in own}]


def v1_device_rules(nodes: list[Node], proc: Path = Path("/proc")) -> list[str]:
    """devices.allow lines for cgroup v1: the pseudo devices and terminals DevicePolicy=closed
    allows, and ``nodes``."""
    rules = [f"c {major}:{minor} rwm" for _, major, minor in PSEUDO_DEVICES]
    rules += [f"c {major}:* rw" for major in char_majors("pts", proc)]      # /dev/pts/N
    rules += [f"c {n.major}:{'*' if n.minor is None else n.minor} {n.access}"
              for n in nodes if n.major is not None]
    return rules


# --------------------------------------------------------------------------------------------
# The appliers


def own_cgroups(text: str) -> dict[str, str]:
    """/proc/self/cgroup as {controller: path}; the v2 hierarchy's path under ""."""
    found = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def _empty(folder: Path, kill_file: str | None = None, timeout_s: float = 10) -> None:
    """Stop every process left in cgroup ``folder`` (a process storm's orphans, a daemon the
    learner started) and remove the folder."""
    if not folder.is_dir():
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        if not pids:
            break
        if kill_file and (folder / kill_file).exists():
            _write(folder / kill_file, 1)                   # cgroup v2: the kernel kills them all
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for child in sorted(folder.iterdir(), reverse=True):     # nested cgroups a hierarchy made
        if child.is_dir():
            _empty(child, kill_file, timeout_s)
    folder.rmdir()


class Systemd:
    """Each learner's server in a transient scope of their own (systemd-run(1), --scope)."""

    name = "systemd"

    def __init__(self, group: str):
        self.group = group

    def unit(self, learner: str) -> str:
        return f"{self.group}-{learner}.scope"

    def start(self, learner: str, limits, nodes: list[Node]) -> tuple[list[str], dict[str, str]]:
        """(the command the server's command line follows, variables for start_learner.sh)."""
        properties = [f"MemoryMax={limits.memory_bytes}", "MemorySwapMax=0",
                      f"CPUWeight={limits.cpu_weight}", f"TasksMax={limits.tasks}",
                      "DevicePolicy=closed", *[f"DeviceAllow={n.path} {n.access}" for n in nodes]]
        command = ["systemd-run", "--scope", "--quiet", "--collect",
                   f"--unit={self.unit(learner)}", f"--slice={self.group}.slice",
                   f"--description=GPU Training Lab workshop: {learner}'s server"]
        for p in properties:
            command += ["--property", p]
        return command + ["--"], {}

    def stop(self, learner: str) -> None:
        """Everything left in the learner's scope ends with it."""
        import subprocess
        subprocess.run(["systemctl", "kill", "--signal=SIGKILL", self.unit(learner)],
                       capture_output=True)
        subprocess.run(["systemctl", "stop", self.unit(learner)], capture_output=True)

    def prepare(self, learners: int) -> None:
        pass

    def finish(self) -> None:
        pass


class CgroupV1:
    """Cgroups of the learner's own in each v1 hierarchy, under the hub's own cgroup there."""

    name = "cgroup v1"
    controllers = ("memory", "pids", "cpu", "devices")

    def __init__(self, group: str, own: dict[str, str], root: Path = Path("/sys/fs/cgroup"),
                 proc: Path = Path("/proc")):
        self.group, self.own, self.root, self.proc = group, own, root, proc

    def folder(self, controller: str, learner: str = "") -> Path:
        path = self.root / controller / self.own[controller].lstrip("/") / self.group
        return path / learner if learner else path

    def start(self, learner: str, limits, nodes: list[Node]) -> tuple[list[str], dict[str, str]]:
        self.stop(learner)                        # whatever a server that died left behind
        for controller in self.controllers:
            self.folder(controller, learner).mkdir(parents=True, exist_ok=True)
        memory = self.folder("memory", learner)
        _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
        if (memory / "memory.memsw.limit_in_bytes").exists():   # swap accounting is on
            _write(memory / "memory.memsw.limit_in_bytes", limits.memory_bytes)
        _write(self.folder("pids", learner) / "pids.max", limits.tasks)
        # cpu.shares: 1024 is the kernel's default weight, as CPUWeight=100 is systemd's
        _write(self.folder("cpu", learner) / "cpu.shares", limits.cpu_weight * 1024 // 100)
        devices = self.folder("devices", learner)
        _write(devices / "devices.deny", "a")
        for rule in v1_device_rules(nodes, self.proc):
            _write(devices / "devices.allow", rule)
        folders = [str(self.folder(c, learner)) for c in self.controllers]
        return [], {"GPULAB_WORKSHOP_CGROUPS": ":".join(folders)}

    def stop(self, learner: str) -> None:
        for controller in self.controllers:
            _empty(self.folder(controller, learner))

    def prepare(self, learners: int) -> None:
        """The room as a whole weighs as much CPU as its learners would as plain processes, and
        so does the hub beside it (its own cgroup, which its proxy and services inherit): under
        a full room the hub still gets up to half the machine when it needs it."""
        room_shares = min(262144, 1024 * learners)                  # the kernel's maximum
        self.folder("cpu").mkdir(parents=True, exist_ok=True)
        _write(self.folder("cpu") / "cpu.shares", room_shares)
        self.hub_cpu.mkdir(exist_ok=True)
        _write(self.hub_cpu / "cpu.shares", room_shares)
        _write(self.hub_cpu / "cgroup.procs", os.getpid())

    @property
    def hub_cpu(self) -> Path:
        return self.folder("cpu").with_name(f"{self.group}-hub")

    def finish(self) -> None:
        if self.hub_cpu.is_dir():
            _write(self.hub_cpu.parent / "cgroup.procs", os.getpid())   # back where it started
            self.hub_cpu.rmdir()
        for controller in self.controllers:
            folder = self.folder(controller)
            for learner in [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []:
                _empty(learner)
            if folder.is_dir():
                folder.rmdir()


class CgroupV2:
    """A cgroup of the learner's own in the v2 hierarchy, under the hub's own cgroup."""

    name = "cgroup v2"
    controllers = "+memory +pids +cpu"

    def __init__(self, group: str, own: str, root: Path = Path("/sys/fs/cgroup"),
                 dev: Path = Path("/dev")):
        self.group, self.base, self.dev = group, root / own.lstrip("/"), dev

    def folder(self, learner: str = "") -> Path:
        return self.base / self.group / learner if learner else self.base / self.group

    def prepare(self, learners: int) -> None:
        """v2 hands controllers only from a cgroup without processes of its own to its
        children ("no internal processes", the kernel's cgroup-v2.rst): the processes in the
        hub's cgroup move to a leaf beside the learners', as a container's init shim does. The
        room and the hub weigh as much CPU as the learners would as plain processes (CgroupV1)."""
        hub = self.base / f"{self.group}-hub"
        hub.mkdir(exist_ok=True)
        for pid in (self.base / "cgroup.procs").read_text().split():
            try:
                _write(hub / "cgroup.procs", pid)
            except OSError:        # exited meanwhile, or a kernel thread
                pass
        _write(self.base / "cgroup.subtree_control", self.controllers)
        self.folder().mkdir(exist_ok=True)
        _write(self.folder() / "cgroup.subtree_control", self.controllers)
        for folder in (hub, self.folder()):
            _write(folder / "cpu.weight", min(10000, 100 * learners))    # cgroup v2's maximum

    def start(self, learner: str, limits, nodes: list[Node]) -> tuple[list[str], dict[str, str]]:
        self.stop(learner)
        folder = self.folder(learner)
        folder.mkdir()
        _write(folder / "memory.max", limits.memory_bytes)
        if (folder / "memory.swap.max").exists():
            _write(folder / "memory.swap.max", 0)
        _write(folder / "pids.max", limits.tasks)
        _write(folder / "cpu.weight", limits.cpu_weight)
        return [], {"GPULAB_WORKSHOP_CGROUPS": str(folder),
                    "GPULAB_WORKSHOP_MASK": ":".join(other_nvidia_nodes(nodes, self.dev))}

    def stop(self, learner: str) -> None:
        _empty(self.folder(learner), kill_file="cgroup.kill")

    def finish(self) -> None:
        folder = self.folder()
        for learner in [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []:
            _empty(learner, kill_file="cgroup.kill")
        if folder.is_dir():
            folder.rmdir()


# --------------------------------------------------------------------------------------------
# The room's shared pages

# What a learner's kernel imports first: read once by the hub, the pages count for no learner.
COURSE_IMPORTS = "import torch, numpy, matplotlib.pyplot, gpulab, gpulab.models, ipykernel.kernelapp"


def warm_shared_pages(python: Path, site_packages: Path, timeout_s: float = 300) -> tuple[int, float]:
    """Read the course's shared libraries (every *.so* under ``site_packages``: torch's 0.4 GiB
    libtorch_cpu.so on a CPU build, the CUDA libraries on a GPU one) and import what a kernel
    imports (their .pyc files), in the hub's own cgroup, before any learner starts. A page of the
    page cache counts in the memory of the cgroup that first read it (the kernel's
    cgroup-v1/memory.rst, "Shared Page Accounting"; v2 alike): otherwise the first learner to
    import torch carries its pages inside their wall, and a chapter that fits beside them
    thrashes, re-reading torch's code from disk at every step (chapter 07's ladder in a 0.7 GiB
    wall: 9,161 major faults in 5 minutes and no end; scripts/bench_workshop.py measures each
    chapter's). run.py starts it beside the hub. Returns (bytes read, seconds)."""
    import subprocess
    start, read = time.monotonic(), 0
    for path in site_packages.rglob("*.so*"):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                while chunk := f.read(2**24):
                    read += len(chunk)
    subprocess.run([str(python), "-c", COURSE_IMPORTS], capture_output=True, timeout=timeout_s,
                   env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    return read, time.monotonic() - start


# --------------------------------------------------------------------------------------------
# What learners may read of the course checkout: their own copy of the release, not these.

INSTRUCTOR_PATHS = ("solutions", "autograder", "book/chapters", "book/_build")  # keys, answers,
# submissions, gradebook.db, grades.csv, and the book built from the solutions


def close_to_learners(root: Path, group_gid: int | None) -> list[Path]:
    """Take read, write and entry from "other" on the instructor's folders of the checkout (and
    from the group, where it is the learners' group); the owner keeps them. What it closed."""
    closed = []
    for name in INSTRUCTOR_PATHS:
        path = root / name
        if not path.exists():
            continue
        info = path.stat()
        mode = info.st_mode & 0o7777 & ~0o007
        if group_gid is not None and info.st_gid == group_gid:
            mode &= ~0o070
        if mode != info.st_mode & 0o7777:
            path.chmod(mode)
        closed.append(path)
    return closed


def readable_by_learners(root: Path, group_gid: int | None) -> list[str]:
    """The instructor's folders a learner account can list, tried as one would: as nobody, in
    the learners' group (with /bin/sh: the course's Python may live where nobody can reach)."""
    import subprocess
    paths = [str(root / n) for n in INSTRUCTOR_PATHS if (root / n).exists()]
    probe = 'for p do if ls "$p" >/dev/null 2>&1; then echo "$p"; fi; done'
    done = subprocess.run(["/bin/sh", "-c", probe, "sh", *paths], user=65534, group=65534,
                          extra_groups=[] if group_gid is None else [group_gid],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


def detect(group: str, root: Path = Path("/sys/fs/cgroup"), run: Path = Path("/run"),
           proc: Path = Path("/proc"), dev: Path = Path("/dev")):
    """(the applier this host gets, or None, and why, in a sentence for the host)."""
    if (run / "systemd" / "system").is_dir() and shutil.which("systemd-run"):
        return Systemd(group), "systemd runs this machine: a transient scope per learner"
    try:
        own = own_cgroups((proc / "self" / "cgroup").read_text())
    except OSError as error:
        return None, f"cannot read this process's cgroups ({error})"
    if (root / "cgroup.controllers").exists():
        base = root / own.get("", "/").lstrip("/")
        available = set((base / "cgroup.controllers").read_text().split())
        missing = {"memory", "pids", "cpu"} - available
        if not missing and os.access(base, os.W_OK):
            return CgroupV2(group, own[""], root, dev), f"cgroup v2 at {root}, no systemd"
        return None, (f"cgroup v2 at {root}, but {base} is not writable or lacks "
                      f"{', '.join(sorted(missing)) or 'nothing'}")
    unusable = [c for c in CgroupV1.controllers
                if c not in own or not os.access(root / c / own[c].lstrip("/"), os.W_OK)]
    if not unusable:
        return CgroupV1(group, own, root, proc), f"cgroup v1 hierarchies at {root}, no systemd"
    return None, (f"no systemd, and the cgroup v1 hierarchies {', '.join(unusable)} are not "
                  f"mounted writable under {root}")
