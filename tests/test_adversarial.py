"""Grading that holds: a class of crafted submissions, graded in one batch by `make autograde`.

A small probe chapter (no torch, so each kernel starts fast) is released in a throwaway course.
Each student's notebook attacks the grading in one way, as a student who wants the marks
without the answers would (issue 9, after Kratzke, CSEDU 2019). Each attack must score zero on
what it attacked, or be flagged; honest students in the same batch must be graded right; the
gradebook may hold only the expected rows; and no process may outlive grading.
"""
import json
import os
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

CHAPTER = "99_probe"
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
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                  "name": "python3"}, "language_info": {"name": "python"}}
    return nb


# ------------------------------------------------------------------------------------------
# The submissions: a function of the release notebook, and what each must score.

def answered(nb, a="2048", b="0.25", before_a="", before_b=""):
    for cell in nb.cells:
        if cell.id == "answer-99-a":
            cell.source = f"{before_a}\na = {a}"
        if cell.id == "answer-99-b":
            cell.source = f"{before_b}\nb = {b}"
    return nb


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

# The folder of the kernel's sockets is the one place on the grader's disk it may write to.
SOCKET_FOLDER = r'''
import os, time
from ipykernel.connect import get_connection_file
for folder in [os.path.dirname(get_connection_file())]:
    for i in range(64):
        open(f"{folder}/fill{i}", "wb").write(b"x" * 2**20)
        time.sleep(0.05)
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
    "huge_text": (lambda nb: answered(nb, before_a="for i in range(300_000):\n    print(i)"), (1, 1), None),
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
    "process_hog": (lambda nb: answered(nb, before_b=PROCESS_HOG), (1, 0), f"more than {PROCESSES} processes"),
    "disk_hog": (lambda nb: answered(nb, b="0 if escaped else 0.25", before_b=DISK_HOG), (1, 1), None),
    "writes_socket_folder": (lambda nb: answered(nb, before_b=SOCKET_FOLDER), (1, 0), "connection sockets"),
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
        env={**os.environ, "JUPYTER_CONFIG_PATH": str(course / "autograder")},
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


@pytest.fixture(scope="module")
def graded(machine):
    """The probe chapter released and every submission graded in one `grade.py` run."""
    course = machine["course"]
    (course / "solutions" / CHAPTER).mkdir()
    nbformat.write(source_notebook(), course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")
    (course / "autograder" / "keys" / f"{CHAPTER}.py").write_text(KEY)
    with open(course / "autograder" / "nbgrader_config.py", "a") as config:
        config.write("\nc.Execute.timeout = 20\nc.ExecuteSandboxed.notebook_timeout = 60\n"
                     f"c.SandboxedKernelManager.memory_limit = {MEMORY_MIB} * 2**20\n"
                     f"c.SandboxedKernelManager.process_limit = {PROCESSES}\n"
                     f"c.SandboxedKernelManager.disk_limit = {DISK_MIB} * 2**20\n")
    run(course, "release.py", CHAPTER)
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
            else ports[socket.AF_UNIX][1:], "@DISK_MIB@": str(DISK_MIB)}
    release = course / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
    broken = course / "autograder" / "submitted" / "not_a_notebook" / CHAPTER
    broken.mkdir(parents=True)
    (broken / f"{CHAPTER}.ipynb").write_text("this is not a notebook {")
    for student, (make, _, _) in ATTACKS.items():
        folder = course / "autograder" / "submitted" / student / CHAPTER
        folder.mkdir(parents=True)
        nb = make(nbformat.read(release, as_version=4))
        text = nbformat.writes(nb).replace("{root}", str(course))
        for placeholder, value in fill.items():
            text = text.replace(placeholder, value)
        (folder / f"{CHAPTER}.ipynb").write_text(text)
    before = set(_processes())
    start = time.perf_counter()
    result = run(course, "grade.py", TMPDIR=str(machine["tmp"]))
    print(f"grade.py: {time.perf_counter() - start:.1f} s for {len(ATTACKS) + 1} submissions")
    return course, result.stdout, before


def run(course, script, *args, **env_vars):
    env = {k: v for k, v in os.environ.items() if k != "GPULAB_ANSWER_KEYS"} | env_vars
    result = subprocess.run([sys.executable, f"autograder/{script}", *args], cwd=course, env=env,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _processes() -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                pass
    return found


def autograded(course, student) -> nbformat.NotebookNode:
    path = course / "autograder" / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"
    return nbformat.read(path, as_version=4)


def verdicts(course, student) -> str:
    """What grading wrote: the test cells' outputs and the grading notes, not the learner's code."""
    texts = []
    for c in autograded(course, student).cells:
        if c.cell_type == "markdown" and c.source.startswith("**Grading notes**"):
            texts.append(c.source)
        if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("test-"):
            texts += [o.get("text") or o.get("evalue", "") for o in c.outputs]
    return "\n".join(texts)


def test_there_are_at_least_29_attacks():
    assert len([name for name in ATTACKS if name not in ("honest", "blank", "wrong")]) >= 29


@pytest.mark.parametrize("student", list(ATTACKS))
def test_each_submission_scores_what_it_earned(graded, student):
    course, _, _ = graded
    _, (score_a, score_b), says = ATTACKS[student]
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        got = tuple(gradebook.find_grade(f"test-99-{name}", CHAPTER, CHAPTER, student).score
                    for name in RIGHT)
        submission = gradebook.find_submission(CHAPTER, student)
        assert submission.max_score == 2, "forged points must not change the maximum"
    assert got == (score_a, score_b), f"{student}: scored {got}"
    if says:
        assert says in verdicts(course, student), f"{student}: the feedback should say {says!r}"


def test_feedback_never_shows_the_answer_or_the_checker(graded):
    course, _, _ = graded
    feedback = course / "autograder" / "feedback" / "wrong" / CHAPTER / f"{CHAPTER}.html"
    text = feedback.read_text()
    assert "2049 is not an fp16 number" in text
    assert "2048" not in text, "the feedback leaks an expected value"
    assert "secure_grading" not in text and "def judge" not in text


def test_outputs_are_capped(graded):
    course, _, _ = graded
    for student in ("huge_text", "huge_image"):
        path = course / "autograder" / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb"
        assert path.stat().st_size < 2 * 2**20, f"{student}: {path.stat().st_size:,} bytes kept"


def test_nothing_was_read_or_written_outside_the_working_copy(graded):
    course, _, _ = graded
    assert not (course / "WRITTEN_BY_STUDENT").exists()
    assert not (ROOT / "WRITTEN_BY_STUDENT").exists()
    assert "student was here" not in (course / "autograder" / "keys" / f"{CHAPTER}.py").read_text()
    db = sqlite3.connect(course / "autograder" / "gradebook.db")
    assert db.execute("select count(*) from grade where manual_score = 100").fetchone() == (0,)


def test_the_instructors_jupyter_server_was_not_reached(graded, machine):
    course, _, _ = graded
    assert not (course / "WRITTEN_VIA_SERVER").exists()
    assert "server: URLError" in outputs(course, "uses_jupyter_server")     # it did try


def test_no_connection_reached_the_machine(graded, machine):
    course, _, _ = graded
    assert len(machine["listeners"]) >= 2
    for listener in machine["listeners"]:
        assert listener.connections == [], f"{listener.address} was reached"
    assert "unreachable" in outputs(course, "connects")                    # it did try


def test_nothing_of_the_home_folder_reaches_grading(graded, machine):
    course, _, _ = graded
    secret = machine["secret"].read_text()
    for folder in ("autograded", "feedback"):
        for path in (course / "autograder" / folder).rglob("*"):
            if path.is_file():
                assert secret not in path.read_text(errors="ignore"), path


def test_limits_stop_the_submission_not_the_batch(graded):
    course, stdout, _ = graded
    for student in ("memory_hog", "process_hog", "writes_socket_folder"):
        assert f"{student}: execution stopped: the submission" in stdout, student   # said at once
    disk_hog = outputs(course, "disk_hog")
    assert disk_hog.count("No space left on device") == 3, disk_hog


def test_what_a_submission_writes_stays_in_its_sandbox(graded, machine):
    course, _, _ = graded
    assert not list(course.rglob("fill*")), "a submission's files reached the course folder"
    assert not list(machine["tmp"].iterdir()), "a kernel's socket folder was left behind"


def test_progress_is_printed_while_grading(graded):
    _, stdout, _ = graded
    lines = stdout.splitlines()
    counts = [int(line.split("/")[0].split()[-1]) for line in lines if " graded, " in line]
    assert counts == sorted(counts) and counts[-1] == len(ATTACKS), counts   # the broken file is not
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
    course, stdout, _ = graded
    assert "could not be graded" in stdout
    row = next(r for r in (course / "autograder" / "grades.csv").read_text().splitlines()
               if ",not_a_notebook," in r)
    assert row.split(",")[-2:] == ["0.0", "2.0"], row          # score, max_score


def test_the_gradebook_holds_only_the_expected_rows(graded):
    course, _, _ = graded
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        assert sorted(s.id for s in gradebook.students) == sorted([*ATTACKS, "not_a_notebook"])
        assert [a.name for a in gradebook.assignments] == [CHAPTER]


def test_findings_are_flagged_for_the_instructor(graded):
    course, stdout, _ = graded
    log = [json.loads(line) for line in (course / "autograder" / "integrity.jsonl").read_text().splitlines()]
    flagged = {entry["student"] for entry in log}
    assert {"deleted_test", "duplicated_test", "retyped_test", "forged_metadata"} <= flagged
    assert "honest" not in flagged
    assert "integrity finding" in stdout


def test_no_process_outlives_grading(graded):
    course, _, before = graded
    leftovers = {pid: cmd for pid, cmd in _processes().items()
                 if pid not in before and (MARKER in cmd or str(course) in cmd)}
    assert not leftovers, leftovers


def test_the_grades_csv_has_a_row_per_student(graded):
    course, _, _ = graded
    rows = (course / "autograder" / "grades.csv").read_text().splitlines()[1:]
    assert len(rows) == len(ATTACKS) + 1       # and the broken file's row


def test_a_course_under_tmp_is_bound_back_into_the_private_tmp(monkeypatch, tmp_path):
    """A CI clone or a venv under /tmp must stay visible: the private /tmp is mounted before the
    Python install and gpulab are bound (bubblewrap mounts in order; the other way round every
    kernel died before it said hello)."""
    import secure_grading
    monkeypatch.setattr(secure_grading, "python_install", lambda: ["/tmp/clone/.venv"])
    args = secure_grading.sandbox_command(str(tmp_path), str(tmp_path), secure_grading.Limits(
        memory_bytes=2**30, tasks=64, disk_bytes=2**20, cpu_seconds=60))
    private_tmp = next(i for i in range(len(args)) if args[i:i + 2] == ["--tmpfs", "/tmp"])
    venv = next(i for i in range(len(args)) if args[i:i + 3] == ["--ro-bind"] + ["/tmp/clone/.venv"] * 2)
    assert private_tmp < venv
