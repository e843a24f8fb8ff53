"""What autocast runs in low precision, and what autograd keeps (chapter 04): output dtypes
per op, the bytes saved for backward by dtype, and the bytes autocast training keeps per
parameter."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpulab.models import GPTConfig


# ------------------------------------------------------------------------------------------
# What autocast runs in low precision, and what autograd keeps

# Which ops autocast runs in float32 whatever their input: PyTorch's "Autocast Op Reference"
# (docs, torch.amp) and, for the exact torch release, its own test lists
# (torch/testing/_internal/autocast_test_lists.py: AutocastTestLists.torch_fp32 for CUDA,
# AutocastCPUTestLists.torch_fp32 and nn_fp32 for the CPU; tests/test_precision.py reads them).
# On CUDA the list has softmax, log_softmax, layer_norm, exp and sum; on the CPU it has the losses
# (cross_entropy through nll_loss) and a few others, not these, so there softmax and layer_norm
# run in their input's dtype.
# Below are the ops of this list that the course's GPT uses, or that the notebook shows.
FLOAT32_OPS = {
    "cuda": ("softmax", "log_softmax", "layer_norm", "exp", "sum", "cross_entropy"),
    "cpu": ("cross_entropy",),
}

def autocast_output_dtypes(device: torch.device | str, dtype: torch.dtype = torch.bfloat16
                           ) -> dict[str, tuple[str, str]]:
    """Under ``torch.autocast(device, dtype)``, each op's output dtype for an fp32 input and for
    a low-precision input (inside a model most ops receive a linear layer's low-precision
    output): {op: (from fp32, from low precision)}. Measured, so it is the learner's own
    device's behaviour."""
    device = torch.device(device)
    x = torch.randn(4, 8, device=device)
    w = torch.randn(8, 8, device=device)
    target = torch.zeros(4, dtype=torch.long, device=device)
    ops = {
        "linear": lambda t: F.linear(t, w),
        "matmul": lambda t: t @ w,
        "softmax": lambda t: F.softmax(t, -1),
        "log_softmax": lambda t: F.log_softmax(t, -1),
        "layer_norm": lambda t: F.layer_norm(t, (8,)),
        "gelu": F.gelu,
        "exp": torch.exp,
        "sum": torch.sum,
        "cross_entropy": lambda t: F.cross_entropy(t, target),
        "add fp32": lambda t: t + x,
    }
    name = lambda t: str(t.dtype).removeprefix("torch.")  # noqa: E731
    with torch.autocast(device.type, dtype=dtype):
        low = F.linear(x, torch.eye(8, device=device))   # a low-precision activation
        return {op: (name(f(x)), name(f(low))) for op, f in ops.items()}


def saved_tensor_bytes(fn, exclude=()) -> dict[str, int]:
    """Run ``fn()`` (a forward pass) and return the bytes autograd saved for backward, by dtype
    name: each storage counted once, at its exact size (no allocator rounding). Storages of the
    tensors in ``exclude`` (e.g. ``model.parameters()``, alive anyway) are not counted.

    Autograd saves only what backward needs: a linear layer saves its weight only when its
    input requires a gradient (inside a model it does)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = (str(t.dtype).removeprefix("torch."), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    totals: dict[str, int] = {}
    for dtype, nbytes in seen.values():
        totals[dtype] = totals.get(dtype, 0) + nbytes
    return totals


def parameter_copy_bytes(fn, params) -> int:
    """Run ``fn()`` (a forward pass under autocast) and return the bytes of the saved tensors
    that are 16-bit copies of ``params``: a saved float16/bfloat16 tensor holding exactly the
    values of a parameter cast to its dtype (or of its transpose, as ``F.linear`` saves it).
    Each storage counted once."""
    params = list(params)
    seen: dict[int, int] = {}

    def is_copy(t: torch.Tensor) -> bool:
        if t.dtype not in (torch.float16, torch.bfloat16):
            return False
        for p in params:
            if t.numel() == p.numel() and p.dim() == t.dim():
                cast = p.detach().to(t.dtype)
                for candidate in (cast, cast.t() if cast.dim() == 2 else cast):
                    if candidate.shape == t.shape and torch.equal(candidate, t.detach()):
                        return True
        return False

    def pack(t: torch.Tensor):
        if is_copy(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def autocast_state_bytes(n_params: float, copied_params: float | None = None) -> dict[str, float]:
    """Bytes that ``torch.autocast`` training with Adam(W) keeps for ``n_params`` parameters, of
    which ``copied_params`` (default: all) are matmul weights. Chapter 04, "Two recipes".

    Autocast does not change the model: the parameters stay fp32, and they *are* the master
    weights (4 bytes); backward returns fp32 gradients (the cast's backward casts the 16-bit
    gradient up: 4); Adam's m and v are fp32 (8); there is no second master copy. The forward
    casts each matmul weight to 16 bits (2 bytes), once per autocast region (autocast caches
    casts of leaf tensors that require grad), and autograd keeps that copy until the layer's
    backward has run: transient, but alive at the step's peak. So 4 + 4 + 8 = 16 bytes stay
    between steps and 18 exist per matmul weight during a step (embeddings and LayerNorm
    weights get no copy: lookups and layer_norm are not on autocast's 16-bit list).

    Compare the 16-bit-weights recipe (apex O2, Megatron-LM, DeepSpeed;
    ``arith.RECIPES["mixed_adam"]`` 2 + 2 + 12, or 2 + 4 + 12 with fp32 gradients): 16-bit
    weights kept between steps, and a separate fp32 master copy inside the optimizer state.
    Gradients are fp32 under autocast, so plain DDP all-reduces 4 bytes per parameter unless a
    communication hook compresses them (``torch.distributed.algorithms.ddp_comm_hooks``).
    """
    copied = n_params if copied_params is None else copied_params
    state = {"params": 4 * n_params, "grads": 4 * n_params, "optimizer": 8 * n_params,
             "copies": 2 * copied}
    state["total"] = sum(state.values())
    return state


def autocast_bytes_per_score(device_type: str) -> int:
    """Bytes autograd keeps per attention score (one of the b·a·s² softmax entries) under 16-bit
    autocast, when attention is written out as in ``gpulab.models``:

    - CUDA: softmax is on the float32 list, so its 16-bit input is cast up and softmax saves its
      fp32 output (4); the next matmul, att @ v, casts that back to 16 bits and saves the copy
      (2): 6 bytes per score.
    - CPU: softmax is not on the CPU's float32 list; it runs in 16 bits and saves its output,
      which att @ v saves too (the same storage): 2 bytes per score.
    (Fused attention, ``F.scaled_dot_product_attention``, keeps no scores at all.)"""
    return 6 if "softmax" in FLOAT32_OPS[torch.device(device_type).type] else 2


def autocast_saved_bytes(config: GPTConfig, batch: int, seq_len: int, device_type: str
                         ) -> dict[str, int]:
    """What one forward of ``gpulab.models.GPT(config)`` (fp32 parameters, dropout 0) under
    16-bit ``torch.autocast(device_type)`` saves for backward, by dtype, as
    ``saved_tensor_bytes(..., exclude=model.parameters())`` measures it, with separate
    ``idx`` and ``targets``. Symbols: b batch, s seq_len, n = b·s tokens, h n_embd, a n_head,
    L n_layer, V vocab_size, T block_size.
    Chapter 04, "Activations under autocast, one layer at a time".

    16-bit (per block): the inputs of c_attn, c_proj, c_fc (2nh each), q, k, v (6nh), GELU's
    input and the MLP projection's input (8nh each): 28nh; the copies of the four weight
    matrices, 2·12h²; the scores, 2·b·a·s². Head: lm_head's input 2nh and weight copy 2Vh.
    fp32: each LayerNorm's input (4nh) and its mean and 1/std (8n), two per block and ln_f;
    the loss's log-softmax 4nV (cross_entropy is on every device's float32 list) and its
    4-byte total weight; on CUDA also the fp32 softmax output, 4·b·a·s² per block
    (``autocast_bytes_per_score``). Buffers and inputs: the causal mask T² (bool, one for all
    layers); idx, targets and positions (int64).
    """
    b, s, n = batch, seq_len, batch * seq_len
    h, a, L = config.n_embd, config.n_head, config.n_layer
    V, T = config.vocab_size, config.block_size
    scores = b * a * s * s
    fp32_scores = autocast_bytes_per_score(device_type) - 2
    return {
        "float32": L * (2 * 4 * n * h + 2 * 8 * n + fp32_scores * scores) + 4 * n * h + 8 * n
                   + 4 * n * V + 4,
        "bfloat16": L * (28 * n * h + 2 * 12 * h * h + 2 * scores) + 2 * n * h + 2 * V * h,
        "bool": T * T,
        "int64": 8 * (2 * n + s),
    }
