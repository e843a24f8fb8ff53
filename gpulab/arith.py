"""The course's formulas, each written once, with its source and the chapter that teaches it.

Units are SI throughout: bytes, seconds, bytes per second, FLOPs, FLOP/s. Decimal and binary
prefixes are kept apart on purpose (GB = 10^9 bytes, GiB = 2^30 bytes): vendors quote memory and
bandwidth in decimal units, while PyTorch and nvidia-smi print binary ones (MiB).
"""

from __future__ import annotations

import math

import torch

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; try 'float32', 'bfloat16', 'float16', 'int8'")
    return found


def bytes_per_element(dtype: torch.dtype | str) -> int:
    """Bytes one value of ``dtype`` occupies: 4 for float32, 2 for bfloat16/float16, 1 for int8.

    Source: IEEE 754 (binary32, binary16), Google's bfloat16 format; PyTorch reports the same as
    ``torch.tensor([], dtype=d).element_size()`` (also ``d.itemsize``). Chapter 01, "dtype sizes".
    """
    return _dtype(dtype).itemsize


def tensor_bytes(shape: tuple[int, ...], dtype: torch.dtype | str) -> int:
    """Bytes of a dense, contiguous tensor: (product of the shape) x (bytes per element).

    This is what ``t.numel() * t.element_size()`` returns. The CUDA caching allocator rounds each
    allocation up to a multiple of 512 bytes (PyTorch docs, "CUDA semantics: memory management"),
    which matters only for tiny tensors. Chapter 01, "How big is a tensor?".
    """
    return math.prod(shape) * bytes_per_element(dtype)


def transfer_seconds(n_bytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Time to move ``n_bytes`` over a link of ``bandwidth`` bytes/s: latency + bytes/bandwidth.

    The simplest link model (a fixed start-up cost plus a bandwidth term; Hockney, 1994), used for
    PCIe copies in chapter 01 and for collectives in chapter 06.
    """
    return latency + n_bytes / bandwidth


def batches_per_second(batch_bytes: float, bandwidth: float) -> float:
    """How many batches of ``batch_bytes`` a link of ``bandwidth`` bytes/s can deliver per second.

    An upper bound: the link is busy only with this batch stream. Chapter 01, "Feeding the GPU".
    """
    return bandwidth / batch_bytes


def resident_warps(sm_count: int, max_threads_per_sm: int, warp_size: int = 32) -> int:
    """Most warps a GPU can keep resident at once: SMs x (threads per SM / threads per warp).

    Source: CUDA C++ Programming Guide, "Compute capabilities" table (2048 threads per SM and
    32 threads per warp for compute capability 8.0 and 9.0). Chapter 01, "The GPU in plain words".
    """
    return sm_count * (max_threads_per_sm // warp_size)


# ------------------------------------------------------------------------------------------
# Training memory (chapter 02)

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


def predict_training_memory(config, batch_size: int, seq_len: int,
                            dtype: torch.dtype | str = torch.float32, optimizer: str = "adamw",
                            checkpointing: bool | int = False, accumulating: bool = False) -> dict:
    """Bytes of one steady-state training step (the second: Adam's state exists) of
    ``gpulab.models.GPT(config)``, term by term. Chapter 02, "Where the peak sits".

    Assumptions, as in ``gpulab.memory.train_step``: the whole model in ``dtype`` (float32 or
    bfloat16, no autocast), dropout 0, the logits dropped before backward, the optimizer built
    with an explicit implementation (``gpulab.memory.make_optimizer``: "sgd", "adamw" = AdamW
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


# ------------------------------------------------------------------------------------------
# Throughput arithmetic (chapter 03): FLOPs, MFU, the roofline.
#
# Conventions: a multiply-add is 2 FLOPs; "FLOPs" counts operations, "FLOP/s" a rate; bytes
# and bytes/s are decimal SI units (GB/s = 10^9 bytes/s), as the datasheets quote them.


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of one matrix product [m, k] x [k, n]: 2·m·k·n.

    Each of the m·n outputs is a dot product of length k: k multiplies and k adds (counting the
    first add into zero), so 2·k FLOPs. Source: formulas.md, "Compute"; How to Scale Your Model,
    "All the Transformer Math" (matrix-matrix: 2NPM). Chapter 03, "Counting FLOPs".
    """
    check_positive_integers(m=m, k=k, n=n)
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, bytes_per_value: int = 2) -> int:
    """Bytes a matrix product [m, k] x [k, n] must move at least: p·(m·k + k·n + m·n).

    Both inputs read once from memory and the output written once, p bytes per value (2 for
    bf16/fp16, 4 for fp32). A lower bound: a kernel whose tiles do not fit on chip re-reads
    inputs. Source: formulas.md, "Roofline" (2·(B·D + D·F + B·F) for 2-byte values); How to
    Scale Your Model, "All the Transformer Math". Chapter 03, "The roofline".
    """
    check_positive_integers(m=m, k=k, n=n, bytes_per_value=bytes_per_value)
    return bytes_per_value * (m * k + k * n + m * n)


def training_flops(n_params: float, n_tokens: float, *, n_layer: int | None = None,
                   hidden: int | None = None, seq_len: int | None = None,
                   recompute: bool = False) -> float:
    """FLOPs to train ``n_params`` parameters on ``n_tokens`` tokens: C ≈ 6·N·D.

    The forward pass costs 2 FLOPs per parameter per token (one multiply-add per weight); the
    backward pass twice that, 4·N·D, since each weight matmul needs a gradient for its input and
    one for its weight. Source: Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
    §2.1 (C ≈ 6·N per token, N without embeddings).

    Attention: given ``n_layer`` (L), ``hidden`` (h) and ``seq_len`` (s), adds the FLOPs of the
    attention scores and their weighted sum, which have no parameters: 12·L·h·s per token
    (forward 4·L·h·s: q·kᵀ and scores·v, 2·s·h each per token per layer; backward twice that).
    Source: Chowdhery et al. 2022, "PaLM", appendix B: 6N + 12·L·H·Q·T per token, with H heads
    of size Q, so h here is the attention width H·Q. It equals d_model in GPT-style models;
    PaLM 540B has 48 heads of 256 = 12288 against a d_model of 18432. Like PaLM, this counts the
    full s×s square: a causal kernel that skips the masked half does less work.

    ``recompute=True``: full activation recomputation runs every forward twice, 8·N·D (plus
    16·L·h·s per token for attention): "hardware FLOPs" rather than "model FLOPs". MFU uses the
    model FLOPs; hardware FLOPs utilisation (HFU) the recomputed ones. Source: Korthikanti et al.
    2022, "Reducing Activation Recomputation in Large Transformer Models", §6 (MFU vs HFU);
    formulas.md, "Compute". Chapter 03, "Counting FLOPs".

    >>> training_flops(1e9, 1e9)
    6e+18
    """
    _positive(n_params=n_params, n_tokens=n_tokens)
    shape = {"n_layer": n_layer, "hidden": hidden, "seq_len": seq_len}
    given = {k: v for k, v in shape.items() if v is not None}
    if given and len(given) < 3:
        missing = ", ".join(k for k in shape if k not in given)
        raise ValueError(f"the attention term needs n_layer, hidden and seq_len together; "
                         f"missing {missing}")
    passes = 4 if recompute else 3                 # forward, backward (= 2 forwards), recompute
    per_token = 2 * passes * n_params
    if given:
        check_positive_integers(**given)
        per_token += 4 * passes * n_layer * hidden * seq_len
    return per_token * n_tokens


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: the model FLOPs a run achieves per second over the hardware's peak.

        MFU = tokens_per_second · flops_per_token / peak_flops_per_second

    with flops_per_token the model's own (``training_flops(N, 1, ...)``), never counting
    recomputation, so MFU compares runs that recompute differently. ``peak_flops_per_second`` is
    the peak of all chips together. Source: Chowdhery et al. 2022, "PaLM", §4.1 and appendix B:
    238.3K tokens/s on 6144 TPU v4 chips of 275 TFLOP/s: 45.7% from 6N alone, 46.2% with the
    attention term. Chapter 03, "MFU".
    """
    _positive(tokens_per_second=tokens_per_second, flops_per_token=flops_per_token,
              peak_flops_per_second=peak_flops_per_second)
    return tokens_per_second * flops_per_token / peak_flops_per_second


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved to or from memory: flops / bytes_moved.

    For a bf16 [B, D] x [D, F] matmul it is 2·B·D·F / (2·(B·D + D·F + B·F)), about B when
    B ≪ D, F. Source: Williams, Waterman, Patterson 2009, "Roofline" (operational intensity);
    formulas.md, "Roofline". Chapter 03, "The roofline".
    """
    _positive(flops=flops, bytes_moved=bytes_moved)
    return flops / bytes_moved


def attention_bytes(batch: int, heads: int, seq_len: int, head_dim: int,
                    bytes_per_value: int = 2, fused: bool = False) -> int:
    """Bytes causal attention's forward moves to and from memory, at least.

    Both read q, k, v and write the output: 4·b·a·s·d·p. The naive chain
    (``gpulab.measure.naive_attention``) also passes over the (b, a, s, s) scores 8 times:
    q·kᵀ writes them (1), the scale and the mask each read and write them (4), softmax reads
    and writes them (2), the product with v reads them (1); the s×s boolean mask itself is
    left out. A fused kernel keeps the scores in on-chip memory and moves only q, k, v and the
    output (FlashAttention re-reads k and v about s·d/M times for on-chip memory M, so this is
    its lower bound). Sources: Dao et al. 2022, "FlashAttention", §3.2 (standard attention
    Θ(s·d + s²) HBM accesses, FlashAttention Θ(s²·d²/M)); Williams et al. 2009 (roofline).
    Chapter 03, "Why a fused kernel wins".

    >>> attention_bytes(1, 1, 1024, 64, 2, fused=False) - attention_bytes(1, 1, 1024, 64, 2, fused=True)
    16777216
    """
    check_positive_integers(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim,
                            bytes_per_value=bytes_per_value)
    qkvo = 4 * batch * heads * seq_len * head_dim * bytes_per_value
    return qkvo if fused else qkvo + 8 * batch * heads * seq_len**2 * bytes_per_value


def critical_intensity(peak_flops_per_second: float, bandwidth: float) -> float:
    """The roofline's ridge point: peak FLOP/s / memory bandwidth, in FLOPs per byte.

    Below it a kernel is memory-bound, above it compute-bound. H100 SXM, bf16 dense:
    989e12 / 3.35e12 ≈ 295 FLOPs/byte. Source: Williams, Waterman, Patterson 2009, "Roofline";
    formulas.md, "Roofline". Chapter 03, "The roofline".
    """
    _positive(peak_flops_per_second=peak_flops_per_second, bandwidth=bandwidth)
    return peak_flops_per_second / bandwidth


def roofline_seconds(flops: float, bytes_moved: float, peak_flops_per_second: float,
                     bandwidth: float) -> float:
    """Shortest time a kernel can take: max(flops / peak, bytes_moved / bandwidth).

    The roofline model assumes compute and memory traffic overlap perfectly, so the slower of
    the two sets the time; real kernels take longer (launch overhead, imperfect overlap). Source:
    Williams, Waterman, Patterson 2009, "Roofline: An Insightful Visual Performance Model for
    Multicore Architectures", CACM 52(4); formulas.md, "Roofline". Chapter 03, "The roofline".
    """
    _positive(flops=flops, bytes_moved=bytes_moved,
              peak_flops_per_second=peak_flops_per_second, bandwidth=bandwidth)
    return max(flops / peak_flops_per_second, bytes_moved / bandwidth)


def bound(flops: float, bytes_moved: float, peak_flops_per_second: float,
          bandwidth: float) -> str:
    """"compute" or "memory": which term of ``roofline_seconds`` is the larger.

    Equivalently, whether the arithmetic intensity is above or below the critical intensity
    (a tie counts as "compute": the kernel would just reach the peak). Source: Williams,
    Waterman, Patterson 2009, "Roofline". Chapter 03, "The roofline".
    """
    _positive(flops=flops, bytes_moved=bytes_moved,
              peak_flops_per_second=peak_flops_per_second, bandwidth=bandwidth)
    compute_s, memory_s = flops / peak_flops_per_second, bytes_moved / bandwidth
    return "compute" if compute_s >= memory_s else "memory"


SECONDS_PER_DAY = 86_400


def training_days(n_params: float, n_tokens: float, n_gpus: int,
                  peak_flops_per_second: float, mfu: float) -> float:
    """Days to train: 6·N·D / (n_gpus · peak · MFU) / 86400.

    ``peak_flops_per_second`` is one GPU's dense peak (``gpulab.hardware.peak_flops``) and
    ``mfu`` the fraction of it the run sustains (0 < mfu <= 1; 0.3-0.5 is typical of large
    runs). Attention is left out, as in 6·N·D. Worked example (LLaMA, Touvron et al. 2023, §2.4):
    65.2B parameters on 1.4T tokens on 2048 A100-80GB at 380 tokens/s/GPU, "approximately
    21 days": MFU = 6·65.2e9·380 / 312e12 = 47.6%, and this gives 20.8 days. Source: Kaplan
    et al. 2020 (C ≈ 6·N·D); formulas.md, "Compute". Chapter 03, "How long will it train?".
    """
    _positive(n_params=n_params, n_tokens=n_tokens, peak_flops_per_second=peak_flops_per_second,
              mfu=mfu)
    check_positive_integers(n_gpus=n_gpus)
    if mfu > 1:
        raise ValueError(f"mfu must be a fraction of the peak (0 < mfu <= 1), got {mfu!r}")
    return training_flops(n_params, n_tokens) / (n_gpus * peak_flops_per_second * mfu) \
        / SECONDS_PER_DAY


# ------------------------------------------------------------------------------------------
# Trading compute for memory (chapter 05): activation checkpointing, gradient accumulation.


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


# ------------------------------------------------------------------------------------------
# Data parallelism: collectives, ZeRO, scaling (chapter 06)
#
# Conventions: n ranks joined in a ring; B is one rank's link bandwidth in one direction
# (bytes/s); S is a collective's size in bytes as nccl-tests counts it: the per-rank buffer for
# all-reduce, broadcast and reduce (input and output are the same size), the FULL buffer for
# all-gather (its output, n x each rank's share) and reduce-scatter (its input). Times are the
# bandwidth-optimal bound plus an optional per-step latency (Hockney's alpha-beta model, as in
# ``transfer_seconds``); real NCCL adds protocol overheads and picks trees for small messages.

# Per-direction link bandwidths, bytes/s. Datasheets quote NVLink as the two directions added.
LINKS: dict[str, float] = {
    # PCI-SIG, PCIe 4.0: 16 GT/s x 16 lanes x 128/130 encoding / 8 = 31.5 GB/s per direction
    "PCIe 4.0 x16": 32e9,
    # PCI-SIG, PCIe 5.0: 32 GT/s per lane, twice PCIe 4.0: about 63 GB/s per direction
    "PCIe 5.0 x16": 64e9,
    # NVIDIA A100 datasheet: NVLink 3, 12 links, 600 GB/s total = 300 GB/s per direction
    "NVLink 3 (A100)": 300e9,
    # NVIDIA H100 SXM datasheet: NVLink 4, 18 links, 900 GB/s total = 450 GB/s per direction.
    "NVLink 4 (H100)": 450e9,
    # NVIDIA ConnectX-7 / Quantum-2: NDR 400 Gb/s per port = 50 GB/s per direction
    "InfiniBand NDR 400Gb/s": 50e9,
    # NVIDIA ConnectX-6 / Quantum: HDR 200 Gb/s per port = 25 GB/s per direction
    "InfiniBand HDR 200Gb/s": 25e9,
    # IEEE 802.3ba/bj: 100 Gb/s = 12.5 GB/s per direction (before protocol overhead)
    "Ethernet 100GbE": 12.5e9,
}

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def _non_negative(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")


def _check_link(n_bytes: float, n_ranks: int, bandwidth: float, latency: float) -> None:
    _non_negative(n_bytes=n_bytes)
    check_positive_integers(n_ranks=n_ranks)
    _positive(bandwidth=bandwidth)
    _non_negative(latency=latency)


def _check_op(op: str) -> None:
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {', '.join(COLLECTIVES)}; got {op!r}")


def allreduce_seconds(n_bytes: float, n_ranks: int, bandwidth: float,
                      latency: float = 0.0) -> float:
    """Ring all-reduce time: 2·(n−1)·latency + 2·(n−1)/n · S/B.

    A reduce-scatter then an all-gather, each n−1 steps in which every rank sends S/n bytes to
    its neighbour: each rank sends 2·(n−1)/n·S bytes in all, the least any all-reduce built from
    point-to-point sends can (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms
    for clusters of workstations", JPDC 69(2)). ``n_bytes`` (S) is each rank's buffer, ``bandwidth``
    (B) one rank's link in one direction. One rank costs nothing. Sources: nccl-tests
    doc/PERFORMANCE.md ("AllReduce"); book/formulas.md, "Data parallelism". Chapter 06.

    Worked example: 1 GB over 8 ranks at 100 GB/s: 2·7/8 · 1e9/1e11 = 17.5 ms.

    >>> round(allreduce_seconds(1e9, 8, 100e9) * 1e3, 6)
    17.5
    """
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    steps = n_ranks - 1
    return 2 * steps * latency + 2 * steps / n_ranks * n_bytes / bandwidth


def allgather_seconds(n_bytes: float, n_ranks: int, bandwidth: float,
                      latency: float = 0.0) -> float:
    """Ring all-gather time: (n−1)·latency + (n−1)/n · S/B, with S the FULL gathered buffer.

    Convention: ``n_bytes`` is the size of the output (each rank contributes S/n), as nccl-tests
    sizes all-gather ("S is the size in bytes of the total array ... sendcount·sizeof·n",
    doc/PERFORMANCE.md). Each rank receives the n−1 shares it lacks, (n−1)/n·S bytes. Half of a
    ring all-reduce (Patarasuk & Yuan 2009). Chapter 06, "Collectives".

    Worked example: gathering 1 GB over 8 ranks at 100 GB/s: 7/8 · 10 ms = 8.75 ms.

    >>> round(allgather_seconds(1e9, 8, 100e9) * 1e3, 6)
    8.75
    """
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    steps = n_ranks - 1
    return steps * latency + steps / n_ranks * n_bytes / bandwidth


def reduce_scatter_seconds(n_bytes: float, n_ranks: int, bandwidth: float,
                           latency: float = 0.0) -> float:
    """Ring reduce-scatter time: (n−1)·latency + (n−1)/n · S/B, with S the FULL input buffer.

    Convention: ``n_bytes`` is each rank's whole input (each rank ends with a reduced S/n
    share), as nccl-tests sizes reduce-scatter ("recvcount·sizeof·n", doc/PERFORMANCE.md). The
    first half of a ring all-reduce (Patarasuk & Yuan 2009), so
    reduce_scatter + all_gather = all_reduce. Chapter 06, "Collectives".

    >>> round(reduce_scatter_seconds(1e9, 8, 100e9) * 1e3, 6)
    8.75
    """
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    steps = n_ranks - 1
    return steps * latency + steps / n_ranks * n_bytes / bandwidth


def collective_seconds(op: str, n_bytes: float, n_ranks: int, bandwidth: float,
                       latency: float = 0.0) -> float:
    """Time of collective ``op`` ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
    "reduce") on a ring, sizes as in nccl-tests (see the section's conventions).

    all-reduce: ``allreduce_seconds``; all-gather, reduce-scatter: ``allgather_seconds``.
    Broadcast and reduce, pipelined along the ring: ≈ (n−1)·latency + S/B, since all S bytes
    must leave (broadcast) or reach (reduce) the root through its one link (nccl-tests
    doc/PERFORMANCE.md, "Broadcast", "Reduce": t = S/B). One rank costs nothing.
    Chapter 06, "Collectives".

    >>> collective_seconds("broadcast", 1e9, 8, 100e9)
    0.01
    """
    _check_op(op)
    if op == "all_reduce":
        return allreduce_seconds(n_bytes, n_ranks, bandwidth, latency)
    if op == "all_gather":
        return allgather_seconds(n_bytes, n_ranks, bandwidth, latency)
    if op == "reduce_scatter":
        return reduce_scatter_seconds(n_bytes, n_ranks, bandwidth, latency)
    _check_link(n_bytes, n_ranks, bandwidth, latency)
    if n_ranks == 1:
        return 0.0
    return (n_ranks - 1) * latency + n_bytes / bandwidth


def algorithm_bandwidth(n_bytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: algbw = S / t, bytes/s (doc/PERFORMANCE.md).

    Size as nccl-tests counts it (see the section's conventions). It falls as ranks are added;
    ``bus_bandwidth`` corrects for that. Chapter 06, "Measuring a collective".

    >>> algorithm_bandwidth(1e9, 0.0175)
    57142857142.85714
    """
    _non_negative(n_bytes=n_bytes)
    _positive(seconds=seconds)
    return n_bytes / seconds


_BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
                "reduce": lambda n: 1.0}


def bus_bandwidth(algbw: float, op: str, n_ranks: int) -> float:
    """nccl-tests' bus bandwidth: busbw = algbw × factor, comparable to one link's bandwidth
    whatever the number of ranks.

    Factors: all_reduce 2(n−1)/n; all_gather, reduce_scatter (n−1)/n; broadcast, reduce 1.
    Source: NVIDIA nccl-tests, doc/PERFORMANCE.md ("Bus bandwidth", "Summary"). A ring run at
    full speed has busbw = B, the per-rank link bandwidth of ``allreduce_seconds``. Chapter 06,
    "Measuring a collective".

    Worked example: 1 GB all-reduced over 8 ranks in 17.5 ms: algbw = 57.1 GB/s,
    busbw = 57.1 × 2·7/8 = 100 GB/s.

    >>> round(bus_bandwidth(1e9 / 0.0175, "all_reduce", 8) / 1e9, 9)
    100.0
    """
    _non_negative(algbw=algbw)
    _check_op(op)
    check_positive_integers(n_ranks=n_ranks)
    return algbw * _BUS_FACTORS[op](n_ranks)


def zero_bytes_per_gpu(n_params: float, n_gpus: int, stage: int,
                       recipe: str = "mixed_adam") -> float:
    """Per-GPU model-state bytes under ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory
    Optimizations Toward Training Trillion Parameter Models", §5, Figure 1).

    With w, g, o the recipe's bytes per parameter for weights, gradients and optimizer state
    (``RECIPES``), Ψ = ``n_params``, N = ``n_gpus``:

        stage 0 (plain data parallelism)   (w + g + o)·Ψ
        stage 1 (optimizer states sharded) (w + g + o/N)·Ψ
        stage 2 (+ gradients)              (w + (g + o)/N)·Ψ
        stage 3 (+ parameters)             (w + g + o)·Ψ/N

    The same numbers as ``zero_sharded(model_state_bytes(Ψ, recipe), N, stage)["total"]``.
    Activations, buffers and fragmentation are extra. Worked example (the paper's Figure 1,
    mixed_adam, K = 12): Ψ = 7.5B, N = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB. Chapter 06, "ZeRO".

    >>> [round(zero_bytes_per_gpu(7.5e9, 64, s) / 1e9, 1) for s in ZERO_STAGES]
    [120.0, 31.4, 16.6, 1.9]
    """
    _positive(n_params=n_params)
    check_positive_integers(n_gpus=n_gpus)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3; got {stage!r}")
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}; got {recipe!r}")
    w, g, o = RECIPES[recipe]
    per_param = {0: w + g + o, 1: w + g + o / n_gpus, 2: w + (g + o) / n_gpus,
                 3: (w + g + o) / n_gpus}[stage]
    return per_param * n_params


def zero_comm_bytes(n_params: float, stage: int, bytes_per_value: int = 2,
                    n_gpus: int | None = None) -> float:
    """Bytes each GPU sends per training step under ZeRO stage ``stage`` (Rajbhandari et al.
    2020, §7, "Communication analysis of ZeRO-DP").

    Stages 0, 1, 2: 2Ψ values: the gradients' all-reduce (plain DP), or the same volume split
    into a reduce-scatter of gradients and an all-gather of updated parameters (stages 1-2).
    Stage 3: 3Ψ, 1.5 times as much: parameters are all-gathered in forward and again in
    backward, and gradients reduce-scattered. Returns values × ``bytes_per_value`` (2 for the
    16-bit gradients and parameters of mixed precision).

    Without ``n_gpus`` this is the paper's asymptotic "≈ 2Ψ"; with it, the exact ring volume
    2(N−1)/N·Ψ for N ranks (``allreduce_seconds``), likewise 3(N−1)/N·Ψ for stage 3.
    Worked example: 7.5B parameters in bf16: 30 GB per step for stages 0-2, 45 GB for stage 3;
    on N = 64 GPUs exactly 63/64 of that, 44.3 GB. Chapter 06, "ZeRO".

    >>> zero_comm_bytes(7.5e9, 0) / 1e9, zero_comm_bytes(7.5e9, 3) / 1e9
    (30.0, 45.0)
    >>> round(zero_comm_bytes(7.5e9, 3, n_gpus=64) / 1e9, 4)
    44.2969
    """
    _positive(n_params=n_params)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"stage must be 0, 1, 2 or 3; got {stage!r}")
    check_positive_integers(bytes_per_value=bytes_per_value)
    values = 3 * n_params if stage == 3 else 2 * n_params
    if n_gpus is not None:
        check_positive_integers(n_gpus=n_gpus)
        values *= (n_gpus - 1) / n_gpus
    return values * bytes_per_value


def dp_step_seconds(compute_seconds: float, comm_seconds: float,
                    overlapped_fraction: float = 0.0) -> float:
    """Data-parallel step time: compute + exposed communication, with
    exposed = max(0, comm − overlapped_fraction·compute).

    PyTorch DDP buckets gradients and all-reduces each bucket as soon as backward has filled
    it, so communication hides behind the rest of backward (Li et al. 2020, "PyTorch
    Distributed: Experiences on Accelerating Data Parallel Training", PVLDB 13(12), §3.2:
    gradient bucketing, overlapping computation with communication).
    Backward is about 2/3 of a step's compute (4·N of 6·N FLOPs per token,
    ``training_flops``), so ``overlapped_fraction`` = 2/3 is the ideal; 0 = no overlap
    (all-reduce after backward). Chapter 06, "Overlap".

    Worked example: 300 ms of compute and 150 ms of all-reduce: 450 ms without overlap,
    300 ms with ideal overlap (150 < 2/3 · 300 = 200: all of it hidden).

    >>> round(dp_step_seconds(0.3, 0.15), 9), round(dp_step_seconds(0.3, 0.15, 2 / 3), 9)
    (0.45, 0.3)
    """
    _non_negative(compute_seconds=compute_seconds, comm_seconds=comm_seconds,
                  overlapped_fraction=overlapped_fraction)
    if overlapped_fraction > 1:
        raise ValueError(f"overlapped_fraction must be between 0 and 1, got "
                         f"{overlapped_fraction!r}")
    exposed = max(0.0, comm_seconds - overlapped_fraction * compute_seconds)
    return compute_seconds + exposed


def min_tokens_compute_bound(n_ranks: int, bandwidth: float, flops_per_second: float,
                             bytes_per_grad: float = 2) -> float:
    """Tokens per GPU per step at which backward compute equals the gradients' ring all-reduce:

        T = (n−1)/n · p·F / (2·B)

    Backward costs 4·N·T FLOPs (``training_flops``: 2/3 of 6·N·T), so 4·N·T/F seconds at the
    achieved ``flops_per_second`` F; all-reducing N·p bytes of gradients takes
    2(n−1)/n · N·p/B (``allreduce_seconds``). Setting them equal, the parameter count N
    cancels: the threshold depends only on the hardware (F/B) and the gradient dtype (p), not
    on the model. With fewer tokens per GPU the all-reduce cannot hide behind backward
    (``dp_step_seconds`` with overlap 2/3). Sources: Li et al. 2020 (DDP overlap); Patarasuk &
    Yuan 2009 (the ring's 2(n−1)/n); book/formulas.md, "Data parallelism".
    Chapter 06, "When does data parallelism scale?".

    Worked example: F = 400 TFLOP/s achieved, B = 50 GB/s (a 400 Gb/s InfiniBand NIC),
    bf16 gradients (p = 2), many ranks: T ≈ 2·400e12 / (2·50e9) = 8000 tokens per GPU.

    >>> min_tokens_compute_bound(1024, 50e9, 400e12) > 7990
    True
    """
    check_positive_integers(n_ranks=n_ranks)
    _positive(bandwidth=bandwidth, flops_per_second=flops_per_second,
              bytes_per_grad=bytes_per_grad)
    return (n_ranks - 1) / n_ranks * bytes_per_grad * flops_per_second / (2 * bandwidth)


def pipeline_bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """Idle fraction of a pipeline-parallel step: (p − 1)/(m + p − 1) for p stages and m
    micro-batches.

    Each stage waits p − 1 micro-batch slots while the pipeline fills and drains, out of
    m + p − 1 slots in all; more micro-batches shrink the bubble. Sources: Huang et al. 2019,
    "GPipe", §2.2 (bubble overhead O((K−1)/(M+K−1)) for K partitions, M micro-batches);
    Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", §2.2.1, whose "bubble time fraction" (p − 1)/m is the same bubble measured
    against the ideal time m slots instead of the whole step; book/formulas.md,
    "Data parallelism".
    Chapter 06.

    >>> pipeline_bubble_fraction(4, 8)
    0.2727272727272727
    """
    check_positive_integers(n_stages=n_stages, n_microbatches=n_microbatches)
    return (n_stages - 1) / (n_microbatches + n_stages - 1)
