"""How long a chapter takes a learner: an estimate, not a measurement (README, "The chapters").

    python scripts/chapter_time.py

Nobody has timed learners working through the course, so the README's hours are worked out from
what each chapter holds (its solution notebook, the single source of the chapter):

- reading: every word of its markdown cells at READING_WORDS_PER_MINUTE, a careful pace for
  technical prose with derivations (plain prose reads at about 200-250 words a minute);
- quizzes: QUIZ_MINUTES for each autograded item (a test cell ``check(...)``);
- written answers: WRITTEN_MINUTES for each;
- running: RUN_MINUTES for Run All's experiments (each solution runs in well under 3 minutes on a
  2-core CPU: `make bench` measures it).

The total is rounded to the nearest quarter hour.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
READING_WORDS_PER_MINUTE = 120
QUIZ_MINUTES = 4
WRITTEN_MINUTES = 10
RUN_MINUTES = 3


def minutes(solution: Path) -> float:
    nb = nbformat.read(solution, as_version=4)
    words = sum(len(c.source.split()) for c in nb.cells if c.cell_type == "markdown")
    quizzes = sum(c.cell_type == "code" and bool(re.match(r"\s*check\(", c.source)) for c in nb.cells)
    written = sum(c.cell_type == "markdown" and bool(c.metadata.get("nbgrader", {}).get("solution"))
                  for c in nb.cells)
    return words / READING_WORDS_PER_MINUTE + quizzes * QUIZ_MINUTES + written * WRITTEN_MINUTES + RUN_MINUTES


def hours(total_minutes: float) -> str:
    """'1¾ h' for 105 minutes: the nearest quarter hour."""
    quarters = max(1, round(total_minutes / 15))
    whole, part = divmod(quarters, 4)
    return f"{whole or ''}{['', '¼', '½', '¾'][part]}\u00a0h"   # no break before the unit


def main() -> None:
    for solution in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        total = minutes(solution)
        print(f"{solution.parent.name:<32} {total:4.0f} min  {hours(total)}")


if __name__ == "__main__":
    main()
