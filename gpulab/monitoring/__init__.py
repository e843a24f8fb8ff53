"""Chapter 08, "Monitoring and failures": watching a run and reading what went wrong.

- ``gpulab.monitoring.monitor``   a background monitor of the GPU through NVML (of the process,
                                  without one), the loop's phases, energy per step
- ``gpulab.monitoring.failures``  Xid codes, checkpoint intervals (Young, Daly), out-of-memory
                                  and CUDA error texts, a hung collective, ``/dev/shm``

What the driver says of a GPU's health (clock-event bits, ECC, row remapping, kernels for this
GPU) is ``gpulab.device.health``: the doctor judges it before any chapter runs.
"""
