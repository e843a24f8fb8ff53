"""tests/hang_watchdog.py on a planted hang, in a pytest run of its own with two workers."""
import os
import signal
import subprocess
import sys
from pathlib import Path

HANG = '''
import ctypes


def hang():
    libc = ctypes.PyDLL(None)         # a call through PyDLL keeps the GIL: no other thread runs
    while True:
        libc.sleep(3600)


def test_hangs():
    hang()
'''


def test_a_test_that_holds_the_gil_ends_the_run_with_where_it_hung(tmp_path):
    """No thread of the worker runs (pytest-timeout's neither): the controller describes the
    worker's threads and Python stack, kills every process of the run and exits with status 3."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_planted.py").write_text(HANG)
    (tmp_path / "test_other.py").write_text("def test_fine():\n    pass\n")
    env = {**os.environ, "GPULAB_HANG_S": "2",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(tmp_path)])}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadscope",
                            "-p", "hang_watchdog", "-p", "no:cacheprovider", str(tmp_path)],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        out, _ = run.communicate(timeout=120)
    finally:                    # a worker left hanging (should the watchdog fail) goes too
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert run.returncode == 3, out
    assert "HUNG TEST: test_planted.py::test_hangs has run" in out, out
    assert "waits in" in out and 'test_planted.py", line 8 in hang' in out, out
    assert "ending the test run" in out
