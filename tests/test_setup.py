"""The two-command setup: dependency lists agree, a bad Python stops at once with advice, and the
torch floor is one version everywhere with every torch name the course uses in it."""
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
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


# --------------------------------------------------------------------------------------------
# Which torch (issue 29): the course is tested with the floor, and uses nothing the floor lacks

def _floor_from(text: str, pattern: str) -> str:
    found = re.findall(pattern, text)
    assert len(found) == 1, (pattern, found)
    return found[0]


def test_the_torch_floor_is_the_same_everywhere_and_make_test_installs_it():
    from gpulab.device.preflight import TORCH_FLOOR

    read = lambda name: (ROOT / name).read_text()
    assert _floor_from(read("scripts/setup_venv.sh"), r'min_torch="([\d.]+)"') == TORCH_FLOOR
    assert _floor_from(read("pyproject.toml"), r'"torch>=([\d.]+)"') == TORCH_FLOOR
    assert _floor_from(read("environment.yml"), r"- torch>=([\d.]+)") == TORCH_FLOOR
    # make test (and CI, on a fresh clone) installs Makefile's default TORCH: the floor itself, so
    # the name check below resolves against the floor's torch.
    pinned = _floor_from(read("Makefile"), r"TORCH\s*\?= torch==([\d.]+)")
    assert pinned.rsplit(".", 1)[0] == TORCH_FLOOR
    assert f"torch {TORCH_FLOOR}" in read("README.md")


def _notebook_sources():
    """(where, code, strict) for every Python source the course runs or shows: gpulab, the keys,
    the scripts, each solution notebook's code cells in order (one namespace: `import torch` in
    the first cell counts for the rest) and its ```python blocks (illustrations: strict=False)."""
    for folder in ("gpulab", "autograder/keys", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text(), True
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text())["cells"]):
            text = "".join(cell["source"])
            if cell["cell_type"] == "code":
                code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                 for line in text.splitlines())
                yield f"{path.name}#{index}", code, True
            else:
                for block in re.findall(r"```python\n(.*?)```", text, re.S):
                    yield f"{path.name}#{index}", block, False


def torch_names(tree, aliases: dict) -> set[str]:
    """The dotted torch names a module uses: ``torch.backends.cuda.cublas_workspace_size`` for
    ``torch.backends.cuda.cublas_workspace_size()``, ``torch.nn.functional.gelu`` for ``F.gelu``
    after ``import torch.nn.functional as F``. ``aliases`` (name -> dotted torch name) carries on
    from cell to cell."""
    import ast

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names if a.name != "*"})
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:   # the whole chain
            parts, root = [], node
            while isinstance(root, ast.Attribute):
                parts.append(root.attr)
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                names.add(".".join([aliases[root.id], *reversed(parts)]))
    return names | set(aliases.values())


def unresolved(names) -> list[str]:
    """The names the installed torch does not have (a module imported, then attributes read)."""
    import importlib

    missing = []
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        try:
            for attribute in parts[cut:]:
                found = getattr(found, attribute)
        except AttributeError:
            missing.append(name)
    return missing


def test_every_torch_name_the_course_uses_exists_in_this_torch():
    """Statically collected from gpulab, the keys, the scripts and every solution notebook, GPU-only
    paths included (chapter 02's torch.backends.cuda.cublas_workspace_size, chapter 04's
    fp32_precision, the CUDA memory snapshot), and resolved against the installed torch: the
    floor's, under make test. Names reached through a variable (props.total_memory) are not seen."""
    import ast

    names, aliases_of = {}, {}
    for where, code, strict in _notebook_sources():
        try:
            tree = ast.parse(code)
        except SyntaxError:
            assert not strict, f"{where} does not parse"
            continue
        for name in torch_names(tree, aliases_of.setdefault(where.split("#")[0], {})):
            names.setdefault(name, where)
    assert {"torch.backends.cuda.cublas_workspace_size", "torch.backends.cuda.matmul.fp32_precision",
            "torch.cuda.device_count", "torch.amp.GradScaler"} <= names.keys()
    missing = unresolved(names)
    assert not missing, [f"{name} (first used in {names[name]})" for name in missing]
    # Resolvable but deprecated since torch 2.9: TF32 goes through fp32_precision (issue 29).
    deprecated = {"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
                  "torch.set_float32_matmul_precision"}
    assert not deprecated & names.keys(), {name: names[name] for name in deprecated & names.keys()}


def test_the_name_check_finds_a_name_torch_lacks():
    import ast

    tree = ast.parse("import torch\nimport torch.nn.functional as F\n"
                     "torch.backends.cuda.no_such_workspace()\nF.no_such_gelu(x)\nF.gelu(x)\n")
    names = torch_names(tree, {})
    assert unresolved(names) == ["torch.backends.cuda.no_such_workspace",
                                 "torch.nn.functional.no_such_gelu"]


def test_this_torch_counts_gpus_as_chapter_01_teaches(monkeypatch):
    """Chapter 01's Experiment 2 sets CUDA_VISIBLE_DEVICES after CUDA has started and expects
    device_count() to keep CUDA's view. torch 2.13 answers from NVML (re-reading the variable)
    only before CUDA starts, and from CUDA once it has (pytorch/pytorch#175355); earlier torch
    answered from NVML then too, with the changed variable: 0 GPUs. The machine is made up: NVML
    sees none under the late variable, CUDA kept the 8 it found at start."""
    import torch

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(cuda, "_cached_device_count", None)
    monkeypatch.setattr(cuda, "_device_count_nvml", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: 8, raising=False)
    monkeypatch.setattr(cuda, "_initialized", False)
    assert cuda.device_count() == 0            # before CUDA starts: NVML and the variable now
    monkeypatch.setattr(cuda, "_initialized", True)
    assert cuda.device_count() == 8            # once it has started: what CUDA read at start


@pytest.mark.parametrize("version, too_old", [
    ("2.4.1+cu121", True), ("2.12.0", True), ("2.13.0+cpu", False), ("2.14.0a0+git", False),
])
def test_the_doctor_calls_torch_older_than_the_floor_an_error(version, too_old):
    from gpulab.device.facts import DeviceFacts
    from gpulab.device.preflight import diagnose, is_usable

    facts = DeviceFacts(torch_version=version, torch_cuda=None, cuda_available=False,
                        cuda_visible_devices=None)
    findings = diagnose(facts)
    old = [f for f in findings if "older than 2.13" in f.message]
    assert bool(old) == too_old and is_usable(findings) != too_old
    if too_old:
        assert old[0].level == "error" and "make lab TORCH=" in old[0].next_step
