"""Per-student numbers (gpulab.course.variants, issue 21): every variant of every parameterised item has a
valid answer and distinct diagnostics, students' numbers differ, the canonical numbers give
today's key and question texts exactly, and a graded run judges each student by their own key.
"""
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from gpulab.course import variants
from gpulab.course.checks import SELFCHECK_FILE, WrongAnswer, decode_selfcheck, import_key, judge
from gpulab.course.variants import Param, canonical, draw, render, student_key

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import answers_replaced, copy_course  # noqa: E402

KEY_FILES = sorted((ROOT / "autograder" / "keys").glob("[0-9][0-9]_*.py"))
MODULES = {path.stem: import_key(path) for path in KEY_FILES}
VARIED = sorted(chapter for chapter, module in MODULES.items() if hasattr(module, "PARAMS"))
SEED = "test-course"
STUDENTS = [f"student{i:03d}" for i in range(200)]


def test_some_chapters_have_variants():
    assert "03_throughput" in VARIED


def test_draw_is_deterministic_and_spreads():
    params = {"x": Param(1, tuple(range(1, 11)))}
    # SHA-256, not Python's hash(): the same on every machine, in every process (a golden value).
    assert draw(params, "seed", "alice", "03_throughput") == draw(params, "seed", " alice ", "03_throughput")
    assert [draw(params, "seed", s, "03_throughput")["x"] for s in ("alice", "bob", "carol")] == \
        [draw(params, "seed", s, "03_throughput")["x"] for s in ("alice", "bob", "carol")]
    counts = [0] * 10
    for student in STUDENTS:
        counts[draw(params, SEED, student, "03")["x"] - 1] += 1
    assert min(counts) >= 8                                     # about 20 each of 200
    assert draw(params, "a", "alice", "03") != draw(params, "b", "alice", "03") or \
        draw(params, "a", "bob", "03") != draw(params, "b", "bob", "03")


def test_golden_draw():
    """A value worked out once: regrading next year, on another machine, draws the same numbers."""
    params = {"tokens": Param(2048, (1024, 1536, 2048, 3072, 4096))}
    assert draw(params, "fall-2026", "ada", "03_throughput") == {"tokens": 1536}


def test_param_needs_its_canonical_value_and_distinct_values():
    with pytest.raises(ValueError):
        Param(3, (1, 2))
    with pytest.raises(ValueError):
        Param(1, (1, 1))


@pytest.mark.parametrize("chapter", VARIED)
def test_canonical_numbers_give_todays_key_and_texts(chapter):
    module = MODULES[chapter]
    p = canonical(module.PARAMS)
    assert module.items(p) == module.ITEMS
    committed = decode_selfcheck((ROOT / "notebooks" / chapter / SELFCHECK_FILE).read_text())
    assert {item.id: item for item in module.items(p)} == committed
    nb = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    source = {cell.get("id"): cell.source for cell in nb.cells if cell.cell_type == "markdown"}
    for cell_id, template in module.QUESTIONS.items():
        assert render(template, p) == source[cell_id], cell_id
    used = "".join(module.QUESTIONS.values())
    for name in module.PARAMS:                   # a student sees every number they are judged by
        assert re.search(r"\{" + name + r"[\[:}]", used), f"{name} is in no question"
    assert set(module.FIXED) <= {item.id for item in module.ITEMS}


def _valid(item):
    """A right answer passes; each typical mistake is wrong and gets its own diagnosis. A judged
    item (chapter 12's plan) has no single right value: any plan that meets the budget passes,
    judged by a run (tests/test_capstone.py runs one); its mistakes are wrong without a run."""
    if item.judged_by:
        assert item.mistakes, item
    elif item.choices:
        assert item.value in item.choices
    else:
        assert math.isfinite(item.value), item
        assert item.value != 0 or item.rel_tol <= 1e-9 or item.abs_tol, f"{item.id}: 0 with a relative tolerance"
    if not item.judged_by:
        judge(item, item.value)
    for mistake in item.mistakes:
        with pytest.raises(WrongAnswer) as info:
            judge(item, mistake.value)
        assert mistake.says in str(info.value), (item.id, item.value, mistake)


@pytest.fixture(scope="module")
def keys_of_class():
    """{chapter: [the items of each of 200 students]}."""
    found = {}
    for chapter in VARIED:
        module = MODULES[chapter]
        found[chapter] = [{item.id: item for item in module.items(draw(module.PARAMS, SEED, s, chapter))}
                          for s in STUDENTS]
    return found


@pytest.mark.parametrize("chapter", VARIED)
def test_every_variant_has_valid_answers_and_distinct_diagnostics(chapter, keys_of_class):
    module = MODULES[chapter]
    for student, key in zip(STUDENTS, keys_of_class[chapter]):
        for item in key.values():
            _valid(item)
        _, questions = student_key(module, SEED, student, chapter)
        assert questions.keys() == module.QUESTIONS.keys() and "{" not in "".join(questions.values())


@pytest.mark.parametrize("chapter", VARIED)
def test_students_get_different_numbers_and_a_classmates_answers_fail(chapter, keys_of_class):
    module, keys = MODULES[chapter], keys_of_class[chapter]
    for item_id in keys[0]:
        distinct = {repr(key[item_id].value) for key in keys}
        if item_id in module.FIXED:
            assert len(distinct) == 1, f"{item_id} is declared fixed but varies"
        else:
            assert len(distinct) >= 3, f"{item_id} takes only {len(distinct)} values"
    # A classmate's right answer, handed in as one's own: right only where the draws coincide
    # (about 1 in 3 at worst, for an item with three published values; rarely over a chapter).
    copied = passed = 0
    for item_id in keys[0]:
        if item_id in module.FIXED:
            continue
        right = 0
        for mine, classmate in zip(keys, keys[1:]):
            try:
                judge(mine[item_id], classmate[item_id].value)
                right += 1
            except WrongAnswer:
                pass
        assert right / (len(keys) - 1) < 0.4, f"{item_id}: a classmate's answer passes {right} times"
        copied, passed = copied + len(keys) - 1, passed + right
    assert passed / copied < 0.2, f"a classmate's answer passes {passed} of {copied} times"


def test_question_cell_shows_the_students_numbers(tmp_path, monkeypatch, capsys):
    chapter = "03_throughput"
    module = MODULES[chapter]
    notebook = tmp_path / f"{chapter}.ipynb"
    shutil.copy(ROOT / "notebooks" / chapter / notebook.name, notebook)
    assert variants.add_question_cells(notebook, module, SEED, chapter)
    nb = nbformat.read(notebook, as_version=4)
    shown = [variants.question_of(cell) for cell in nb.cells if variants.question_of(cell)]
    assert shown == list(module.QUESTIONS)       # in the notebook's order, each replaced once
    markdown = "".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    assert "### Quiz 1:" not in markdown
    for name in (variants.STUDENT_ENV, "JUPYTERHUB_USER", "NBGRADER_EXECUTION"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    variants.question("ch03-md-04")               # no variants.json here: says where it belongs
    assert variants.VARIANTS_FILE in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    variants.question("ch03-md-04")               # no id, and no way to ask: says how to give it
    assert "set_student" in capsys.readouterr().out
    monkeypatch.setenv("JUPYTERHUB_USER", "ada")
    variants.question("ch03-md-04")
    _, questions = student_key(module, SEED, "ada", chapter)
    assert capsys.readouterr().out == questions["ch03-md-04"] + "\n"
    monkeypatch.delenv("JUPYTERHUB_USER")
    variants.set_student("bob")
    capsys.readouterr()
    variants.question("ch03-md-16")
    _, questions = student_key(module, SEED, "bob", chapter)
    assert capsys.readouterr().out == questions["ch03-md-16"] + "\n"


def test_no_seed_no_variants(tmp_path):
    module = MODULES["03_throughput"]
    assert student_key(module, "", "ada", "03_throughput") == (module.ITEMS, {})
    notebook = tmp_path / "03_throughput.ipynb"
    shutil.copy(ROOT / "notebooks" / "03_throughput" / notebook.name, notebook)
    assert not variants.add_question_cells(notebook, module, "", "03_throughput")
    assert notebook.read_bytes() == (ROOT / "notebooks" / "03_throughput" / notebook.name).read_bytes()


# ------------------------------------------------------------------------------------------
# One graded run: a student who submits their own right answers scores full marks; one who
# submits a classmate's scores (near) zero. The chapter is cut to its quiz cells (no experiments).

GRADED_CHAPTER = "03_throughput"


def _quiz_only(notebook: Path, module) -> None:
    nb = nbformat.read(notebook, as_version=4)
    kept = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        prediction = cell.cell_type == "code" and meta.get("solution") and not meta["grade_id"].startswith("answer-")
        if meta and not prediction or cell.get("id") in module.QUESTIONS:
            kept.append(cell)
        elif cell.cell_type == "code" and "from gpulab.course.checks import check" in cell.source and not kept:
            cell.source = "from gpulab.course.checks import check"
            kept.append(cell)
    nb.cells = kept
    nbformat.write(nb, notebook)


# release.py's graded release, then nbgrader's autograde of each student, through nbgrader's
# Python API in one process: the same code as `make autograde` (grade.py starts the same two
# nbgrader commands), without paying for nbgrader's and torch's imports once per command.
GRADE_IN_ONE_PROCESS = """
import sys
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from traitlets.config.loader import PyFileConfigLoader
import release

chapter, students = sys.argv[1], sys.argv[2:]
config = PyFileConfigLoader("nbgrader_config.py", path=".").load_config()
config.CourseDirectory.release_directory = "autograder/graded_release"
api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)

def nbgrader(command, assignment, *flags):
    result = getattr(api, command)(assignment)
    assert result["success"], result.get("error") or result.get("log")

release.nbgrader = nbgrader
release.release(chapter, "autograder/graded_release", self_checks=False)
for student in students:
    result = api.autograde(chapter, student)
    assert result["success"], result.get("error") or result.get("log")
"""


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    chapter, module = GRADED_CHAPTER, MODULES[GRADED_CHAPTER]
    course = copy_course(tmp_path_factory.mktemp("variants-course"))
    with open(course / "autograder" / "nbgrader_config.py", "a") as config:
        config.write(f'\nc.GradeRecordedAnswers.course_seed = "{SEED}"\n')
    _quiz_only(course / "solutions" / chapter / f"{chapter}.ipynb", module)
    # The submissions: the cut notebook answered with ada's right answers (bob hands in ada's),
    # with the question cells a graded release has.
    source = course / "solutions" / chapter / f"{chapter}.ipynb"
    ada_key = {item.id: item for item in student_key(module, SEED, "ada", chapter)[0]}
    for student in ("ada", "bob"):
        folder = course / "autograder" / "submitted" / student / chapter
        folder.mkdir(parents=True)
        nbformat.write(answers_replaced(source, lambda i: ada_key[i].value), folder / source.name)
        variants.add_question_cells(folder / source.name, module, SEED, chapter)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-c", GRADE_IN_ONE_PROCESS, chapter, "ada", "bob"],
                            cwd=course / "autograder", env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return course


def _auto_scores(course: Path, student: str) -> tuple[float, float]:
    module = MODULES[GRADED_CHAPTER]
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        grades = [gradebook.find_grade(f"test-{item.id}", GRADED_CHAPTER, GRADED_CHAPTER, student)
                  for item in module.ITEMS]
        return sum(g.auto_score for g in grades), sum(g.max_score for g in grades)


def test_graded_release_carries_the_variants(graded_class):
    released = graded_class / "autograder" / "graded_release" / GRADED_CHAPTER
    assert (released / variants.VARIANTS_FILE).is_file()
    assert not (released / SELFCHECK_FILE).exists()


def test_own_answers_score_full_marks_a_classmates_near_zero(graded_class):
    score, total = _auto_scores(graded_class, "ada")
    assert score == total
    score, total = _auto_scores(graded_class, "bob")
    assert score <= len(MODULES[GRADED_CHAPTER].FIXED) + 1, f"bob copied ada and scored {score}/{total}"


def test_graded_copy_shows_each_students_numbers(graded_class):
    chapter = GRADED_CHAPTER
    for student in ("ada", "bob"):
        nb = nbformat.read(graded_class / "autograder" / "autograded" / student / chapter / f"{chapter}.ipynb",
                           as_version=4)
        _, questions = student_key(MODULES[chapter], SEED, student, chapter)
        shown = {variants.question_of(cell): cell.outputs[0]["data"]["text/markdown"]
                 for cell in nb.cells if variants.question_of(cell)}
        assert shown == questions


def test_grading_judges_a_record_against_the_students_own_key(tmp_path):
    """GradeRecordedAnswers alone, without a kernel: with no seed the chapter's key decides (as
    before variants); with one, the submission folder's student's key, and the question cells
    get that student's text."""
    from secure_grading import GradeRecordedAnswers
    from gpulab.course.checks import RECORD_MIME

    chapter, module = GRADED_CHAPTER, MODULES[GRADED_CHAPTER]
    canonical_value = module.ITEMS[0].value
    ada_value = student_key(module, SEED, "ada", chapter)[0][0].value
    assert canonical_value != ada_value

    def graded(seed: str, answer: float) -> nbformat.NotebookNode:
        test = nbformat.v4.new_code_cell(f'check("{module.ITEMS[0].id}", x)')
        test.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": f"test-{module.ITEMS[0].id}"}
        record = {RECORD_MIME: {"item": module.ITEMS[0].id, "value": answer}, "text/plain": "recorded"}
        test.outputs = [nbformat.v4.new_output("display_data", data=record)]
        shown = nbformat.v4.new_code_cell('from gpulab.course.variants import question; question("ch03-md-04")')
        shown.metadata["gpulab"] = {"question": "ch03-md-04"}
        nb = nbformat.v4.new_notebook(cells=[shown, test])
        resources = {"nbgrader": {"assignment": chapter, "notebook": chapter, "student": "ada",
                                  "db_url": f"sqlite:///{tmp_path / 'gradebook.db'}"}}
        grader = GradeRecordedAnswers(keys_dir=str(ROOT / "autograder" / "keys"), course_seed=seed)
        return grader.preprocess(nb, resources)[0]

    assert graded("", canonical_value).cells[1].outputs[0]["output_type"] == "stream"      # right
    assert graded("", ada_value).cells[1].outputs[0]["output_type"] == "error"
    nb = graded(SEED, ada_value)
    assert nb.cells[1].outputs[0]["output_type"] == "stream"
    assert nb.cells[0].outputs[0]["data"]["text/markdown"] == student_key(module, SEED, "ada", chapter)[1]["ch03-md-04"]
    assert graded(SEED, canonical_value).cells[1].outputs[0]["output_type"] == "error"


def test_release_reads_the_course_seed_as_python_would(tmp_path, monkeypatch):
    import release

    monkeypatch.setattr(release, "AUTOGRADER", tmp_path)
    config = tmp_path / "nbgrader_config.py"
    config.write_text('c = get_config()\nc.GradeRecordedAnswers.course_seed = ""\n')
    assert release.course_seed() == ""
    config.write_text(config.read_text() + "c.GradeRecordedAnswers.course_seed = 'fall-#2026'  # ours\n")
    assert release.course_seed() == "fall-#2026"              # the last setting, comment and all
    config.write_text(config.read_text() + "c.GradeRecordedAnswers.course_seed = os.environ['X']\n")
    with pytest.raises(SystemExit, match="plain string"):
        release.course_seed()
