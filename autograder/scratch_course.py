"""A throwaway copy of the course with its own gradebook, for tests and benchmarks.

Grading in a copy leaves the instructor's real gradebook and folders untouched.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("nbgrader_config.py", "release.py", "grade.py", "secure_grading.py", "sandbox.py",
           "intake.py", "graded_html.py")


def copy_course(dest: Path) -> Path:
    """Copy solutions/, notebooks/ and the grading scripts and keys into ``dest``."""
    for folder in ("solutions", "notebooks"):
        shutil.copytree(ROOT / folder, dest / folder)
    (dest / "autograder").mkdir()
    for name in SCRIPTS:
        shutil.copy(ROOT / "autograder" / name, dest / "autograder" / name)
    shutil.copytree(ROOT / "autograder" / "keys", dest / "autograder" / "keys")
    return dest


def answers_replaced(release_nb: Path, answer_for) -> nbformat.NotebookNode:
    """The release notebook with each answer cell set to ``answer_for(item_id)``.

    An answer cell starts `name = ...`; its item is the one whose test cell checks `name`. An
    answer cell that no test cell checks (the learner's own prediction before an experiment)
    is left as it is.
    """
    nb = nbformat.read(release_nb, as_version=4)
    for cell, item_id in _quiz_answer_cells(nb):
        cell.source = f"{cell.source.split('=')[0].strip()} = {answer_for(item_id)!r}"
    return nb


def _quiz_answer_cells(nb: nbformat.NotebookNode) -> list[tuple[nbformat.NotebookNode, str]]:
    """(answer cell, its item id) for each answer cell whose variable a test cell checks."""
    item_of = {}
    for cell in nb.cells:
        if match := re.match(r'check\("([^"]+)", (\w+)\)', cell.source):
            item_of[match.group(2)] = match.group(1)
    answers = [(cell, cell.source.split("=")[0].strip()) for cell in nb.cells
               if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution")]
    return [(cell, item_of[variable]) for cell, variable in answers if variable in item_of]


def worked_answer(source: str) -> str:
    """A solution cell's worked answer: the code between its solution markers."""
    return source.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0].strip("\n")


def worked_answers(release_nb: Path, solution_nb: Path) -> nbformat.NotebookNode:
    """The release notebook with each quiz's answer cell set to the solution's worked answer (the
    code between its solution markers), as a student who typed the worked answers would submit
    it. Answer cells that no test cell checks (the learner's own predictions before an
    experiment) are left unanswered, so the experiments also run as they do for a learner who
    skipped a prediction."""
    worked = {cell.id: worked_answer(cell.source) for cell in nbformat.read(solution_nb, as_version=4).cells
              if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.read(release_nb, as_version=4)
    for cell, _ in _quiz_answer_cells(nb):
        cell.source = worked[cell.id]
    return nb


def quizzes_only(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` as grading judges it: every markdown cell and every nbgrader cell (answers, their
    checks, the written answer), and in place of the setup and experiment code only the import
    of ``check``. A submission whose answers are all that is being tested is graded in a second
    or two instead of the chapter's whole run (the solver's submission runs that)."""
    kept, imported = [], False
    for cell in nb.cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader"):
            if imported:
                continue
            cell.source, imported = "from gpulab.course.checks import check", True
        kept.append(cell)
    nb.cells = kept
    return nb
