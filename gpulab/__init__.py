"""gpulab: the small library the GPU Training Lab notebooks import.

One module per idea, each short enough to read in one sitting:

- ``gpulab.device``   pick the best device; the preflight report (``python -m gpulab doctor``)
- ``gpulab.hardware`` datasheet figures of common NVIDIA GPUs, each row with its source
- ``gpulab.arith``    the course's formulas (bytes, transfer times, ...), each citing its source
- ``gpulab.measure``  timing and bandwidth measurements that are right on CPU and GPU alike
- ``gpulab.checks``   the quiz checker used by notebook test cells
- ``gpulab.plots``    the few plots the chapters share

Submodules are imported explicitly (``from gpulab import arith``) so that importing the
package itself stays cheap.
"""

__version__ = "0.1.0"
