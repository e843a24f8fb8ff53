"""The input pipeline of a training loop (chapter 07): how long a step takes when data loading,
the host-to-device copy and the compute run one after another or side by side, synthetic
datasets that cost a known time per sample, and a loop that measures where a step's time goes.

One module per idea, in the order the chapter meets them:

- ``gpulab.pipeline.step_model``    sections 1-2 and 6: the step-time model (``step_seconds``,
                                    ``device_idle_share``, ``bottleneck``, ``workers_needed``),
                                    what workers buy (``loading_speedup``, ``usable_cores``) and
                                    when a one-time cost pays back (``compile_break_even_steps``)
- ``gpulab.pipeline.datasets``      sections 1-2: datasets with a known cost per sample
                                    (``LatencyDataset``, ``DecodeDataset`` with ``busy_work`` and
                                    ``calibrate_rounds``, ``TokenDataset``); section 8: a stream
                                    every worker reads whole (``Stream``, ``unsharded_batches``),
                                    read once across workers and ranks (``ShardedStream``), a
                                    random augmentation (``RandomAugment``)
- ``gpulab.pipeline.loop``          sections 1-2 and 4: a device step of known duration
                                    (``StandInCompute``), the DataLoader (``make_loader``), and a
                                    loop that measures it (``time_loop`` and its ``LoopTiming``,
                                    ``load_seconds``, ``worker_load_seconds``, ``free_cores``,
                                    ``handover_seconds``, ``measure_pipeline``, ``loading_rate``,
                                    ``shutdown``)
- ``gpulab.pipeline.copy_overlap``  section 3: a pinned copy on a second stream beside the
                                    compute, measured on a GPU (``copy_compute_overlap``)
- ``gpulab.pipeline.trace``         section 5: reading a torch.profiler trace (idle share, top
                                    ops, launch overhead); import it as a module
- ``gpulab.pipeline.utilisation``   section 5: NVML utilisation sampled during a run, and its CPU
                                    analogue; import it as a module
- ``gpulab.pipeline.ladder``        section 7: the capstone ladder (``Rung``, ``run_rung``, the
                                    course's own ``course_ladder`` and its ``LOAD_SHARE``)

Every name is offered here too, so a notebook writes ``pipeline.step_seconds`` whichever module
holds it. To replace a function in a test, patch it in the module that holds it: a module calls
its neighbours' functions through its own imports, not through ``gpulab.pipeline``.
"""

from gpulab.pipeline.step_model import (bottleneck, compile_break_even_steps, device_idle_share,
                                        loading_speedup, step_seconds, usable_cores,
                                        workers_needed)
from gpulab.pipeline.datasets import (DecodeDataset, LatencyDataset, RandomAugment, ShardedStream,
                                      Stream, TokenDataset, busy_work, calibrate_rounds,
                                      unsharded_batches)
from gpulab.pipeline.loop import (LoopTiming, StandInCompute, free_cores, handover_seconds,
                                  load_seconds, loading_rate, make_loader, measure_pipeline,
                                  shutdown, time_loop, worker_load_seconds)
from gpulab.pipeline.copy_overlap import copy_compute_overlap
from gpulab.pipeline.ladder import LOAD_SHARE, Rung, course_ladder, run_rung

__all__ = [
    # the step-time model (sections 1-2, 6)
    "step_seconds", "device_idle_share", "bottleneck", "workers_needed", "loading_speedup",
    "usable_cores", "compile_break_even_steps",
    # synthetic datasets (sections 1-2)
    "LatencyDataset", "busy_work", "calibrate_rounds", "DecodeDataset", "TokenDataset",
    # section 8: streams, workers and ranks, random draws
    "Stream", "unsharded_batches", "ShardedStream", "RandomAugment",
    # the stand-in step and the measured loop (sections 1-2, 4)
    "StandInCompute", "LoopTiming", "shutdown", "time_loop", "load_seconds", "handover_seconds",
    "worker_load_seconds", "free_cores", "make_loader", "measure_pipeline", "loading_rate",
    # pinned memory and a second stream (section 3)
    "copy_compute_overlap",
    # the capstone ladder (section 7)
    "Rung", "run_rung", "course_ladder", "LOAD_SHARE",
]
