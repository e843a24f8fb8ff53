"""Command line:

- ``python -m gpulab doctor`` prints the preflight report (see gpulab.device). Exit status 0 when
  the lab can run here (CPU-only included), 1 when something is broken.
- ``python -m gpulab progress [COURSE]`` prints a self-study learner's progress in every chapter,
  from their notebooks as last saved (gpulab.course.progress); COURSE is the course's folder
  (default: this one). Exit status 0.

Exit status 2 for a missing or unknown command.
"""

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab", description="GPU Training Lab helpers.")
    commands = parser.add_subparsers(dest="command", metavar="command")
    commands.add_parser("doctor", help="check that this machine can run the lab; exit 1 if broken")
    progress = commands.add_parser("progress", help="your quizzes in every chapter, from your saved notebooks")
    progress.add_argument("course", nargs="?", type=Path, default=Path.cwd(),
                          help="the course's folder (default: the current one)")
    args = parser.parse_args(argv)  # an unknown command exits 2 with the usage
    if args.command == "progress":
        from gpulab.course.progress import report   # no torch: the report only reads notebooks

        print(report(args.course))
        return 0
    if args.command != "doctor":
        parser.print_help()
        return 2

    from gpulab import device  # imports torch: only when a command needs it, so --help stays fast

    facts = device.doctor()
    return 0 if device.is_usable(device.diagnose(facts)) else 1


if __name__ == "__main__":
    sys.exit(main())
