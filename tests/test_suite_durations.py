"""scripts/suite_durations.py (make bench): it reads pytest's durations right and runs the suite as
`make test` does."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import suite_durations  # noqa: E402

REPORT = """\
============================= slowest durations =============================
40.10s call     tests/test_book.py::test_every_chapter_is_a_page
12.00s setup    tests/test_book.py::test_every_chapter_is_a_page
3.50s call     solutions/01_device_basics/01_device_basics.ipynb::Cell 12
2.25s call     solutions/01_device_basics/01_device_basics.ipynb::Cell 3
0.50s teardown tests/test_arith.py
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
812 passed, 8 skipped in 455.10s (0:07:35)
"""


def test_durations_add_up_per_file_and_per_test():
    per_file, per_test = suite_durations.parse_durations(REPORT)
    assert per_file == {"tests/test_book.py": 52.1,
                        "solutions/01_device_basics/01_device_basics.ipynb": 5.75,
                        "tests/test_arith.py": 0.5}
    assert per_test[0] == (52.1, "tests/test_book.py::test_every_chapter_is_a_page")
    assert [t for _, t in per_test][1:3] == [
        "solutions/01_device_basics/01_device_basics.ipynb::Cell 12",
        "solutions/01_device_basics/01_device_basics.ipynb::Cell 3"]


def test_the_suite_runs_as_make_test_runs_it():
    command = suite_durations.make_test_command()
    assert command[:3] == [sys.executable, "-m", "pytest"]
    assert "tests" in command and "-n" in command
