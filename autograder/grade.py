"""`make autograde`: grade every submission, write feedback and the grades CSV.

Put each student's work at autograder/submitted/<student>/<chapter>/<chapter>.ipynb (nbgrader's
`collect` does that with an exchange; `zip_collect` does it from an LMS download), then run
`make autograde`. After grading the written answers in the Formgrader, `make feedback`
(this script with --feedback-only) rebuilds feedback and the CSV without re-running anything.
Results:

    autograder/autograded/<student>/<chapter>/   executed, scored copies
    autograder/feedback/<student>/<chapter>/     HTML feedback to return to the student
    autograder/grades.csv                        one row per student and chapter

Each notebook runs in a sandbox that cannot see this folder; its test cells only record the
answers, which are judged against the instructor's key in autograder/keys/ outside the learner's
kernel (autograder/secure_grading.py). Findings such as deleted or duplicated test cells are
listed at the top of the student's feedback and in autograder/integrity.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from nbgrader.api import Gradebook

from release import AUTOGRADER, course_seed, nbgrader, release, start_nbgrader
from secure_grading import INTEGRITY_LOG, PROGRESS_LOG, sandbox_warnings

SUBMITTED = AUTOGRADER / "submitted"


def submitted_chapters() -> list[str]:
    return sorted({p.name for p in SUBMITTED.glob("*/*") if p.is_dir()})


class Progress:
    """Prints, while nbgrader runs, each submission graded (done of total, elapsed, estimated
    time left) and each integrity finding as soon as it is made, from the lines that
    secure_grading appends to the logs beside the gradebook."""

    def __init__(self, chapter: str, total: int):
        self.chapter, self.total, self.done = chapter, total, 0
        self.start = time.monotonic()
        self.read_to = {PROGRESS_LOG: 0, INTEGRITY_LOG: 0}
        for name in self.read_to:
            path = AUTOGRADER / name
            self.read_to[name] = path.stat().st_size if path.exists() else 0

    def _new_lines(self, name: str) -> list[dict]:
        path = AUTOGRADER / name
        if not path.exists():
            return []
        with open(path) as log:
            log.seek(self.read_to[name])
            text = log.read()
        complete = text[:text.rfind("\n") + 1]          # a line being written waits
        self.read_to[name] += len(complete.encode())
        return [json.loads(line) for line in complete.splitlines()]

    def update(self) -> None:
        for finding in self._new_lines(INTEGRITY_LOG):
            print(f"  finding  {finding['student']}: {finding['finding']}", flush=True)
        graded = len(self._new_lines(PROGRESS_LOG))
        if graded:
            self.done += graded
            elapsed = time.monotonic() - self.start
            left = elapsed / self.done * max(0, self.total - self.done)
            print(f"  {self.chapter}: {self.done}/{self.total} graded, {_clock(elapsed)} elapsed, "
                  f"about {_clock(left)} left", flush=True)


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def autograde(chapter: str, jobs: int) -> None:
    """nbgrader autograde, with the students split over ``jobs`` processes (each one runs a
    notebook at a time; the gradebook is SQLite, whose writes are short and wait on a lock)."""
    students = sorted(p.parent.name for p in SUBMITTED.glob(f"*/{chapter}") if p.is_dir())
    groups = [students[i::jobs] for i in range(max(1, min(jobs, len(students))))]
    print(f"grading {chapter}: {len(students)} submissions, {len(groups)} at a time", flush=True)
    progress = Progress(chapter, len(students))
    running = []
    for group in groups:
        others = ",".join(s for s in students if s not in group)
        running.append(start_nbgrader("autograde", chapter, "--create", "--force",
                                      f"--CourseDirectory.student_id_exclude={others}"))
    while any(p.poll() is None for p in running):
        progress.update()
        time.sleep(1)
    progress.update()
    if any(p.returncode != 0 for p in running):
        # nbgrader grades every other submission and leaves the broken ones (e.g. a file that
        # is not a notebook) without scores: they export as zero. The class goes on.
        print(f"WARNING: some {chapter} submissions could not be graded at all (nbgrader's "
              "errors above); they score zero. The rest of the class was graded.")


def threads_per_kernel(jobs: int) -> int:
    """Each of the ``jobs`` kernels running at once gets an equal share of the cores. PyTorch's
    default, a thread per core in every kernel, oversubscribes them, and OpenMP's waiting threads
    then slow every step several-fold. An OMP_NUM_THREADS already set is kept."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--feedback-only", action="store_true",
                        help="after manual grading: rebuild feedback and the CSV, run nothing")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="submissions graded at once (default: one per CPU core)")
    args = parser.parse_args()
    os.environ.pop("GPULAB_ANSWER_KEYS", None)  # keys never reach a learner's kernel
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_kernel(args.jobs)))
    chapters = submitted_chapters()
    if not chapters:
        raise SystemExit(f"nothing to grade: no folders like {SUBMITTED}/<student>/<chapter>/")
    integrity = AUTOGRADER / INTEGRITY_LOG
    if not args.feedback_only:
        for warning in sandbox_warnings():  # fails now, with the install command, if bwrap is missing
            print(f"WARNING: {warning}")
        integrity.unlink(missing_ok=True)
        (AUTOGRADER / PROGRESS_LOG).unlink(missing_ok=True)
        if course_seed():
            print("per-student numbers: on (the course seed in nbgrader_config.py); each submission "
                  "is judged against the key for its student's numbers")
    for chapter in chapters:
        if not args.feedback_only:
            # (Re)generating the graded release records the chapter's source cells, hidden tests
            # included, in the gradebook: autograde restores test cells from there.
            release(chapter, "autograder/graded_release", self_checks=False)
            autograde(chapter, args.jobs)
        nbgrader("generate_feedback", chapter, "--force")
    nbgrader("export", "--to", str(AUTOGRADER / "grades.csv"))
    with Gradebook("sqlite:///" + str(AUTOGRADER / "gradebook.db")) as gradebook:
        for chapter in chapters:
            for submission in gradebook.assignment_submissions(chapter):
                print(f"{chapter}  {submission.student_id:<20} "
                      f"{submission.score:g} / {submission.max_score:g}"
                      + ("  (needs manual grading)" if submission.needs_manual_grade else ""))
    if integrity.exists():
        findings = [json.loads(line) for line in integrity.read_text().splitlines()]
        print(f"{len(findings)} integrity finding(s), also at the top of each student's feedback:")
        for f in findings:
            print(f"  {f['assignment']}  {f['student']}: {f['finding']}")
    print(f"grades: {(AUTOGRADER / 'grades.csv').relative_to(AUTOGRADER.parent)}; "
          f"feedback: autograder/feedback/")


if __name__ == "__main__":
    main()
