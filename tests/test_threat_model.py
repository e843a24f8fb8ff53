"""docs/threat-model.md stays whole: every row of its tables names the test that attacks its wall,
and every name it gives is a test (or a hostile submission of the graded batch) that exists.

A new way in gets its row and its attack test in the same change; a renamed or deleted test
would otherwise leave a row that points at nothing.
"""
import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "threat-model.md"
COLUMNS = ["asset", "actor", "way in", "the wall", "the test that attacks it"]


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every table whose header has COLUMNS, as lists of cells."""
    rows, in_table = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if [c.lower() for c in cells] == COLUMNS:
            in_table = True
        elif in_table and not set(line) <= set("|- :"):
            rows.append(cells)
    return rows


@functools.cache
def existing_tests() -> frozenset[str]:
    """Every test function in tests/, and the hostile submissions of the graded batch (the keys of
    the dictionaries in test_adversarial.py that name them)."""
    names = set()
    for path in (ROOT / "tests").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name)
            if isinstance(node, ast.Dict) and path.name in ("test_adversarial.py", "hostile_submissions.py"):
                names.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return frozenset(names)


def named_tests(cell: str) -> list[str]:
    return re.findall(r"`([A-Za-z_]\w*)`", cell)


ROWS = table_rows(PAGE.read_text())


def test_both_tables_are_there():
    text = PAGE.read_text()
    assert "## Grading" in text and "## Workshop" in text
    assert len(ROWS) >= 30, f"{len(ROWS)} rows"
    assert all(len(row) == len(COLUMNS) and all(row) for row in ROWS), "a row with an empty cell"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row[2][:40])
def test_every_row_names_tests_that_exist(row):
    cell = row[-1]
    exists = existing_tests()
    names = [n for n in named_tests(cell) if n in exists or n.startswith("test_")]
    bench = "`make bench`" in cell
    assert names or bench, f"no test named for '{row[2]}'"
    missing = [n for n in names if n not in exists]
    assert not missing, f"'{row[2]}' names tests that do not exist: {missing}"


def test_the_checker_finds_a_row_without_a_test_and_a_test_that_is_gone():
    page = ("| Asset | Actor | Way in | The wall | The test that attacks it |\n|---|---|---|---|---|\n"
            "| keys | student | x | y | `test_every_row_names_tests_that_exist` |\n"
            "| keys | student | z | y | nothing yet |\n"
            "| keys | student | w | y | `test_that_was_renamed` |\n\nprose\n| a | b |\n")
    rows = table_rows(page)
    assert len(rows) == 3
    exists = existing_tests()
    assert [n for n in named_tests(rows[0][-1]) if n in exists]
    assert not named_tests(rows[1][-1])
    assert [n for n in named_tests(rows[2][-1]) if n.startswith("test_") and n not in exists]
