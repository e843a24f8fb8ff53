"""The grading sandbox: each submission's kernel in bubblewrap, with a watchdog on its resources.

``SandboxedKernelManager`` starts the kernel on an allow-list file system: the system's folders,
the Python installation and the gpulab package read-only, and size-limited private folders
(/tmp, /dev/shm, a working copy of the submission, and KERNEL_DIR for its connection file and
sockets); no home folder, no course folder (keys, solutions, gradebook, other students' work).
Everything else is read-only, the sandbox's own root and /dev included. It has no network: its
own network namespace, and it talks to nbgrader over Unix sockets (jupyter's ``ipc`` transport)
in KERNEL_DIR, which the grader reaches through /proc/<sandbox>/root; the grader takes its
messages up to a size (``max_message_bytes``): a bigger one is never held in the grader's memory.
Its processes live in their own PID namespace, so none outlives it, and a ``Watchdog`` stops it
when they use more memory, processes or CPU time than allowed. A root grader also puts it in a
memory cgroup of its own (``memory_wall``), which counts the memory held in files that the
watchdog's resident count misses.

The kernel has no capabilities anywhere and is never root (issue 34). A grader that is not root
runs bubblewrap in a user namespace of its own, which bubblewrap makes (the kernel is then the
grader's own uid, outside as inside). A root grader runs bubblewrap as root, which builds the file
system with every capability, and ``LAUNCHER`` then becomes ``sandbox_user`` (nobody) for good,
outside the sandbox too: a user namespace made by root would map the kernel to root outside, and
root owns the files the sandbox shows. In both cases the kernel's user namespace allows no further
one (a namespace of its own would give a submission capabilities there: to mount a tmpfs without
a size, say), and no_new_privs is set, so no setuid program gives any back.
autograder/secure_grading.py runs each notebook with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import zmq
from jupyter_client.manager import AsyncKernelManager
from traitlets import Float, Integer, Unicode

import gpulab
from gpulab.gpu_share import own_cgroups


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
    """What this machine's sandbox cannot bound, for `make autograde` to say before it starts
    (SandboxUnavailable, with what to do, where it cannot run at all)."""
    bwrap = bubblewrap()
    if os.getuid() == 0:
        check_readable_to_sandbox(SandboxedKernelManager.sandbox_user.default_value)
    found = []
    if not _bwrap_has(bwrap, "--size"):
        found.append("this bubblewrap is older than 0.8 and cannot size its folders: what a submission "
                     "writes is limited per file, not in total (install a newer bubblewrap)")
    if os.getuid() != 0 and not _bwrap_has(bwrap, "--disable-userns"):
        found.append("this bubblewrap is older than 0.8: a submission may make user namespaces of "
                     "its own (install a newer bubblewrap)")
    if memory_wall_kind()[0] is None:
        found.append("no memory cgroup per submission (it takes a root grader, and systemd or "
                     "cgroup v1): memory a submission holds in files (memfd, System V shared "
                     "memory) is not counted against memory_limit")
    return found


@functools.cache
def _bwrap_has(bwrap: str, option: str) -> bool:
    """Whether this bubblewrap knows ``option`` (--size and --disable-userns came in 0.8)."""
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True).stdout
    return option in help_text.split()


@functools.cache
def check_readable_to_sandbox(user: str) -> None:
    """A root grader's kernel runs as ``user``, who must be able to read the Python installation
    and gpulab (bubblewrap binds them in, so closed folders above them do not matter: a clone in
    a private home folder grades). SandboxUnavailable, naming the file, where one cannot."""
    import ipykernel
    import zmq as pyzmq

    for path in (os.path.realpath(sys.executable), os.__file__, ipykernel.__file__, pyzmq.__file__,
                 gpulab.__file__):
        top = next((t for t in map(os.path.realpath, (*python_install(), _package()))
                    if os.path.realpath(path).startswith(t + os.sep)), None)
        path = Path(os.path.realpath(path))
        for part in [path, *path.parents]:
            mode = part.stat().st_mode
            needed = 0o005 if part.is_dir() else 0o004
            if mode & needed != needed:
                raise SandboxUnavailable(
                    f"grading as root runs each submission as the user {user!r}, who cannot read "
                    f"{part}: make the course's Python and gpulab readable to every user "
                    f"(chmod -R o+rX {top or part})")
            if top is None or str(part) == top:
                break


def sandbox_ids(user: str) -> tuple[int, int]:
    """(uid, gid) a root grader's kernels run as."""
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


# The system's own folders, read-only. Nothing else of the machine is there: no home folder, no
# /root, no /run (sockets of other services), no /var, no /opt, no course folder.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# What of /etc a Python kernel uses (the dynamic linker's cache, users' names, time zone, fonts,
# localhost): not /etc as a whole, which holds e.g. /etc/shadow, readable to a root grader.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "passwd", "group",
             "localtime", "timezone", "fonts", "ssl", "alternatives", "os-release")
# The sandbox's own /etc/hosts (its host name is localhost, and it has no network). It names the
# IPv4-mapped loopback too: torch.distributed's store looks up the address of each rank that
# connects, which a dual-stack socket reports as ::ffff:127.0.0.1; missing from the hosts file,
# the lookup went on to DNS, which no sandbox reaches, and every rank of chapters 05, 06 and 09
# printed "[c10d] The hostname of the client socket cannot be retrieved. err=-3" on stderr.
SANDBOX_HOSTS = "127.0.0.1 localhost\n::1 localhost\n::ffff:127.0.0.1 localhost\n"
# Environment variables a kernel keeps; everything else (tokens, keys, the grader's HOME) is dropped.
KEPT_ENV = ("LANG", "LANGUAGE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
            "PYTHONHASHSEED", "NBGRADER_EXECUTION", "NBGRADER_VALIDATING", "GPULAB_STRICT_CHECKS")
SUBMISSION_ORIGINAL = "/gpulab-submission"   # the submitted folder, read-only, in the sandbox
# In the sandbox: the kernel's connection file and its sockets, on a tmpfs of KERNEL_DIR_BYTES
# (sockets take no room). The grader reaches them as /proc/<sandbox's init>/root/gpulab-kernel.
KERNEL_DIR = "/gpulab-kernel"
KERNEL_DIR_BYTES = 2**20
WALL_MARGIN = 64 * 2**20      # what a memory cgroup charges besides memory and files (memory_wall)


def python_install() -> list[str]:
    """The Python installation the kernel runs from: the venv and the interpreter it was made
    from (e.g. pyenv under /root/.pyenv), resolved through symlinks."""
    found = []
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for candidate in (path, os.path.realpath(path)):
            if candidate not in found:
                found.append(candidate)
    return found


def _package() -> str:
    return str(Path(gpulab.__file__).resolve().parent)


def sandbox_command(workdir: str, connection_fd: int, hosts_fd: int, limits: "Limits") -> list[str]:
    """bubblewrap arguments that run a command on an allow-list file system with no network.

    The kernel sees the system folders and the Python installation read-only, the gpulab
    package, and size-limited private tmpfs folders: /tmp, /dev/shm, KERNEL_DIR (the connection
    file, read from ``connection_fd``, and the ``ipc`` transport's sockets) and a working copy at
    ``workdir``, which ``LAUNCHER`` fills from the submission (bound read-only at
    SUBMISSION_ORIGINAL). An /etc/hosts of its own, read from ``hosts_fd`` (SANDBOX_HOSTS). The
    root and /dev are read-only. Its own network namespace (only a
    loopback of its own), PID, IPC and UTS namespaces; no capabilities (see the module's
    docstring for a root grader).
    """
    bwrap = bubblewrap()
    args = [bwrap]
    binds, made = [Path(d) for d in SYSTEM_DIRS], {Path("/tmp"), Path("/dev")}

    def open_parents(path: str) -> None:
        """The folders above a mount point, open to all: bubblewrap makes them 0700, which a
        root grader's kernel (not root) could not pass (/etc, /root, a private home folder)."""
        for parent in reversed(Path(path).parents[:-1]):
            if parent not in made and not any(b == parent or b in parent.parents for b in binds):
                args.extend(["--perms", "0755", "--dir", str(parent)])
                made.add(parent)

    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):                       # e.g. /bin -> usr/bin (merged /usr)
            args += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            args += ["--ro-bind", folder, folder]
    for name in ETC_FILES:
        if os.path.lexists(f"/etc/{name}"):
            open_parents(f"/etc/{name}")
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for device in sorted(Path("/dev").glob("nvidia*")):   # a GPU, where there is one
        args += ["--dev-bind", str(device), str(device)]
    workdir = str(Path(workdir).resolve())
    size = _bwrap_has(bwrap, "--size")

    def private_folder(folder: str, size_bytes: int) -> None:
        if size:
            args.extend(["--size", str(size_bytes)])
        args.extend(["--tmpfs", folder])

    # The private /tmp comes before the binds: bubblewrap mounts in order, so a Python install or
    # a course that lives under /tmp (a CI clone, say) is bound back into it, not hidden by it.
    private_folder("/tmp", limits.disk_bytes)
    private_folder("/dev/shm", limits.disk_bytes)
    for keep in (*python_install(), _package()):
        open_parents(keep)
        args += ["--ro-bind", keep, keep]
        binds.append(Path(keep))
    open_parents(workdir)
    private_folder(workdir, limits.disk_bytes + _folder_bytes(workdir))
    private_folder(KERNEL_DIR, KERNEL_DIR_BYTES)
    args += ["--perms", "0444", "--ro-bind-data", str(hosts_fd), "/etc/hosts"]
    args += ["--perms", "0444", "--ro-bind-data", str(connection_fd), f"{KERNEL_DIR}/kernel.json",
             "--ro-bind", workdir, SUBMISSION_ORIGINAL, "--chdir", workdir,
             "--remount-ro", "/dev", "--remount-ro", "/",
             "--hostname", "localhost",
             "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--cap-drop", "ALL"]
    if os.getuid() == 0:
        # Only what LAUNCHER needs to hand the private folders to the kernel's user and become
        # it; becoming it clears them (setresuid away from root), before any submission code.
        args += ["--cap-add", "CAP_CHOWN", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"] + (["--disable-userns"] if _bwrap_has(bwrap, "--disable-userns") else [])
    # ipykernel exits when its parent's pid is not its ppid, which a PID namespace changes;
    # --die-with-parent ends the sandbox with its parent instead.
    args += ["--unsetenv", "JPY_PARENT_PID", "--die-with-parent", "--"]
    return args


def _folder_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink())


# Runs first in the sandbox: copies the submission into the working copy; as root (a root
# grader's sandbox) hands the private folders to the kernel's uid and becomes it, in a user
# namespace of its own that allows no further one; sets the per-process limits; then becomes the
# kernel. RLIMIT_NPROC counts per user and user namespace, so it is set only in a user namespace
# of the sandbox's own; at twice the watchdog's limit, it stops what a fork bomb starts between
# two of its looks.
LAUNCHER = """
import ctypes, os, resource, shutil, sys
original, kernel_dir, cpu, size, tasks, uid, gid = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
shutil.copytree(original, '.', symlinks=True, dirs_exist_ok=True)
if os.getuid() == 0:
    for top in ('.', kernel_dir, '/tmp', '/dev/shm'):
        os.chown(top, uid, gid)
    for folder, dirs, files in os.walk('.'):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 1, 0, 0, 0)              # PR_SET_DUMPABLE, as exec makes it: /proc/self is its own
    if libc.unshare(0x10000000) == 0:      # CLONE_NEWUSER
        for name, text in (('setgroups', 'deny'), ('uid_map', f'{uid} {uid} 1'), ('gid_map', f'{gid} {gid} 1')):
            with open(f'/proc/self/{name}', 'w') as f:
                f.write(text)
        try:
            with open('/proc/sys/user/max_user_namespaces', 'w') as f:
                f.write('0')
        except OSError:
            pass                                   # a kernel that confines user namespaces already
limits = [(resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, size), (resource.RLIMIT_CORE, 0)]
if open('/proc/self/uid_map').read().split()[2:3] == ['1']:
    limits.append((resource.RLIMIT_NPROC, 2 * tasks))
for limit, value in limits:
    resource.setrlimit(limit, (value, value))
os.execv(sys.argv[9], sys.argv[9:])
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
    transport) in its KERNEL_DIR, with a ``Watchdog`` on its resources."""

    memory_limit = Integer(8 * 2**30, help="Bytes of resident memory, all of a submission's "
                           "processes together.").tag(config=True)
    process_limit = Integer(1024, help="Processes and threads of a submission at once.").tag(config=True)
    disk_limit = Integer(2**30, help="Bytes a submission may write, in each of /tmp, /dev/shm "
                         "and its working copy (and per file).").tag(config=True)
    cpu_limit = Integer(3600, help="CPU seconds, all of a submission's processes together.").tag(config=True)
    sandbox_user = Unicode("nobody", help="The account a root grader runs each kernel as (an "
                           "account of its own, with nothing to lose, is better still).").tag(config=True)
    watch_interval = Float(0.2, help="Seconds between two looks at a submission's usage.").tag(config=True)
    max_message_bytes = Integer(32 * 2**20, help="Largest message the grader takes from the kernel; "
                                "ZeroMQ drops a bigger one as it arrives (ZMQ_MAXMSGSIZE), so it "
                                "never reaches the grader's memory.").tag(config=True)
    queued_messages = Integer(16, help="Messages ZeroMQ holds for the grader per channel before "
                              "dropping more (ZMQ_RCVHWM).").tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Mode 0700: the grader's copy of the connection file (the kernel gets its own, read-only).
        self.private_dir = tempfile.mkdtemp(prefix="gpulab-kernel-")
        weakref.finalize(self, shutil.rmtree, self.private_dir, ignore_errors=True)
        self.transport = "ipc"
        self.connection_file = os.path.join(self.private_dir, "kernel.json")
        self.ip = f"{KERNEL_DIR}/ipc"          # as the kernel sees it; the grader's, once it runs
        self.watchdog: Watchdog | None = None
        self.memory_wall: SystemdScope | V1MemoryGroup | None = None
        self._out_of_memory = False         # what the wall said when the kernel ended
        self._connection_fd: int | None = None
        self._hosts_fd: int | None = None
        self._not_started: str | None = None
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
        self.ip = f"{KERNEL_DIR}/ipc"                       # a restart writes the kernel's view again
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        uid, gid = -1, -1
        if os.getuid() == 0:
            check_readable_to_sandbox(self.sandbox_user)
            uid, gid = sandbox_ids(self.sandbox_user)
        workdir = kw.get("cwd") or os.getcwd()
        limits = self.limits
        env = {k: v for k, v in (kw.get("env") or os.environ).items() if k in KEPT_ENV}
        env.update(PATH=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
                   HOME="/tmp", IPYTHONDIR="/tmp/ipython", MPLCONFIGDIR="/tmp/matplotlib")
        kw["env"] = env
        # What the kernel prints to its own stdout and stderr would reach the grader's terminal.
        kw["stdout"] = kw["stderr"] = subprocess.DEVNULL
        self._connection_fd = os.open(self.connection_file, os.O_RDONLY)
        self._hosts_fd, write_end = os.pipe()                # SANDBOX_HOSTS, read by bubblewrap
        os.write(write_end, SANDBOX_HOSTS.encode())
        os.close(write_end)
        kw["pass_fds"] = (self._connection_fd, self._hosts_fd)
        cmd = [f"{KERNEL_DIR}/kernel.json" if arg == self.connection_file else arg for arg in cmd]
        launcher = [sys.executable, "-I", "-c", LAUNCHER, SUBMISSION_ORIGINAL, KERNEL_DIR,
                    str(limits.cpu_seconds + 5), str(limits.disk_bytes), str(limits.tasks),
                    str(uid), str(gid), "--"]
        self._remove_memory_wall()                           # a restart's kernel gets a new one
        self._out_of_memory = False
        self.memory_wall = memory_wall(f"{os.getpid()}-{id(self):x}", self.wall_bytes(workdir))
        joins = self.memory_wall.prefix if self.memory_wall else []
        return joins + sandbox_command(workdir, self._connection_fd, self._hosts_fd, limits) + launcher + cmd, kw

    def wall_bytes(self, workdir: str) -> int:
        """The memory wall: resident memory, the private folders (tmpfs pages count in a memory
        cgroup) and WALL_MARGIN for what the Linux kernel charges besides (page tables, caches)."""
        return (self.memory_limit + 3 * self.disk_limit + _folder_bytes(workdir) + KERNEL_DIR_BYTES
                + WALL_MARGIN)           # /tmp, /dev/shm and the working copy: disk_limit each

    def _remove_memory_wall(self) -> None:
        if self.memory_wall:
            self._out_of_memory = self.memory_wall.oom_killed()
            self.memory_wall.remove()
            self.memory_wall = None

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        finally:
            os.close(self._connection_fd)
            os.close(self._hosts_fd)
        bwrap_pid = self.provisioner.process.pid
        init = await _sandbox_init(bwrap_pid)
        if init is None:
            self._not_started = "could not be watched (the grader cannot read the sandbox's /proc)"
            _kill(bwrap_pid)
            return
        # The kernel's sockets, as the grader reaches them: through the sandbox's own root.
        self.ip = f"/proc/{init}/root{KERNEL_DIR}/ipc"
        self.watchdog = Watchdog(init, bwrap_pid, self.limits, self.watch_interval)
        self.watchdog.start()

    @property
    def stopped_because(self) -> str | None:
        reason = self.watchdog.reason if self.watchdog else self._not_started
        if reason is None and (self._out_of_memory or (self.memory_wall and self.memory_wall.oom_killed())):
            reason = (f"used more than {_size(self.memory_limit)} of memory, counting what it held "
                      "in files (the Linux kernel stopped it at its memory wall)")
        return reason

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        if self.watchdog:
            self.watchdog.stop()
        await super()._async_cleanup_resources(restart)
        self._remove_memory_wall()
        if not restart:
            shutil.rmtree(self.private_dir, ignore_errors=True)


async def _sandbox_init(bwrap_pid: int, patience: float = 60) -> int | None:
    """bubblewrap's first child, the sandbox's PID 1, once its /proc is the sandbox's own; None
    when bubblewrap ended first or it takes longer than ``patience`` seconds."""
    give_up = time.monotonic() + patience
    while time.monotonic() < give_up:
        init = _child_of(bwrap_pid)
        if init is None and not Path(f"/proc/{bwrap_pid}").exists():
            return None
        try:
            if init and os.readlink(f"/proc/{init}/ns/pid") == os.readlink(f"/proc/{init}/root/proc/1/ns/pid") \
                    and os.path.isdir(f"/proc/{init}/root{KERNEL_DIR}"):
                return init
        except OSError:
            pass                            # not set up yet (or already gone)
        await asyncio.sleep(0.02)
    return None


class Watchdog(threading.Thread):
    """Looks at a sandbox's processes every ``interval`` seconds (through the sandbox's own
    /proc, which lists only them) and kills the sandbox when they use more than ``limits``, or
    put anything but sockets in KERNEL_DIR."""

    def __init__(self, init: int, bwrap_pid: int, limits: Limits, interval: float):
        super().__init__(daemon=True, name=f"watchdog-{bwrap_pid}")
        self.init, self.bwrap_pid, self.limits, self.interval = init, bwrap_pid, limits, interval
        self.reason: str | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            usage = sandbox_usage(self.init)
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
            elif _grew(f"/proc/{self.init}/root{KERNEL_DIR}"):
                self.reason = "wrote files into the folder of its connection sockets"
            if self.reason:
                _kill(self.init, self.bwrap_pid)
                return


def _kill(*pids: int | None) -> None:
    """SIGKILL to the sandbox's init (the kernel then ends every process in its PID namespace)
    and to bubblewrap."""
    for pid in pids:
        try:
            if pid:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _grew(kernel_dir: str) -> bool:
    """Whether the kernel's socket folder holds more than its connection file and a few sockets
    (what it writes there without a name, O_TMPFILE, is bounded by the folder's size)."""
    try:
        entries = [e for e in os.scandir(kernel_dir) if e.name != "kernel.json"]
        return len(entries) > 16 or not all(stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode) for e in entries)
    except OSError:
        return False


def _child_of(pid: int) -> int | None:
    """The first child process of ``pid`` (bubblewrap's PID-namespace init), or None."""
    with os.scandir("/proc") as entries:        # closed on return too (no ResourceWarning)
        for entry in entries:
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


# ------------------------------------------------------------------------------ the memory wall
# The watchdog counts resident memory. Memory held in files, a memfd or System V shared memory
# that no process maps, is in no process's resident set; a memory cgroup counts it (and the
# private tmpfs folders, which is why the wall adds their sizes). So a root grader puts each
# submission in one of its own, systemd's way where systemd runs the machine, or cgroup v1's; the
# Linux kernel then stops the submission at the wall. A grader that is not root cannot make one.


def memory_wall_kind() -> tuple[str | None, Path | None]:
    """("systemd", None), ("cgroup v1", the grader's own memory cgroup), or (None, None) where
    this grader cannot make a memory cgroup (not root, or cgroup v2 without systemd)."""
    if os.geteuid() != 0:
        return None, None
    if Path("/run/systemd/system").is_dir() and shutil.which("systemd-run"):   # sd_booted(3)
        return "systemd", None
    own = own_cgroups().get("memory")
    base = Path("/sys/fs/cgroup/memory") / (own or "").lstrip("/")
    if own is not None and base.is_dir() and os.access(base, os.W_OK):
        return "cgroup v1", base
    return None, None


def memory_wall(name: str, limit_bytes: int):
    """A memory cgroup of ``limit_bytes`` for one submission (a SystemdScope or a V1MemoryGroup),
    or None where this grader cannot make one (memory_wall_kind)."""
    kind, base = memory_wall_kind()
    if kind == "systemd":
        return SystemdScope(name, limit_bytes)
    if kind == "cgroup v1":
        return V1MemoryGroup(base / "gpulab-grading" / name, limit_bytes)
    return None


class SystemdScope:
    """The submission in a transient scope (systemd-run(1) --scope) with MemoryMax= and no swap
    (systemd.resource-control(5)). A scope runs the command in systemd-run's own process, so the
    kernel manager keeps bubblewrap's pid."""

    def __init__(self, name: str, limit_bytes: int):
        self.unit = f"gpulab-grading-{name}.scope"
        self.prefix = ["systemd-run", "--scope", "--quiet", f"--unit={self.unit}",
                       "--property", f"MemoryMax={limit_bytes}", "--property", "MemorySwapMax=0", "--"]

    def oom_killed(self) -> bool:
        shown = subprocess.run(["systemctl", "show", "--property=Result", "--value", self.unit],
                               capture_output=True, text=True)
        return shown.stdout.strip() == "oom-kill"

    def remove(self) -> None:
        for verb in ("kill", "reset-failed"):    # a scope that failed stays loaded until reset
            subprocess.run(["systemctl", verb, self.unit], capture_output=True)


class V1MemoryGroup:
    """The submission in a cgroup v1 memory group of its own, under the grader's (swap counted
    where the kernel accounts it). bubblewrap joins it before it starts: a shell writes its own
    pid into cgroup.procs and becomes bubblewrap, so every process of the sandbox is inside."""

    def __init__(self, folder: Path, limit_bytes: int):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "memory.limit_in_bytes").write_text(f"{limit_bytes}\n")
        if (folder / "memory.memsw.limit_in_bytes").exists():
            (folder / "memory.memsw.limit_in_bytes").write_text(f"{limit_bytes}\n")
        self.prefix = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(folder / "cgroup.procs")]

    def oom_killed(self) -> bool:
        try:                                 # "oom_kill N" since Linux 4.13
            killed = re.search(r"^oom_kill (\d+)$", (self.folder / "memory.oom_control").read_text(), re.M)
        except OSError:
            return False
        return bool(killed and int(killed.group(1)))

    def remove(self, patience: float = 10) -> None:
        give_up = time.monotonic() + patience
        while self.folder.is_dir() and time.monotonic() < give_up:
            for pid in (self.folder / "cgroup.procs").read_text().split():
                _kill(int(pid))
            try:
                self.folder.rmdir()
            except OSError:                  # busy until its last process has exited
                time.sleep(0.05)
        try:
            self.folder.parent.rmdir()       # the grader's gpulab-grading, once no job uses it
        except OSError:
            pass


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"
