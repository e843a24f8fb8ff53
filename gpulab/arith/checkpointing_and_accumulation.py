"""Trading compute for memory (chapter 05): activation checkpointing, gradient accumulation.

Part of ``gpulab.arith`` (see its docstring for the conventions); import it as
``from gpulab import arith`` and call ``arith.<name>``, as the notebooks do. ``segment_size``
(what ``GPT(config, checkpointing=k)`` accepts) lives in ``arith.training_memory``, beside the
memory prediction that needs it.
"""

from __future__ import annotations

import math

import torch

from .training_memory import _positive, check_positive_integers, predict_training_memory


def sqrt_segment_size(n_layer: int) -> int:
    """Chen et al.'s segment size: √L blocks per segment, rounded (at least 1).

    Chen, Xu, Zhang, Guestrin 2016, "Training Deep Nets with Sublinear Memory Cost", §4.1:
    cut a chain of L layers into segments of k, keep only the segments' inputs (L/k of them) and
    recompute one segment at a time during backward (k layers' activations alive): memory
    ~ L/k + k, smallest at k = √L, so O(√L) memory for one extra forward. That count gives a
    kept input and a layer's activations the same size. In a transformer block the activations
    A are 17 times the input S with Korthikanti et al.'s 34·s·b·h (16 without dropout; more
    with the attention scores stored), and (L/k)·S + k·A is smallest at k ≈ √(L·S/A)
    (``segment_activation_bytes``): 1 for shallow models, 2 past 34 layers with fused
    attention. Compare ``best_segment_size``, which asks ``predict_training_memory``. Chapter 05.

    >>> [sqrt_segment_size(L) for L in (1, 4, 12, 32, 96)]
    [1, 2, 3, 6, 10]
    """
    check_positive_integers(n_layer=n_layer)
    return max(1, round(math.sqrt(n_layer)))


def segment_activation_bytes(n_layer: int, k: int, input_bytes: float,
                             block_bytes: float) -> float:
    """Activation memory with segments of k blocks in Chen et al.'s model: (L/k)·S + k·A.

    Forward keeps the L/k segment inputs (S bytes each); backward rebuilds one segment at a time,
    k blocks of A bytes. Setting the derivative to zero gives the best k ≈ √(L·S/A), and k + 1
    keeps less than k once L/k − L/(k+1) > A/S, i.e. L > k·(k+1)·A/S: segments of 2 beat
    segments of 1 past L = 2·A/S layers. For a transformer block A/S = 17 with Korthikanti et
    al.'s 34·s·b·h and S = 2·s·b·h (``activation_bytes_per_layer``), more with the attention
    scores stored: k = 2 wins past 34 layers with fused attention. Source: Chen, Xu, Zhang,
    Guestrin 2016, "Training Deep Nets with Sublinear Memory Cost", §4.1 (there S = A: k = √L).
    The measured peak adds weights, gradients and backward's temporaries
    (``predict_training_memory``). Chapter 05, "Checkpointing granularity".

    >>> segment_activation_bytes(34, 1, 2, 34) == segment_activation_bytes(34, 2, 2, 34)
    True
    """
    check_positive_integers(n_layer=n_layer, k=k)
    _positive(input_bytes=input_bytes, block_bytes=block_bytes)
    return n_layer / k * input_bytes + k * block_bytes


def best_segment_size(config, batch_size: int, seq_len: int,
                      dtype: torch.dtype | str = torch.float32, optimizer: str = "adamw") -> int:
    """The segment size k in 1..n_layer with the lowest ``predict_training_memory`` peak
    (ties go to the smaller k). Chapter 05, "Checkpointing granularity"."""
    peaks = {k: predict_training_memory(config, batch_size, seq_len, dtype, optimizer, k)["peak"]
             for k in range(1, config.n_layer + 1)}
    return min(peaks, key=lambda k: (peaks[k], k))


def training_flops_with_checkpointing(n_params_blocks: float, n_params_other: float,
                                      n_tokens: float) -> float:
    """Training FLOPs when every block is checkpointed: (8·N_blocks + 6·N_other)·D.

    Without checkpointing a step costs 6 FLOPs per parameter per token (``training_flops``).
    Full recomputation runs the checkpointed blocks' forward a second time during backward,
    2·N_blocks more per token; the head (final LayerNorm, lm_head) is not checkpointed and runs
    once. ``n_params_blocks``: parameters inside the checkpointed blocks; ``n_params_other``:
    the other parameters that do matmuls (leave out embedding tables: a lookup does no
    arithmetic). Attention's parameter-free matmuls are left out (``training_flops`` counts
    them). The segment size does not change the count: each block is recomputed once whatever
    k is (PyTorch's early stop skips the last op of each segment, a little less). These are
    "hardware FLOPs"; MFU counts only the 6N model FLOPs. Sources: Chen et al. 2016, §4 (one
    extra forward); Korthikanti et al. 2022, §6 (model vs hardware FLOPs); formulas.md,
    "Compute". Chapter 05, "What recomputation costs".

    >>> training_flops_with_checkpointing(1e9, 0.0, 1.0) / training_flops(1e9, 1.0)
    1.3333333333333333
    """
    _positive(n_params_blocks=n_params_blocks, n_tokens=n_tokens)
    if n_params_other < 0:
        raise ValueError(f"n_params_other must be >= 0, got {n_params_other!r}")
    return (8 * n_params_blocks + 6 * n_params_other) * n_tokens


def global_batch(micro_batch: int, accumulation_steps: int, dp_ranks: int = 1) -> int:
    """Samples per optimizer step: micro_batch · accumulation_steps · dp_ranks.

    Each of ``dp_ranks`` data-parallel ranks runs ``accumulation_steps`` forward/backward passes
    of ``micro_batch`` samples before the one optimizer step (Ultra-Scale Playbook, "Data
    parallelism": gbs = mbs · grad_acc · dp). Chapter 05, "Gradient accumulation".

    >>> global_batch(4, 8, dp_ranks=2)
    64
    """
    check_positive_integers(micro_batch=micro_batch, accumulation_steps=accumulation_steps,
                            dp_ranks=dp_ranks)
    return micro_batch * accumulation_steps * dp_ranks


def accumulation_steps(global_batch: int, micro_batch: int, dp_ranks: int = 1) -> int:
    """Micro-batches each rank accumulates: global_batch / (micro_batch · dp_ranks).

    ValueError when that is not a whole number: the global batch is a hyperparameter to keep,
    so change the micro-batch or the number of ranks rather than round. Chapter 05,
    "Gradient accumulation".

    >>> accumulation_steps(512, 8, dp_ranks=4)
    16
    """
    check_positive_integers(global_batch=global_batch, micro_batch=micro_batch,
                            dp_ranks=dp_ranks)
    per_step = micro_batch * dp_ranks
    if global_batch % per_step:
        raise ValueError(f"global_batch={global_batch} is not divisible by micro_batch x "
                         f"dp_ranks = {micro_batch} x {dp_ranks} = {per_step} (it would take "
                         f"{global_batch / per_step:g} accumulation steps); choose a micro-batch "
                         f"and a number of ranks whose product divides {global_batch}")
    return global_batch // per_step


def largest_micro_batch(budget_bytes: float, config, seq_len: int,
                        dtype: torch.dtype | str = torch.float32, optimizer: str = "adamw",
                        checkpointing: bool | int = False, accumulating: bool = False) -> int:
    """The largest micro-batch whose predicted peak (``predict_training_memory``) fits in
    ``budget_bytes``; 0 if even a batch of 1 does not (the model state alone may not fit).
    ``accumulating=True`` sizes it for gradient accumulation, where later micro-batches run
    with every gradient alive (smaller than a plain step's largest batch by about P·p worth).

    Every term of the prediction grows with the batch, so doubling, then halving the gap, finds
    it in a few dozen predictions. The prediction is within about 2% of a measurement: leave
    that much headroom (and the CUDA context, which PyTorch does not count) when ``budget_bytes``
    is a GPU's whole memory. Chapter 05, "How big a micro-batch fits?".
    """
    _positive(budget_bytes=budget_bytes)

    def fits(b: int) -> bool:
        return predict_training_memory(config, b, seq_len, dtype, optimizer, checkpointing,
                                       accumulating)["peak"] <= budget_bytes

    if not fits(1):
        return 0
    low, high = 1, 2                                        # fits(low), and find a high that not
    while fits(high):
        low, high = high, 2 * high
    while high - low > 1:                                   # fits(low) and not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
