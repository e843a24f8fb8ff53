"""`make bench`: the course's performance figures (a benchmark that prints, not a timed test).

1. CPU execution time of every solution notebook (target: chapter 01 <= 60 s, each well under
   120 s on a 2-core machine);
2. the book build (Jupyter Book, chapters executed unless cached);
3. autograding a class of 50 synthetic submissions of chapter 03 (correct, typical wrong, blank
   and adversarial mixed, among them links beside the notebook and script in it) in a throwaway
   copy of the course: target <= 10 minutes on 2 cores, with a grades CSV row for every student;
4. chapter 07's figures (scripts/bench_ch07.py): the step-time model against measured loops,
   DataLoader workers on an I/O-bound dataset, the profiler's idle share, the capstone ladder;
5. workshop mode (scripts/bench_workshop.py): 30 learners signing up at once, time until all
   servers are ready, memory per learner server and the hub's own; then every chapter's release
   run inside one learner's walls of a room planned for 30 (peak memory, tasks, time against
   outside the walls: workshop/chapter_needs.json, which make workshop-check reads; about 5 min);
6. where `make test`'s time goes (scripts/suite_durations.py): a fresh venv's setup time, and
   pytest's durations per test file and for the slowest tests (budget: venv + suite <= 10 min);
7. first, because it costs nothing: each chapter's prose (scripts/prose_stats.py: mean words per
   sentence, share over 35 words, colons per sentence, against issue 35's targets, which
   tests/test_prose.py holds every chapter to).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbgrader.api import Gradebook

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import answers_replaced, copy_course  # noqa: E402

from gpulab.course.checks import load_key_module  # noqa: E402


def execute_seconds(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


CLASS_CHAPTER = "03_throughput"


def adversarial(nb, kind: str):
    """Chapter notebook ``nb`` attacked one way (see tests/test_adversarial.py for all of them)."""
    answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution") and c.cell_type == "code"]
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")]
    if kind == "equals_everything":
        answers[0].source = "class Anything:\n    def __eq__(self, other): return True\n" + answers[0].source
        for c in answers:
            c.source = c.source.replace("= ...", "= Anything()")
    elif kind == "patched_checker":
        answers[0].source = ("import gpulab.course.checks, math\nmath.isclose = lambda *a, **k: True\n"
                             "gpulab.course.checks.check = check = lambda *a: print('right')\n") + answers[0].source
    elif kind == "kernel_exit":
        answers[len(answers) // 2].source = "import os\nos._exit(0)"
    elif kind == "deleted_tests":
        for c in tests:
            nb.cells.remove(c)
    elif kind == "forged_metadata":
        for c in tests:
            c.metadata["nbgrader"]["points"] = 100
            c.source = "pass"
    elif kind == "reads_keys":
        answers[0].source = ("import glob\nprint([open(p).read()[:100] for p in "
                             "glob.glob('../../../keys/*.py')])\n") + answers[0].source
    elif kind == "links_and_html":   # with a link to the key beside it (autograde_class adds it)
        answers[0].source = "print(open('key.py').read()[:100])\n" + answers[0].source
        nb.cells.insert(1, nbformat.v4.new_markdown_cell("<img src=x onerror=alert(1)><script>alert(2)</script>"))
    return nb


def autograde_class(n_students: int = 50) -> tuple[float, int, dict[str, list[float]]]:
    """Grade a mixed class of one chapter: (seconds, CSV rows, scores by kind of student).
    A smaller class keeps the same mix (`python scripts/bench.py --class-only 10`)."""
    kinds = ["solver"] * 20 + ["typical"] * 10 + ["blank"] * 5 + [
        "equals_everything", "patched_checker", "kernel_exit", "deleted_tests", "forged_metadata",
        "reads_keys", "links_and_html"] * 3
    kinds = kinds[:50]
    kinds = [kinds[i * len(kinds) // n_students] for i in range(n_students)]   # the same mix
    with tempfile.TemporaryDirectory() as tmp:
        course = copy_course(Path(tmp) / "course")
        items = load_key_module(course / "autograder" / "keys" / f"{CLASS_CHAPTER}.py")
        release = course / "notebooks" / CLASS_CHAPTER / f"{CLASS_CHAPTER}.ipynb"
        source = course / "solutions" / CLASS_CHAPTER / f"{CLASS_CHAPTER}.ipynb"
        for i, kind in enumerate(kinds):
            folder = course / "autograder" / "submitted" / f"{kind}{i:02d}" / CLASS_CHAPTER
            folder.mkdir(parents=True)
            if kind == "solver":
                nb = nbformat.read(source, as_version=4)
            elif kind == "typical":
                nb = answers_replaced(release, lambda item_id: items[item_id].mistakes[0].value)
            elif kind == "blank":
                nb = nbformat.read(release, as_version=4)
            else:
                nb = adversarial(nbformat.read(release, as_version=4), kind)
            nbformat.write(nb, folder / f"{CLASS_CHAPTER}.ipynb")
            if kind == "links_and_html":
                (folder / "key.py").symlink_to(course / "autograder" / "keys" / f"{CLASS_CHAPTER}.py")
        start = time.perf_counter()
        subprocess.run([sys.executable, "autograder/grade.py"], cwd=course, check=True,
                       capture_output=True)
        seconds = time.perf_counter() - start
        rows = (course / "autograder" / "grades.csv").read_text().splitlines()[1:]
        scores: dict[str, list[float]] = {}
        with Gradebook(f"sqlite:///{course / 'autograder' / 'gradebook.db'}") as gradebook:
            for i, kind in enumerate(kinds):
                submission = gradebook.find_submission(CLASS_CHAPTER, f"{kind}{i:02d}")
                scores.setdefault(kind, []).append(submission.score)
        return seconds, len(rows), scores


def print_class(n_students: int) -> None:
    seconds, rows, scores = autograde_class(n_students)
    print(f"\nautograde of a class of {n_students} submissions of {CLASS_CHAPTER} (release + autograde + "
          f"feedback + export, {os.cpu_count()} jobs): {seconds:.1f} s = {seconds / 60:.1f} min "
          f"(target for 50: <= 10 min), {seconds / n_students:.1f} s per submission; grades.csv rows: {rows}")
    for kind, got in scores.items():
        print(f"  {kind:<18} x{len(got):>2}: scores {sorted(set(got))}")


def main() -> None:
    if "--class-only" in sys.argv:      # only the class, of this many (the same mix): a quick look
        print_class(int(sys.argv[sys.argv.index("--class-only") + 1]))
        return
    print(f"machine: {os.cpu_count()} CPU cores; python {sys.version.split()[0]}")
    print("\nprose of each chapter (scripts/prose_stats.py):", flush=True)
    subprocess.run([sys.executable, "scripts/prose_stats.py"], cwd=ROOT, check=True)
    print("\nsolution notebooks, executed top to bottom (fresh kernel each):")
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        print(f"  {path.relative_to(ROOT)}: {execute_seconds(path):6.1f} s")
    cache = ROOT / "book" / "_build" / ".jupyter_cache"
    state = "warm cache" if cache.exists() else "cold: every chapter executed"
    start = time.perf_counter()
    subprocess.run([sys.executable, "scripts/build_book.py"], cwd=ROOT, check=True, capture_output=True)
    print(f"\nbook build (make book, {state}): {time.perf_counter() - start:.1f} s")
    print_class(50)
    print("\nchapter 07, the input pipeline:", flush=True)
    subprocess.run([sys.executable, "scripts/bench_ch07.py"], cwd=ROOT, check=True)
    print("\nworkshop mode (scripts/bench_workshop.py):", flush=True)
    subprocess.run([sys.executable, "scripts/bench_workshop.py"], cwd=ROOT, check=True)
    print("\nthe test suite:", flush=True)
    subprocess.run([sys.executable, "scripts/suite_durations.py"], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
