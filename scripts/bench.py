"""`make bench`: the course's performance figures (a benchmark that prints, not a timed test).

1. CPU execution time of every solution notebook (target: chapter 01 <= 60 s, each well under
   120 s on a 2-core machine);
2. the book build (Jupyter Book, chapters executed unless cached);
3. autograding time per submission, in a throwaway copy of the course.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import copy_course  # noqa: E402


def execute_seconds(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def autograde_seconds(n_students: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        course = copy_course(Path(tmp) / "course")
        for chapter in sorted(p.name for p in (course / "solutions").iterdir() if p.is_dir()):
            for i in range(n_students):
                shutil.copytree(course / "solutions" / chapter,
                                course / "autograder" / "submitted" / f"student{i:02d}" / chapter)
        start = time.perf_counter()
        subprocess.run([sys.executable, "autograder/grade.py"], cwd=course, check=True,
                       capture_output=True)
        return time.perf_counter() - start


def main() -> None:
    os.environ["GPULAB_ANSWER_KEYS"] = str(ROOT / "autograder" / "keys")
    print(f"machine: {os.cpu_count()} CPU cores; python {sys.version.split()[0]}")
    print("\nsolution notebooks, executed top to bottom (fresh kernel each):")
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        print(f"  {path.relative_to(ROOT)}: {execute_seconds(path):6.1f} s")
    cache = ROOT / "book" / "_build" / ".jupyter_cache"
    state = "warm cache" if cache.exists() else "cold: every chapter executed"
    start = time.perf_counter()
    subprocess.run([sys.executable, "scripts/build_book.py"], cwd=ROOT, check=True, capture_output=True)
    print(f"\nbook build (make book, {state}): {time.perf_counter() - start:.1f} s")
    n = 2
    chapters = len(list((ROOT / "solutions").glob("*/*.ipynb")))
    total = autograde_seconds(n)
    print(f"\nautograde of {n} students x {chapters} chapters (release + autograde + feedback + "
          f"export): {total:.1f} s, {total / (n * chapters):.1f} s per chapter submission")


if __name__ == "__main__":
    main()
