"""The nbgrader round trip, in a throwaway copy of the course with its own gradebook.

release == committed notebooks/ byte for byte; the solutions score full marks, the untouched
release zero, and typical wrong answers zero with their diagnostic in the feedback.
"""
import filecmp
import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from gpulab.checks import load_key_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import answers_replaced, copy_course  # noqa: E402
CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
STUDENTS = ("solver", "blank", "typical")


def run(script: str, course: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, f"autograder/{script}"], cwd=course,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = copy_course(tmp_path_factory.mktemp("course"))
    for chapter in CHAPTERS:
        shutil.rmtree(course / "notebooks" / chapter)     # must be regenerated, not left over
    run("release.py", course)
    for chapter in CHAPTERS:
        items = load_key_module(ROOT / "autograder" / "keys" / f"{chapter}.py")
        submitted = course / "autograder" / "submitted"
        for student in STUDENTS:
            (submitted / student / chapter).mkdir(parents=True)
        notebook = f"{chapter}.ipynb"
        shutil.copy(ROOT / "solutions" / chapter / notebook, submitted / "solver" / chapter / notebook)
        shutil.copytree(ROOT / "notebooks" / chapter, submitted / "blank" / chapter, dirs_exist_ok=True)
        typical = answers_replaced(ROOT / "notebooks" / chapter / notebook,
                                   lambda item_id: items[item_id].mistakes[0].value)
        nbformat.write(typical, submitted / "typical" / chapter / notebook)
    grading = run("grade.py", course)
    return course, grading.stdout


def test_release_is_in_sync_with_committed_notebooks(course):
    course, _ = course
    for chapter in CHAPTERS:
        fresh, committed = course / "notebooks" / chapter, ROOT / "notebooks" / chapter
        comparison = filecmp.dircmp(fresh, committed, ignore=["__pycache__", ".ipynb_checkpoints"])
        assert not comparison.left_only and not comparison.right_only, "different files"
        for name in comparison.common_files:
            assert (fresh / name).read_bytes() == (committed / name).read_bytes(), (
                f"notebooks/{chapter}/{name} is stale: run `make release` and commit it")


def test_graded_release_has_no_self_checks(course):
    course, _ = course
    for chapter in CHAPTERS:
        graded = course / "autograder" / "graded_release" / chapter
        assert sorted(p.name for p in graded.iterdir()) == [f"{chapter}.ipynb"]
        committed = ROOT / "notebooks" / chapter / f"{chapter}.ipynb"
        assert (graded / f"{chapter}.ipynb").read_bytes() == committed.read_bytes()


def scores(course: Path, chapter: str, student: str) -> dict[str, tuple[float, float]]:
    items = load_key_module(ROOT / "autograder" / "keys" / f"{chapter}.py")
    with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
        out = {}
        for item_id in items:
            grade = gradebook.find_grade(f"test-{item_id}", chapter, chapter, student)
            out[item_id] = (grade.auto_score, grade.max_score)
        return out


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solutions_score_full_marks(course, chapter):
    course, _ = course
    results = scores(course, chapter, "solver")
    assert all(score == maximum > 0 for score, maximum in results.values()), results


@pytest.mark.parametrize("chapter", CHAPTERS)
@pytest.mark.parametrize("student", ["blank", "typical"])
def test_untouched_release_and_typical_mistakes_score_zero(course, chapter, student):
    course, _ = course
    results = scores(course, chapter, student)
    assert all(score == 0 for score, _ in results.values()), results


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_feedback_names_the_mistake(course, chapter):
    course, _ = course
    feedback = course / "autograder" / "feedback" / "typical" / chapter / f"{chapter}.html"
    text = html.unescape(re.sub(r"<[^>]+>", "", feedback.read_text()))
    items = load_key_module(ROOT / "autograder" / "keys" / f"{chapter}.py")
    for item in items.values():
        assert item.mistakes[0].says in text, f"{item.id}: diagnostic missing from feedback"
    blank = course / "autograder" / "feedback" / "blank" / chapter / f"{chapter}.html"
    assert "not answered yet" in html.unescape(blank.read_text())


def test_grades_csv_has_every_student(course):
    course, stdout = course
    rows = (course / "autograder" / "grades.csv").read_text().splitlines()
    for student in STUDENTS:
        assert any(f",{student}," in row for row in rows), student
    assert "solver" in stdout and "needs manual grading" in stdout   # the written answer


def test_feedback_only_rebuilds_without_regrading(course):
    course, _ = course
    csv = course / "autograder" / "grades.csv"
    csv.unlink()
    result = subprocess.run([sys.executable, "autograder/grade.py", "--feedback-only"], cwd=course,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert csv.exists() and "solver" in result.stdout
