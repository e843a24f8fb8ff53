"""Training memory (chapter 02): model state, activations, the peak of a training step.

Part of ``gpulab.arith`` (see its docstring for the conventions); import it as
``from gpulab import arith`` and call ``arith.<name>``, as the notebooks do.
"""

from __future__ import annotations

import torch

from .bytes_and_transfers import bytes_per_element


# Bytes per parameter of model state: (weights, gradients, optimizer = master weights + moments).
RECIPES: dict[str, tuple[int, int, int]] = {
    "fp32_adam": (4, 4, 8),               # plain fp32 training: Adam's m and v in fp32
    "mixed_adam": (2, 2, 12),             # ZeRO paper (Rajbhandari et al. 2020, §3.1): 2 + 2 + K, K = 12
    "mixed_adam_fp32_grads": (2, 4, 12),  # Megatron-LM's distributed optimizer docs; ml-engineering
    "bf16_adam": (2, 2, 4),               # pure bf16: weights, grads and both moments in bf16
    "fp32_sgd": (4, 4, 0),                # plain SGD keeps no state
    "fp32_sgd_momentum": (4, 4, 4),       # one momentum buffer per parameter
}


def _positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def model_state_bytes(n_params: float, recipe: str = "mixed_adam") -> dict[str, float]:
    """Bytes of weights, gradients and optimizer state (master weights + moments) for a recipe.

    Recipes and their sources are in ``RECIPES``: e.g. ``mixed_adam`` is 2 + 2 + 12 = 16 bytes per
    parameter (ZeRO paper; the Ultra-Scale Playbook's 1B parameters -> 16 GB), while
    ``mixed_adam_fp32_grads`` is 18 (Megatron-LM). Activations are not model state: see
    ``activation_bytes_per_layer``. Chapter 02, "Bytes per parameter".
    """
    _positive(n_params=n_params)
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}; got {recipe!r}")
    weights, grads, optimizer = (n_params * b for b in RECIPES[recipe])
    return {"params": weights, "grads": grads, "optimizer": optimizer,
            "total": weights + grads + optimizer}


def activation_bytes_per_layer(seq_len: int, batch: int, hidden: int, heads: int,
                               bytes_per_value: int = 2, recompute: str = "none", tp: int = 1,
                               dropout: bool = True) -> int:
    """Bytes a transformer layer saves for backward (Korthikanti et al. 2022, "Reducing
    Activation Recomputation in Large Transformer Models", §4).

    With 16-bit values (p = 2) and 1-byte dropout masks this is their

        none:       s·b·h·(10 + 24/t + 5·a·s/(h·t))
        selective:  s·b·h·(10 + 24/t)            (the attention core is recomputed)
        full:       2·s·b·h                      (only the layer input is kept)

    written for any p: the 10 is LayerNorm inputs (2p), the QKV and MLP inputs (p each) and two
    dropout masks (1 each); the 24 is Q, K, V, the attention output, the GeLU input and the second
    MLP input (12p), split over t tensor-parallel ranks; the 5·a·s/h is the softmax output (p), its
    dropout mask (1) and the dropout output (p). Without dropout the masks and the dropout output
    go. Assumes a 4h MLP and the s×s scores stored (no flash attention); embedding, head and loss
    are extra. Chapter 02, "Activations, term by term".
    """
    _positive(seq_len=seq_len, batch=batch, hidden=hidden, heads=heads,
              bytes_per_value=bytes_per_value, tp=tp)
    if hidden % heads:
        raise ValueError(f"heads={heads} must divide hidden={hidden} (each head gets hidden/heads)")
    if heads % tp:
        raise ValueError(f"tp={tp} must divide heads={heads} (tensor parallelism splits heads)")
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full'; got {recompute!r}")
    p, mask = bytes_per_value, (1 if dropout else 0)
    sbh = seq_len * batch * hidden
    if recompute == "full":
        return p * sbh
    total = (4 * p + 2 * mask) * sbh + 12 * p * sbh / tp
    if recompute == "none":
        per_score = p + ((p + mask) if dropout else 0)
        total += per_score * heads * seq_len**2 * batch / tp
    return round(total)


ZERO_STAGES = (0, 1, 2, 3)


def check_positive_integers(**values) -> None:
    """Raise ValueError naming the first value that is not a positive integer."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")


def gpt_param_count(n_layer: int, hidden: int, vocab: int) -> int:
    """Parameters of a GPT-style decoder, ≈ 12·L·h² + V·h.

    Each layer has 4h² in attention (Q, K, V, output) and 8h² in a 4h MLP; V·h is one (tied)
    token embedding. Biases, LayerNorms and position embeddings are left out. Source: Kaplan et
    al. 2020, "Scaling Laws for Neural Language Models", §2.1 (N ≈ 12·n_layer·d_model², which
    leaves out the embedding); the Ultra-Scale Playbook's memory section, which adds the V·h term.
    GPT-2 small: 12·12·768² + 50257·768 = 123.5M (the published count, 124.4M, includes
    position embeddings and biases). Untied embeddings (Llama) add another V·h.
    """
    check_positive_integers(n_layer=n_layer, hidden=hidden, vocab=vocab)
    return 12 * n_layer * hidden**2 + vocab * hidden


def zero_sharded(state: dict[str, float], n_gpus: int, zero_stage: int) -> dict[str, float]:
    """Per-GPU model state under ZeRO data parallelism (Rajbhandari et al. 2020, §5, Figure 1).

    Stage 1 divides the optimizer state by ``n_gpus``; stage 2 also the gradients; stage 3 also
    the parameters. Stage 0 is plain data parallelism: every GPU holds everything. With K = 12,
    Ψ = 7.5B, N_d = 64: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU for stages 0 to 3.
    """
    check_positive_integers(n_gpus=n_gpus)
    if isinstance(zero_stage, bool) or zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3; got {zero_stage!r}")
    sharded = ("optimizer", "grads", "params")[:zero_stage]
    out = {k: (v / n_gpus if k in sharded else v) for k, v in state.items() if k != "total"}
    out["total"] = sum(out.values())
    return out


ALLOCATOR_ROUNDING = 512  # bytes; every CUDA caching-allocator block is a multiple of this


def allocator_bytes(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 512, as the CUDA caching allocator counts a block
    (PyTorch docs, "CUDA semantics: memory management"; c10/cuda/CUDACachingAllocator.cpp,
    kMinBlockSize). Chapter 02, "Allocated vs reserved"."""
    return -(-nbytes // ALLOCATOR_ROUNDING) * ALLOCATOR_ROUNDING


def segment_size(checkpointing: bool | int, n_layer: int) -> int | None:
    """Blocks per checkpoint segment for ``GPT(config, checkpointing=...)``: None for False (no
    checkpointing), 1 for True (every block), k for an int 1 <= k <= n_layer.

    ValueError for anything else (0, a negative number, k > n_layer, a float, a string), so a
    sweep that runs past the model's depth fails loudly instead of silently repeating k = L.
    Chapter 05, "Checkpointing granularity".
    """
    check_positive_integers(n_layer=n_layer)
    if checkpointing is False:
        return None
    if checkpointing is True:
        return 1
    if not isinstance(checkpointing, int) or not 1 <= checkpointing <= n_layer:
        raise ValueError(f"checkpointing must be False, True or a segment size k with "
                         f"1 <= k <= n_layer = {n_layer}; got {checkpointing!r}")
    return checkpointing


def predict_training_memory(config, batch_size: int, seq_len: int,
                            dtype: torch.dtype | str = torch.float32, optimizer: str = "adamw",
                            checkpointing: bool | int = False, accumulating: bool = False) -> dict:
    """Bytes of one steady-state training step (the second: Adam's state exists) of
    ``gpulab.models.GPT(config)``, term by term. Chapter 02, "Where the peak sits".

    Assumptions, as in ``gpulab.measure.memory.train_step``: the whole model in ``dtype`` (float32 or
    bfloat16, no autocast), dropout 0, the logits dropped before backward, the optimizer built
    with an explicit implementation (``gpulab.measure.memory.make_optimizer``: "sgd", "adamw" = AdamW
    foreach, "adamw_fused"). Symbols: b batch, s seq_len, h n_embd, a n_head, L n_layer,
    V vocab_size, T block_size, p bytes per value; S = b·s·h·p (one residual-stream tensor),
    Z = b·a·s²·p (one tensor of attention scores), N = b·s·V·p (the logits).

    Alive all step ("base"):
      params     P·p with P = L(12h² + 13h) + 2Vh + Th + 2h      (``GPT.count_params``)
      optimizer  0 for SGD; AdamW's m and v: 2·P·p, in the parameters' dtype, so bfloat16 here is
                 the pure-bf16 recipe 2 + 2 + 4 (``RECIPES["bf16_adam"]``), not mixed precision
      buffers    T² bytes (the bool causal mask); inputs 2·b·s·8 (idx and targets, int64)
    Saved by forward (``activations``), with ln = 2·b·s·p (one LayerNorm's mean and 1/std):
      per block  A = ``activation_bytes_per_layer(s, b, h, a, p, dropout=False)`` + 2·ln
                 = 16S + Z + 2·ln (Korthikanti et al. 2022, §4: their sbh(34 + 5as/h) without
                 dropout, for any p).
      head       ln_f input S + lm_head input S + the log-softmax N (the largest single tensor
                 when V ≫ h) + ln + the positions s·8
      activations = L·A + head without checkpointing. With ``checkpointing=k`` (True is k = 1;
                 chapter 05) the blocks form n_seg = ⌈L/k⌉ segments of k (the top one shorter
                 when k does not divide L) and forward keeps only each segment's input:
                 activations = n_seg·S + head (k = 1: Korthikanti's "full" recomputation, 2sbh
                 per layer in 16 bits).
    Gradients: P·p once backward is over; per block G = (12h² + 13h)·p, head G_head = (Vh + 2h)·p.

    Where the peak sits: backward walks down the blocks; autograd frees a node's saved tensors
    once the node has run, so each block's activations go as its gradients arrive, and every
    backward op briefly holds its incoming gradient and its results. Each candidate moment is
    "base + still saved + gradients so far + temporaries"; the peak is the largest (``phases``):
      loss        base + activations + 2N     log-softmax's and the logits' gradients, with the
                                              log-softmax output still saved
      head        base + activations + Vh·p + S   the head's weight and input gradients
      block i     base + below(i) + saved + G_head + (L−1−i)·G + grads + temporaries, at four
                  moments inside the block's backward (i = 0 is the bottom block), where below(i)
                  is what the blocks under block i still hold:
                    no checkpointing   below(i) = i·A
                    segments of k      below(i) = j·S + r·A,  j = i // k, r = i mod k
                  With checkpointing, a segment's backward starts by recomputing its forward
                  (``torch.utils.checkpoint``), so all its blocks' activations exist at once and
                  go block by block as backward walks down: block i sees the inputs of the j
                  segments below its own (j·S) and the r blocks under it in its segment, whole
                  (r·A). k = 1 gives i·S; k = L gives i·A, the same as no checkpointing (one
                  segment recomputes, then holds, everything), so k = L only removes the
                  loss and head peaks.
        moment               saved         grads (this block)  temporaries
        MLP down-projection  A             4h²·p               5S: residual + 4h-wide input grad
        MLP up-projection    A − 8S        (8h² + h)·p         6S: + GELU's input grad
        attention core       A − 12S − ln  (9h² + 8h)·p        2S + 2Z: probabilities' and
                                                                 scores' grads
        QKV projection       2S + ln       (12h² + 8h)·p       5S: q, k, v grads (3S)
                  Each is linear in i (in j and in r with segments), so only the top
                  (i = L−1) or the bottom (i = 0) block can hold the largest without
                  segments: the top when a block's saved activations outweigh its gradients,
                  the bottom otherwise (usually so with k = 1, which recomputes A just before
                  each block's backward). With segments of k > 1 the largest sits at a corner:
                  the bottom or top block of the bottom segment, of the top full segment, or
                  of a shorter top segment; ``phases`` names them "block i".
                  Sizing by hand: the top block's down-projection holds about
                  (n_seg − 1)·S + k·A ≈ (L/k)·S + k·A, smallest at k = √(L·S/A)
                  (``sqrt_segment_size`` for Chen et al.'s √L rule, which assumes A ≈ S).
      end         base + P·p + S              all gradients, the embeddings' input gradient
      step        base + P·p (+ P·p for AdamW foreach: its temporary ``exp_avg_sq_sqrt``,
                  torch/optim/adam.py ``_multi_tensor_adam``; fused updates in place)

    ``accumulating=True``: the step is one of gradient accumulation (chapter 05), with
    ``batch_size`` the micro-batch. The first micro-batch peaks as above (less the optimizer
    step, which comes once at the end); every later one runs forward and backward with all P·p
    gradients already alive, and each weight gradient it makes is a temporary (the largest of a
    block is 4h²·p, c_fc's or c_proj's; 3h²·p for c_attn) that autograd adds into ``.grad`` in
    place. Its phases ("..., later micro-batch") are the ones above with "gradients so far"
    replaced by P·p + that temporary: base + P·p + activations + 2N at the loss, and so on. So
    accumulation over m micro-batches costs about the step of batch b/m plus P·p, not 1/m of it.

    Not counted: the CUDA allocator's 512-byte rounding (PyTorch docs, "CUDA semantics") and
    Adam's step counters (one scalar per parameter tensor): under 1% with n_embd >= 128, a few
    percent for tiny bfloat16 models; kernels' scratch memory (cuBLAS workspaces on CUDA are
    excluded by the warm baseline). On CUDA the LayerNorm statistics of 16-bit inputs are fp32
    (b·s·2 bytes more each). Returns bytes: ``params``, ``grads``, ``optimizer``,
    ``activations``, ``buffers``, ``inputs``, ``peak``, and
    ``phases`` (name -> bytes).
    """
    if optimizer not in ("sgd", "adamw", "adamw_fused"):
        raise ValueError(f"optimizer must be 'sgd', 'adamw' or 'adamw_fused'; got {optimizer!r}")
    if config.dropout:
        raise ValueError("the prediction assumes dropout 0 (masks add temporaries not modelled)")
    b, s, p = batch_size, seq_len, bytes_per_element(dtype)
    h, a, L = config.n_embd, config.n_head, config.n_layer
    V, T = config.vocab_size, config.block_size
    P = L * (12 * h * h + 13 * h) + 2 * V * h + T * h + 2 * h
    S, Z, N = b * s * h * p, b * a * s * s * p, b * s * V * p

    params, grads = P * p, P * p
    state = 2 * P * p if optimizer.startswith("adamw") else 0
    buffers, inputs = T * T, 2 * b * s * 8
    base = params + state + buffers + inputs

    ln = 2 * b * s * p                                      # one LayerNorm's mean and 1/std
    A = activation_bytes_per_layer(s, b, h, a, p, dropout=False) + 2 * ln
    k = segment_size(checkpointing, L)                      # None: no checkpointing
    kept = activation_bytes_per_layer(s, b, h, a, p, "full")  # one segment input, S
    activations = (L * A if k is None else -(-L // k) * kept) + 2 * S + N + ln + s * 8
    G, G_head = (12 * h * h + 13 * h) * p, (V * h + 2 * h) * p

    block_moments = {  # name: (still saved in the block, its gradients so far, temporaries)
        "MLP down-projection": (A, 4 * h * h * p, 5 * S),
        "MLP up-projection": (A - 8 * S, (8 * h * h + h) * p, 6 * S),
        "attention core": (A - 12 * S - ln, (9 * h * h + 8 * h) * p, 2 * S + 2 * Z),
        "QKV projection": (2 * S + ln, (12 * h * h + 8 * h) * p, 5 * S),
    }
    phases = {"loss": base + activations + 2 * N,
              "head": base + activations + V * h * p + S}
    def below(i: int) -> int:                               # what the blocks under i hold
        return i * A if k is None else (i // k) * kept + (i % k) * A

    for name, (saved, block_grads, temporaries) in block_moments.items():
        for where, i in _candidate_blocks(L, k):
            phases[f"{name}, {where}"] = (base + below(i) + saved + G_head
                                          + (L - 1 - i) * G + block_grads + temporaries)
    if accumulating:   # a later micro-batch: every gradient alive, each new one added in place
        fresh = {"MLP down-projection": 4 * h * h * p, "MLP up-projection": 4 * h * h * p,
                 "attention core": 0, "QKV projection": 3 * h * h * p}
        phases["loss, later micro-batch"] = phases["loss"] + grads
        phases["head, later micro-batch"] = phases["head"] + grads
        for name, (saved, _, temporaries) in block_moments.items():
            for where, i in _candidate_blocks(L, k):
                phases[f"{name}, {where}, later micro-batch"] = (
                    base + grads + below(i) + saved + fresh[name] + temporaries)
    phases["end of backward"] = base + grads + S
    phases["optimizer step"] = base + grads + (P * p if optimizer == "adamw" else 0)
    return {"params": params, "grads": grads, "optimizer": state, "activations": activations,
            "buffers": buffers, "inputs": inputs, "peak": max(phases.values()), "phases": phases}


def _candidate_blocks(L: int, k: int | None) -> list[tuple[str, int]]:
    """(name, index) of the blocks where a backward moment can peak (see
    ``predict_training_memory``): the top and bottom block and, with segments of k > 1, the
    bottom segment's top, the top full segment's bottom and top, a shorter top segment's
    bottom. Blocks are numbered from 0 at the bottom."""
    middle = set()
    if k is not None and k > 1:
        full = L // k                                       # segments of exactly k blocks
        middle = {k - 1, (full - 1) * k, full * k - 1} | ({full * k} if L % k else set())
    middle -= {0, L - 1}
    return ([("top block", L - 1)] + [(f"block {i}", i) for i in sorted(middle, reverse=True)]
            + [("bottom block", 0)])
