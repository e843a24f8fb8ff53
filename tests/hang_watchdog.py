"""A hung test is ended, shown and run once more, instead of holding `make test` for good.

Twice a CI run printed all but 17 results and then nothing until CI's 5400 s ran out, with no
word from pytest-timeout (issues 32 and 40). Its thread cannot end a worker whose threads never
run (stopped, frozen) or whose C code holds the GIL, and its dump goes to a worker's own output,
which the run never shows. So under xdist the watching moves out of the worker:

- Each worker writes, at each test's start and end, which test it runs and since when
  (``<folder>/<worker>.json``), and registers faulthandler for SIGUSR1: a C signal handler that
  writes every thread's Python stack without the GIL.
- A thread in the controller (``make test``'s own pytest, which runs no test) reads those files.
  A test past ``HANG_S`` (setup and teardown included, as pytest-timeout counted them) has its
  worker's processes described (state, what each thread waits on in the kernel, its kernel stack
  as root can read it, the Python stacks), and the worker and everything it started are killed.
- xdist (``--dist loadscope``) then hands the rest of that module to a fresh worker, the hung
  test first, and the crash is reported as a rerun. A test that hangs a second time is ended
  again, and its next start fails at once with what both hangs showed. The summary lists every
  hang, so a rerun is never silent.

pytest-timeout stays for a run without xdist (``timeout`` in pyproject.toml); under xdist this
takes its place. GPULAB_HANG_S sets the limit (tests/test_hang_watchdog.py plants hangs of 3 s).
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

import pytest

HANG_S = float(os.environ.get("GPULAB_HANG_S", 900))
KEY = "gpulab_watchdog_folder"
CONDEMNED = "hung-twice"      # JSON: {test id: what its hangs showed}, for the workers


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

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        condemned = self.state.parent / CONDEMNED
        if condemned.exists() and item.nodeid in (seen := json.loads(condemned.read_text())):
            pytest.fail("it hung twice and was ended both times; not run a third time\n\n"
                        + seen[item.nodeid], pytrace=False)

    def pytest_runtest_logfinish(self, nodeid):
        self._write(None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_set_timer(self, item, settings):
        return True                 # the controller watches instead (no timer of pytest-timeout's)

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_cancel_timer(self, item):
        return True


# ------------------------------------------------------------------------------ the controller

def processprocess_stat(pid: int) -> tuple[str, str, int] | None:
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
    def __init__(self, config):
        self.config = config
        self.folder = Path(tempfile.mkdtemp(prefix="gpulab-watchdog-"))
        self.hangs: dict[str, list[str]] = {}     # test id: what was seen each time it hung
        self.seen: set[tuple[int, str]] = set()
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
                running = (state["pid"], state["nodeid"])
                if state["nodeid"] and time.time() - state["since"] > HANG_S and running not in self.seen:
                    self.seen.add(running)
                    self._end(state_file.stem, *running, time.time() - state["since"])

    def _end(self, worker: str, pid: int, nodeid: str, seconds: float) -> None:
        tree = process_tree(pid)
        seen = [f"{nodeid} ran {seconds:.0f} s on {worker} (limit {HANG_S:.0f} s); its processes:",
                describe(tree)]
        stacks = self.folder / f"{worker}.{pid}.stacks"
        if (process_stat(pid) or ("", "?"))[1] not in "TtZX":       # a stopped process runs no handler
            os.kill(pid, signal.SIGUSR1)
            time.sleep(1)
        seen += ["Python stacks of the worker (faulthandler):", _read(str(stacks), 20000) or "(none written)"]
        for victim in tree:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        times = self.hangs.setdefault(nodeid, [])
        times.append("\n".join(seen))
        if len(times) == 2:
            condemned = {n: "\n\n".join(t) for n, t in self.hangs.items() if len(t) >= 2}
            (self.folder / "partial").write_text(json.dumps(condemned))
            (self.folder / "partial").replace(self.folder / CONDEMNED)
        sys.stderr.write("\n\nHUNG TEST ENDED: " + "\n".join(seen) + "\n")
        sys.stderr.flush()
        deadline = time.monotonic() + 60
        while (process_stat(pid) or ("", "Z"))[1] not in "ZX":
            if time.monotonic() > deadline:
                sys.stderr.write(f"\nworker {worker} (pid {pid}) did not end when killed: {describe([pid])}\n"
                                 "ending the test run\n")
                sys.stderr.flush()
                os._exit(3)
            time.sleep(1)

    def pytest_handlecrashitem(self, crashitem, report, sched):
        if crashitem not in self.hangs:
            return
        report.longrepr = f"{report.longrepr}: it hung and was ended\n\n" + self.hangs[crashitem][-1]
        from xdist.scheduler import LoadScopeScheduling
        if isinstance(sched, LoadScopeScheduling):
            report.outcome = "rerun"      # loadscope has put its module back, this test first

    def pytest_report_teststatus(self, report):
        if report.outcome == "rerun":
            return "rerun", "R", ("RERUN", {"yellow": True})

    def pytest_terminal_summary(self, terminalreporter):
        if self.hangs:
            terminalreporter.section("hung tests, ended by tests/hang_watchdog.py")
            for nodeid, times in self.hangs.items():
                verdict = "ended and run again" if len(times) == 1 else "hung twice: failed"
                terminalreporter.write_line(f"{nodeid}: {verdict}")
                for seen in times:
                    terminalreporter.write_line(seen)

    def pytest_unconfigure(self, config):
        self.stopped.set()
        shutil.rmtree(self.folder, ignore_errors=True)


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        folder = config.workerinput.get(KEY)
        if folder:
            config.pluginmanager.register(WorkerSide(Path(folder), config.workerinput["workerid"]))
    elif config.pluginmanager.hasplugin("xdist") and getattr(config.option, "numprocesses", None):
        config.pluginmanager.register(ControllerSide(config))
