"""Per-GPU model state under a ZeRO stage, two ways (chapter 09, section 4):

- the ZeRO paper's formula (Rajbhandari et al. 2020, K = 12 for mixed-precision Adam):
  ``gpulab.arith.zero_bytes_per_gpu``, chapter 06;
- DeepSpeed's own estimators, ``estimate_zero2_model_states_mem_needs_all_live`` and
  ``estimate_zero3_model_states_mem_needs_all_live`` (deepspeed/runtime/zero/stage_1_and_2.py and
  stage3.py), which run on a CPU. Without offload they count, per GPU, 2Ψ of 16-bit weights plus
  18Ψ/N sharded ("2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit", the
  source's comment) for stage 2, and 4 x the largest layer's parameters plus 18Ψ/N for stage 3: an
  fp32 copy of the gradients the paper's 16 bytes per parameter do not have. They print bytes /
  2^30 labelled "GB": GiB.

``deepspeed_gpu_bytes`` restates those formulas (the answer keys import no framework);
``deepspeed_estimate`` calls DeepSpeed's functions; tests/test_frameworks.py checks they agree.
"""

from __future__ import annotations

from gpulab.arith import zero_bytes_per_gpu

DS_SHARDED_BYTES = 18        # per parameter, divided by the GPUs (stages 2 and 3, no offload)
DS_REPLICATED_BYTES = 2      # stage 2: every GPU keeps the 16-bit weights
DS_LAYER_BYTES = 4           # stage 3: per parameter of the largest layer (gathered weights)


def paper_gpu_bytes(n_params: float, n_gpus: int, stage: int) -> float:
    """The ZeRO paper's model state per GPU, mixed-precision Adam (2 + 2 + 12 bytes per
    parameter, recipe ``mixed_adam``), in bytes."""
    return zero_bytes_per_gpu(n_params, n_gpus, stage, "mixed_adam")


def deepspeed_gpu_bytes(n_params: int, n_gpus: int, stage: int, largest_layer_params: int = 0) -> int:
    """What DeepSpeed 0.19's estimator prints per GPU without offload, in bytes (it shows them
    divided by 2^30 and labelled "GB")."""
    if stage == 2:
        return DS_REPLICATED_BYTES * n_params + int(DS_SHARDED_BYTES * n_params / n_gpus)
    if stage == 3:
        return DS_LAYER_BYTES * largest_layer_params + int(DS_SHARDED_BYTES * n_params / n_gpus)
    raise ValueError(f"DeepSpeed estimates stages 2 and 3; got {stage!r}")


def deepspeed_estimate(stage: int, n_params: int, n_gpus: int, largest_layer_params: int = 0) -> int:
    """DeepSpeed's own per-GPU estimate (no offload, one node of ``n_gpus``), in bytes: its
    ``estimate_zero{2,3}_model_states_mem_needs`` functions, which the ``..._all_live`` and
    ``..._all_cold`` printers call."""
    if stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
        return estimate_zero2_model_states_mem_needs(n_params, n_gpus, 1, cpu_offload=False)[1]
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        return estimate_zero3_model_states_mem_needs(n_params, largest_layer_params, n_gpus, 1,
                                                     cpu_offload=False)[1]
    raise ValueError(f"DeepSpeed estimates stages 2 and 3; got {stage!r}")


def largest_layer_params(model) -> int:
    """The largest number of parameters any one module holds directly, as DeepSpeed's
    ``model_to_params`` counts it (the layer ZeRO-3 must gather whole)."""
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
