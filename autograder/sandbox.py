"""The grading sandbox: each submission's kernel in bubblewrap, with a watchdog on its resources.

``SandboxedKernelManager`` starts the kernel on an allow-list file system: the system's folders,
the Python installation and the gpulab package read-only, and size-limited private folders
(/tmp, /dev/shm, a working copy of the submission); no home folder, no course folder (keys,
solutions, gradebook, other students' work). It has no network: its own network namespace, and
it talks to nbgrader over Unix sockets (jupyter's ``ipc`` transport) in a private folder, whose
messages the grader takes up to a size (``max_message_bytes``): a bigger one is never held in the
grader's memory. Its processes live in their own PID namespace, so none outlives it, and a
``Watchdog`` stops it when they use more memory, processes or CPU time than allowed.
autograder/secure_grading.py runs each notebook with it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import zmq
from jupyter_client.manager import AsyncKernelManager
from traitlets import Float, Integer

import gpulab


class SandboxUnavailable(RuntimeError):
    pass


def bubblewrap() -> str:
    """The bwrap command, or SandboxUnavailable with the command that installs it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "grading needs bubblewrap to isolate each submission: `apt-get install bubblewrap` "
            "(Debian/Ubuntu; `make test` and `make autograde` do it when run as root).")
    return bwrap


def sandbox_warnings() -> list[str]:
    """What this machine's sandbox cannot bound, for `make autograde` to say before it starts."""
    if _bwrap_has_size(bubblewrap()):
        return []
    return ["this bubblewrap is older than 0.8 and cannot size its folders: what a submission "
            "writes is limited per file, not in total (install a newer bubblewrap)"]


@functools.cache
def _bwrap_has_size(bwrap: str) -> bool:
    """bubblewrap >= 0.8 can size a tmpfs (--size); older ones cannot."""
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    return "--size" in help_text


# The system's own folders, read-only. Nothing else of the machine is there: no home folder, no
# /root, no /run (sockets of other services), no /var, no /opt, no course folder.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# What of /etc a Python kernel uses (the dynamic linker's cache, users' names, time zone, fonts,
# localhost): not /etc as a whole, which holds e.g. /etc/shadow, readable to a root grader.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group",
             "hosts", "localtime", "timezone", "fonts", "ssl", "alternatives", "os-release")
# Environment variables a kernel keeps; everything else (tokens, keys, the grader's HOME) is dropped.
KEPT_ENV = ("LANG", "LANGUAGE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
            "PYTHONHASHSEED", "NBGRADER_EXECUTION", "NBGRADER_VALIDATING", "GPULAB_STRICT_CHECKS")
SUBMISSION_ORIGINAL = "/gpulab-submission"   # the submitted folder, read-only, in the sandbox


def python_install() -> list[str]:
    """The Python installation the kernel runs from: the venv and the interpreter it was made
    from (e.g. pyenv under /root/.pyenv), resolved through symlinks."""
    found = []
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for candidate in (path, os.path.realpath(path)):
            if candidate not in found:
                found.append(candidate)
    return found


def sandbox_command(workdir: str, private_dir: str, limits: "Limits") -> list[str]:
    """bubblewrap arguments that run a command on an allow-list file system with no network.

    The kernel sees the system folders and the Python installation read-only, the gpulab
    package, ``private_dir`` (its connection file and sockets: the ``ipc`` transport), and
    size-limited private tmpfs folders: /tmp, /dev/shm and a working copy at ``workdir``, which
    ``LAUNCHER`` fills from the submission (bound read-only at SUBMISSION_ORIGINAL). Its own
    network namespace (only a loopback of its own), PID, IPC and UTS namespaces.
    """
    bwrap = bubblewrap()
    args = [bwrap]
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):                       # e.g. /bin -> usr/bin (merged /usr)
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for name in ETC_FILES:
        if os.path.lexists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for device in sorted(Path("/dev").glob("nvidia*")):   # a GPU, where there is one
        args += ["--dev-bind", str(device), str(device)]
    workdir = str(Path(workdir).resolve())
    size = _bwrap_has_size(bwrap)

    def private_folder(folder: str, extra: int = 0) -> None:
        if size:
            args.extend(["--size", str(limits.disk_bytes + extra)])
        args.extend(["--tmpfs", folder])

    # The private /tmp comes before the binds: bubblewrap mounts in order, so a Python install or
    # a course that lives under /tmp (a CI clone, say) is bound back into it, not hidden by it.
    private_folder("/tmp")
    private_folder("/dev/shm")
    package = str(Path(gpulab.__file__).resolve().parent)
    for keep in (*python_install(), package):
        args += ["--ro-bind", keep, keep]
    private_folder(workdir, _folder_bytes(workdir))
    args += ["--ro-bind", workdir, SUBMISSION_ORIGINAL,
             "--bind", private_dir, private_dir, "--chdir", workdir,
             "--hostname", "localhost",
             "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try",
             # ipykernel exits when its parent's pid is not its ppid, which a PID namespace
             # changes; --die-with-parent ends the sandbox with its parent instead.
             "--unsetenv", "JPY_PARENT_PID", "--die-with-parent", "--"]
    return args


def _folder_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink())


# Runs first in the sandbox: copies the submission into the working copy, sets the per-process
# limits, then becomes the kernel. RLIMIT_NPROC counts per user and user namespace, so it is set
# only in a user namespace of the sandbox's own (bubblewrap makes one when not run as root);
# root is exempt from it anyway, and the watchdog counts the processes in every case.
LAUNCHER = """
import os, resource, shutil, sys
original, cpu, size, tasks = sys.argv[1], *map(int, sys.argv[2:5])
shutil.copytree(original, '.', symlinks=True, dirs_exist_ok=True)
limits = [(resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, size), (resource.RLIMIT_CORE, 0)]
if open('/proc/self/uid_map').read().split()[2:3] == ['1']:
    limits.append((resource.RLIMIT_NPROC, tasks))
for limit, value in limits:
    resource.setrlimit(limit, (value, value))
os.execv(sys.argv[6], sys.argv[6:])
"""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one submission may use (SandboxedKernelManager's settings say how much)."""
    memory_bytes: int
    tasks: int
    disk_bytes: int
    cpu_seconds: int


class SandboxedKernelManager(AsyncKernelManager):
    """Starts the kernel inside ``sandbox_command``, talking to it over Unix sockets (the ipc
    transport) in a private folder, with a ``Watchdog`` on its resources."""

    memory_limit = Integer(8 * 2**30, help="Bytes of resident memory, all of a submission's "
                           "processes together.").tag(config=True)
    process_limit = Integer(1024, help="Processes and threads of a submission at once.").tag(config=True)
    disk_limit = Integer(2**30, help="Bytes a submission may write, in each of /tmp, /dev/shm "
                         "and its working copy (and per file).").tag(config=True)
    cpu_limit = Integer(3600, help="CPU seconds, all of a submission's processes together.").tag(config=True)
    watch_interval = Float(0.2, help="Seconds between two looks at a submission's usage.").tag(config=True)
    max_message_bytes = Integer(32 * 2**20, help="Largest message the grader takes from the kernel; "
                                "ZeroMQ drops a bigger one as it arrives (ZMQ_MAXMSGSIZE), so it "
                                "never reaches the grader's memory.").tag(config=True)
    queued_messages = Integer(16, help="Messages ZeroMQ holds for the grader per channel before "
                              "dropping more (ZMQ_RCVHWM).").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Mode 0700. A Unix socket's path must be short (108 bytes): a long TMPDIR gives way to /tmp.
        short = len(tempfile.gettempdir()) <= 64
        self.private_dir = tempfile.mkdtemp(prefix="gpulab-kernel-", dir=None if short else "/tmp")
        weakref.finalize(self, shutil.rmtree, self.private_dir, ignore_errors=True)
        self.transport = "ipc"
        self.connection_file = os.path.join(self.private_dir, "kernel.json")
        self.ip = os.path.join(self.private_dir, "ipc")
        self.watchdog: Watchdog | None = None
        self.context.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)   # the control channel

    def client(self, **kwargs):
        """A client whose sockets take at most ``max_message_bytes`` per message and hold at most
        ``queued_messages`` not yet read: what the grader holds of a flood is bounded as it arrives."""
        kernel_client = super().client(**kwargs)
        kernel_client.context.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        kernel_client.context.setsockopt(zmq.RCVHWM, self.queued_messages)
        return kernel_client

    @property
    def limits(self) -> "Limits":
        return Limits(memory_bytes=self.memory_limit, tasks=self.process_limit,
                      disk_bytes=self.disk_limit, cpu_seconds=self.cpu_limit)

    async def _async_pre_start_kernel(self, **kw):
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        workdir = kw.get("cwd") or os.getcwd()
        limits = self.limits
        env = {k: v for k, v in (kw.get("env") or os.environ).items() if k in KEPT_ENV}
        env.update(PATH=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
                   HOME="/tmp", IPYTHONDIR="/tmp/ipython", MPLCONFIGDIR="/tmp/matplotlib")
        kw["env"] = env
        # What the kernel prints to its own stdout and stderr would reach the grader's terminal.
        kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        launcher = [sys.executable, "-I", "-c", LAUNCHER, SUBMISSION_ORIGINAL, str(limits.cpu_seconds + 5),
                    str(limits.disk_bytes), str(limits.tasks), "--"]
        return sandbox_command(workdir, self.private_dir, limits) + launcher + cmd, kw

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        await super()._async_launch_kernel(kernel_cmd, **kw)
        self.watchdog = Watchdog(self.provisioner.process.pid, self.limits, self.watch_interval,
                                 self.private_dir)
        self.watchdog.start()

    @property
    def stopped_because(self) -> str | None:
        return self.watchdog.reason if self.watchdog else None

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        if self.watchdog:
            self.watchdog.stop()
        await super()._async_cleanup_resources(restart)
        if not restart:
            shutil.rmtree(self.private_dir, ignore_errors=True)


class Watchdog(threading.Thread):
    """Looks at a sandbox's processes every ``interval`` seconds (through the sandbox's own
    /proc, which lists only them) and kills the sandbox when they use more than ``limits``."""

    def __init__(self, bwrap_pid: int, limits: Limits, interval: float, private_dir: str):
        super().__init__(daemon=True, name=f"watchdog-{bwrap_pid}")
        self.bwrap_pid, self.limits, self.interval = bwrap_pid, limits, interval
        self.private_dir = private_dir
        self.reason: str | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        init = self._sandbox_init()
        while init and not self._stop_event.wait(self.interval):
            usage = sandbox_usage(init)
            if usage is None:               # the sandbox has ended
                return
            memory, tasks, cpu = usage
            limits = self.limits
            if memory > limits.memory_bytes:
                self.reason = f"used more than {_size(limits.memory_bytes)} of memory"
            elif tasks > limits.tasks:
                self.reason = f"ran more than {limits.tasks} processes and threads at once"
            elif cpu > limits.cpu_seconds:
                self.reason = f"used more than {limits.cpu_seconds} s of CPU time"
            elif _grew(self.private_dir):
                self.reason = "wrote files into the folder of its connection sockets"
            if self.reason:
                _kill(init, self.bwrap_pid)
                return

    def _sandbox_init(self) -> int | None:
        """bubblewrap's first child, the sandbox's PID 1, once its /proc is the sandbox's own.
        A sandbox that cannot be watched is not left to run unwatched: it is stopped."""
        give_up = time.monotonic() + 60
        while not self._stop_event.wait(0.02):
            init = _child_of(self.bwrap_pid)
            if init is None and not Path(f"/proc/{self.bwrap_pid}").exists():
                return None
            try:
                if init and os.readlink(f"/proc/{init}/ns/pid") == os.readlink(f"/proc/{init}/root/proc/1/ns/pid"):
                    return init
            except OSError:
                pass                        # not set up yet (or already gone)
            if time.monotonic() > give_up:
                self.reason = "could not be watched (the grader cannot read the sandbox's /proc)"
                _kill(init, self.bwrap_pid)
                return None
        return None


def _kill(*pids: int | None) -> None:
    """SIGKILL to the sandbox's init (the kernel then ends every process in its PID namespace)
    and to bubblewrap."""
    for pid in pids:
        try:
            if pid:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _grew(private_dir: str) -> bool:
    """Whether the kernel's socket folder (on the grader's disk, writable because the kernel
    makes its sockets there) holds more than a connection file and a few sockets."""
    try:
        entries = list(os.scandir(private_dir))
        return len(entries) > 16 or sum(e.stat(follow_symlinks=False).st_size for e in entries) > 2**20 or any(
            e.is_dir(follow_symlinks=False) for e in entries)
    except OSError:
        return False


def _child_of(pid: int) -> int | None:
    """The first child process of ``pid`` (bubblewrap's PID-namespace init), or None."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        return int(entry.name)
            except (OSError, IndexError, ValueError):
                continue
    return None


def sandbox_usage(init: int) -> tuple[int, int, float] | None:
    """(resident bytes, tasks, CPU seconds) of every process in the sandbox whose PID-namespace
    init is ``init`` (a process id seen from outside), or None once it has ended. Children that
    have ended count through their parents' cutime and cstime."""
    proc = f"/proc/{init}/root/proc"
    memory = tasks = ticks = 0
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return None
    for name in entries:
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue                        # ended between the listing and the read
        if fields[0] == b"Z":
            continue
        ticks += sum(int(x) for x in fields[11:15])     # utime, stime, cutime, cstime
        tasks += int(fields[17])
        memory += int(fields[21]) * PAGE_BYTES
    return memory, tasks, ticks / CLOCK_TICKS


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"
