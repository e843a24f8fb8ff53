"""Which device the lab runs on, and the preflight report that says whether it can.

Notebooks call ``best_device()``. ``doctor()`` (or ``python -m gpulab doctor``) answers "can this
machine run the lab, and if not, what do I do next?" in three steps kept apart:

    collect_facts()                 -> DeviceFacts    what torch and the NVIDIA driver report
    diagnose(facts)                 -> list[Finding]  pure rules: tests feed it made-up machines
    render_report(facts, findings)  -> str            the text a learner reads

The driver is asked through NVML (the library nvidia-smi itself uses, via the ``pynvml`` module of
nvidia-ml-py), never by parsing nvidia-smi's output, whose layout changes between versions.
Sizes are reported in GiB (2^30 bytes).

One module per idea, in the order a learner meets them:

- ``gpulab.device.choosing``   chapter 01: ``best_device``; what CUDA_VISIBLE_DEVICES does
                               (``physical_gpu``, ``count_gpus_in_this_process``,
                               ``visible_gpu_counts``, ``visible_gpu_count``); the learner's
                               memory budget (``LEARNER_BUDGET_BYTES``, ``MIN_FREE_FRACTION``)
- ``gpulab.device.facts``      what torch and the driver report: ``collect_facts`` ->
                               ``DeviceFacts`` (``TorchGPU``, ``NvmlGPU``, ``GPUProcess``, the
                               ``NVML_*`` statuses)
- ``gpulab.device.preflight``  the doctor: ``Finding``, ``diagnose``, ``is_usable``,
                               ``render_report``, ``doctor``
- ``gpulab.device.health``     what the driver says of a GPU's health: clock-event bits, power,
                               ECC, row remapping, kernels for this GPU (the doctor; chapter 08)
- ``gpulab.device.hardware``   datasheet figures of A100/H100/H200, each row with its sources
- ``gpulab.device.sampler``    the background thread the course's NVML samplers share
- ``gpulab.device.footprint``  a learner's real GPU footprint from NVML, summed over their
                               processes (``make gpu-check``, ``make workshop-check``)

``health``, ``hardware``, ``sampler`` and ``footprint`` are imported as modules
(``from gpulab.device import hardware``).

Every name is offered here too, so a notebook writes ``from gpulab.device import best_device``
whichever module holds it. To replace a function in a test, patch it in the module that holds
it: a module calls its neighbours' functions through its own imports, not through
``gpulab.device``.
"""

from gpulab.device.choosing import (LEARNER_BUDGET_BYTES, MIN_FREE_FRACTION, GiB, best_device,
                                    count_gpus_in_this_process, physical_gpu, visible_gpu_count,
                                    visible_gpu_counts)
from gpulab.device.facts import (NVML_INIT_FAILED, NVML_NO_LIBRARY, NVML_NOT_INSTALLED, NVML_OK,
                                 DeviceFacts, GPUProcess, NvmlGPU, TorchGPU, collect_facts)
from gpulab.device.preflight import Finding, diagnose, doctor, is_usable, render_report

__all__ = [
    # choosing the device; CUDA_VISIBLE_DEVICES (chapter 01)
    "GiB", "LEARNER_BUDGET_BYTES", "MIN_FREE_FRACTION", "best_device", "physical_gpu",
    "count_gpus_in_this_process", "visible_gpu_counts", "visible_gpu_count",
    # the facts torch and the driver report
    "TorchGPU", "GPUProcess", "NvmlGPU", "NVML_OK", "NVML_NOT_INSTALLED", "NVML_NO_LIBRARY",
    "NVML_INIT_FAILED", "DeviceFacts", "collect_facts",
    # the preflight report
    "Finding", "diagnose", "is_usable", "render_report", "doctor",
]
