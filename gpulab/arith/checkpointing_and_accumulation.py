"""Trading compute for memory (chapter 05): activation checkpointing, gradient accumulation.

Part of ``gpulab.arith`` (see its docstring for the conventions); import it as
``from gpulab import arith`` and call ``arith.<name>``, as the notebooks do. ``segment_size``
(what ``GPT(config, checkpointing=k)`` accepts) lives in ``arith.training_memory``, beside the
memory prediction that needs it.
"""

from __future__ import annotations

import math

import torch

from .training_memory import (_positive, check_positive_integers, predict_training_memory,
                              segment_size)


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
    k is. This is the textbook count (reentrant checkpointing, Megatron-LM's full recomputation);
    PyTorch's default non-reentrant ``checkpoint`` stops early and does less
    (``gpt_step_flops_per_token`` counts what it runs). These are "hardware FLOPs"; MFU counts
    only the 6N model FLOPs. Sources: Chen et al. 2016, §4 (one extra forward); Korthikanti et
    al. 2022, §6 (model vs hardware FLOPs); formulas.md, "Compute". Chapter 05, "What
    recomputation costs".

    >>> training_flops_with_checkpointing(1e9, 0.0, 1.0) / training_flops(1e9, 1.0)
    1.3333333333333333
    """
    _positive(n_params_blocks=n_params_blocks, n_tokens=n_tokens)
    if n_params_other < 0:
        raise ValueError(f"n_params_other must be >= 0, got {n_params_other!r}")
    return (8 * n_params_blocks + 6 * n_params_other) * n_tokens


def block_forward_flops_per_token(n_embd: int, seq_len: int) -> float:
    """Matmul FLOPs per token of one block of the course GPT in forward: 2·12h² + 4·s·h.

    12h² weights (attention c_attn 3h² and c_proj h², MLP c_fc 4h² and c_proj 4h²), 2 FLOPs per
    weight per token; the attention's q·kᵀ and scores·v, 2·s·h each per token (the full s × s
    square, as ``training_flops`` and FlopCounterMode count it). Chapter 05.

    >>> block_forward_flops_per_token(256, 128)
    1703936
    """
    check_positive_integers(n_embd=n_embd, seq_len=seq_len)
    return 24 * n_embd * n_embd + 4 * seq_len * n_embd


def recompute_flops_per_token(config, seq_len: int, segments, *, early_stop: bool = True,
                              attention_core_only: bool = False) -> float:
    """FLOPs per token that backward spends recomputing checkpointed segments of the course GPT.

    ``segments``: the number of blocks in each checkpointed segment, e.g. [1, 1, 1, 1] for
    every block of four, [2] for ``checkpoint_sequential(blocks, 2, x)`` on four blocks (it
    leaves the last segment unchecked). Each segment's forward runs again during backward, with
    one exception. PyTorch's non-reentrant ``checkpoint`` (``use_reentrant=False``) stops
    recomputing as soon as every tensor backward needs has been rebuilt ("early stop", on by
    default: torch.utils.checkpoint docs, ``set_checkpoint_early_stop``). In the course GPT the
    segment's last matmul, the MLP's output projection (4h² weights, 8h² FLOPs per token), feeds
    only the residual addition, which saves nothing, so it is never recomputed: each segment
    rebuilds a third of a block less. With dropout the last op is the dropout, whose mask is
    saved, and nothing is skipped; with ``early_stop=False`` (or reentrant checkpointing)
    nothing is either.

    ``attention_core_only=True``: selective recomputation that keeps every Linear layer's output
    and recomputes the rest (``CheckpointPolicy.MUST_SAVE`` for ``aten.mm``/``aten.addmm``):
    only the attention's two parameter-free matmuls, 4·s·h per token per block, run again.
    Chapter 05, "What PyTorch recomputes"; measured with ``torch.utils.flop_counter.FlopCounterMode``
    in tests/test_checkpointing.py.

    >>> from gpulab.models import GPTConfig
    >>> recompute_flops_per_token(GPTConfig(), 128, [1, 1, 1, 1])
    4718592
    """
    check_positive_integers(seq_len=seq_len)
    segments = list(segments)
    check_positive_integers(**{f"segments[{i}]": k for i, k in enumerate(segments)})
    if sum(segments) > config.n_layer:
        raise ValueError(f"segments {segments} hold more blocks than the model's "
                         f"n_layer = {config.n_layer}")
    h = config.n_embd
    if attention_core_only:
        return sum(segments) * 4 * seq_len * h
    skipped = 8 * h * h if early_stop and config.dropout == 0 else 0
    per_block = block_forward_flops_per_token(h, seq_len)
    return sum(k * per_block - skipped for k in segments)


def gpt_step_flops_per_token(config, seq_len: int, checkpointing: bool | int = False,
                             early_stop: bool = True) -> float:
    """Matmul FLOPs per token of a training step of ``GPT(config, checkpointing=...)``, as
    ``torch.utils.flop_counter.FlopCounterMode`` counts them (forward, backward and what
    checkpointing recomputes; no element-wise work, no optimizer).

    Without checkpointing: 3 × forward, forward = L·(24h² + 4sh) + 2hV (the blocks, then the
    head; the embedding lookups do no arithmetic): ``training_flops``' 6N + 12·L·h·s with N the
    matmul weights. With it, plus ``recompute_flops_per_token`` for the segments
    ``GPT(config, checkpointing=k)`` makes (k blocks each, the top one shorter). For the course
    GPT (4 blocks, h = 256, V = 1000) at s = 128: 21.98 M per token, 26.70 M with every block
    checkpointed: 1.215 times as many, not the 8N/6N = 1.33 of full recomputation, because
    PyTorch's early stop skips each block's last matmul. The first number is the "model FLOPs"
    MFU counts; the second the "hardware FLOPs" of HFU (Korthikanti et al. 2022, §6; PaLM,
    Chowdhery et al. 2022, appendix B: MFU leaves rematerialisation out). Chapter 05.

    >>> from gpulab.models import GPTConfig
    >>> gpt_step_flops_per_token(GPTConfig(), 128), gpt_step_flops_per_token(GPTConfig(), 128, True)
    (21983232, 26701824)
    """
    check_positive_integers(seq_len=seq_len)
    L, h = config.n_layer, config.n_embd
    forward = L * block_forward_flops_per_token(h, seq_len) + 2 * h * config.vocab_size
    k = segment_size(checkpointing, L)
    segments = [] if k is None else [min(k, L - start) for start in range(0, L, k)]
    return 3 * forward + recompute_flops_per_token(config, seq_len, segments,
                                                   early_stop=early_stop)


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
