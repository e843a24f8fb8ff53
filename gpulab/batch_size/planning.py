"""Putting the chapters together (chapter 10, section 5): given a model, a target and N GPUs,
the micro-batch (memory, chapter 02), the accumulation (chapter 05), the data-parallel width and
its all-reduce (chapter 06), the step time (chapter 03), and the steps the critical batch implies
(``tradeoff``), so that "how many GPUs?" is answered for learning as well as for throughput.

Conventions: batches in tokens (micro-batch × sequence length × accumulation × ranks), times in
seconds, GPU-hours = GPUs × hours. The step time is a prediction from a peak FLOP/s and an
assumed MFU, with the all-reduce not overlapped (the slow case), never a measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulab import arith
from gpulab.batch_size.tradeoff import examples_at_batch, steps_at_batch


def tokens_per_step(micro_batch: int, accumulation: int, ranks: int, seq_len: int) -> int:
    """Tokens one optimizer step trains on: micro-batch × accumulation × ranks × sequence
    (chapter 05's global batch, in sequences, times the sequence length).

    >>> tokens_per_step(4, 8, 64, 4096)
    8388608
    """
    arith.check_positive_integers(micro_batch=micro_batch, accumulation=accumulation, ranks=ranks,
                                  seq_len=seq_len)
    return micro_batch * accumulation * ranks * seq_len


def gpus_for_batch(batch_tokens: float, micro_batch: int, seq_len: int, accumulation: int = 1) -> float:
    """GPUs whose micro-batches add up to ``batch_tokens`` per step: B / (micro-batch ×
    sequence × accumulation). Past B = B_crit each doubling of the GPUs cuts the steps by a third
    or less (``doubling_speedup``).

    >>> gpus_for_batch(4 * 2**20, 8, 4096)
    128.0
    """
    return batch_tokens / (micro_batch * seq_len * accumulation)


def doubling_speedup(batch: float, b_crit: float) -> float:
    """How many times fewer steps a run needs when its batch doubles from B to 2B:
    S(B)/S(2B) = (1 + B_crit/B) / (1 + B_crit/(2B)). 2 far below B_crit (perfect scaling),
    4/3 at B = B_crit, towards 1 far above it.

    >>> round(doubling_speedup(1.0, 1.0), 4)
    1.3333
    """
    return (1 + b_crit / batch) / (1 + b_crit / (2 * batch))


@dataclass(frozen=True)
class PlanRow:
    """One way to run the job on ``gpus`` GPUs."""

    gpus: int
    micro_batch: int          # sequences per GPU per forward-backward
    accumulation: int         # micro-batches per optimizer step
    batch_tokens: int         # tokens per optimizer step, all GPUs
    steps: float              # to the target, S(B) = S_min (1 + B_crit/B)
    tokens: float             # to the target, E(B) = E_min (1 + B/B_crit)
    step_seconds: float
    hours: float
    gpu_hours: float


def plan(gpus: int, micro_batch: int, seq_len: int, min_batch_tokens: float, s_min: float,
         b_crit_tokens: float, n_params: float, peak_flops: float, mfu: float,
         link_bandwidth: float, grad_bytes: int = 2) -> PlanRow:
    """The run on ``gpus`` GPUs, each at its largest micro-batch ``micro_batch`` (chapter 02):
    accumulate until the global batch reaches ``min_batch_tokens`` (at least one micro-batch
    per GPU); steps from S_min and B_crit; a step is ``accumulation`` forward-backward passes
    of 6·N FLOPs per token at ``mfu`` of ``peak_flops`` (chapter 03) plus one ring all-reduce of
    ``grad_bytes`` per parameter over ``link_bandwidth`` (chapter 06, not overlapped)."""
    per_pass = micro_batch * seq_len
    accumulation = max(1, math.ceil(min_batch_tokens / (gpus * per_pass)))
    batch = tokens_per_step(micro_batch, accumulation, gpus, seq_len)
    compute = accumulation * arith.training_flops(n_params, per_pass) / (peak_flops * mfu)
    step = compute + arith.allreduce_seconds(grad_bytes * n_params, gpus, link_bandwidth)   # 0 for 1 GPU
    steps = steps_at_batch(s_min, b_crit_tokens, batch)
    hours = steps * step / 3600
    return PlanRow(gpus, micro_batch, accumulation, batch, steps,
                   examples_at_batch(s_min * b_crit_tokens, b_crit_tokens, batch), step, hours, gpus * hours)
