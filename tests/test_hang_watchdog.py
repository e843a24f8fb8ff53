"""tests/hang_watchdog.py on planted hangs, in a pytest run of its own with two workers."""
import os
import subprocess
import sys
from pathlib import Path

HANGS = '''
import ctypes, os
from pathlib import Path


def hang():
    libc = ctypes.PyDLL(None)         # a call through PyDLL keeps the GIL: no other thread runs
    while True:
        libc.sleep(3600)


def test_hangs_once():
    mark = Path(os.environ["PLANTED_MARK"])
    if not mark.exists():
        mark.write_text("hung once")
        hang()


def test_after_it():
    pass
'''

HANGS_ALWAYS = '''
from test_once import hang


def test_hangs_every_time():
    hang()
'''


def test_a_hung_test_is_described_ended_and_run_once_more(tmp_path):
    """A test that holds the GIL in C code (no thread of its worker runs: pytest-timeout's
    neither) is described, ended and run again in a fresh worker; one that hangs every time is
    ended twice and then fails at its next start."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_once.py").write_text(HANGS)
    (tmp_path / "test_always.py").write_text(HANGS_ALWAYS)
    env = {**os.environ, "GPULAB_HANG_S": "2", "PLANTED_MARK": str(tmp_path / "mark"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(tmp_path)])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadscope",
                          "-p", "hang_watchdog", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "2 passed, 1 error, 3 rerun" in out, out
    assert "PASSED test_once.py::test_hangs_once" in out and "ERROR test_always.py::test_hangs_every_time" in out
    assert "test_once.py::test_hangs_once: ended and run again" in out
    assert "test_always.py::test_hangs_every_time: hung twice: failed" in out
    assert "it hung twice and was ended both times; not run a third time" in out
    # what each hang showed: the worker's threads in the kernel and its Python stack
    assert "HUNG TEST ENDED: test_once.py::test_hangs_once ran" in out
    assert "waits in" in out and 'test_once.py", line 9 in hang' in out, out
