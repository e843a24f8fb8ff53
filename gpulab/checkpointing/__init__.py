"""Chapter 05, "Checkpointing and accumulation": trading compute for memory.

- ``gpulab.checkpointing.accumulation``  gradient accumulation, and when it is not one big batch
- ``gpulab.checkpointing.ddp_accumulation``  the same on data-parallel ranks: no_sync, the token count

The formulas (what checkpointing keeps, the global batch, the best segment size) are in
``gpulab.arith.checkpointing_and_accumulation``; the step timing with and without
checkpointing is ``gpulab.measure.step_seconds``.
"""
