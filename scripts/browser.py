"""The course seen through a real browser: Debian's Chromium driven by Playwright.

Shared by the browser tests (tests/test_browser.py, tests/test_book.py) and `make screenshots`
(scripts/screenshots.py), so that what is tested is what is pictured:

- ``chromium()``: the system Chromium (no browser download), with background networking off, so
  that on a machine without internet it does not flood the network with refused connections;
- ``jupyterlab(course)``: JupyterLab started exactly as `make lab` starts it (the learner's lab;
  ``target="formgrader"``: the instructor's), in a scratch copy of the course (autosave,
  workspaces and the Formgrader's gradebook write there, not into the repository), on a free port
  with a token, with a Jupyter config folder of its own in place of ~/.jupyter; stopped
  afterwards with every kernel, no process left;
- ``only_local(page)``: every request that is not to this machine is blocked (and counted);
- small JupyterLab moves: open a notebook, Run All and wait for the last cell, save, edit a cell.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-gpu"]
VIEWPORT = {"width": 1280, "height": 900}


@contextlib.contextmanager
def chromium():
    """A headless Chromium (Playwright Browser), closed afterwards."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"no Chromium at {CHROMIUM}: apt-get install chromium "
                           "(make test installs it when run as root)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Console:
    """What a page reported: console errors, uncaught exceptions, HTTP errors, blocked requests."""

    def __init__(self, page):
        self.errors: list[str] = []
        self.blocked: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        page.on("response", lambda r: r.status >= 500 and self.errors.append(
            f"HTTP {r.status}: {r.url}"))


def only_local(page, console: Console) -> None:
    """Block every request that leaves this machine (file:// and 127.0.0.1 pass)."""
    def route(request_route):
        url = request_route.request.url
        if url.startswith(("file://", "http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")):
            request_route.continue_()
        else:
            console.blocked.append(url)
            request_route.abort()
    page.route("**/*", route)


# ------------------------------------------------------------------------------------------
# JupyterLab, as `make lab` starts it

def scratch_course(dest: Path) -> Path:
    """A copy of the course to run JupyterLab in: notebooks, solutions, nbgrader's config and
    keys, and the Makefile with what its lab targets read (lab/: each lab's settings)."""
    sys.path.insert(0, str(ROOT / "autograder"))
    from scratch_course import copy_course

    copy_course(dest)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, dest / name)
    for folder in ("scripts", "lab"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, url: str, token: str, course: Path, process: subprocess.Popen):
        self.url, self.token, self.course, self.process = url, token, course, process

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def open(self, page, path: str) -> None:
        """Open a path in a fresh workspace (?reset), so that no earlier tab is reopened."""
        page.goto(f"{self.url}/lab/tree/{path}?reset&token={self.token}")

    def close_sessions(self) -> None:
        """Shut down every notebook's kernel (they hold memory between chapters)."""
        for session in self.api("/api/sessions"):
            self.api(f"/api/sessions/{session['id']}", method="DELETE")


@contextlib.contextmanager
def jupyterlab(course: Path, log: Path | None = None, target: str = "lab"):
    """`make lab` (or another of the Makefile's lab targets: `formgrader`) in ``course`` (a
    scratch copy) on a free port; yields a Lab. Its Jupyter config folder (JUPYTER_CONFIG_DIR,
    ~/.jupyter otherwise: user settings, and the workspaces of any lab that does not keep its
    own) is ``course/.jupyter``. On exit the server is asked to shut down (it stops its kernels),
    then its process group is ended; RuntimeError if a kernel process outlives it."""
    venv = Path(sys.executable).parent.parent   # the venv this runs in: the course's own
    port, token = free_port(), secrets.token_hex(16)
    lab_args = (f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} "
                f"--LabApp.user_settings_dir={course / '.lab-settings'} "
                "--ServerApp.port_retries=0")
    # -o: the venv is ready (this is running in it); do not let make rebuild it.
    command = ["make", "-s", "-C", str(course), "-o", f"{venv}/.gpulab-ready", f"VENV={venv}",
               target, f"LAB_ARGS={lab_args}"]
    out = open(log or os.devnull, "a")
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "JUPYTER_CONFIG_DIR": str(course / ".jupyter")})
    lab = Lab(f"http://127.0.0.1:{port}", token, course, process)
    kernels: set[str] = set()
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                lab.api("/api/status")
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start (make lab exited {process.poll()})")
                time.sleep(0.5)
        yield lab
    finally:
        with contextlib.suppress(OSError):
            kernels = {k["id"] for k in lab.api("/api/kernels")}
            lab.api("/api/shutdown", method="POST")
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)   # anything left in make's process group
        process.wait()
        out.close()
        left = _processes_naming(kernels)
        if left:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise RuntimeError(f"kernel processes outlived JupyterLab: {left}")


def _processes_naming(kernel_ids: set[str]) -> list[int]:
    """PIDs whose command line names one of these kernels (its connection file)."""
    return [pid for pid, cmdline in command_lines().items()
            if any(kernel_id in cmdline for kernel_id in kernel_ids)]


UNREADABLE = "(its command line could not be read)"


def _read_command_lines(pids: list[int], found: dict[int, str]) -> None:
    while pids:
        try:
            pid = pids.pop()
        except IndexError:                 # another reader took the last one
            return
        found[pid] = UNREADABLE            # so it stays while the read below waits
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:                    # it ended
            found.pop(pid, None)


def command_lines(patience: float = 5.0) -> dict[int, str]:
    """Every process's command line, by pid. A read of /proc/<pid>/cmdline waits for as long as
    that process's memory map stays locked, and only SIGKILL ends that wait. So a thread reads
    them; when it has not moved on in ``patience`` seconds, the process it waits on is left
    UNREADABLE and a new thread reads the rest. (This scan was once suspected of two CI runs
    that hung; the cause was a DDP deadlock, gpulab/parallel/train_ddp.py's main says which.)"""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    found: dict[int, str] = {}
    while pids:
        reader = threading.Thread(target=_read_command_lines, args=(pids, found), daemon=True)
        reader.start()
        left = len(pids)
        while reader.is_alive():
            reader.join(patience)
            if reader.is_alive() and len(pids) == left:
                break                      # stuck on one process: the next reader takes the rest
            left = len(pids)
    return dict(found)


# ------------------------------------------------------------------------------------------
# Moves in JupyterLab

def open_notebook(lab: Lab, page, path: str, timeout_s: float = 90) -> None:
    """Open a notebook and wait until its kernel is started, connected and idle (running a cell
    earlier makes JupyterLab ask which kernel to start); answer JupyterLab's news question."""
    lab.open(page, path)
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=timeout_s * 1000)
    deadline = time.monotonic() + timeout_s
    while not any(s["path"] == path and s["kernel"]["execution_state"] == "idle"
                  and s["kernel"]["connections"] > 0 for s in lab.api("/api/sessions")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the kernel of {path} did not start")
        page.wait_for_timeout(500)
    no_news = page.locator(".jp-toast-button", has_text="No")   # kept in the scratch copy
    with contextlib.suppress(Exception):
        no_news.first.click(timeout=3000)


def menu(page, *path: str) -> None:
    """Click through JupyterLab's menu bar, e.g. menu(page, "Run", "Run All Cells")."""
    page.locator(".lm-MenuBar-itemLabel", has_text=path[0]).first.click()
    for label in path[1:]:
        page.locator(".lm-Menu-itemLabel", has_text=label).first.click()


def save(page) -> None:
    page.keyboard.press("Control+s")
    page.wait_for_timeout(300)


def run_all_and_wait(page, notebook_file: Path, timeout_s: float = 180) -> dict:
    """Run > Run All Cells, then wait until every code cell has run (read from the saved file:
    JupyterLab renders only the cells in view). Returns the saved notebook."""
    menu(page, "Run", "Run All Cells")
    deadline = time.monotonic() + timeout_s
    while True:
        page.wait_for_timeout(1500)
        save(page)
        try:
            nb = nbformat.reads(notebook_file.read_text(), as_version=4)
        except Exception:   # read while the server was writing it
            continue
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        raised = any(o["output_type"] == "error" for c in code for o in c.get("outputs", []))
        if code[-1].get("execution_count") is not None or raised:   # done, or stopped
            return nb
        if time.monotonic() > deadline:
            ran = sum(c.get("execution_count") is not None for c in code)
            raise TimeoutError(f"Run All reached {ran} of {len(code)} code cells")
