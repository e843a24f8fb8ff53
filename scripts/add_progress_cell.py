"""Give every chapter its last cell: the learner's tally (gpulab.course.progress.tally).

    python scripts/add_progress_cell.py                  # every solutions/NN_topic/NN_topic.ipynb
    python scripts/add_progress_cell.py NOTEBOOK...      # these notebooks (a scratch copy, a release)

The cell has the id PROGRESS_CELL_ID and is the notebook's last cell; a notebook that already has
it gets it again at the end (run it as often as you like). Then regenerate each release
(`make release`) and commit both: notebooks/ is generated from solutions/.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
PROGRESS_CELL_ID = "progress-tally"


def progress_cell(chapter: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(
        "# Your tally: the quizzes you answered, the ones right, which to revisit, what to read next.\n"
        "from gpulab.course.progress import tally\n"
        f'tally("{chapter}")', id=PROGRESS_CELL_ID)


def add_progress_cell(notebook: Path) -> None:
    nb = nbformat.read(notebook, as_version=4)
    nb.cells = [c for c in nb.cells if c.get("id") != PROGRESS_CELL_ID] + [progress_cell(notebook.stem)]
    nbformat.write(nb, notebook)


def main(paths: list[str]) -> None:
    notebooks = [Path(p) for p in paths] or sorted((ROOT / "solutions").glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb"))
    for notebook in notebooks:
        add_progress_cell(notebook)
        print(f"{notebook}: last cell {PROGRESS_CELL_ID}")


if __name__ == "__main__":
    main(sys.argv[1:])
