"""Static checks of the committed notebooks: nbgrader metadata, no outputs, nothing leaked."""
from pathlib import Path

import nbformat
import pytest
from nbgrader.nbgraderformat import MetadataValidator

ROOT = Path(__file__).resolve().parent.parent
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
            worked = cell.source.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
            assert worked.strip() not in text, f"{meta['grade_id']}: worked answer shipped"
    assert not list(path.parent.glob("*.py")), "no answer key (or any code) in the release folder"
