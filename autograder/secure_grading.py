"""Grading that holds: verdicts outside the learner's kernel, each submission in a sandbox.

nbgrader's own autograde runs each notebook and scores a test cell by whether it raised. Code in
an answer cell runs in the same kernel as the tests, so it can patch the checker, return an
object that equals everything, or read the answer key from disk. Here the roles are split:

1. ``NormalizeCells`` (before nbgrader's sanitising) makes the submitted notebook's graded cells
   match the instructor's: deleted ones come back, duplicates and cells claiming unknown ids lose
   their grading metadata, retyped ones get their type back, and every change is flagged.
2. ``ExecuteSandboxed`` runs the notebook in a kernel inside bubblewrap, on an allow-list
   file system: the system's folders, the Python installation and the gpulab package read-only,
   and size-limited private folders (/tmp, /dev/shm, a working copy of the submission); no
   home folder, no course folder (keys, solutions, gradebook, other students' work). It has no
   network: its own network namespace, and it talks to nbgrader over Unix sockets (jupyter's
   ``ipc`` transport) in a private folder. Its processes live in their own PID namespace, so
   none outlives it, and a ``Watchdog`` stops it when they use more memory, processes or CPU
   time than allowed. A cell over its time limit, a kernel death (``os._exit``, a segfault), a
   limit reached, or the notebook's total time limit stops the run with a message; grading
   goes on with what ran.
3. In the kernel, ``gpulab.course.checks.check`` only *records* each answer (a plain number or text).
   ``GradeRecordedAnswers`` then judges the records against the instructor's key, here in the
   grading process, and rewrites each test cell's output to the verdict: a diagnostic error
   (zero) or a pass. It also caps every output's size.

What this cannot stop: a learner who knows the right number can type it. With a course seed
(``GradeRecordedAnswers.course_seed``) each student's quizzes have numbers of their own
(gpulab.course.variants), so a classmate's number, or the solutions', is not the right one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
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

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbgrader.api import Gradebook
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Float, Integer, Unicode

import gpulab
from gpulab.course import variants
from gpulab.course.checks import RECORD_MIME, Item, WrongAnswer, import_key, items_by_id, judge

INTEGRITY_LOG = "integrity.jsonl"  # one line per finding, beside the gradebook
PROGRESS_LOG = "progress.jsonl"    # one line per notebook graded, beside the gradebook


# ------------------------------------------------------------------------------------------
# The sandbox

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


# ------------------------------------------------------------------------------------------
# 1. Graded cells as the instructor made them

def _flag(resources, message: str) -> None:
    resources.setdefault("gpulab_flags", []).append(message)


# nbgrader runs two passes (sanitise, then execute and grade) with fresh resources; the
# findings of the first travel to the second in the notebook's metadata, under this name.
CARRY = "gpulab_grading"


class NormalizeCells(NbGraderPreprocessor):
    """Graded and answer cells back to the instructor's layout, every change flagged."""

    def preprocess(self, nb, resources):
        nb.metadata.pop(CARRY, None)  # only this step writes it
        nb, resources = self._normalize(nb, resources)
        nb.metadata[CARRY] = {"flags": resources.get("gpulab_flags", [])}
        return nb, resources

    def _normalize(self, nb, resources):
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            source = gb.find_notebook(info["notebook"], info["assignment"])
            cells = {c.name: (c.cell_type, c.source, c.locked) for c in source.source_cells}
            points = {c.name: c.max_score for c in source.grade_cells}
            solutions = {c.name for c in source.solution_cells}
            order = [c.name for c in source.source_cells]

        def metadata(grade_id: str) -> dict:
            """The cell's nbgrader metadata as the instructor's source has it."""
            meta = {"grade": grade_id in points, "solution": grade_id in solutions,
                    "locked": cells[grade_id][2], "grade_id": grade_id, "schema_version": 3}
            if grade_id in points:
                meta["points"] = points[grade_id]
            return meta

        seen = set()
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if meta is None:
                continue
            grade_id = meta.get("grade_id")
            if grade_id not in cells or grade_id in seen:
                why = "a second copy of" if grade_id in seen else "an unknown"
                _flag(resources, f"removed grading metadata from {why} cell {grade_id!r}")
                del cell.metadata["nbgrader"]
                cell.metadata.pop("deletable", None)
                cell.metadata.pop("editable", None)
                continue
            seen.add(grade_id)
            cell_type, text, locked = cells[grade_id]
            expected = metadata(grade_id)
            changed = [k for k, v in expected.items() if k != "schema_version" and meta.get(k) != v]
            if changed or set(meta) - set(expected) - {"checksum", "cell_type"}:
                _flag(resources, f"restored the grading metadata of {grade_id!r} ({', '.join(changed) or 'extra keys'})")
            cell.metadata["nbgrader"] = expected
            if cell.cell_type != cell_type:
                _flag(resources, f"restored {grade_id!r} as a {cell_type} cell (it was {cell.cell_type})")
                _retype(cell, cell_type)
            if locked and cell.source != text:
                _flag(resources, f"restored the text of locked cell {grade_id!r}")
                cell.source = text
        for position, grade_id in enumerate(order):
            if grade_id in seen or grade_id not in points and grade_id not in solutions:
                continue
            _flag(resources, f"put back deleted cell {grade_id!r}")
            cell_type, text, _ = cells[grade_id]
            cell = _new_cell(cell_type, text)
            cell.metadata["nbgrader"] = metadata(grade_id)
            nb.cells.insert(_insert_at(nb, order[:position]), cell)
            seen.add(grade_id)
        return nb, resources


def _retype(cell, cell_type: str) -> None:
    fresh = _new_cell(cell_type, cell.source)
    fresh.metadata = cell.metadata
    fresh.id = cell.get("id", fresh.id)
    cell.clear()
    cell.update(fresh)


def _new_cell(cell_type: str, text: str):
    return nbformat.v4.new_code_cell(text) if cell_type == "code" else nbformat.v4.new_markdown_cell(text)


def _insert_at(nb, earlier_ids: list[str]) -> int:
    """After the last cell whose grade_id comes before the missing one in the source."""
    position = 0
    for index, cell in enumerate(nb.cells):
        if cell.metadata.get("nbgrader", {}).get("grade_id") in earlier_ids:
            position = index + 1
    return position


# ------------------------------------------------------------------------------------------
# 2. Running the notebook in the sandbox, with limits

class _StopRun(Exception):
    pass


class ExecuteSandboxed(Execute):
    """nbgrader's Execute in a sandboxed kernel; a cell or notebook time limit or a kernel
    death stops the run with a message instead of failing the whole submission."""

    notebook_timeout = Integer(900, help="Seconds for the whole notebook.").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def create_kernel_manager(self):
        self.sandbox = super().create_kernel_manager()     # nbclient drops its km when done
        return self.sandbox

    def preprocess(self, nb, resources=None, km=None):
        self.sandbox = None
        resources["gpulab_flags"] = list(nb.metadata.pop(CARRY, {}).get("flags", []))
        self._deadline = time.monotonic() + self.notebook_timeout
        try:
            return super().preprocess(nb, resources, km)
        except (DeadKernelError, CellTimeoutError, _StopRun, RuntimeError) as stop:
            over_limit = getattr(self.sandbox, "stopped_because", None)
            if over_limit:
                why = f"the submission {over_limit} (a limit per submission)"
            elif isinstance(stop, _StopRun):
                why = str(stop)
            elif isinstance(stop, CellTimeoutError):
                why = "a cell ran past its time limit"
            elif isinstance(stop, DeadKernelError) or "kernel died" in str(stop).lower():
                why = "the kernel died (the process exited, crashed or hit a limit)"
            else:
                raise
            resources.setdefault("gpulab", {})["stopped"] = why
            _flag(resources, f"execution stopped: {why}")
            return nb, resources

    def _get_timeout(self, cell):
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _StopRun(f"the notebook ran past its limit of {self.notebook_timeout} s")
        timeout = super()._get_timeout(cell)
        return remaining if timeout is None else min(timeout, remaining)

    async def _async_handle_timeout(self, timeout, cell=None):
        # A kernel that swallows the interrupt would stall every later cell: stop here.
        raise _StopRun(f"a cell ran longer than {timeout:.0f} s")


# ------------------------------------------------------------------------------------------
# 3. Verdicts from the records, outside the kernel

class GradeRecordedAnswers(NbGraderPreprocessor):
    """Judge each test cell's recorded answer against the instructor's key; cap outputs."""

    keys_dir = Unicode(help="Folder of the instructor's answer keys (NN_topic.py).").tag(config=True)
    course_seed = Unicode("", help="Per-student numbers (gpulab.course.variants): the course's seed; "
                          "empty, everyone has the chapter's own numbers.").tag(config=True)
    max_output_chars = Integer(100_000, help="Largest output kept, in characters.").tag(config=True)

    def preprocess(self, nb, resources):
        assignment = resources["nbgrader"]["assignment"]
        key_file = next(Path(self.keys_dir).glob(f"{assignment[:2]}_*.py"), None)
        # Each student is judged against the key for their own numbers (drawn from the id of
        # their submission folder, never from the notebook), and sees their own quiz texts.
        student = resources["nbgrader"].get("student") or ""
        items, questions = (variants.student_key(import_key(key_file), self.course_seed, student,
                                                 key_file.stem) if key_file else ([], {}))
        key = items_by_id(items, key_file)
        stopped = resources.get("gpulab", {}).get("stopped")
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = [self._capped(o) for o in cell.outputs]
                if (shown := variants.question_of(cell)) in questions:
                    cell.outputs = [variants.question_output(questions[shown])]
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            item_id = meta["grade_id"].removeprefix("test-")
            passed, message = _verdict(item_id, cell, key, stopped)
            cell.outputs = [_pass(message) if passed else _fail(message)]
        flags = resources.get("gpulab_flags", [])
        if flags:
            note = "**Grading notes** (for you and your instructor):\n\n" + "\n".join(f"- {f}" for f in flags)
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(note))
            _log(resources, INTEGRITY_LOG, [{"finding": flag} for flag in flags])
        _log(resources, PROGRESS_LOG, [{"findings": len(flags)}])
        return nb, resources

    def _capped(self, output):
        size = len(json.dumps(output, default=str))
        if size <= self.max_output_chars:
            return output
        return nbformat.v4.new_output("stream", name="stdout",
                                      text=f"[output of {size:,} characters removed: over the "
                                           f"{self.max_output_chars:,} limit]\n")


def _verdict(item_id: str, cell, key: dict[str, Item], stopped: str | None) -> tuple[bool, str]:
    if item_id not in key:
        return False, f"{item_id}: not in the instructor's answer key (tell your instructor)."
    records = [o["data"][RECORD_MIME] for o in cell.get("outputs", [])
               if o.get("output_type") in ("display_data", "execute_result") and RECORD_MIME in o.get("data", {})]
    if not records:
        if stopped:
            return False, f"{item_id}: not graded, because {stopped} before this cell ran."
        return False, f"{item_id}: no answer was recorded (did this cell run `check(...)`?)."
    if len(records) > 1:
        return False, f"{item_id}: more than one answer was recorded; only one counts, so none does."
    record = records[0]
    if not isinstance(record, dict) or record.get("item") != item_id or len(record) != 2:
        return False, f"{item_id}: the recorded answer is malformed."
    kind, value = next((k, v) for k, v in record.items() if k != "item")
    if kind == "error" and isinstance(value, str):
        return False, value[:500]
    if kind == "text" and isinstance(value, str):
        answer = value
    elif kind == "value" and type(value) in (int, float) and math.isfinite(value):
        answer = float(value)
    else:
        return False, f"{item_id}: the recorded answer is malformed."
    try:
        return True, judge(key[item_id], answer)
    except WrongAnswer as wrong:
        return False, str(wrong)


def _pass(message: str):
    return nbformat.v4.new_output("stream", name="stdout", text=message + "\n")


def _fail(message: str):
    return nbformat.v4.new_output("error", ename="WrongAnswer", evalue=message,
                                  traceback=[f"\x1b[31m✘ {message}\x1b[0m"])


def _log(resources, name: str, entries: list[dict]) -> None:
    """Append one line per entry to the log ``name`` beside the gradebook (make autograde
    prints them as they come)."""
    info = resources["nbgrader"]
    db_path = info["db_url"].removeprefix("sqlite:///")
    with open(Path(db_path).parent / name, "a") as log:
        for entry in entries:
            log.write(json.dumps({"student": info.get("student"), "assignment": info["assignment"],
                                  "notebook": info["notebook"], **entry}) + "\n")
