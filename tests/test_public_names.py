"""Every gpulab name the course uses resolves where it is imported from, and ships in the wheel.

Issue 26 regrouped gpulab by chapter, moving modules without leaving shims behind: a learner
reading ``from gpulab.X import Y`` in a chapter finds Y in X. So the names the notebooks, answer
keys, scripts, the workshop and the tests import or use (``from gpulab.course import plots`` and
then ``plots.bars``) are read from their source and resolved here, and no old top-level module
answers any more. The packages whose names already read as the table of contents keep every
public name they offered (PUBLIC_NAMES).
"""
import ast
import importlib
import importlib.util
import json
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PUBLIC_NAMES = {
    # From gpulab/arith.py before it became the package gpulab/arith/ (one module per chapter).
    "gpulab.arith": [
        # chapter 01: bytes and transfers
        "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "bytes_per_element", "tensor_bytes",
        "transfer_seconds", "batches_per_second", "resident_warps",
        # chapter 02: training memory
        "RECIPES", "model_state_bytes", "activation_bytes_per_layer", "ZERO_STAGES",
        "check_positive_integers", "gpt_param_count", "zero_sharded", "ALLOCATOR_ROUNDING",
        "allocator_bytes", "segment_size", "predict_training_memory",
        # chapter 03: FLOPs and the roofline
        "matmul_flops", "matmul_bytes", "training_flops", "mfu", "arithmetic_intensity",
        "attention_bytes", "critical_intensity", "roofline_seconds", "bound", "SECONDS_PER_DAY",
        "training_days",
        # chapter 05: checkpointing and accumulation
        "sqrt_segment_size", "segment_activation_bytes", "best_segment_size",
        "training_flops_with_checkpointing", "global_batch", "accumulation_steps",
        "largest_micro_batch",
        # chapter 06: communication
        "LINKS", "COLLECTIVES", "allreduce_seconds", "allgather_seconds", "reduce_scatter_seconds",
        "collective_seconds", "algorithm_bandwidth", "bus_bandwidth", "zero_bytes_per_gpu",
        "zero_comm_bytes", "dp_step_seconds", "min_tokens_compute_bound",
        "pipeline_bubble_fraction",
    ],
    # From gpulab/measure.py before it became the package gpulab/measure/ (commit a556270).
    "gpulab.measure": [
        # chapter 01: timing and copies
        "Timing", "synchronize", "time_fn", "CopyBandwidth", "host_copy_bandwidth",
        "allocated_bytes",
        # chapter 02: peak memory (re-exported from gpulab.measure.memory)
        "MemoryPeak", "peak_memory", "training_step_peak",
        # chapter 03: throughput, launch overhead, attention, training-step throughput
        "Throughput", "matmul_throughput", "elementwise_throughput", "LaunchOverhead",
        "launch_overhead", "training_step_throughput", "naive_attention",
        "attention_naive_vs_fused",
        # chapter 05: what recomputation costs
        "training_step_timing", "step_seconds",
    ],
    # From gpulab/precision.py before it became the package gpulab/precision/ (commit 5ca9381).
    "gpulab.precision": [
        # formats and rounding
        "Format", "FORMATS", "number_format", "round_to", "running_sum", "stall_point",
        # gradients that underflow, loss scaling
        "initial_logit_gradient", "logit_gradients", "loss_scale_after", "grad_scaler_scale",
        # autocast: output dtypes and saved bytes
        "FLOAT32_OPS", "autocast_output_dtypes", "saved_tensor_bytes", "parameter_copy_bytes",
        "autocast_state_bytes", "autocast_bytes_per_score", "autocast_saved_bytes",
        # training in each precision
        "PRECISIONS", "text_corpus", "sample_batch", "TrainingRun", "train", "step_seconds",
    ],
    # From gpulab/device.py before it became the package gpulab/device/.
    "gpulab.device": [
        # choosing the device; CUDA_VISIBLE_DEVICES (chapter 01)
        "GiB", "LEARNER_BUDGET_BYTES", "MIN_FREE_FRACTION", "best_device", "physical_gpu",
        "count_gpus_in_this_process", "visible_gpu_counts", "visible_gpu_count",
        # the facts torch and the driver report
        "TorchGPU", "GPUProcess", "NvmlGPU", "NVML_OK", "NVML_NOT_INSTALLED", "NVML_NO_LIBRARY",
        "NVML_INIT_FAILED", "DeviceFacts", "collect_facts",
        # the preflight report
        "Finding", "diagnose", "is_usable", "render_report", "doctor",
    ],
    # From gpulab/pipeline.py before it became the package gpulab/pipeline/ (commit 5ca9381).
    "gpulab.pipeline": [
        # the step-time model
        "step_seconds", "device_idle_share", "bottleneck", "workers_needed", "loading_speedup",
        "usable_cores", "compile_break_even_steps",
        # synthetic datasets
        "LatencyDataset", "busy_work", "calibrate_rounds", "DecodeDataset", "TokenDataset",
        # the stand-in step and the measured loop
        "StandInCompute", "LoopTiming", "shutdown", "time_loop", "load_seconds", "make_loader",
        "measure_pipeline", "loading_rate",
        # pinned memory and a second stream; the capstone ladder
        "copy_compute_overlap", "Rung", "run_rung",
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
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    on_disk = sorted(".".join(init.parent.relative_to(ROOT).parts)
                     for init in (ROOT / "gpulab").rglob("__init__.py"))
    assert sorted(listed) == on_disk


#: Top-level modules before issue 26, and where they went. None of them may answer any more.
MOVED = {"checks": "course", "variants": "course", "predict": "course", "plots": "course",
         "widgets": "course", "hardware": "device", "sampler": "device", "footprint": "device",
         "memory": "measure", "accumulation": "checkpointing", "dist": "parallel",
         "collectives": "parallel", "data_parallel": "parallel", "trace": "pipeline",
         "utilisation": "pipeline", "monitor": "monitoring", "failures": "monitoring"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_left_no_shim_behind(old):
    assert importlib.util.find_spec(f"gpulab.{old}") is None, f"gpulab.{old} still answers"
    assert importlib.util.find_spec(f"gpulab.{MOVED[old]}.{old}") is not None


def _sources():
    """(where, Python source) of every notebook code cell and Python file that uses gpulab."""
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).splitlines()
                yield f"{path.name} cell {i}", "\n".join(l for l in lines
                                                         if not l.lstrip().startswith(("%", "!")))
    for folder in ("autograder", "scripts", "workshop", "tests", "gpulab"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text()


def _resolve(dotted: str):
    """The object ``gpulab.a.b.c`` names: modules imported as needed, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError: the name is not there
        return obj
    raise ModuleNotFoundError(dotted)


def _used_names(tree: ast.AST) -> set[str]:
    """Dotted gpulab names a source uses: what it imports, and ``alias.attr`` on a gpulab module
    it imported (one attribute deep: ``plots.bars``, ``gpulab.device.hardware.GPUS``)."""
    bound, used = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "gpulab" or node.module.startswith("gpulab.")):
            for alias in node.names:
                used.add(f"{node.module}.{alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gpulab":
                    used.add(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["gpulab"] = "gpulab"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in bound:
                used.add(".".join([bound[inner.id]] + chain[::-1]))
    return used


def test_every_gpulab_name_the_course_uses_resolves():
    """What a notebook, key, script or test imports from gpulab, and the attributes it reads off
    the gpulab modules it imported, all exist: a move that missed one place fails here first."""
    import types
    missing = []
    for where, source in _sources():
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell holding a student's "..." placeholder or a shell line
            continue
        for dotted in sorted(_used_names(tree)):
            try:
                obj = _resolve(dotted)
            except (ModuleNotFoundError, AttributeError):
                # an attribute read on something a module holds (``trace.events[0]``) is not a
                # module's name: only a module's own missing attribute counts
                parent, _, _ = dotted.rpartition(".")
                try:
                    holder = _resolve(parent)
                except (ModuleNotFoundError, AttributeError):
                    missing.append(f"{where}: {dotted}")
                    continue
                if isinstance(holder, types.ModuleType):
                    missing.append(f"{where}: {dotted}")
    assert not missing, "names that do not resolve:\n" + "\n".join(missing)
