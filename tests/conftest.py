"""The suite's order: its costliest parts first, so that `make test`'s two workers share them;
and the tests that need root, for a run as another user.

pytest-xdist (`--dist loadscope`) hands each worker a module (or a class) at a time, in the order
collected here (the Makefile turns off xdist's own reordering, which goes by the number of
tests, not by their cost). Started last, a grading batch would run on one worker long after
the other had finished; started first, the cheap modules fill in around them.

``@pytest.mark.needs_root``: a test that creates system accounts, cgroups or mounts (workshop
mode does all three). Run as another user, `make test` skips it and its summary lists it as
needing `sudo make test`; everything else runs and must pass. CI runs as root and runs them all.
"""
import os

import pytest

NEEDS_ROOT = "needs root: run `sudo make test`"

# Under xdist a test that pytest-timeout cannot end ends the run, saying where (tests/hang_watchdog.py).
pytest_plugins = ["hang_watchdog"]

# Costliest first (seconds of CPU in a fresh clone's `make test`, measured; keep it in that order).
COSTLIEST_FIRST = (
    "tests/test_pipeline.py::TestBatch1",        # grades five chapters, each solution whole
    "tests/test_pipeline.py::TestBatch2",
    "tests/test_adversarial.py",                 # about fifty hostile submissions graded
    "tests/test_workshop.py",                    # a hub, ten learners' servers, Chromium
    "tests/test_browser.py",                     # JupyterLab and the Formgrader in Chromium
    "tests/test_book.py",                        # the book built, one chapter executed
)


def _rank(nodeid: str) -> int:
    return next((rank for rank, prefix in enumerate(COSTLIEST_FIRST)
                 if nodeid == prefix or nodeid.startswith(prefix + "::")), len(COSTLIEST_FIRST))


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: _rank(item.nodeid))      # stable: each module keeps its order
    if os.geteuid() != 0:
        for item in items:
            if item.get_closest_marker("needs_root"):
                item.add_marker(pytest.mark.skip(reason=NEEDS_ROOT))


def pytest_terminal_summary(terminalreporter):
    """One line per test that did not run for want of root (from every xdist worker)."""
    skipped = [report for report in terminalreporter.stats.get("skipped", [])
               if isinstance(report.longrepr, tuple) and NEEDS_ROOT in str(report.longrepr[-1])]
    if skipped:
        terminalreporter.section("tests that need root")
        terminalreporter.write_line(f"{len(skipped)} tests need root and did not run as uid "
                                    f"{os.geteuid()}: run `sudo make test` to run them too "
                                    "(CI does, as root):")
        for report in skipped:
            terminalreporter.write_line(f"  {report.nodeid}")
