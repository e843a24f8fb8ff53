"""No public name is lost when a library module is split into a package (issue 17, item 4).

Notebooks, answer keys, scripts and tests write ``measure.time_fn``, ``arith.xxx``: each module
below must go on offering every name it offered before its split. To cover another module, add
it to PUBLIC_NAMES with the names its last single-file version offered (its functions, classes,
constants and deliberate re-exports, not the modules it happened to import).
"""
import importlib
import tomllib
from pathlib import Path

import pytest

PUBLIC_NAMES = {
    # From gpulab/measure.py before it became the package gpulab/measure/ (commit a556270).
    "gpulab.measure": [
        # chapter 01: timing and copies
        "Timing", "synchronize", "time_fn", "CopyBandwidth", "host_copy_bandwidth",
        "allocated_bytes",
        # chapter 02: peak memory (re-exported from gpulab.memory)
        "MemoryPeak", "peak_memory", "training_step_peak",
        # chapter 03: throughput, launch overhead, attention, training-step throughput
        "Throughput", "matmul_throughput", "elementwise_throughput", "LaunchOverhead",
        "launch_overhead", "training_step_throughput", "naive_attention",
        "attention_naive_vs_fused",
        # chapter 05: what recomputation costs
        "training_step_timing", "step_seconds",
    ],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC_NAMES))
def test_every_public_name_is_still_offered(module_name):
    module = importlib.import_module(module_name)
    missing = [name for name in PUBLIC_NAMES[module_name] if not hasattr(module, name)]
    assert not missing, f"{module_name} no longer offers {missing}"
    # Where the module lists its names in __all__ (what `import *` takes), every old name is in
    # it, and it names nothing the module lacks (a typo there breaks `import *`).
    listed = getattr(module, "__all__", None)
    if listed is not None:
        unlisted = sorted(set(PUBLIC_NAMES[module_name]) - set(listed))
        assert not unlisted, f"{module_name}.__all__ lacks {unlisted}"
        absent = [name for name in listed if not hasattr(module, name)]
        assert not absent, f"{module_name}.__all__ names {absent}, which it does not define"


def test_every_subpackage_goes_into_the_wheel():
    """pyproject.toml lists packages by hand: a split module's new folder must be in the list, or
    an install that is not editable (a wheel) would have no ``gpulab.measure`` at all."""
    root = Path(__file__).resolve().parents[1]
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    on_disk = sorted(".".join(init.parent.relative_to(root).parts)
                     for init in (root / "gpulab").rglob("__init__.py"))
    assert sorted(listed) == on_disk
