"""Per-student numbers in graded assignments: the same quiz, with numbers drawn for each student.

A chapter's answer key (``autograder/keys/NN_topic.py``) may declare what its questions'
numbers can be, and compute its items from them::

    PARAMS = {"tokens": Param(2048, (1024, 1536, 2048, 3072, 4096)), ...}
    QUESTIONS = {"ch03-md-04": "### Quiz 1 ... {tokens} tokens ..."}   # question cell id -> text
    def items(p) -> list[Item]: ...                                     # the key for numbers p
    ITEMS = items(canonical(PARAMS))                                     # today's key

The canonical values are the numbers the chapter states, so the self-study release, its
self-checks and the book read exactly as without variants. A value may be a record (a dict,
e.g. a published model's name with its sizes), which a question shows with ``{model[name]}``.
``FIXED`` names the items that stay the same for everyone, and why.

With a course seed set (``c.GradeRecordedAnswers.course_seed`` in autograder/nbgrader_config.py),
the graded release replaces each question cell by a one-line code cell, ``question("<cell
id>")``, that shows the quiz with the student's numbers, drawn from the course seed, the
student's id, the chapter and the parameter's name (``draw``: SHA-256, the same on every machine
and in every Python). The student's id comes from ``GPULAB_STUDENT`` or JupyterHub's
``JUPYTERHUB_USER``, or is typed once. Grading never asks the notebook: it draws the numbers
from the id of the submission's folder, judges the answers against the key for those numbers,
and writes the quiz text with those numbers into the graded copy (autograder/secure_grading.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpulab.course.checks import display_bundle

VARIANTS_FILE = "variants.json"      # beside a graded notebook: seed, parameters, question texts
STUDENT_FILE = ".gpulab-student"     # beside it: the id a student typed, asked once
STUDENT_ENV = "GPULAB_STUDENT"


@dataclass(frozen=True)
class Param:
    """One number of a chapter's questions: the value the chapter states, and the values a
    student may get instead (the canonical one among them)."""

    canonical: object
    values: tuple

    def __post_init__(self):
        if self.canonical not in self.values:
            raise ValueError(f"canonical value {self.canonical!r} is not among {self.values!r}")
        if len(self.values) < 2 or any(a == b for i, a in enumerate(self.values) for b in self.values[:i]):
            raise ValueError(f"a parameter needs two or more distinct values: {self.values!r}")


def canonical(params: dict[str, Param]) -> dict:
    """The numbers the chapter states (the self-study release's)."""
    return {name: param.canonical for name, param in params.items()}


def draw(params: dict[str, Param], seed: str, student: str, chapter: str) -> dict:
    """A student's numbers: each parameter's value picked by SHA-256 of (course seed, student id,
    chapter, parameter name), so that regrading gives the same numbers and knowing how they are
    drawn, or a classmate's, tells nothing about one's own answers."""
    values = {}
    for name, param in params.items():
        text = "\x1f".join((seed, student.strip(), chapter, name)).encode()
        index = int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % len(param.values)
        values[name] = param.values[index]
    return values


def render(template: str, values: dict) -> str:
    """A question's text with these numbers (``str.format``: ``{tokens:,}``, ``{model[name]}``)."""
    return template.format(**values)


# --------------------------------------------------------------------------------------------
# The instructor's side: the key for a student, the graded release

def student_key(module, seed: str, student: str, chapter: str) -> tuple[list, dict[str, str]]:
    """(items, {question cell id: text}) of a key module for one student. Without a seed, or for a
    chapter without parameters, the canonical key and no question texts."""
    params = getattr(module, "PARAMS", None)
    if not seed or not params:
        return module.ITEMS, {}
    values = draw(params, seed, student, chapter)
    return module.items(values), {cell_id: render(text, values) + _drawn_for(student)
                                  for cell_id, text in module.QUESTIONS.items()}


def _drawn_for(student: str) -> str:
    return f"\n\n*These numbers are drawn for `{student}`; they differ from a classmate's.*"


def question_output(text: str) -> dict:
    """A code cell's output that shows ``text`` as Markdown."""
    import nbformat
    return nbformat.v4.new_output("display_data", data={"text/markdown": text, "text/plain": text})


def question_of(cell) -> str | None:
    """The question cell id a graded release's ``question(...)`` cell shows (from its metadata;
    None for any other cell, or metadata a submission mangled)."""
    mark = cell.get("metadata", {}).get("gpulab")
    shown = mark.get("question") if isinstance(mark, dict) else None
    return shown if isinstance(shown, str) else None


def add_question_cells(notebook: Path, module, seed: str, chapter: str) -> bool:
    """Turn a released notebook into its per-student form: each question cell the key renders
    becomes ``question("<id>")``, and ``variants.json`` goes beside it. False (nothing changed)
    for a chapter without parameters."""
    import nbformat
    params = getattr(module, "PARAMS", None)
    if not seed or not params:
        return False
    nb = nbformat.read(notebook, as_version=4)
    missing = set(module.QUESTIONS) - {cell.get("id") for cell in nb.cells}
    if missing:
        raise ValueError(f"{notebook.name}: no question cells {sorted(missing)}")
    for index, cell in enumerate(nb.cells):
        if cell.get("id") in module.QUESTIONS:
            shown = nbformat.v4.new_code_cell(f'from gpulab.course.variants import question; question("{cell.id}")')
            shown.id = f"question-{cell.id}"[:64]
            shown.metadata = {"gpulab": {"question": cell.id}, "jupyter": {"source_hidden": True}}
            shown.outputs = [question_output("▶ *Run this cell: it shows this quiz with your own numbers.*")]
            nb.cells[index] = shown
    nbformat.write(nb, notebook)
    data = {"chapter": chapter, "seed": seed,
            "params": {name: list(param.values) for name, param in params.items()},
            "questions": module.QUESTIONS}
    (notebook.parent / VARIANTS_FILE).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return True


# --------------------------------------------------------------------------------------------
# The student's side: the question cell's one line

def set_student(student: str) -> None:
    """Remember the id your course knows you by (beside the notebook), for the quizzes' numbers."""
    Path(STUDENT_FILE).write_text(student.strip() + "\n")
    print(f"student id set to {student.strip()!r}: rerun the quiz cells to see your numbers.")


def student_id(ask: bool = True) -> str | None:
    """The student's id: GPULAB_STUDENT, JupyterHub's user, the id typed before, or asked now."""
    for name in (STUDENT_ENV, "JUPYTERHUB_USER"):
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    saved = Path(STUDENT_FILE)
    if saved.is_file() and saved.read_text().strip():
        return saved.read_text().strip()
    if not ask:
        return None
    try:
        typed = input("Your student id, as your course knows you (asked once): ").strip()
    except Exception:        # no way to ask (a batch run): the question says what to do
        return None
    if typed:
        saved.write_text(typed + "\n")
    return typed or None


def question(cell_id: str) -> None:
    """Show one quiz with your numbers (the graded release's question cells call this)."""
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        _show("*The grader writes this quiz here with the numbers drawn for you.*")
        return
    if not Path(VARIANTS_FILE).is_file():
        _show(f"*This quiz's numbers come from `{VARIANTS_FILE}`, which belongs beside this notebook: "
              "open the notebook from the folder your instructor handed out.*")
        return
    data = json.loads(Path(VARIANTS_FILE).read_text())
    student = student_id()
    if student is None:
        _show("*This quiz has numbers of your own. Tell it who you are, once: run "
              "`from gpulab.course.variants import set_student; set_student(\"your id\")`, then this cell again.*")
        return
    params = {name: Param(values[0], tuple(values)) for name, values in data["params"].items()}
    values = draw(params, data["seed"], student, data["chapter"])
    _show(render(data["questions"][cell_id], values) + _drawn_for(student))


def _show(text: str) -> None:
    display_bundle({"text/markdown": text, "text/plain": text})   # as grading writes it
