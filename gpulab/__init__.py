"""gpulab: the small library the GPU Training Lab notebooks import.

Its folders follow the course, one per chapter idea, in the order a learner meets them:

- ``gpulab.device``         01: choosing the device, facts from torch and NVML, datasheets
                            (``hardware``), the GPU's health, a learner's footprint on it, the
                            doctor (``python -m gpulab doctor``)
- ``gpulab.arith``          the course's formulas, one module per chapter, each citing its source
- ``gpulab.models``         the course's GPT, whose memory follows the formulas
- ``gpulab.measure``        timing, bandwidth, peak memory and throughput, right on CPU and GPU
- ``gpulab.precision``      04: number formats, loss scaling, autocast, training per precision
- ``gpulab.checkpointing``  05: gradient accumulation (and checkpointing's measurements)
- ``gpulab.parallel``       06: ranks from a notebook, the collectives, DDP, ZeRO and FSDP
- ``gpulab.pipeline``       07: the step-time model, datasets, the measured loop, profiling
- ``gpulab.monitoring``     08: a GPU monitor, the classic failures, checkpoint intervals
- ``gpulab.batch_size``     10: the gradient noise scale, the critical batch, learning-rate
                            scaling and warm-up
- ``gpulab.capstone``       12: a budget of one's own, a plan as a config, the run that
                            measures it, the file of runs, what grading trusts
- ``gpulab.gpu_share``      a workshop learner's GPU memory cap, applied when torch is imported
- ``gpulab.course``         the course's machinery: quiz checks, per-student numbers,
                            predictions beside measurements, plots, widgets

Submodules are imported explicitly (``from gpulab import arith``) so that importing the
package itself stays cheap.
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("GPULAB_GPU_MEMORY_FRACTION"):  # a workshop's per-learner GPU memory cap
    from gpulab.gpu_share import cap_from_environment as _cap

    _cap()
