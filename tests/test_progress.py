"""A self-study learner's progress (gpulab.course.progress): the tally at the end of a chapter,
from the verdicts this kernel's checks showed, and `python -m gpulab progress`, from the saved
notebooks; and scripts/add_progress_cell.py, which gives every chapter that last cell (checked
on a scratch copy of solutions/). In JupyterLab, the tally's links are followed in
tests/test_browser.py."""
import json
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from gpulab.__main__ import main
from gpulab.course import checks, progress
from gpulab.course.checks import Item, Mistake, check

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import add_progress_cell  # noqa: E402

BYTES = Item("98-bytes", 4096, "bytes", mistakes=(Mistake(32768, "8x too large: you counted bits."),))
MIB = Item("98-mib", 2.5, "MiB")
WATTS = Item("98-watts", 700, "W")
KEY = {item.id: item for item in (BYTES, MIB, WATTS)}


def chapter_folder(course: Path, folder: str, title: str, cells: list) -> Path:
    """notebooks/<folder>/<folder>.ipynb with these cells, and the key as selfcheck.dat."""
    here = course / "notebooks" / folder
    here.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {title}\n\nText."), *cells])
    nbformat.write(nb, here / f"{folder}.ipynb")
    (here / checks.SELFCHECK_FILE).write_text(checks.encode_selfcheck(KEY))
    return here


@pytest.fixture
def chapter(tmp_path, monkeypatch):
    """Chapter 98 of a two-chapter course, as the working folder of a fresh kernel."""
    for name in (checks.KEYS_ENV, checks.STRICT_ENV, "NBGRADER_EXECUTION", "JPY_SESSION_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(checks, "shown", {})
    here = chapter_folder(tmp_path, "98_bytes", "Chapter 98: bytes", [])
    chapter_folder(tmp_path, "99_watts", "Chapter 99: watts and heat", [])
    monkeypatch.chdir(here)
    return here


def test_each_check_remembers_its_last_verdict(chapter, capsys):
    check("98-bytes", 32768)
    check("98-mib", ...)
    assert {i: v.state for i, v in checks.shown.items()} == {"98-bytes": "wrong", "98-mib": "unanswered"}
    check("98-bytes", 4096)                        # answered again, right this time
    assert checks.shown["98-bytes"].state == "right"
    assert checks.shown["98-bytes"].cell_id is None    # plain Python: no cell to link to


def test_the_tally_counts_names_what_to_revisit_and_the_next_chapter(chapter, capsys):
    check("98-bytes", 32768)
    check("98-mib", 2.5)
    capsys.readouterr()
    progress.tally("98_bytes")
    shown = capsys.readouterr().out
    assert shown.startswith("Your progress in this chapter: 2 of 3 quizzes answered, 1 right.")
    assert "To revisit: 98-bytes" in shown
    assert "Not answered yet: 98-watts" in shown           # its check never ran
    assert "Next: Chapter 99: watts and heat (../99_watts/99_watts.ipynb)" in shown
    assert "python -m gpulab progress" in shown


def test_the_tally_links_each_quiz_to_its_check_cell_in_this_notebook(chapter, monkeypatch):
    checks.shown.update({"98-bytes": checks.Verdict("wrong", "ch98-test-bytes")})
    monkeypatch.setenv("JPY_SESSION_NAME", str(chapter / "renamed copy.ipynb"))
    shown = []
    monkeypatch.setattr(checks, "display_bundle", shown.append)
    progress.tally("98_bytes")
    box = shown[0]["text/html"]
    assert 'To revisit: <a href="renamed copy.ipynb#cell-id=ch98-test-bytes">98-bytes</a>' in box
    assert "Not answered yet: 98-mib, 98-watts" in box       # not run here: no cell to link to
    assert '<a href="../99_watts/99_watts.ipynb">Chapter 99: watts and heat</a>' in box


def test_all_right_says_so_and_a_graded_run_only_points_to_the_feedback(chapter, monkeypatch, capsys):
    for item in KEY.values():
        check(item.id, item.value)
    capsys.readouterr()
    progress.tally("98_bytes")
    assert "3 of 3 quizzes answered, 3 right.\nAll right: well done." in capsys.readouterr().out
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    progress.tally("98_bytes")
    assert capsys.readouterr().out.startswith("This copy is graded")


def saved_check(item_id: str, state: str | None, cell_id: str) -> nbformat.NotebookNode:
    """A check cell as JupyterLab saves it after it ran (state None: never run)."""
    cell = nbformat.v4.new_code_cell(f'check("{item_id}", answer)', id=cell_id)
    if state:
        box = f'<div class="gpulab-check gpulab-check-{state}" style="color:#000">{item_id}: ...</div>'
        cell.outputs = [nbformat.v4.new_output("display_data", {"text/html": box, "text/plain": item_id})]
    return cell


def test_the_command_reads_every_saved_chapter_and_says_where_to_go_next(tmp_path, capsys):
    chapter_folder(tmp_path, "98_bytes", "Chapter 98: bytes", [
        saved_check("98-bytes", "right", "c1"), saved_check("98-mib", "wrong", "c2"),
        saved_check("98-watts", None, "c3")])
    chapter_folder(tmp_path, "99_watts", "Chapter 99: watts", [saved_check("99-heat", "unanswered", "c4")])
    (tmp_path / "notebooks" / "99_watts" / "scratch.ipynb").write_text("not a notebook")   # not a chapter
    assert main(["progress", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "98_bytes                        2 of 3 quizzes answered, 1 right" in shown
    assert "    to revisit: 98-mib\n    not answered yet: 98-watts" in shown
    assert "99_watts                        0 of 1 quizzes answered, 0 right\n\n" in shown  # untouched: no list
    assert "Next: finish 98_bytes (notebooks/98_bytes/98_bytes.ipynb)." in shown


def test_the_command_names_the_first_chapter_not_done_and_reads_broken_files_calmly(tmp_path, capsys):
    chapter_folder(tmp_path, "98_bytes", "Chapter 98: bytes", [saved_check("98-bytes", "right", "c1")])
    chapter_folder(tmp_path, "99_watts", "Chapter 99: watts", [saved_check("99-heat", None, "c4")])
    assert main(["progress", str(tmp_path)]) == 0
    assert "Next: Chapter 99: watts (notebooks/99_watts/99_watts.ipynb)." in capsys.readouterr().out
    (tmp_path / "notebooks" / "98_bytes" / "98_bytes.ipynb").write_text('{"cells": "?"}')
    assert main(["progress", str(tmp_path / "nowhere")]) == 0
    assert "No chapter notebooks" in capsys.readouterr().out
    assert progress.saved_chapter(tmp_path / "notebooks" / "98_bytes" / "98_bytes.ipynb") is None


def test_the_command_reads_the_course_as_released(capsys):
    """The committed release, untouched: every chapter, every quiz not run yet."""
    assert main(["progress", str(ROOT)]) == 0
    shown = capsys.readouterr().out
    for notebook in progress.chapter_notebooks(ROOT):
        quizzes = len(checks.find_key(notebook.stem[:2]))
        assert f"{notebook.parent.name:<31} 0 of {quizzes} quizzes answered, 0 right" in shown
    assert "Next: Chapter 01" in shown


def test_the_script_makes_the_tally_every_chapters_last_cell(tmp_path):
    scratch = shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    notebooks = sorted(scratch.glob("*/*.ipynb"))
    for path in notebooks:                          # the chapters as they were before the script
        nb = nbformat.read(path, as_version=4)
        nb.cells = [c for c in nb.cells if c.id != add_progress_cell.PROGRESS_CELL_ID]
        nbformat.write(nb, path)
    before = {p: len(nbformat.read(p, as_version=4).cells) for p in notebooks}
    for _ in range(2):                              # twice: still one tally cell, at the end
        add_progress_cell.main([str(p) for p in notebooks])
    for notebook in notebooks:
        nb = nbformat.read(notebook, as_version=4)
        assert len(nb.cells) == before[notebook] + 1
        last = nb.cells[-1]
        assert last.id == add_progress_cell.PROGRESS_CELL_ID and last.cell_type == "code"
        assert last.source.endswith(f'tally("{notebook.stem}")') and not last.outputs
        assert "nbgrader" not in last.metadata     # an ordinary cell: the release keeps it as it is
        nbformat.validate(nb)
    json.loads(notebooks[0].read_text())
