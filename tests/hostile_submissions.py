"""Submissions that attack grading from beside and inside the notebook (issue 25), graded in the
batch of tests/test_adversarial.py: links, FIFOs, sockets and hard links beside the notebook or in
its place; collect's and zip_collect's input; script in what the instructor's browser renders;
floods of output and attachments; a submission that waits out the time limit (tested on its own: the
batch would wait with it); and failures of
one student's grading or feedback, which the batch must survive.

Issue 34 adds HTML that took quadratic time to inspect, the exchange (a submission in a
classmate's name, a link to a classmate's folder) and a student id with a comma.

Each script a student plants marks what ran: it appends its name to ``window.gpulabPwned`` (also
in the top window) and requests a URL with PWNED in it, so that the browser test sees both.
"""
from __future__ import annotations

import json
import os
import pwd
import socket
import stat
import zipfile
from pathlib import Path

import nbformat

CHAPTER = "99_probe"
SECOND = "98_probe"          # graded first: a submission there must not stop this chapter
MARK = "gpulabPwned"

# The batch's limits (the course's defaults are in autograder/nbgrader_config.py), small so that
# each case stays small: kB per file and per folder, attachment and output characters.
FILE_KB, FOLDER_KB = 1000, 2000
CELL_ATTACHMENT, NOTEBOOK_ATTACHMENT = 200_000, 500_000
CELL_OUTPUT, NOTEBOOK_OUTPUT = 200_000, 1_000_000
NOTEBOOK_SECONDS = 60         # torch's import in a kernel takes seconds on a busy machine

CONFIG = f"""
c.CourseDirectory.max_file_size = {FILE_KB}
c.CourseDirectory.max_dir_size = {FOLDER_KB}
c.SanitizeMarkdown.max_cell_attachment_chars = {CELL_ATTACHMENT}
c.SanitizeMarkdown.max_notebook_attachment_chars = {NOTEBOOK_ATTACHMENT}
c.ExecuteSandboxed.max_cell_output_chars = {CELL_OUTPUT}
c.ExecuteSandboxed.max_notebook_output_chars = {NOTEBOOK_OUTPUT}
c.ExecuteSandboxed.iopub_timeout = 5     # the flood's stop waits this long (15 s by default)

# Two failures made by the test, for one student each: grading's process dies (os._exit), and
# feedback raises. The batch must grade and give feedback to everyone else.
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades, NbGraderPreprocessor

class DiesFor(NbGraderPreprocessor):
    def preprocess(self, nb, resources):
        if resources["nbgrader"]["student"] == "grader_dies":
            os._exit(3)
        return nb, resources

class FeedbackFailsFor(NbGraderPreprocessor):
    def preprocess(self, nb, resources):
        if resources["nbgrader"]["student"] == "feedback_fails":
            raise RuntimeError("a failure the test made")
        return nb, resources

c.Autograde.sanitize_preprocessors = [DiesFor, *c.Autograde.sanitize_preprocessors]
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, FeedbackFailsFor]
"""


def js(vector: str) -> str:
    """A script that marks ``vector`` as run and calls the server's API (single quotes only)."""
    return (f"window.{MARK}=top.{MARK}=(top.{MARK}||'')+'{vector};';"
            f"fetch('/api/contents/PWNED-{vector}',{{method:'PUT',body:'{{}}'}})")


def answered(nb, a="2048", b="0.25", before_a="", before_b=""):
    for cell in nb.cells:
        if cell.id == "answer-99-a":
            cell.source = f"{before_a}\na = {a}"
        if cell.id == "answer-99-b":
            cell.source = f"{before_b}\nb = {b}"
    return nb


def _add(nb, cell, after="setup"):
    index = next(i for i, c in enumerate(nb.cells) if c.id == after)
    nb.cells.insert(index + 1, cell)
    return cell


# ------------------------------------------------------------------------------------------
# What a student puts inside the notebook

def html_in_cells(nb):
    """Script in markdown, in the written answer, in a raw cell, and in a cell's grading id."""
    answered(nb)
    written = next(c for c in nb.cells if c.id == "answer-99-text")
    written.source = (f"My answer. <script>{js('answer-script')}</script>\n\n"
                      f'<img src=x onerror="{js("answer-img")}">')
    _add(nb, nbformat.v4.new_markdown_cell(
        f'<img src=x onerror="{js("markdown-img")}">\n\n<svg onload="{js("markdown-svg")}"></svg>\n\n'
        f'<details open ontoggle="{js("markdown-details")}">x</details>\n\n'
        f"[a link](javascript:{js('markdown-link')})", id="planted-markdown"))
    _add(nb, nbformat.v4.new_raw_cell(f"<script>{js('raw')}</script>", id="planted-raw",
                                      metadata={"raw_mimetype": "text/html", "format": "text/html"}))
    forged = f'<img src=x onerror="{js("grade-id")}">'
    _add(nb, nbformat.v4.new_markdown_cell("Extra credit, please.", id="planted-id", metadata={
        "nbgrader": {"grade": True, "solution": True, "locked": False, "points": 5,
                     "schema_version": 3, "grade_id": forged}}))
    return nb


def html_in_outputs(nb):
    """Script in outputs: HTML, JavaScript, SVG, Markdown; metadata nbconvert cannot read; and a
    forged record whose message carries HTML and a terminal escape."""
    shown = [{"text/html": f'<img src=x onerror="{js("html-output")}">', "text/plain": "html"},
             {"application/javascript": js("js-output"), "text/plain": "js"},
             {"image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{js("svg-output")}">'
                               f"<script>{js('svg-script')}</script></svg>"},
             {"text/markdown": f'<img src=x onerror="{js("markdown-output")}">', "text/plain": "md"},
             {"text/html": "<b>kept: plain HTML</b>", "text/plain": "kept"}]
    before_a = "from IPython.display import display\n" + "\n".join(
        f"display({bundle!r}, raw=True)" for bundle in shown) + (
        # metadata nbconvert's templates stop at (the whole class's feedback did)
        "\ndisplay({'text/html': '<i>odd metadata</i>'}, metadata={'text/html': 'x', "
        "'filenames': 'image/png'}, raw=True)")
    forged = {"item": "99-b", "error": f'<img src=x onerror="{js("record")}">\x1b[2J'}
    before_b = ("from IPython.display import display as _show\n"
                "def check(item, value):\n"
                f"    _show({{'application/vnd.gpulab.answer+json': {forged!r}}}, raw=True)")
    return answered(nb, before_a=before_a, before_b=before_b)


def attachments(nb):
    """A reference to an attachment the cell does not have (nbconvert stops at it), attachments
    over the caps per cell and per notebook, and one that is not an image."""
    answered(nb)
    _add(nb, nbformat.v4.new_markdown_cell("![logo](attachment:logo.png)", id="missing"))
    for i in range(3):      # each within a cell's cap; the third takes the notebook over its cap
        cell = _add(nb, nbformat.v4.new_markdown_cell(f"![big](attachment:big{i}.png)", id=f"big{i}"))
        cell.attachments = {f"big{i}.png": {"image/png": "A" * (CELL_ATTACHMENT - 10_000)}}
    page = _add(nb, nbformat.v4.new_markdown_cell("![page](attachment:page.html)", id="not-image"))
    page.attachments = {"page.html": {"text/html": f"<script>{js('attachment')}</script>"}}
    return nb


def output_flood(nb):
    """Many outputs, each under the per-output cap (the cap per cell and notebook holds them),
    then one message of 120 MB (the grader must never hold it)."""
    return answered(nb, before_a=("from IPython.display import display\nfor i in range(300):\n"
                                  "    display({'text/plain': 'y' * 90_000}, raw=True)"),
                    before_b="print('x' * 120_000_000)")


# HTML that inspection read in quadratic time: an output under the cap per cell (issue 34: 3.7 s
# for 36,000 characters of this), and a raw cell (400,000 characters of "<a/": 20 minutes or more).
UNFINISHED = "<a b='"


def quadratic_html(nb):
    answered(nb, before_a=("from IPython.display import display\n"
                           f"display({{'text/html': {UNFINISHED!r} * {CELL_OUTPUT // len(UNFINISHED) - 400}}}, raw=True)"))
    _add(nb, nbformat.v4.new_raw_cell("<a/" * 133_333, id="quadratic",
                                      metadata={"raw_mimetype": "text/html", "format": "text/html"}))
    return nb


NOTEBOOK_ATTACKS = {
    # name: (make the submission from the release notebook, expected (a, b) scores, says)
    "html_in_cells": (html_in_cells, (1, 1), "as text: it held"),
    "html_in_outputs": (html_in_outputs, (1, 0), "removed from the output"),
    "attachments": (attachments, (1, 1), "which it does not have"),
    "output_flood": (output_flood, (1, 0), "stopped reaching the grader"),
    "feedback_fails": (answered, (1, 1), None),
    "honest_with_files": (answered, (1, 1), None),
    "quadratic_html": (quadratic_html, (1, 1), "as text: it held an unfinished tag"),
}


# ------------------------------------------------------------------------------------------
# What a student puts beside the notebook, or in its place

# Reads the key through whatever lies beside the notebook.
SPY_BESIDE = r'''
import re
found = None
for path in ["key.py", "key2.py", "sub/dir/key3.py", "hard.py"]:
    try:
        match = re.search(r'99-a", (\d+)', open(path).read())
        found = int(match.group(1)) if match else found
    except OSError as error:
        print(path, type(error).__name__)
'''
HTML_NAME = f"<img src=x onerror={MARK}=1>"     # a file name: no '/' in it


def links_beside(folder: Path, course: Path, release: Path) -> None:
    key = course / "autograder" / "keys" / f"{CHAPTER}.py"
    _write(folder, answered(_read(release), a="found or 0", before_a=SPY_BESIDE))
    (folder / "key.py").symlink_to(key)
    (folder / "key2.py").symlink_to(Path("..", "..", "..", "keys", key.name))   # relative
    (folder / "sub" / "dir").mkdir(parents=True)
    (folder / "sub" / "dir" / "key3.py").symlink_to(key)
    (folder / "zero").symlink_to("/dev/zero")
    os.link(key, folder / "hard.py")
    os.mkfifo(folder / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "sock"))
    if os.getuid() == 0:    # a device node needs root; the link to /dev/zero above needs nothing
        os.mknod(folder / "device", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    (folder / HTML_NAME).symlink_to("x")
    (folder / "timestamp.txt").write_text("the day after tomorrow")    # nbgrader stops the run at it


def notebook_to_solution(folder, course, release):
    (folder / f"{CHAPTER}.ipynb").symlink_to(course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")


def notebook_to_classmate(folder, course, release):
    (folder / f"{CHAPTER}.ipynb").symlink_to(Path("..", "..", "honest", CHAPTER, f"{CHAPTER}.ipynb"))


def folder_to_classmate(folder, course, release):
    folder.rmdir()
    folder.symlink_to(Path("..", "honest", CHAPTER))


def oversize(folder, course, release):
    _write(folder, answered(_read(release)))
    (folder / "big.bin").write_bytes(b"x" * int(FILE_KB * 1000 * 1.5))
    for i in range(3):
        (folder / f"part{i}.bin").write_bytes(b"x" * int(FOLDER_KB * 1000 * 0.45))


def with_files(folder, course, release):
    _write(folder, answered(_read(release)))
    (folder / "data.csv").write_text("a,b\n1,2\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("my notes")
    os.link(folder / "data.csv", folder / "sub" / "same-data.csv")     # both links inside: kept


FILE_ATTACKS = {
    # name: (make the folder, expected (a, b) scores, says)
    "links_beside": (links_beside, (0, 1), "refused 'key.py': a symbolic link"),
    "notebook_to_solution": (notebook_to_solution, (0, 0), "the blank release was graded in its place"),
    "notebook_to_classmate": (notebook_to_classmate, (0, 0), "the blank release was graded in its place"),
    "folder_to_classmate": (folder_to_classmate, (0, 0), f"refused '{CHAPTER}/': a symbolic link"),
    "oversize": (oversize, (1, 1), "per file"),
}
HONEST_WITH_FILES = with_files
# Refused as a whole before grading (a link in submitted/ itself): no row in the gradebook.
STUDENT_FOLDER_LINK = "student_folder_link"


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _write(folder: Path, nb) -> None:
    nbformat.write(nb, folder / f"{CHAPTER}.ipynb")


# ------------------------------------------------------------------------------------------
# nbgrader collect's and zip_collect's input

# The exchange's students are accounts of this machine (collect counts a submission only for the
# account that owns it): the one running the tests submits honestly; "nobody" plays a classmate.
COLLECTED, ZIPPED = pwd.getpwuid(os.getuid()).pw_name, "zipped"
CLASSMATE = "nobody"
ZIP_REGEXP = r".*/(?P<student_id>[a-z]+)_(?P<file_id>.*)"
# A folder named for the honest student and a comma: nbgrader split the list of ids to leave
# out at it, and never graded "honest".
COMMA_ID = "honest,x"


def exchange_submission(exchange: Path, course_id: str, release: Path, course: Path) -> None:
    """What `nbgrader submit` leaves in the exchange, with a link to the key and a FIFO added;
    and a classmate's two attacks: a later submission in the honest student's name (as root, who
    can give it to the classmate's account), and one in their own name that links to the honest
    student's folder."""
    inbound = exchange / course_id / "inbound"
    honest = inbound / f"{COLLECTED}+{CHAPTER}+2026-01-05 10:00:00.000000 UTC+abc"
    honest.mkdir(parents=True)
    nbformat.write(answered(_read(release)), honest / f"{CHAPTER}.ipynb")
    (honest / "key.py").symlink_to(course / "autograder" / "keys" / f"{CHAPTER}.py")
    os.mkfifo(honest / "fifo")
    (honest / "timestamp.txt").write_text("2026-01-05 10:00:00.000000 UTC")
    classmate = pwd.getpwnam(CLASSMATE)
    link = inbound / f"{CLASSMATE}+{CHAPTER}+2026-01-05 11:00:00.000000 UTC+lnk"
    link.symlink_to(honest)
    if os.getuid() == 0:
        os.lchown(link, classmate.pw_uid, classmate.pw_gid)
        forged = inbound / f"{COLLECTED}+{CHAPTER}+2026-01-06 10:00:00.000000 UTC+forged"
        forged.mkdir()
        nbformat.write(answered(_read(release), a="2049", b="0.5"), forged / f"{CHAPTER}.ipynb")
        (forged / "timestamp.txt").write_text("2026-01-06 10:00:00.000000 UTC")
        for path in (forged, *forged.iterdir()):
            os.chown(path, classmate.pw_uid, classmate.pw_gid)


def lms_download(course: Path, release: Path) -> Path:
    """An LMS download for zip_collect: the notebook, a notebook that is a link to the solution,
    and an archive that declares 10 times the folder limit (a few kB on disk)."""
    archive = course / "downloaded" / CHAPTER / "archive"
    archive.mkdir(parents=True)
    nbformat.write(answered(_read(release)), archive / f"{ZIPPED}_{CHAPTER}.ipynb")
    (archive / f"{ZIPPED}_extra.ipynb").symlink_to(course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb")
    with zipfile.ZipFile(archive / f"{ZIPPED}_bomb.zip", "w", zipfile.ZIP_DEFLATED) as bomb:
        bomb.writestr(f"{ZIPPED}_bomb.ipynb", b"\0" * (FOLDER_KB * 1000 * 10))
    return archive


def records(course: Path) -> dict[str, list[str]]:
    """What intake recorded as refused, per student (chapter 99)."""
    found = {}
    for path in (course / "autograder" / "refused").glob(f"*/{CHAPTER}.json"):
        found[path.parent.name] = json.loads(path.read_text())["refused"]
    return found
