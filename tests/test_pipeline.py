"""The nbgrader round trip, every chapter, in throwaway copies of the course with their own gradebooks.

release == committed notebooks/ byte for byte; the solutions score full marks, the untouched
release zero, and typical wrong answers zero with their diagnostic in the feedback.

What runs whole, in the grading sandbox: every chapter as the solver submits it, the worked
answers of the solution typed into the release's quiz cells and its own predictions left
unanswered (scratch_course.worked_answers). That is each chapter's one whole run in `make test`:
its Run All (every code cell runs, none raises), the worked answers judged against the key, and
the experiments, ranks, DataLoader workers, probes in fresh processes and monitors included,
within the sandbox's limits, its private /dev/shm and its network namespace, as a class's
notebooks meet them. The untouched release and the typical student's first slip are graded as
their quiz cells alone (scratch_course.quizzes_only): answers are all that grading judges
there. An untouched release's experiments read the learner's names only after `name is ...`
(tests/test_notebooks.py checks every chapter), and chapter 08's release runs top to bottom,
untouched, in JupyterLab (tests/test_browser.py). The book build executes one chapter
(tests/test_book.py).

The chapters are graded in two batches, one `make autograde` each (one per pytest worker): a
batch pays for grade.py's start, its imports and the CSV export once, not once a chapter.
"""
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

from gpulab.course.checks import SELFCHECK_FILE, encode_selfcheck, load_key_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import answers_replaced, copy_course, quizzes_only, worked_answers  # noqa: E402

CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
STUDENTS = ("solver", "blank", "typical")


def run(course: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, f"autograder/{script}", *args], cwd=course,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def key(chapter: str):
    return load_key_module(ROOT / "autograder" / "keys" / f"{chapter}.py")


def submit(submitted: Path, chapter: str) -> None:
    """The three students' submissions of ``chapter``."""
    items, notebook = key(chapter), f"{chapter}.ipynb"
    release = ROOT / "notebooks" / chapter / notebook
    for student in STUDENTS:
        (submitted / student / chapter).mkdir(parents=True)
    right = worked_answers(release, ROOT / "solutions" / chapter / notebook)
    for cell in right.cells:       # a written answer, for the instructor to grade by hand
        if cell.cell_type == "markdown" and cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = "The solver's written answer."
    nbformat.write(right, submitted / "solver" / chapter / notebook)
    shutil.copytree(ROOT / "notebooks" / chapter, submitted / "blank" / chapter, dirs_exist_ok=True)
    nbformat.write(quizzes_only(nbformat.read(release, as_version=4)),
                   submitted / "blank" / chapter / notebook)
    typical = answers_replaced(release, lambda item_id: items[item_id].mistakes[0].value)
    nbformat.write(quizzes_only(typical), submitted / "typical" / chapter / notebook)


class RoundTrip:
    chapters: list[str]         # set by the generated subclasses below
    first: bool = False         # the batch that also checks `make feedback`

    @pytest.fixture(scope="class")
    @classmethod
    def graded(cls, tmp_path_factory):
        """Submit three students for each of the batch's chapters and grade them all in one
        `make autograde`, a submission at a time: (course folder, stdout)."""
        course = copy_course(tmp_path_factory.mktemp("course"))
        for chapter in cls.chapters:
            submit(course / "autograder" / "submitted", chapter)
        return course, run(course, "grade.py", "--jobs", "1").stdout

    @staticmethod
    def scores(course: Path, chapter: str, student: str) -> dict[str, tuple[float, float]]:
        found = {}
        with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
            for item_id in key(chapter):
                grade = gradebook.find_grade(f"test-{item_id}", chapter, chapter, student)
                found[item_id] = (grade.auto_score, grade.max_score)
        return found

    def test_release_is_in_sync_with_committed_notebooks(self, graded, chapter):
        """grade.py released the chapter again from solutions/ (nbgrader generate_assignment, as
        `make release` does): the committed release is that notebook byte for byte, and its
        self-check file is the key as `make release` encodes it."""
        course, _ = graded
        committed = ROOT / "notebooks" / chapter
        assert sorted(p.name for p in committed.iterdir()
                      if p.name not in ("__pycache__", ".ipynb_checkpoints")) == sorted(
            [f"{chapter}.ipynb", SELFCHECK_FILE]), "different files"
        fresh = course / "autograder" / "graded_release" / chapter
        assert sorted(p.name for p in fresh.iterdir()) == [f"{chapter}.ipynb"], "self-checks leak"
        stale = f"notebooks/{chapter} is stale: run `make release` and commit it"
        assert (fresh / f"{chapter}.ipynb").read_bytes() == (
            committed / f"{chapter}.ipynb").read_bytes(), stale
        assert (committed / SELFCHECK_FILE).read_text() == encode_selfcheck(key(chapter)), stale

    def test_solutions_score_full_marks(self, graded, chapter):
        results = self.scores(graded[0], chapter, "solver")
        assert all(score == maximum > 0 for score, maximum in results.values()), results

    def test_untouched_release_and_typical_mistakes_score_zero(self, graded, chapter):
        for student in ("blank", "typical"):
            results = self.scores(graded[0], chapter, student)
            assert all(score == 0 for score, _ in results.values()), (student, results)

    def test_the_solvers_notebook_runs_to_its_last_cell_in_the_sandbox(self, graded, chapter):
        """Run All of the chapter with its worked answers, graded, experiments included: every
        code cell ran and none raised. The untouched release (its quiz cells) ran every cell,
        and only the test cells of the quizzes it left unanswered failed."""
        course, _ = graded
        for student, raising_allowed in (("solver", False), ("blank", True)):
            nb = nbformat.read(course / "autograder" / "autograded" / student / chapter /
                               f"{chapter}.ipynb", as_version=4)
            code = [c for c in nb.cells if c.cell_type == "code"]
            assert code and all(c.execution_count is not None for c in code), (student, "stopped before the end")
            failed = [(c.metadata.get("nbgrader", {}).get("grade_id", c.get("id")), o.ename, o.evalue)
                      for c in code if not (raising_allowed and c.metadata.get("nbgrader", {}).get("grade"))
                      for o in c.outputs if o.output_type == "error"]
            assert not failed, (student, failed)

    def test_the_solvers_run_all_shows_no_stderr(self, graded, chapter):
        """A learner reads a pink stderr box as an error: a chapter's Run All shows none (a
        harmless library log is silenced at its source, or explained beside it on stdout). Each
        one found is named by its cell and first line."""
        course, _ = graded
        nb = nbformat.read(course / "autograder" / "autograded" / "solver" / chapter / f"{chapter}.ipynb",
                           as_version=4)
        found = [(c.get("id"), (o.text.strip().splitlines() or ["(blank)"])[0][:160])
                 for c in nb.cells if c.cell_type == "code" for o in c.outputs
                 if o.output_type == "stream" and o.name == "stderr"]
        assert not found, f"{chapter}: stderr in the solver's Run All: {found}"

    def test_feedback_names_the_mistake(self, graded, chapter):
        course, _ = graded
        feedback = course / "autograder" / "feedback"
        typical = feedback / "typical" / chapter / f"{chapter}.html"
        text = html.unescape(re.sub(r"<[^>]+>", "", typical.read_text()))
        for item in key(chapter).values():
            assert item.mistakes[0].says in text, f"{item.id}: diagnostic missing from feedback"
        blank = feedback / "blank" / chapter / f"{chapter}.html"
        assert "not answered yet" in html.unescape(blank.read_text())

    def test_grades_csv_has_every_student(self, graded, chapter):
        course, stdout = graded
        rows = [row for row in (course / "autograder" / "grades.csv").read_text().splitlines()
                if row.startswith(f"{chapter},")]
        for student in STUDENTS:
            assert any(f",{student}," in row for row in rows), student
        assert re.search(rf"{chapter}\s+solver\b.*needs manual grading", stdout)  # written answer

    def test_honest_submissions_raise_no_findings(self, graded):
        """What grading refuses or removes (links, scripts, floods: issue 25) is never in a
        chapter's own notebook: its solver, untouched release and typical slips pass clean."""
        course, _ = graded
        log = course / "autograder" / "integrity.jsonl"
        assert not log.exists() or not log.read_text().strip(), log.read_text()
        assert not (course / "autograder" / "refused").exists()


def pytest_generate_tests(metafunc):
    if "chapter" in metafunc.fixturenames:
        metafunc.parametrize("chapter", metafunc.cls.chapters)


def test_graded_kernels_running_at_once_share_the_cores():
    from grade import threads_per_kernel
    cores = os.cpu_count() or 1
    assert threads_per_kernel(1) == cores
    assert threads_per_kernel(cores) == 1 and threads_per_kernel(4 * cores) == 1


def test_every_chapter_is_in_a_batch():
    assert sorted(c for batch in BATCHES for c in batch) == CHAPTERS


def feedback_only_rebuilds_without_regrading(self, graded, tmp_path):
    """`make feedback` after manual grading: feedback and CSV again, nothing re-run. In a copy
    of the graded course that keeps one chapter's submissions (the script is the same for every
    chapter; the copy leaves the batch's own results alone)."""
    course = shutil.copytree(graded[0], tmp_path / "course", symlinks=True)
    chapter, *others = self.chapters
    for student in STUDENTS:
        for other in others:
            shutil.rmtree(course / "autograder" / "submitted" / student / other)
    feedback = course / "autograder" / "feedback" / "typical" / chapter / f"{chapter}.html"
    feedback.unlink()
    csv = course / "autograder" / "grades.csv"
    csv.unlink()
    before = sorted(p.stat().st_mtime_ns for p in (course / "autograder" / "autograded").rglob("*.ipynb"))
    result = run(course, "grade.py", "--feedback-only")
    assert csv.exists() and "solver" in result.stdout
    says = next(iter(key(chapter).values())).mistakes[0].says
    assert feedback.exists() and says in html.unescape(re.sub(r"<[^>]+>", "", feedback.read_text()))
    assert before == sorted(p.stat().st_mtime_ns for p in (course / "autograder" / "autograded").rglob("*.ipynb"))


# Two batches of about equal cost (the chapters alternate), one class each, so that
# pytest-xdist's loadscope grades them on different workers; the first also checks the
# feedback-only rerun, which is the same script for every chapter.
BATCHES = (CHAPTERS[0::2], CHAPTERS[1::2])
for _number, _chapters in enumerate(BATCHES, 1):
    _name = f"TestBatch{_number}"
    _tests = {"chapters": _chapters}
    if _number == 1:
        _tests["test_feedback_only_rebuilds_without_regrading"] = feedback_only_rebuilds_without_regrading
    globals()[_name] = type(_name, (RoundTrip,), _tests)
