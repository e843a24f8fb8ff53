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
        # chapter 02: peak memory (re-exported from gpulab.memory)
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
    root = Path(__file__).resolve().parents[1]
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    on_disk = sorted(".".join(init.parent.relative_to(root).parts)
                     for init in (root / "gpulab").rglob("__init__.py"))
    assert sorted(listed) == on_disk
