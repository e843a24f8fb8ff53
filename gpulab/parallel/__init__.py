"""Chapter 06, "Data parallelism": several processes training one model, run for real.

In the order the chapter meets them:

- ``gpulab.parallel.dist``           launch N ranks from a notebook, the way torchrun does
- ``gpulab.parallel.collectives``    the collectives, run on real processes and timed
- ``gpulab.parallel.data_parallel``  DDP by hand next to PyTorch's DDP, ZeRO and FSDP, per rank
- ``gpulab.parallel.train_ddp``      a torchrun training script: DDP, DistributedSampler, set_epoch

The formulas (ring costs, algbw and busbw, ZeRO's bytes, the pipeline bubble) are in
``gpulab.arith.communication``.
"""
