"""Measurements that are right on a CPU and on a GPU alike.

One module per idea, in the order the chapters meet them:

- ``gpulab.measure.timing``          chapter 01: ``time_fn`` (warm-up, CUDA events, median) and
                                     its ``Timing``, ``synchronize``, host-to-device copies
                                     (``host_copy_bandwidth``), ``allocated_bytes``
- ``gpulab.measure.memory``          chapter 02: peak memory (``peak_memory``,
                                     ``training_step_peak``, ``MemoryPeak``), the storage tracker
                                     behind it (it counts like the CUDA caching allocator)
- ``gpulab.measure.throughput``      chapter 03: matmul and elementwise throughput (the two roofs
                                     of the roofline), ``launch_overhead``
- ``gpulab.measure.attention``       chapter 03: naive vs fused attention, timed
- ``gpulab.measure.training_steps``  chapter 03: tokens per second and FLOP/s of a training step
                                     (``training_step_throughput``); chapter 05: the time of a
                                     step with and without checkpointing (``step_seconds``)

Every name is offered here too, so a notebook writes ``measure.time_fn`` whichever module holds
it. To replace a function in a test, patch it in the module that holds it: a module calls its
neighbours' functions through its own imports, not through ``gpulab.measure``.
"""

from gpulab.measure.timing import (CopyBandwidth, Timing, allocated_bytes, host_copy_bandwidth,
                                   synchronize, time_fn)

# Peak memory (chapter 02). The storage tracker, the CUDA allocator path and the GPT training
# step live in gpulab.measure.memory; these are the names the notebooks use:
#   peak_memory(fn, device=None, *, model=None, optimizer=None, inputs=()) -> MemoryPeak
#   training_step_peak(config, batch_size, seq_len, dtype, optimizer,
#                      checkpointing=False | True | k, device=None, fake=False,
#                      micro_batches=1) -> MemoryPeak   (.peak in bytes)
from gpulab.measure.memory import MemoryPeak, peak_memory, training_step_peak

from gpulab.measure.throughput import (LaunchOverhead, Throughput, elementwise_throughput,
                                       launch_overhead, matmul_throughput)
from gpulab.measure.attention import attention_naive_vs_fused, naive_attention
from gpulab.measure.training_steps import (step_seconds, training_step_throughput,
                                           training_step_timing)

__all__ = [
    # timing (chapter 01)
    "Timing", "synchronize", "time_fn", "CopyBandwidth", "host_copy_bandwidth",
    "allocated_bytes",
    # peak memory (chapter 02, from gpulab.measure.memory)
    "MemoryPeak", "peak_memory", "training_step_peak",
    # throughput (chapter 03)
    "Throughput", "matmul_throughput", "elementwise_throughput", "LaunchOverhead",
    "launch_overhead",
    # attention (chapter 03)
    "naive_attention", "attention_naive_vs_fused",
    # training steps (chapters 03 and 05)
    "training_step_throughput", "training_step_timing", "step_seconds",
]
