"""`make autograde`: grade every submission, write feedback and the grades CSV.

Put each student's work at autograder/submitted/<student>/<chapter>/<chapter>.ipynb (nbgrader's
`collect` does that with an exchange; `zip_collect` does it from an LMS download), then run
`make autograde`. After grading the written answers in the Formgrader, `make feedback`
(this script with --feedback-only) rebuilds feedback and the CSV without re-running anything.
Results:

    autograder/autograded/<student>/<chapter>/   executed, scored copies
    autograder/feedback/<student>/<chapter>/     HTML feedback to return to the student
    autograder/grades.csv                        one row per student and chapter
    autograder/refused/<student>/<chapter>/      what a submission held that grading refused

Before nbgrader copies anything, each submission folder is checked: only regular files within the
size limits enter grading (autograder/intake.py). Each notebook runs in a sandbox that cannot see
this folder; its test cells only record the answers, which are judged against the instructor's
key in autograder/keys/ outside the learner's kernel (autograder/secure_grading.py). Findings such
as refused files or deleted test cells are listed at the top of the student's feedback and in
autograder/integrity.jsonl. One submission never stops the batch: a student whose grading or
feedback fails is retried alone, and if it fails again gets feedback that says so.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from traitlets.config.loader import PyFileConfigLoader

import intake
from release import AUTOGRADER, chapters, course_seed, nbgrader, release, start_nbgrader
from secure_grading import INTEGRITY_LOG, PROGRESS_LOG, ExecuteSandboxed, printable, sandbox_warnings

SUBMITTED = AUTOGRADER / "submitted"
FEEDBACK = AUTOGRADER / "feedback"
# A finding that names a time limit: `make autograde` lists these submissions at the end.
TIME_LIMIT = re.compile(r"execution stopped: (the notebook ran past its time limit|a cell ran longer)"
                        r"|grading stopped: its grading ran past the limit")


def submitted_chapters() -> list[str]:
    """The course's chapters someone submitted (a folder, or a link grading will refuse)."""
    names = {chapter.name for student in _student_folders() for chapter in os.scandir(student)
             if not chapter.is_file(follow_symlinks=False)}
    unknown = names - set(chapters())
    if unknown:
        print(f"WARNING: not chapters of this course, not graded: {printable(', '.join(sorted(unknown)))}")
    return sorted(names - unknown)


def _student_folders() -> list[Path]:
    """Students' folders, as nbgrader's globs see them (a name starting with '.' is skipped)."""
    return sorted(Path(e.path) for e in os.scandir(SUBMITTED) if e.is_dir(follow_symlinks=False)
                  and not e.name.startswith(".")) if SUBMITTED.is_dir() else []


def _log_lines(name: str) -> list[dict]:
    path = AUTOGRADER / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


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
        with open(path, "rb") as log:
            log.seek(self.read_to[name])
            text = log.read()
        complete = text[:text.rfind(b"\n") + 1]          # a line being written waits
        self.read_to[name] += len(complete)
        return [json.loads(line) for line in complete.decode().splitlines()]

    def update(self) -> list[str]:
        """Print what is new; the students graded since the last call."""
        for finding in self._new_lines(INTEGRITY_LOG):
            print(f"  finding  {printable(str(finding['student']))}: {printable(finding['finding'])}", flush=True)
        graded = [line["student"] for line in self._new_lines(PROGRESS_LOG)]
        if graded:
            self.done += len(graded)
            elapsed = time.monotonic() - self.start
            left = elapsed / self.done * max(0, self.total - self.done)
            print(f"  {self.chapter}: {self.done}/{self.total} graded, {_clock(elapsed)} elapsed, "
                  f"about {_clock(left)} left", flush=True)
        return graded


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def _graded(chapter: str) -> set[str]:
    return {line["student"] for line in _log_lines(PROGRESS_LOG) if line["assignment"] == chapter}


class Run:
    """An nbgrader command running in the background, its output kept in a file (printed when
    it ends) so that the students it could not process can be read from it."""

    def __init__(self, *args: str):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = start_nbgrader(*args, output=self.log.fileno())
        self.since = time.monotonic()      # when it started on the submission it is grading
        self.over_limit = False

    def finish(self) -> tuple[int, dict[str, str]]:
        """(exit status, {student: why} for each student nbgrader reported an error for)."""
        self.process.join()
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        sys.stderr.write(text)
        return self.process.exitcode, _failures(text)


# nbgrader logs "There was an error processing assignment: <submission folder>", the traceback,
# and at the end "... for student '<id>'" for each submission it could not process.
ERROR_START = re.compile(r"There was an error processing assignment: (\S+)")


def _failures(log: str) -> dict[str, str]:
    found = {}
    parts = ERROR_START.split(log)
    for folder, text in zip(parts[1::2], parts[2::2]):
        errors = re.findall(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)\b.*)$", text, re.M)
        found[Path(folder).parent.name] = printable(errors[-1][:300]) if errors else "nbgrader reported an error"
    return found


def died(status: int) -> bool:
    """nbgrader exits 1 when some submissions failed and it went on; anything else is a death."""
    return status not in (0, 1)


def submission_timeout() -> int:
    """Seconds one submission's grading may take (``c.ExecuteSandboxed.submission_timeout``)."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(AUTOGRADER)).load_config()
    return int(config.ExecuteSandboxed.get("submission_timeout", ExecuteSandboxed.submission_timeout.default_value))


def autograde(chapter: str, jobs: int, limit: float) -> dict[str, str]:
    """nbgrader autograde, with the students split over ``jobs`` processes (each one runs a
    notebook at a time; the gradebook is SQLite, whose writes are short and wait on a lock).
    nbgrader goes on past a submission that fails; a process that dies (a crash, a hard exit)
    leaves the rest of its students, which are graded at once in a process of their own, without
    the student it died at. A process that spends more than ``limit`` seconds on one submission
    (from its last graded one, or its start: nbgrader's look at the files, sanitising and
    inspecting the HTML, the run, the verdicts, saving them) is stopped there, and the submission
    gets zero and a finding. Returns {student: why} for those who could not be graded."""
    students = sorted(p.parent.name for p in SUBMITTED.glob(f"*/{chapter}")
                      if p.is_dir() and not intake.invalid_student_id(p.parent.name))
    groups = [students[i::jobs] for i in range(max(1, min(jobs, len(students))))]
    print(f"grading {chapter}: {len(students)} submissions, {len(groups)} at a time", flush=True)
    progress = Progress(chapter, len(students))
    failed: dict[str, str] = {}

    def start(group: list[str]) -> tuple[list[str], Run]:
        others = ",".join(set(students) - set(group))
        return group, Run("autograde", chapter, "--create", "--force",
                          f"--CourseDirectory.student_id_exclude={others}")

    running = [start(group) for group in groups]

    def note_progress() -> None:
        for student in progress.update():
            for group, run in running:
                if student in group:
                    run.since = time.monotonic()

    while running:
        note_progress()
        for group, run in running:
            if run.process.exitcode is None and time.monotonic() - run.since > limit:
                run.over_limit = True
                run.process.kill()          # its sandbox goes with it (--die-with-parent)
                run.process.join()
        for group, run in [(g, r) for g, r in running if r.process.exitcode is not None]:
            status, errors = run.finish()
            note_progress()
            running.remove((group, run))
            failed.update(errors)
            # nbgrader takes the submissions in the order of their folders' paths
            rest = sorted(set(group) - _graded(chapter) - set(failed), key=lambda s: s + "/")
            if rest and (run.over_limit or died(status)):   # it stopped at the first of the rest
                if run.over_limit:
                    failed[rest[0]] = f"its grading ran past the limit of {limit:g} s per submission"
                    _log_finding(rest[0], chapter, f"grading stopped: {failed[rest[0]]}; it scores zero")
                    _zero(rest[0], chapter)
                else:
                    failed[rest[0]] = f"the grading process died at it (exit status {status})"
                if rest[1:]:                # the others go on
                    print(f"  {chapter}: grading {len(rest) - 1} submission(s) again, whose process "
                          "stopped", flush=True)
                    running.append(start(rest[1:]))
        if running:      # until one of them ends, or a second passes for the progress line
            wait([run.process.sentinel for _, run in running], 1)
    progress.update()
    for student in sorted(set(students) - _graded(chapter) - set(failed)):
        failed[student] = "nbgrader graded no notebook of it"
    for student, why in sorted(failed.items()):
        print(f"  {chapter}: {printable(student)} could not be graded: {why}", flush=True)
    return failed


def _zero(student: str, chapter: str) -> None:
    """No score from an earlier grading stays for a submission whose grading was stopped."""
    if not (AUTOGRADER / "gradebook.db").exists():
        return
    with Gradebook("sqlite:///" + str(AUTOGRADER / "gradebook.db")) as gradebook:
        try:
            submission = gradebook.find_submission(chapter, student)
        except MissingEntry:
            return
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                grade.auto_score = 0
        gradebook.db.commit()


def feedback(chapter: str, not_graded: dict[str, str]) -> dict[str, str]:
    """nbgrader's feedback for the chapter. A student whose feedback fails (or who could not be
    graded) gets a page that says why, with the score; {student: why}."""
    status, errors = Run("generate_feedback", chapter, "--force").finish()
    failed = {}
    with Gradebook("sqlite:///" + str(AUTOGRADER / "gradebook.db")) as gradebook:
        try:
            submissions = {s.student_id: s for s in gradebook.assignment_submissions(chapter)}
        except MissingEntry:
            submissions = {}
        for student, submission in sorted(submissions.items()):
            page = FEEDBACK / student / chapter / f"{chapter}.html"
            if student in not_graded:
                why = f"it could not be graded ({not_graded[student]})"
            elif student in errors:
                why = f"its feedback could not be generated ({errors[student]})"
            elif not page.exists() and (SUBMITTED.parent / "autograded" / student / chapter).is_dir():
                why = f"its feedback could not be generated (nbgrader's exit status {status})"
            else:
                continue
            failed[student] = why
            print(f"  {chapter}: {printable(student)}: {why}", flush=True)
            _write_plain_feedback(page, chapter, why, submission.score, submission.max_score,
                                  intake.recorded(student, chapter))
    return failed


def _write_plain_feedback(page: Path, chapter: str, why: str, score: float, max_score: float,
                          refused: list[str]) -> None:
    """A page of text in nbgrader's place, everything in it escaped."""
    page.parent.mkdir(parents=True, exist_ok=True)
    text = html.escape(f"Your submission of {chapter} scores {score:g} / {max_score:g}: {why}. "
                       "Your instructor has been told.")
    notes = "".join(f"<li>{html.escape(printable(line))}</li>" for line in refused)
    page.write_text(f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(chapter)}"
                    f"</title></head>\n<body><h1>{html.escape(chapter)}</h1>\n<p>{text}</p>"
                    + (f"<ul>{notes}</ul>" if notes else "") + "</body></html>\n")


def threads_per_kernel(jobs: int) -> int:
    """Each of the ``jobs`` kernels running at once gets an equal share of the cores. PyTorch's
    default, a thread per core in every kernel, oversubscribes them, and OpenMP's waiting threads
    then slow every step several-fold. An OMP_NUM_THREADS already set is kept."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def _log_finding(student: str, chapter: str, finding: str) -> None:
    with open(AUTOGRADER / INTEGRITY_LOG, "a") as log:
        log.write(json.dumps({"student": student, "assignment": chapter, "notebook": chapter,
                              "finding": finding}) + "\n")


def check_submissions(chapter: str) -> None:
    """intake's look at each submission of ``chapter`` before nbgrader reads any of it."""
    for student in _student_folders():
        folder = student / chapter
        if os.path.lexists(folder):      # what it refuses is a finding once the notebook is graded
            intake.check_submission(folder, student.name, chapter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--feedback-only", action="store_true",
                        help="after manual grading: rebuild feedback and the CSV, run nothing")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="submissions graded at once (default: one per CPU core)")
    args = parser.parse_args()
    os.environ.pop("GPULAB_ANSWER_KEYS", None)  # keys never reach a learner's kernel
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_kernel(args.jobs)))
    integrity = AUTOGRADER / INTEGRITY_LOG
    if not args.feedback_only:
        # Each autograde process imports the keys, and with them torch (about 3 CPU-s). Imported
        # here once, it comes with every fork (start_nbgrader). Nothing runs on it here, so a
        # fork of this process is as safe as one of a DataLoader's workers.
        import torch  # noqa: F401
        for warning in sandbox_warnings():  # fails now, with the install command, if bwrap is missing
            print(f"WARNING: {warning}")
        limit = submission_timeout()
        integrity.unlink(missing_ok=True)
        (AUTOGRADER / PROGRESS_LOG).unlink(missing_ok=True)
        for student, message in intake.check_students(SUBMITTED):
            print(f"  refused  {printable(student)}: {printable(message)}")
            _log_finding(student, "*", message)
    chapters_submitted = submitted_chapters()
    if not chapters_submitted:
        raise SystemExit(f"nothing to grade: no folders like {SUBMITTED}/<student>/<chapter>/")
    if not args.feedback_only and course_seed():
        print("per-student numbers: on (the course seed in nbgrader_config.py); each submission "
              "is judged against the key for its student's numbers")
    problems: dict[str, dict[str, str]] = {}
    for chapter in chapters_submitted:
        not_graded = {}
        if not args.feedback_only:
            try:
                # (Re)generating the graded release records the chapter's source cells, hidden
                # tests included, in the gradebook: autograde restores test cells from there.
                release(chapter, "autograder/graded_release", self_checks=False)
            except subprocess.CalledProcessError as error:
                print(f"ERROR: {chapter}: its release failed ({error}); the chapter is not graded")
                continue
            check_submissions(chapter)
            not_graded = autograde(chapter, args.jobs, limit)
        problems[chapter] = feedback(chapter, not_graded)
    try:
        nbgrader("export", "--to", str(AUTOGRADER / "grades.csv"))
    except subprocess.CalledProcessError as error:
        print(f"ERROR: the grades CSV could not be written ({error})")
    summary(chapters_submitted, problems)


def summary(chapters_graded: list[str], problems: dict[str, dict[str, str]]) -> None:
    with Gradebook("sqlite:///" + str(AUTOGRADER / "gradebook.db")) as gradebook:
        for chapter in chapters_graded:
            try:
                submissions = gradebook.assignment_submissions(chapter)
            except MissingEntry:
                continue
            for submission in submissions:
                print(f"{chapter}  {printable(submission.student_id):<20} "
                      f"{submission.score:g} / {submission.max_score:g}"
                      + ("  (needs manual grading)" if submission.needs_manual_grade else ""))
    findings = _log_lines(INTEGRITY_LOG)
    if findings:
        print(f"{len(findings)} integrity finding(s), also at the top of each student's feedback:")
        for f in findings:
            print(f"  {f['assignment']}  {printable(str(f['student']))}: {printable(f['finding'])}")
    timed_out = [f for f in findings if TIME_LIMIT.search(f["finding"])]
    if timed_out:
        print(f"{len(timed_out)} submission(s) stopped at a time limit (the cells that ran are graded):")
        for f in timed_out:
            print(f"  {f['assignment']}  {printable(str(f['student']))}: {printable(f['finding'])}")
    for chapter, failed in problems.items():
        for student, why in failed.items():
            print(f"NOT GRADED IN FULL: {chapter}  {printable(student)}: {why}")
    print(f"grades: {(AUTOGRADER / 'grades.csv').relative_to(AUTOGRADER.parent)}; "
          f"feedback: autograder/feedback/")


if __name__ == "__main__":
    main()
