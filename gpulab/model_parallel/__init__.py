"""Chapter 11, "When the model does not fit one GPU": the model itself split over ranks, run for real.

In the order the chapter meets them:

- ``gpulab.model_parallel.counting``           count the collectives and sends a rank makes, in elements
- ``gpulab.model_parallel.tensor_parallel``    Megatron's column and row split by hand, next to
                                               ``parallelize_module``; the chapter's TP workers
- ``gpulab.model_parallel.sequence_parallel``  the same with the sequence split between them
                                               (Korthikanti et al.), and activation memory per rank
- ``gpulab.model_parallel.pipeline_parallel``  the course GPT cut into ``PipelineStage``s, GPipe
                                               and 1F1B timed, the bubble read from the timeline

The ranks are started by chapter 06's ``gpulab.parallel.dist.launch``. The formulas (TP traffic,
activation memory with TP and SP, bubbles, the layout calculator) are in
``gpulab.arith.model_parallel``.
"""
