"""A self-study learner's progress: the quizzes answered, the ones right, those to revisit, and
what to read next.

Two views of the same verdicts, both read from what the checks already showed
(gpulab.course.checks):

- ``tally("08_monitoring")``, the last cell of each chapter: the verdicts this kernel's checks
  showed (``checks.shown``), with a link to the check cell of each quiz to revisit;
- ``python -m gpulab progress``: every chapter's notebook as last saved
  (notebooks/NN_topic/NN_topic.ipynb; JupyterLab saves every two minutes and on Ctrl-S), where
  each check cell's output is the verdict box of class ``gpulab-check-<state>``.

A verdict is one of: right, wrong, unanswered (the `...` is still there), recorded (a graded
release, which has no key: the instructor grades it), or not run (the check cell has not run).
"""
from __future__ import annotations

import html
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.course import checks

CHECK_CELL = re.compile(r"""^\s*check\(\s*["']([A-Za-z0-9_.-]+)["']""", re.MULTILINE)
VERDICT_BOX = re.compile(r"gpulab-check-(right|wrong|unanswered|recorded)")
ANSWERED = ("right", "wrong", "recorded")


@dataclass
class Quiz:
    item: str
    state: str                  # right | wrong | unanswered | recorded | not run
    cell_id: str | None = None  # the check cell, for a link back to it


@dataclass
class Chapter:
    folder: str                 # "08_monitoring"
    title: str                  # the notebook's first heading
    quizzes: list[Quiz] = field(default_factory=list)

    def having(self, *states: str) -> list[Quiz]:
        return [q for q in self.quizzes if q.state in states]

    @property
    def done(self) -> bool:
        """Every quiz answered, and none known to be wrong."""
        return bool(self.quizzes) and all(q.state in ("right", "recorded") for q in self.quizzes)

    def summary(self) -> str:
        answered, right = self.having(*ANSWERED), self.having("right")
        if self.having("recorded"):
            return (f"{len(answered)} of {len(self.quizzes)} quizzes answered; "
                    "this release has no self-checks: your instructor grades them")
        return f"{len(answered)} of {len(self.quizzes)} quizzes answered, {len(right)} right"


# ------------------------------------------------------------------------------------------
# Reading saved notebooks


def title_of(cells: list) -> str:
    for cell in cells:
        if isinstance(cell, dict) and cell.get("cell_type") == "markdown":
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else str(source)
            for line in source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def saved_quizzes(cells: list) -> list[Quiz]:
    """The quizzes of a notebook's cells (its JSON), each with the verdict its check cell showed
    when it last ran. Any JSON at all is read without an error: the workshop's progress page
    reads learners' notebooks with it (workshop/progress.py)."""
    quizzes = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        match = CHECK_CELL.search(source)
        if not match:
            continue
        state = "not run"
        outputs = cell.get("outputs")
        for output in outputs if isinstance(outputs, list) else []:
            data = output.get("data") if isinstance(output, dict) else None
            box = data.get("text/html", "") if isinstance(data, dict) else ""
            found = VERDICT_BOX.search("".join(box) if isinstance(box, list) else str(box))
            if found:
                state = found.group(1)
        quizzes.append(Quiz(match.group(1), state, cell.get("id")))
    return quizzes


def saved_chapter(notebook: Path) -> Chapter | None:
    """A chapter as its notebook was last saved; None when the file is not a notebook."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(cells, list):
        return None
    return Chapter(notebook.parent.name, title_of(cells), saved_quizzes(cells))


def chapter_notebooks(course: Path) -> list[Path]:
    """notebooks/NN_topic/NN_topic.ipynb of each chapter, in course order."""
    return sorted(p for p in course.glob("notebooks/[0-9][0-9]_*/[0-9][0-9]_*.ipynb")
                  if p.stem == p.parent.name)


# ------------------------------------------------------------------------------------------
# `python -m gpulab progress`


def report(course: Path) -> str:
    """Every chapter's tally from its saved notebook, and which chapter to open next."""
    chapters = [c for c in map(saved_chapter, chapter_notebooks(course)) if c is not None]
    if not chapters:
        return f"No chapter notebooks under {course / 'notebooks'}: run this in the course's folder."
    lines = ["Your progress, from your notebooks as last saved (Ctrl-S in JupyterLab saves one):", ""]
    for chapter in chapters:
        lines.append(f"{chapter.folder:<31} {chapter.summary()}")
        if not chapter.having(*ANSWERED):
            continue                    # an untouched chapter: nothing to list
        for label, states in (("to revisit", ("wrong",)), ("not answered yet", ("unanswered", "not run"))):
            if quizzes := chapter.having(*states):
                lines.append(f"    {label}: " + ", ".join(q.item for q in quizzes))
    following = next((c for c in chapters if not c.done), None)
    path = following and f"notebooks/{following.folder}/{following.folder}.ipynb"
    if following is None:
        lines += ["", "Every quiz of every chapter is answered, and none is wrong. Well done."]
    elif following.having(*ANSWERED):
        lines += ["", f"Next: finish {following.folder} ({path})."]
    else:
        lines += ["", f"Next: {following.title or following.folder} ({path})."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# The last cell of a chapter


def _next_chapter(folder: str, here: Path) -> tuple[str, str] | None:
    """(title, link) of the chapter after ``folder``, found beside this notebook's folder
    (notebooks/NN_topic/); None when there is none (the last chapter, a graded copy, the book)."""
    if here.name != folder:
        return None
    later = [p for p in chapter_notebooks(here.parent.parent) if p.parent.name > folder]
    if not later:
        return None
    chapter = saved_chapter(later[0])
    title = chapter.title if chapter and chapter.title else later[0].parent.name
    return title, f"../{later[0].parent.name}/{later[0].name}"


def kernel_chapter(folder: str) -> Chapter:
    """This chapter's quizzes as this kernel's checks showed them, in the key's order (the
    order of the chapter); a quiz whose check has not run here is "not run"."""
    number = folder.split("_", 1)[0]
    key = checks.find_key(number) or {}
    items = list(key) or [i for i in checks.shown if checks.chapter_of(i) == number]
    quizzes = [Quiz(i, checks.shown[i].state, checks.shown[i].cell_id) if i in checks.shown
               else Quiz(i, "not run") for i in items]
    return Chapter(folder, "", quizzes)


def _links(quizzes: list[Quiz], notebook: str) -> str:
    return ", ".join(f'<a href="{html.escape(notebook)}#cell-id={html.escape(q.cell_id)}">{html.escape(q.item)}</a>'
                     if q.cell_id else html.escape(q.item) for q in quizzes)


def tally(folder: str) -> None:
    """Show the learner's tally for this chapter: answered, right, which to revisit (with links
    to their check cells), and what to read next."""
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        checks.display_bundle({"text/plain": "This copy is graded: your instructor's feedback "
                                             "shows each quiz's verdict."})
        return
    chapter = kernel_chapter(folder)
    # The notebook these links open: this kernel's own (JupyterLab names it), else the chapter's.
    session = os.path.basename(os.environ.get("JPY_SESSION_NAME", ""))
    notebook = session if session.endswith(".ipynb") else f"{folder}.ipynb"
    wrong, open_ = chapter.having("wrong"), chapter.having("unanswered", "not run")
    text = [f"Your progress in this chapter: {chapter.summary()}."]
    rows = [f"<b>Your progress in this chapter:</b> {html.escape(chapter.summary())}."]
    if chapter.done and chapter.having("right"):
        text.append("All right: well done.")
        rows.append("All right: well done.")
    if wrong:
        text.append("To revisit: " + ", ".join(q.item for q in wrong))
        rows.append("To revisit: " + _links(wrong, notebook))
    if open_:
        text.append("Not answered yet: " + ", ".join(q.item for q in open_))
        rows.append("Not answered yet: " + _links(open_, notebook))
    following = _next_chapter(folder, Path.cwd())
    if following:
        title, link = following
        text.append(f"Next: {title} ({link})")
        rows.append(f'Next: <a href="{html.escape(link)}">{html.escape(title)}</a>')
    text.append("Every chapter at once: python -m gpulab progress, in a terminal in the course's folder.")
    rows.append("Every chapter at once: <code>python -m gpulab progress</code>, in a terminal in "
                "the course's folder.")
    box = ('<div class="gpulab-progress" style="border-left:4px solid #6b8fb8;background:#eef3f9;'
           'padding:6px 10px;line-height:1.6">' + "<br>".join(rows) + "</div>")
    checks.display_bundle({"text/html": box, "text/plain": "\n".join(text)})
