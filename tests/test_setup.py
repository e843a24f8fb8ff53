"""The two-command setup: dependency lists agree, and a bad Python stops at once with advice."""
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup_venv.sh"


def test_environment_yml_lists_exactly_pyprojects_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = [line for line in pip_section if not line.startswith("-")]
    assert sorted(listed) == sorted(wanted)
    assert "-e ." in pip_section
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert python.removeprefix("python") == project["requires-python"]


def setup(tmp_path, python, torch="torch==2.13.0"):
    venv = tmp_path / "venv"
    result = subprocess.run(["bash", str(SETUP), python, str(venv), torch], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    return result, venv


def test_missing_python_stops_with_what_to_install(tmp_path):
    result, venv = setup(tmp_path, str(tmp_path / "no-such-python"))
    assert result.returncode == 1
    assert "Install Python 3.10 or newer" in result.stderr and "PYTHON=" in result.stderr
    assert not venv.exists()


def test_old_python_stops_with_what_to_install(tmp_path):
    old = tmp_path / "python3.8"
    old.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "Python 3.8.18"; exit 0; }\nexit 1\n')
    old.chmod(0o755)
    result, venv = setup(tmp_path, str(old))
    assert result.returncode == 1
    assert "Python 3.8.18 is too old" in result.stderr and "3.10 or newer" in result.stderr
    assert not venv.exists()


def test_failed_install_leaves_no_venv_the_next_run_trusts(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "half-made").write_text("an earlier run stopped here")
    # An install that fails at once, without network: an unknown package with --no-index.
    result, venv = setup(tmp_path, sys.executable, torch="--no-index no-such-package-gpulab")
    assert result.returncode != 0
    assert "rebuilding it" in result.stdout and "install failed" in result.stderr
    assert not venv.exists()
