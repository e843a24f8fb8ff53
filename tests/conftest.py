"""The suite's order: its costliest parts first, so that `make test`'s two workers share them.

pytest-xdist (`--dist loadscope`) hands each worker a module (or a class) at a time, in the order
collected here (the Makefile turns off xdist's own reordering, which goes by the number of
tests, not by their cost). Started last, a grading batch would run on one worker long after
the other had finished; started first, the cheap modules fill in around them.
"""

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
