"""A hung test ends `make test` within minutes, saying where it hung, instead of holding it for good.

Twice a CI run printed all but 17 results and then nothing until CI's 5400 s ran out, pytest-timeout
silent (stops 32 and 40 in `issues stops`). The cause, found when a fresh clone's run hung here the same way:
a DDP object freed by the garbage collector after its process group was destroyed, in a later
test; its reducer dropped the group's last reference while holding the GIL, and gloo's destructor
waited for a worker thread that waited for the GIL (gpulab/parallel/train_ddp.py's main). No
Python thread of that worker could run again: not pytest-timeout's, whose dump would in any case
go to the worker's own output, which the run never shows. So under xdist the watching moves out
of the worker:

- Each worker writes, at each test's start and end, which test it runs and since when
  (``<folder>/<worker>.json``), and registers faulthandler for SIGUSR1: a C signal handler that
  writes every thread's Python stack without the GIL.
- A thread in the controller (``make test``'s own pytest, which runs no test) reads those files.
  A test still running ``HANG_S`` after its start (setup and teardown included) is one that
  pytest-timeout (900 s, ``timeout`` in pyproject.toml) could not end. Its worker's processes are
  described (state, what each thread waits on in the kernel, its kernel stack as root reads it,
  the Python stacks), every process of the run but the controller is killed, and the run ends
  with exit status 3.

GPULAB_HANG_S sets the limit (tests/test_hang_watchdog.py plants a hang of 2 s).
"""
from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

HANG_S = float(os.environ.get("GPULAB_HANG_S", 960))
KEY = "gpulab_watchdog_folder"


# ---------------------------------------------------------------------------------- the worker

class WorkerSide:
    def __init__(self, folder: Path, worker: str):
        self.state = folder / f"{worker}.json"
        self.stacks = open(folder / f"{worker}.{os.getpid()}.stacks", "w")
        faulthandler.register(signal.SIGUSR1, file=self.stacks, all_threads=True)

    def _write(self, nodeid: str | None) -> None:
        partial = self.state.with_suffix(".partial")
        partial.write_text(json.dumps({"pid": os.getpid(), "nodeid": nodeid, "since": time.time()}))
        partial.replace(self.state)

    def pytest_runtest_logstart(self, nodeid):
        self._write(nodeid)

    def pytest_runtest_logfinish(self, nodeid):
        self._write(None)


# ------------------------------------------------------------------------------ the controller

def process_stat(pid: int) -> tuple[str, str, int] | None:
    """(name, state, parent pid) from /proc/<pid>/stat, which takes no lock of the process's
    memory (a read of its cmdline may wait as long as it is held)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return name, rest[0], int(rest[1])


def process_tree(root: int, leave_out: str = "") -> list[int]:
    """``root`` and every process it started, children before grandchildren; without the
    processes named ``leave_out`` and what they started."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := process_stat(int(entry))) and stat[0] != leave_out:
            parents[int(entry)] = stat[2]
    tree = [root]
    for pid in tree:
        tree += sorted(child for child, parent in parents.items() if parent == pid)
    return tree


def _read(path: str, limit: int = 2000) -> str:
    try:
        return Path(path).read_text(errors="replace")[:limit].strip()
    except OSError as error:
        return f"({error.strerror})"


def describe(pids: list[int]) -> str:
    """Each process and thread: state, the kernel function it waits in, its kernel stack."""
    lines = []
    for pid in pids:
        stat = process_stat(pid)
        if stat is None:
            continue
        lines.append(f"process {pid} ({stat[0]}), state {stat[1]}, parent {stat[2]}")
        try:
            threads = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            threads = []
        for tid in threads:
            task = f"/proc/{pid}/task/{tid}"
            state = (process_stat(tid) or ("", "?", 0))[1]
            lines.append(f"  thread {tid}: state {state}, waits in {_read(task + '/wchan') or '-'}")
            stack = _read(task + "/stack")
            if stack and not stack.startswith("("):
                lines += [f"    {frame}" for frame in stack.splitlines()[:12]]
    return "\n".join(lines)


class ControllerSide:
    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="gpulab-watchdog-"))
        self.stopped = threading.Event()
        threading.Thread(target=self._watch, name="hang watchdog", daemon=True).start()

    def pytest_configure_node(self, node):
        node.workerinput[KEY] = str(self.folder)

    def _watch(self) -> None:
        while not self.stopped.wait(min(5.0, HANG_S / 3)):
            for state_file in self.folder.glob("*.json"):
                try:
                    state = json.loads(state_file.read_text())
                except (OSError, ValueError):
                    continue
                if state["nodeid"] and time.time() - state["since"] > HANG_S:
                    self._end(state_file.stem, state["pid"], state["nodeid"], time.time() - state["since"])

    def _end(self, worker: str, pid: int, nodeid: str, seconds: float) -> None:
        """Say where the test hung, kill every process of the run but this one, and end the run."""
        seen = [f"HUNG TEST: {nodeid} has run {seconds:.0f} s on {worker} (limit {HANG_S:.0f} s); "
                "its worker's processes:", describe(process_tree(pid))]
        try:
            if (process_stat(pid) or ("", "?"))[1] not in "TtZX":    # a stopped process runs no handler
                os.kill(pid, signal.SIGUSR1)
                time.sleep(1)
            seen += ["Python stacks of the worker (faulthandler):",
                     _read(str(self.folder / f"{worker}.{pid}.stacks"), 20000) or "(none written)"]
        finally:
            sys.stderr.write("\n\n" + "\n".join(seen) + "\n\nending the test run (tests/hang_watchdog.py)\n")
            sys.stderr.flush()
            for victim in process_tree(os.getpid())[1:]:
                try:
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os._exit(3)

    def pytest_unconfigure(self, config):
        self.stopped.set()
        shutil.rmtree(self.folder, ignore_errors=True)


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        folder = config.workerinput.get(KEY)
        if folder:
            config.pluginmanager.register(WorkerSide(Path(folder), config.workerinput["workerid"]))
    elif config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None):
        config.pluginmanager.register(ControllerSide())
