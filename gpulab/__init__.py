"""gpulab: the small library the GPU Training Lab notebooks import.

One module per idea, each short enough to read in one sitting:

- ``gpulab.device``   pick the best device; the preflight report (``python -m gpulab doctor``)
- ``gpulab.hardware`` datasheet figures of common NVIDIA GPUs, each row with its source
- ``gpulab.arith``    the course's formulas (bytes, transfer times, training memory), each citing
                      its source
- ``gpulab.models``   the course's GPT, built so that its memory follows the formulas
- ``gpulab.measure``  timing, bandwidth and peak memory, measured right on CPU and GPU alike
- ``gpulab.memory``   the storage tracker and training step behind ``measure``'s peak memory
- ``gpulab.footprint`` a learner's GPU memory as the driver counts it, over their processes
                      (``make gpu-check``)
- ``gpulab.accumulation`` gradient accumulation, and when it is not the same as one big batch
- ``gpulab.checks``   the quiz checker used by notebook test cells
- ``gpulab.plots``    the few plots the chapters share
- ``gpulab.widgets``  interactive calculators (ipywidgets), each backed by a plain function

Submodules are imported explicitly (``from gpulab import arith``) so that importing the
package itself stays cheap.
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("GPULAB_GPU_MEMORY_FRACTION"):  # a workshop's per-learner GPU memory cap
    from gpulab.gpu_share import cap_from_environment as _cap

    _cap()
