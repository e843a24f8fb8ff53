"""`make release`: regenerate the student release from solutions/ with nbgrader.

    python autograder/release.py            # notebooks/, with self-checks (the committed release)
    python autograder/release.py --graded   # autograder/graded_release/, without self-checks

The self-study release gets, beside each chapter's notebook, `selfcheck.dat`: the chapter's
answer key encoded (gpulab.course.checks.encode_selfcheck), so that its test cells give an immediate
verdict. A graded release has no such file: its test cells only record the answer, and the
verdict comes from `make autograde` with the instructor's key. With a course seed set
(`c.GradeRecordedAnswers.course_seed` in nbgrader_config.py), a graded release gives each student
numbers of their own: its question cells become `question("<id>")` cells, with `variants.json`
beside the notebook (gpulab.course.variants). The self-study release never has variants.
"""
from __future__ import annotations

import argparse
import ast
import atexit
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

from gpulab.course.checks import SELFCHECK_FILE, encode_selfcheck, import_key, load_key_module
from gpulab.course.variants import add_question_cells

AUTOGRADER = Path(__file__).resolve().parent
ROOT = AUTOGRADER.parent
KEYS = AUTOGRADER / "keys"


def chapters() -> list[str]:
    """Chapter folders under solutions/, e.g. ['01_device_basics']."""
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir() and p.name[:2].isdigit())


def _nbgrader_main(args: tuple[str, ...], output: int | None) -> None:
    """The body of a forked nbgrader command (``start_nbgrader``)."""
    os.chdir(AUTOGRADER)                 # nbgrader reads nbgrader_config.py from the working folder
    # nbgrader runs the `alembic` and `jupyter` commands by name: put this venv's bin/ first.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    if output is not None:
        os.dup2(output, 1)
        os.dup2(output, 2)
    from nbgrader.apps.nbgraderapp import NbGraderApp

    try:
        NbGraderApp.launch_instance(argv=[*args, "--log-level=WARN"])
    finally:
        # A forked process ends without the interpreter's shutdown (multiprocessing's os._exit):
        # run what a `python -m nbgrader` would at its exit, e.g. a kernel manager's finalizer
        # that removes the kernel's socket folder.
        atexit._run_exitfuncs()


def start_nbgrader(*args: str, output: int | None = None) -> multiprocessing.process.BaseProcess:
    """Start ``nbgrader <args>`` with this course's config, its output to the file descriptor
    ``output`` (default: this process's). In a process forked from this one, not a new
    interpreter: nbgrader's imports (about 2 CPU-seconds), and whatever else the caller imported
    (grade.py imports torch for the keys: about 3), are paid once, not again by every command. It is a process of its own all
    the same, as `python -m nbgrader` would be: one that crashes or exits hard ends alone, and
    its ``exitcode`` says how (negative: the signal that killed it)."""
    process = multiprocessing.get_context("fork").Process(target=_nbgrader_main, args=(args, output),
                                                          name=f"nbgrader {args[0]}")
    process.start()
    return process


def nbgrader(*args: str) -> None:
    """Run an nbgrader command to the end; CalledProcessError if it fails."""
    process = start_nbgrader(*args)
    process.join()
    if process.exitcode != 0:
        raise subprocess.CalledProcessError(process.exitcode, ["nbgrader", *args])


def course_seed() -> str:
    """The course seed set in nbgrader_config.py, a plain string (empty: no per-student numbers).
    Read as text: loading the config would import all of nbgrader for one line."""
    text = (AUTOGRADER / "nbgrader_config.py").read_text()
    settings = re.findall(r"^c\.GradeRecordedAnswers\.course_seed\s*=(.*)$", text, re.M)
    if not settings:
        return ""
    setting = settings[-1]                                   # the last one wins, as in Python
    for value in (setting, setting.split("#")[0]):          # with or without a comment after it
        try:
            return str(ast.literal_eval(value.strip()))
        except (ValueError, SyntaxError):
            pass
    raise SystemExit(f"nbgrader_config.py: course_seed must be a plain string, not {setting.strip()}")


def release(chapter: str, release_dir: str, self_checks: bool) -> Path:
    """Generate one chapter's release into ROOT/release_dir/chapter; return that folder."""
    nbgrader("generate_assignment", chapter, "--force", "--create",
             f"--CourseDirectory.release_directory={release_dir}")
    out = ROOT / release_dir / chapter
    key_file = KEYS / f"{chapter}.py"
    if self_checks:
        (out / SELFCHECK_FILE).write_text(encode_selfcheck(load_key_module(key_file)))
    elif seed := course_seed():
        add_question_cells(out / f"{chapter}.ipynb", import_key(key_file), seed, chapter)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--graded", action="store_true",
                        help="release without self-checks, into autograder/graded_release/")
    parser.add_argument("chapters", nargs="*", help="chapter folders (default: all)")
    args = parser.parse_args()
    release_dir = "autograder/graded_release" if args.graded else "notebooks"
    for chapter in args.chapters or chapters():
        out = release(chapter, release_dir, self_checks=not args.graded)
        print(f"released {chapter} -> {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
