"""Where `make test`'s time goes: the venv's setup time and pytest's durations, per file and per test.

    python scripts/suite_durations.py            # the suite as `make test` runs it, plus a fresh venv
    python scripts/suite_durations.py --no-setup # the suite only

`make bench` runs it. The suite runs exactly as `make test` runs it (same flags, two workers), with
`--durations=0`, and each test's setup + call + teardown is added up per file. The setup time is
a new venv built by scripts/setup_venv.sh in a temporary folder (pip's cache warm, as on a machine that ran it once).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A --durations line: "12.34s call     tests/test_book.py::test_pages[01]".
DURATION = re.compile(r"^\s*([\d.]+)s\s+(setup|call|teardown)\s+(\S+?)(?:::(.*))?$")


def make_test_command() -> list[str]:
    """pytest's arguments from the Makefile's test target, so the two cannot drift apart."""
    recipe = re.search(r"^test:.*\n(?:\t.*\n)*", (ROOT / "Makefile").read_text(), re.M).group(0)
    line = next(l for l in recipe.splitlines() if "-m pytest" in l)
    return [sys.executable, "-m", "pytest", *line.split("-m pytest", 1)[1].split()]


def parse_durations(output: str) -> tuple[dict[str, float], list[tuple[float, str]]]:
    """(seconds per file, [(seconds, test id)]) from pytest's --durations=0 report."""
    per_file: dict[str, float] = defaultdict(float)
    per_test: dict[str, float] = defaultdict(float)
    for line in output.splitlines():
        match = DURATION.match(line)
        if match:
            seconds, _, path, name = float(match[1]), match[2], match[3], match[4]
            per_file[path] += seconds
            per_test[f"{path}::{name}" if name else path] += seconds
    return dict(per_file), sorted(((s, t) for t, s in per_test.items()), reverse=True)


def setup_seconds() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run(["scripts/setup_venv.sh", sys.executable, f"{tmp}/venv", "torch==2.13.0"],
                       cwd=ROOT, check=True, capture_output=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--no-setup", action="store_true", help="skip building a fresh venv")
    parser.add_argument("--top", type=int, default=15, help="how many of the slowest tests to list")
    args = parser.parse_args()
    if not args.no_setup:
        print(f"setup: a new venv by scripts/setup_venv.sh took {setup_seconds():.0f} s")
    start = time.perf_counter()
    result = subprocess.run(make_test_command() + ["--durations=0", "-q", "-p", "no:cacheprovider"],
                            cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    summary = [l for l in result.stdout.splitlines() if re.search(r"\d+ (passed|failed)", l)]
    print(f"pytest as make test runs it: {wall:.0f} s wall; {summary[-1] if summary else 'no summary'}")
    per_file, per_test = parse_durations(result.stdout)
    print(f"\nper file (setup + call + teardown; two workers, so these add up to ~2x the wall time):")
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1]):
        print(f"  {seconds:7.1f} s  {path}")
    print(f"\nthe {args.top} slowest tests:")
    for seconds, test in per_test[:args.top]:
        print(f"  {seconds:7.1f} s  {test}")
    if result.returncode != 0:
        print(result.stdout[-3000:], file=sys.stderr)
        sys.exit(result.returncode)


if __name__ == "__main__":
    main()
