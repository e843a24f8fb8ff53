"""The benchmark and GPU-check scripts: they refuse to invent figures."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_refuses_without_a_gpu(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a GPU machine
    result = subprocess.run([sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "needs a usable CUDA GPU" in result.stderr
    assert not list(tmp_path.iterdir()), "no report may be written without a GPU"
