"""The course's formulas, each written once, with its source and the chapter that teaches it.

Units are SI throughout: bytes, seconds, bytes per second, FLOPs, FLOP/s. Decimal and binary
prefixes are kept apart on purpose (GB = 10^9 bytes, GiB = 2^30 bytes): vendors quote memory and
bandwidth in decimal units, while PyTorch and nvidia-smi print binary ones (MiB).

One module per chapter, each readable top to bottom:

- ``arith.bytes_and_transfers``: chapter 01, tensor bytes, copy times, resident warps;
- ``arith.training_memory``: chapter 02, model state, activations, the peak of a step;
- ``arith.flops_and_roofline``: chapter 03, FLOPs, MFU, the roofline, days of training;
- ``arith.checkpointing_and_accumulation``: chapter 05, recomputation and accumulation;
- ``arith.communication``: chapter 06, collectives, ZeRO, data-parallel scaling.

Chapter 04's formulas (number formats, autocast) are in ``gpulab.precision``, chapter 07's
(the input pipeline) in ``gpulab.pipeline``. Every name is offered here too, so
``arith.tensor_bytes`` works wherever it did before the split.
"""

from __future__ import annotations

from .bytes_and_transfers import (  # noqa: F401
    KB, MB, GB, TB, KiB, MiB, GiB, TiB, _dtype, bytes_per_element, tensor_bytes, transfer_seconds,
    batches_per_second, resident_warps,
)
from .training_memory import (  # noqa: F401
    RECIPES, model_state_bytes, activation_bytes_per_layer, ZERO_STAGES, check_positive_integers,
    gpt_param_count, zero_sharded, ALLOCATOR_ROUNDING, allocator_bytes, segment_size,
    predict_training_memory,
)
from .flops_and_roofline import (  # noqa: F401
    matmul_flops, matmul_bytes, training_flops, mfu, arithmetic_intensity, attention_bytes,
    critical_intensity, roofline_seconds, bound, SECONDS_PER_DAY, training_days,
)
from .checkpointing_and_accumulation import (  # noqa: F401
    sqrt_segment_size, segment_activation_bytes, best_segment_size,
    training_flops_with_checkpointing, block_forward_flops_per_token, recompute_flops_per_token,
    gpt_step_flops_per_token, global_batch, accumulation_steps, largest_micro_batch,
)
from .communication import (  # noqa: F401
    LINKS, COLLECTIVES, allreduce_seconds, allgather_seconds, reduce_scatter_seconds,
    alltoall_seconds, collective_seconds, algorithm_bandwidth, bus_bandwidth, zero_bytes_per_gpu,
    zero_comm_bytes, dp_step_seconds, min_tokens_compute_bound, pipeline_bubble_fraction,
)

__all__ = [
    "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "bytes_per_element", "tensor_bytes",
    "transfer_seconds", "batches_per_second", "resident_warps", "RECIPES", "model_state_bytes",
    "activation_bytes_per_layer", "ZERO_STAGES", "check_positive_integers", "gpt_param_count",
    "zero_sharded", "ALLOCATOR_ROUNDING", "allocator_bytes", "predict_training_memory",
    "matmul_flops", "matmul_bytes", "training_flops", "mfu", "arithmetic_intensity",
    "attention_bytes", "critical_intensity", "roofline_seconds", "bound", "SECONDS_PER_DAY",
    "training_days", "segment_size", "sqrt_segment_size", "segment_activation_bytes",
    "best_segment_size", "training_flops_with_checkpointing", "block_forward_flops_per_token",
    "recompute_flops_per_token", "gpt_step_flops_per_token", "global_batch", "accumulation_steps",
    "largest_micro_batch", "LINKS", "COLLECTIVES", "allreduce_seconds", "allgather_seconds",
    "reduce_scatter_seconds", "alltoall_seconds", "collective_seconds", "algorithm_bandwidth",
    "bus_bandwidth", "zero_bytes_per_gpu", "zero_comm_bytes", "dp_step_seconds",
    "min_tokens_compute_bound", "pipeline_bubble_fraction",
]
