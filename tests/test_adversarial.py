"""Grading that holds: a class of crafted submissions, graded in one batch by `make autograde`.

A small probe chapter (no torch, so each kernel starts fast) is released in a throwaway course.
Each student's notebook attacks the grading in one way, as a student who wants the marks
without the answers would (issue 9, after Kratzke, CSEDU 2019). Each attack must score zero on
what it attacked, or be flagged; honest students in the same batch must be graded right; the
gradebook may hold only the expected rows; and no process may outlive grading.
"""
import json
import os
import sqlite3
import subprocess
import sys
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
from gpulab.checks import Item, Mistake
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
             nbformat.v4.new_code_cell("from gpulab.checks import check", id="setup",
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
        "import gpulab.checks\ngpulab.checks._close = lambda *a, **k: True")), (0, 0), None),
    "patched_checker": (lambda nb: answered(nb, "1", "1", before_b=(
        "import gpulab.checks\ngpulab.checks.check = lambda *a: print('right')\n"
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
        "display({'image/png': base64.b64encode(os.urandom(100 * 2**20)).decode()}, raw=True)")),
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
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The probe chapter released and every submission graded in one `grade.py` run."""
    course = copy_course(tmp_path_factory.mktemp("adversarial"))
    (course / "solutions" / CHAPTER).mkdir()
    nbformat.write(source_notebook(), course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")
    (course / "autograder" / "keys" / f"{CHAPTER}.py").write_text(KEY)
    with open(course / "autograder" / "nbgrader_config.py", "a") as config:
        config.write("\nc.Execute.timeout = 10\nc.ExecuteSandboxed.notebook_timeout = 60\n")
    run(course, "release.py", CHAPTER)
    release = course / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb"
    broken = course / "autograder" / "submitted" / "not_a_notebook" / CHAPTER
    broken.mkdir(parents=True)
    (broken / f"{CHAPTER}.ipynb").write_text("this is not a notebook {")
    for student, (make, _, _) in ATTACKS.items():
        folder = course / "autograder" / "submitted" / student / CHAPTER
        folder.mkdir(parents=True)
        nb = make(nbformat.read(release, as_version=4))
        text = nbformat.writes(nb).replace("{root}", str(course))
        (folder / f"{CHAPTER}.ipynb").write_text(text)
    before = set(_processes())
    result = run(course, "grade.py")
    return course, result.stdout, before


def run(course, script, *args):
    env = {k: v for k, v in os.environ.items() if k != "GPULAB_ANSWER_KEYS"}
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


def test_there_are_at_least_17_attacks():
    assert len([name for name in ATTACKS if name not in ("honest", "blank", "wrong")]) >= 17


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
