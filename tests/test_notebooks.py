"""Static checks of the committed notebooks: nbgrader metadata, no outputs, nothing leaked."""
import ast
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.nbgraderformat import MetadataValidator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import worked_answer  # noqa: E402

SOURCES = sorted((ROOT / "solutions").glob("*/*.ipynb"))
RELEASES = sorted((ROOT / "notebooks").glob("*/*.ipynb"))


def test_every_chapter_is_released():
    assert SOURCES and [p.relative_to(ROOT / "solutions") for p in SOURCES] == [
        p.relative_to(ROOT / "notebooks") for p in RELEASES]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name)
def test_source_metadata_validates(path):
    nb = nbformat.read(path, as_version=4)
    MetadataValidator().validate_nb(nb)  # raises on malformed nbgrader metadata
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    manual = [c for c in graded if c.metadata["nbgrader"].get("solution")]
    assert len(graded) - len(manual) >= 8 and manual, "8+ autograded items and a written answer"


@pytest.mark.parametrize("path", SOURCES + RELEASES, ids=lambda p: f"{p.parts[-3]}/{p.parent.name}")
def test_committed_notebooks_carry_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.id


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.parent.name)
def test_release_leaks_no_solution(path):
    text = path.read_text()
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    source = nbformat.read(ROOT / "solutions" / path.parent.name / path.name, as_version=4)
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            worked = worked_answer(cell.source)
            assert worked.strip() not in text, f"{meta['grade_id']}: worked answer shipped"
    assert not list(path.parent.glob("*.py")), "no answer key (or any code) in the release folder"


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell assigns, names it reads), from its syntax tree."""
    assigned, read = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (assigned if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assigned.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            assigned.update((a.asname or a.name).split(".")[0] for a in node.names)
    return assigned, read


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.parent.name)
def test_only_its_answer_cell_sets_an_answer(path):
    """The untouched release scores zero only if no other cell computes an answer variable, and
    runs top to bottom only if an experiment reads one only after checking it was answered
    (`if name is ...:`, as chapter 02's budget experiment does). (The pipeline grades the untouched
    release end to end for the first chapter; this covers every chapter)."""
    nb = nbformat.read(path, as_version=4)
    roles = {c.id: c.metadata.get("nbgrader", {}) for c in nb.cells}
    answers = {c.id: c.source.split("=")[0].strip() for c in nb.cells
               if c.cell_type == "code" and roles[c.id].get("solution")}
    assert all(re.fullmatch(r"[A-Za-z_]\w* = \.\.\.\n# YOUR CODE HERE", c.source)
               for c in nb.cells if c.id in answers), "an answer cell is not `name = ...` + stub"
    for c in nb.cells:
        if c.cell_type != "code" or c.id in answers or roles[c.id].get("grade"):
            continue
        assigned, read = _names(c.source)
        assert not assigned & set(answers.values()), f"{c.id} sets {assigned & set(answers.values())}"
        unguarded = {name for name in read & set(answers.values()) if f"{name} is ..." not in c.source}
        assert not unguarded, f"{c.id} reads {unguarded} without checking `is ...` first"


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.parent.name)
def test_no_later_cell_needs_what_only_a_worked_answer_defines(path):
    """A worked answer may name its steps (`per_param = 2 + 2 + 12`); the release's answer cell
    is only `name = ...`, so a later cell that read such a step would raise NameError in the
    untouched release (and for a learner who answered differently). Every name a later cell
    reads is defined by a cell the release has, before it (or is a builtin)."""
    import builtins
    source = nbformat.read(ROOT / "solutions" / path.parent.name / path.name, as_version=4)
    only_worked = set()
    for cell in source.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            stub_name = cell.source.split("=")[0].strip()
            only_worked |= _names(worked_answer(cell.source))[0] - {stub_name}
    release = nbformat.read(path, as_version=4)
    defined = set(dir(builtins)) | {"get_ipython", "display", "In", "Out"}
    for cell in release.cells:
        if cell.cell_type != "code":
            continue
        assigned, read = _names(cell.source)
        assert not (read & only_worked) - defined - assigned, (
            f"{cell.id} reads {sorted((read & only_worked) - defined - assigned)}, which only a worked answer defines")
        defined |= assigned
