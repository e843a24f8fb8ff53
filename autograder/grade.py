"""`make autograde`: grade every submission, write feedback and the grades CSV.

Put each student's work at autograder/submitted/<student>/<chapter>/<chapter>.ipynb (nbgrader's
`collect` does that with an exchange; `zip_collect` does it from an LMS download), then run
`make autograde`. After grading the written answers in the Formgrader, `make feedback`
(this script with --feedback-only) rebuilds feedback and the CSV without re-running anything.
Results:

    autograder/autograded/<student>/<chapter>/   executed, scored copies
    autograder/feedback/<student>/<chapter>/     HTML feedback to return to the student
    autograder/grades.csv                        one row per student and chapter

The test cells are checked against the instructor's answer key in autograder/keys/, never the
copy a student could have edited: GPULAB_ANSWER_KEYS points gpulab.checks at it.
"""
from __future__ import annotations

import argparse
import os

from nbgrader.api import Gradebook

from release import AUTOGRADER, KEYS, nbgrader, release

SUBMITTED = AUTOGRADER / "submitted"


def submitted_chapters() -> list[str]:
    return sorted({p.name for p in SUBMITTED.glob("*/*") if p.is_dir()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--feedback-only", action="store_true",
                        help="after manual grading: rebuild feedback and the CSV, run nothing")
    args = parser.parse_args()
    os.environ["GPULAB_ANSWER_KEYS"] = str(KEYS)  # inherited by the kernels nbgrader starts
    chapters = submitted_chapters()
    if not chapters:
        raise SystemExit(f"nothing to grade: no folders like {SUBMITTED}/<student>/<chapter>/")
    for chapter in chapters:
        if not args.feedback_only:
            # (Re)generating the graded release records the chapter's source cells, hidden tests
            # included, in the gradebook: autograde restores test cells from there.
            release(chapter, "autograder/graded_release", self_checks=False)
            nbgrader("autograde", chapter, "--create", "--force")
        nbgrader("generate_feedback", chapter, "--force")
    nbgrader("export", "--to", str(AUTOGRADER / "grades.csv"))
    with Gradebook("sqlite:///" + str(AUTOGRADER / "gradebook.db")) as gradebook:
        for chapter in chapters:
            for submission in gradebook.assignment_submissions(chapter):
                print(f"{chapter}  {submission.student_id:<20} "
                      f"{submission.score:g} / {submission.max_score:g}"
                      + ("  (needs manual grading)" if submission.needs_manual_grade else ""))
    print(f"grades: {(AUTOGRADER / 'grades.csv').relative_to(AUTOGRADER.parent)}; "
          f"feedback: autograder/feedback/")


if __name__ == "__main__":
    main()
