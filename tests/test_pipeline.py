"""The nbgrader round trip, per chapter, in a throwaway copy of the course with its own gradebook.

release == committed notebooks/ byte for byte; the solutions score full marks, the untouched
release zero, and typical wrong answers zero with their diagnostic in the feedback. One test
class per chapter (generated at the bottom), so that pytest-xdist's loadscope grades chapters on
different workers. The untouched release is graded for the first chapter (the path is the same
for all: every answer records "not answered yet"); for every chapter, tests/test_notebooks.py
checks statically that no other cell sets an answer variable.

What runs whole in the grading sandbox: the solution of every chapter whose experiments start
processes or threads (ranks, DataLoader workers, probes in fresh processes, a monitor): those
meet the sandbox's limits, its private /dev/shm and its network namespace, as a class's
notebooks do. In the other chapters the solver submits the key's right answers and, like the
untouched and the typical-mistakes submissions, leaves the experiments out
(scratch_course.without_experiments): answers are all that grading judges there. Every solution
also runs whole, with its checks strict, in the book build (tests/test_book.py), and every
untouched release under nbval or in the browser test.
"""
import filecmp
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from gpulab.course.checks import load_key_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import answers_replaced, copy_course, without_experiments  # noqa: E402

CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
STUDENTS = ("solver", "blank", "typical")     # "blank" for the first chapter only
# What in a solution starts another process or a thread.
STARTS_PROCESSES = re.compile(r"dist\.launch|num_workers|subprocess|Popen|multiprocessing|spawn\(|"
                              r"visible_gpu_counts|Thread\(|Monitor\(")


def runs_whole_in_sandbox(chapter: str) -> bool:
    solution = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    return any(STARTS_PROCESSES.search(c.source) for c in solution.cells if c.cell_type == "code")


def run(course: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, f"autograder/{script}", *args], cwd=course,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


class ChapterRoundTrip:
    chapter: str                # set by the generated subclasses below
    students = STUDENTS[::2]    # solver and typical; the first chapter adds blank

    @pytest.fixture(scope="class")
    @classmethod
    def graded(cls, tmp_path_factory):
        """Release the chapter, submit three students, grade them: (course folder, stdout)."""
        chapter = cls.chapter
        course = copy_course(tmp_path_factory.mktemp(f"course-{chapter[:2]}"))
        shutil.rmtree(course / "notebooks" / chapter)          # must be regenerated, not left over
        run(course, "release.py", chapter)
        items = load_key_module(ROOT / "autograder" / "keys" / f"{chapter}.py")
        submitted = course / "autograder" / "submitted"
        for student in cls.students:
            (submitted / student / chapter).mkdir(parents=True)
        notebook = f"{chapter}.ipynb"
        if runs_whole_in_sandbox(chapter):
            shutil.copy(ROOT / "solutions" / chapter / notebook, submitted / "solver" / chapter / notebook)
        else:
            right = answers_replaced(ROOT / "notebooks" / chapter / notebook, lambda item_id: items[item_id].value)
            for cell in right.cells:   # a written answer, for the instructor to grade by hand
                if cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("solution"):
                    cell.source = "The solver's written answer."
            nbformat.write(without_experiments(right), submitted / "solver" / chapter / notebook)
        if "blank" in cls.students:
            shutil.copytree(ROOT / "notebooks" / chapter, submitted / "blank" / chapter, dirs_exist_ok=True)
            release = nbformat.read(ROOT / "notebooks" / chapter / notebook, as_version=4)
            nbformat.write(without_experiments(release), submitted / "blank" / chapter / notebook)
        typical = answers_replaced(ROOT / "notebooks" / chapter / notebook,
                                   lambda item_id: items[item_id].mistakes[0].value)
        nbformat.write(without_experiments(typical), submitted / "typical" / chapter / notebook)
        return course, run(course, "grade.py").stdout

    def scores(self, course: Path, student: str) -> dict[str, tuple[float, float]]:
        items = load_key_module(ROOT / "autograder" / "keys" / f"{self.chapter}.py")
        found = {}
        with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
            for item_id in items:
                grade = gradebook.find_grade(f"test-{item_id}", self.chapter, self.chapter, student)
                found[item_id] = (grade.auto_score, grade.max_score)
        return found

    def test_release_is_in_sync_with_committed_notebooks(self, graded):
        course, _ = graded
        fresh, committed = course / "notebooks" / self.chapter, ROOT / "notebooks" / self.chapter
        comparison = filecmp.dircmp(fresh, committed, ignore=["__pycache__", ".ipynb_checkpoints"])
        assert not comparison.left_only and not comparison.right_only, "different files"
        for name in comparison.common_files:
            assert (fresh / name).read_bytes() == (committed / name).read_bytes(), (
                f"notebooks/{self.chapter}/{name} is stale: run `make release` and commit it")

    def test_graded_release_has_no_self_checks(self, graded):
        course, _ = graded
        graded_dir = course / "autograder" / "graded_release" / self.chapter
        assert sorted(p.name for p in graded_dir.iterdir()) == [f"{self.chapter}.ipynb"]
        committed = ROOT / "notebooks" / self.chapter / f"{self.chapter}.ipynb"
        assert (graded_dir / f"{self.chapter}.ipynb").read_bytes() == committed.read_bytes()

    def test_solutions_score_full_marks(self, graded):
        results = self.scores(graded[0], "solver")
        assert all(score == maximum > 0 for score, maximum in results.values()), results

    def test_untouched_release_and_typical_mistakes_score_zero(self, graded):
        for student in set(self.students) - {"solver"}:
            results = self.scores(graded[0], student)
            assert all(score == 0 for score, _ in results.values()), (student, results)

    def test_feedback_names_the_mistake(self, graded):
        course, _ = graded
        feedback = course / "autograder" / "feedback" / "typical" / self.chapter / f"{self.chapter}.html"
        text = html.unescape(re.sub(r"<[^>]+>", "", feedback.read_text()))
        for item in load_key_module(ROOT / "autograder" / "keys" / f"{self.chapter}.py").values():
            assert item.mistakes[0].says in text, f"{item.id}: diagnostic missing from feedback"
        if "blank" in self.students:
            blank = course / "autograder" / "feedback" / "blank" / self.chapter / f"{self.chapter}.html"
            assert "not answered yet" in html.unescape(blank.read_text())

    def test_honest_submissions_raise_no_findings(self, graded):
        """What grading refuses or removes (links, scripts, floods: issue 25) is never in a
        chapter's own notebook: its solver, untouched release and typical slips pass clean."""
        course, _ = graded
        log = course / "autograder" / "integrity.jsonl"
        assert not log.exists() or not log.read_text().strip(), log.read_text()
        assert not (course / "autograder" / "refused").exists()

    def test_grades_csv_has_every_student(self, graded):
        course, stdout = graded
        rows = (course / "autograder" / "grades.csv").read_text().splitlines()
        for student in self.students:
            assert any(f",{student}," in row for row in rows), student
        assert "solver" in stdout and "needs manual grading" in stdout   # the written answer


def test_graded_kernels_running_at_once_share_the_cores():
    from grade import threads_per_kernel
    cores = os.cpu_count() or 1
    assert threads_per_kernel(1) == cores
    assert threads_per_kernel(cores) == 1 and threads_per_kernel(4 * cores) == 1


def test_chapters_that_start_processes_run_whole_in_the_sandbox():
    whole = [chapter for chapter in CHAPTERS if runs_whole_in_sandbox(chapter)]
    assert {"01_device_basics", "06_data_parallel", "07_input_pipeline"} <= set(whole), whole
    assert "03_throughput" not in whole


def feedback_only_rebuilds_without_regrading(self, graded):
    """`make feedback` after manual grading: feedback and CSV again, nothing re-run."""
    course, _ = graded
    csv = course / "autograder" / "grades.csv"
    csv.unlink()
    result = run(course, "grade.py", "--feedback-only")
    assert csv.exists() and "solver" in result.stdout


# One class per chapter; the feedback-only rerun is the same script for all, so the first
# chapter's class checks it.
for _chapter in CHAPTERS:
    _name = f"TestChapter{_chapter[:2]}"
    _tests = {"chapter": _chapter}
    if _chapter == CHAPTERS[0]:
        _tests["students"] = STUDENTS
        _tests["test_feedback_only_rebuilds_without_regrading"] = feedback_only_rebuilds_without_regrading
    globals()[_name] = type(_name, (ChapterRoundTrip,), _tests)
