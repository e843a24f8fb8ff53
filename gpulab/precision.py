"""Number formats and mixed precision (chapter 04): what each format can hold, what autocast runs
in low precision, and how loss scaling keeps fp16 gradients from vanishing.

A binary floating-point number is ``sign × 1.mantissa × 2^(exponent − bias)``. With ``e``
exponent bits and ``m`` explicit mantissa bits (IEEE 754-2008; Micikevicius et al. 2022, "FP8
Formats for Deep Learning", arXiv:2209.05433, for fp8):

- bias = 2^(e−1) − 1
- machine epsilon (the gap between 1 and the next number) = 2^−m
- smallest normal = 2^(1 − bias); smallest subnormal = 2^(1 − bias − m)
- largest finite = (2 − 2^−m) · 2^(2^e − 2 − bias) when the all-ones exponent is reserved for
  inf/NaN (fp32, fp16, bf16, fp8 e5m2); fp8 e4m3 ("fn": finite, no inf) uses that exponent too
  and reserves only the all-ones mantissa for NaN: (2 − 2^−(m−1)) · 2^(2^e − 1 − bias) = 448.

These are the values ``torch.finfo`` reports (``eps``, ``smallest_normal``, ``max``); the tests
check every one. TF32 has no torch dtype: it is how tensor cores read fp32 matmul inputs
(fp32's 8-bit exponent, fp16's 10-bit mantissa) when ``torch.backends.cuda.matmul.allow_tf32``
is on.
"""

from __future__ import annotations

import math
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from gpulab.measure import synchronize
from gpulab.models import GPT, GPTConfig


@dataclass(frozen=True)
class Format:
    """A binary floating-point format, described by its bit counts."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    dtype_name: str | None       # the torch dtype's attribute name; None for TF32
    finite_only: bool = False    # fp8 e4m3fn: no infinities, only all-ones mantissa is NaN

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def eps(self) -> float:
        return 2.0 ** -self.mantissa_bits

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def max(self) -> float:
        if self.finite_only:
            return (2 - 2.0 ** -(self.mantissa_bits - 1)) * 2.0 ** (2 ** self.exponent_bits - 1 - self.bias)
        return (2 - 2.0 ** -self.mantissa_bits) * 2.0 ** (2 ** self.exponent_bits - 2 - self.bias)

    @property
    def dtype(self) -> torch.dtype | None:
        """The torch dtype, or None (TF32, or fp8 in a torch without it)."""
        return getattr(torch, self.dtype_name, None) if self.dtype_name else None


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("fp32", 8, 23, "float32"),
    Format("tf32", 8, 10, None),
    Format("fp16", 5, 10, "float16"),
    Format("bf16", 8, 7, "bfloat16"),
    Format("fp8_e4m3", 4, 3, "float8_e4m3fn", finite_only=True),
    Format("fp8_e5m2", 5, 2, "float8_e5m2"),
)}


def number_format(name_or_dtype: str | torch.dtype) -> Format:
    """The Format for "bf16", "fp16", ... or for a torch dtype such as torch.bfloat16."""
    for f in FORMATS.values():
        if name_or_dtype in (f.name, f.dtype_name) or (f.dtype is not None and name_or_dtype == f.dtype):
            return f
    raise ValueError(f"unknown format {name_or_dtype!r}; known: {', '.join(FORMATS)}")


def round_to(x: float, name_or_dtype: str | torch.dtype) -> float:
    """``x`` stored in the format and read back: round to nearest, ties to even (IEEE 754's
    default), subnormals included; beyond the largest finite number, inf (fp8 e4m3, which has
    no inf, saturates at ±448 as PyTorch's conversion does). Computed exactly from the bit
    counts, so TF32 works too. (Converting a
    float64 tensor with torch goes through fp32 first: a second rounding that can differ.)"""
    f = number_format(name_or_dtype)
    x = float(x)
    if x == 0 or math.isnan(x):
        return x
    if math.isinf(x):
        return math.copysign(f.max, x) if f.finite_only else x
    # The gap between neighbours at |x|: 2^(exponent − m), never below the subnormals' gap.
    exponent = max(math.frexp(abs(x))[1] - 1, 1 - f.bias)
    gap = 2.0 ** (exponent - f.mantissa_bits)
    rounded = round(x / gap) * gap   # x / gap is exact (a power of two); round() ties to even
    if abs(rounded) > f.max:
        return math.copysign(f.max if f.finite_only else math.inf, x)
    return rounded

def running_sum(step: float, n: int, name_or_dtype: str | torch.dtype, start: float = 0.0) -> list[float]:
    """Add ``step`` to ``start`` ``n`` times, keeping the sum in the format after every addition
    (as an fp16 accumulator or weight would): the sum after each addition. ``step`` and
    ``start`` are stored in the format first (1e-4 is 1.00017e-4 in fp16). The sum stops growing
    once the step is less than half the gap between neighbouring numbers at the sum."""
    dtype = number_format(name_or_dtype).dtype
    total, increment = torch.tensor(start, dtype=dtype), torch.tensor(step, dtype=dtype)
    sums = []
    for _ in range(n):
        total = total + increment
        sums.append(total.item())
    return sums



def stall_point(step: float, name_or_dtype: str | torch.dtype) -> float:
    """Where a running sum of ``step``, started at 0 and kept in the format, stops growing: the
    first power of two 2^k at which the step is at most half the gap, 2^(k − m − 1) ≥ step
    (a tie rounds back to 2^k, whose mantissa is even). Below 2^k every addition moves the sum
    by at least one gap, and the last one before 2^k lands on it (it cannot get half a gap
    past it), so the sum stops at 2^k exactly; ``step`` is first stored in the format.
    Chapter 04, "Rounding: what survives"."""
    f = number_format(name_or_dtype)
    stored = round_to(step, f.name)
    return 2.0 ** math.ceil(math.log2(stored) + f.mantissa_bits + 1)

# ------------------------------------------------------------------------------------------
# Loss scaling

def loss_scale_after(overflows, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                     backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """GradScaler's dynamic loss scale after a run of steps: (scale, steps skipped).

    ``overflows`` has one bool per step: True when the scaled gradients held an inf or NaN. Such
    a step is skipped (no optimizer step) and the scale is multiplied by ``backoff_factor``;
    after ``growth_interval`` clean steps in a row it is multiplied by ``growth_factor``. The
    defaults are ``torch.amp.GradScaler``'s; the rule is its ``update()`` (the tests run both).
    """
    scale, clean, skipped = float(init_scale), 0, 0
    for overflow in overflows:
        if overflow:
            scale, clean, skipped = scale * backoff_factor, 0, skipped + 1
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * growth_factor, 0
    return scale, skipped


def grad_scaler_scale(overflows, **rule) -> float:
    """The same run of steps on a real ``torch.amp.GradScaler("cpu", **rule)``: one parameter
    whose gradient is inf on an overflowing step and 1 otherwise; returns the final scale.
    What ``loss_scale_after`` predicts, measured. (About 10k steps per second on a CPU.)"""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **rule)
    scaler.scale(torch.ones(()))            # creates the scale tensor, as a first step would
    for overflow in overflows:
        param.grad = torch.full((1,), float("inf") if overflow else 1.0)
        scaler.step(optimizer)
        scaler.update()
    return scaler.get_scale()


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
    L n_layer, V vocab_size, T block_size. Chapter 04, "Activations under autocast".

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


# ------------------------------------------------------------------------------------------
# Predict, then measure

# ------------------------------------------------------------------------------------------
# Training in each precision, on text every Python install has

PRECISIONS = ("fp32", "bf16", "fp16", "fp16 without scaler")


def text_corpus(n_bytes: int = 500_000) -> torch.Tensor:
    """The first ``n_bytes`` bytes of the standard library's own source (sorted file names): a
    byte-level corpus (vocabulary 256) that needs no download."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(stdlib.glob("*.py")):
        chunks.append(path.read_bytes())
        size += len(chunks[-1])
        if size >= n_bytes:
            break
    return torch.tensor(list(b"".join(chunks)[:n_bytes]), dtype=torch.long)


def sample_batch(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator,
                 device) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``seq_len`` tokens and, as targets, the next token of each."""
    starts = torch.randint(0, len(data) - seq_len, (batch,), generator=generator)  # last start: len − seq_len − 1
    idx = torch.stack([data[s:s + seq_len] for s in starts])
    targets = torch.stack([data[s + 1:s + seq_len + 1] for s in starts])
    return idx.to(device), targets.to(device)


@dataclass
class TrainingRun:
    precision: str
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)   # GradScaler's scale after each step
    skipped: int = 0                                     # steps GradScaler skipped (inf/NaN)


def _setup(config: GPTConfig, precision: str, device: torch.device, lr: float, seed: int,
           init_scale: float = 2.0 ** 16, growth_interval: int = 2000, fused: bool = False):
    """A fresh GPT (same seed for every precision), AdamW on its fp32 parameters (they are the
    master weights), the autocast dtype, and a GradScaler enabled for "fp16" only."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    torch.manual_seed(seed)
    model = GPT(config, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused or None)
    low = {"bf16": torch.bfloat16}.get(precision, torch.float16)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale,
                                  growth_interval=growth_interval, enabled=precision == "fp16")
    return model, optimizer, low, scaler


def _step(model, optimizer, scaler, low, precision, idx, targets, device_type) -> torch.Tensor:
    """One training step; returns the loss as a tensor (reading it would wait for the GPU)."""
    with torch.autocast(device_type, dtype=low, enabled=precision != "fp32"):
        _, loss = model(idx, targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(config: GPTConfig, precision: str, steps: int, batch: int, seq_len: int,
          device, data: torch.Tensor | None = None, lr: float = 3e-3, seed: int = 0,
          init_scale: float = 2.0 ** 16, growth_interval: int = 2000) -> TrainingRun:
    """Train a fresh GPT (same seed, same batches for every precision) with AdamW on fp32 master
    weights and record every step's loss. "fp32": no autocast. "bf16"/"fp16":
    ``torch.autocast`` with that dtype; "fp16" uses ``torch.amp.GradScaler`` (``init_scale``,
    ``growth_interval``), "fp16 without scaler" does not. Reads the loss (and the scale) after
    every step, which waits for the GPU: for timing use ``step_seconds``."""
    device = torch.device(device)
    data = text_corpus() if data is None else data
    model, optimizer, low, scaler = _setup(config, precision, device, lr, seed, init_scale,
                                           growth_interval)
    generator = torch.Generator().manual_seed(seed)
    run = TrainingRun(precision)
    for _ in range(steps):
        idx, targets = sample_batch(data, batch, seq_len, generator, device)
        before = scaler.get_scale() if scaler.is_enabled() else 1.0
        run.losses.append(_step(model, optimizer, scaler, low, precision, idx, targets,
                                device.type).item())
        if scaler.is_enabled():
            run.scales.append(scaler.get_scale())
            run.skipped += run.scales[-1] < before     # update() backed off: the step was skipped
    return run


def step_seconds(config: GPTConfig, precision: str, batch: int, seq_len: int, device,
                 data: torch.Tensor | None = None, steps: int = 10, warmup: int = 3,
                 lr: float = 3e-4) -> float:
    """Seconds per training step in ``precision``, timed so that a GPU shows its real speed.
    Chapter 04, "Speed: training steps per precision".

    - Warm-up: the first steps pay one-time costs (cuBLAS handles and kernel selection, Adam's
      state allocated at the first ``step()``, the allocator growing its cache, GradScaler's
      scale tensor): ``warmup`` untimed steps first.
    - No host syncs inside the timed steps: every batch is sampled and copied to the device
      beforehand (a copy from pageable host memory synchronises the stream), no loss is read,
      and AdamW is ``fused``, whose step takes GradScaler's inf check on the device
      (``_step_supports_amp_scaling``; otherwise ``GradScaler.step`` reads it with ``.item()``
      every step, a host sync on a GPU). The clock stops after one ``synchronize`` at the end.
    - Size: each step must do enough arithmetic per kernel launch that the GPU is not waiting
      for Python (chapter 03, "launch overhead"); a tiny model shows no gain from bf16 on a GPU.
    """
    device = torch.device(device)
    data = text_corpus() if data is None else data
    model, optimizer, low, scaler = _setup(config, precision, device, lr, seed=0,
                                           fused=True)
    generator = torch.Generator().manual_seed(0)
    batches = [sample_batch(data, batch, seq_len, generator, device) for _ in range(warmup + steps)]
    for idx, targets in batches[:warmup]:
        _step(model, optimizer, scaler, low, precision, idx, targets, device.type)
    synchronize(device)
    start = time.perf_counter()
    for idx, targets in batches[warmup:]:
        _step(model, optimizer, scaler, low, precision, idx, targets, device.type)
    synchronize(device)
    return (time.perf_counter() - start) / steps


def initial_logit_gradient(vocab_size: int, batch: int, seq_len: int) -> float:
    """The gradient of a mean cross-entropy over the b·s tokens of one backward pass with
    respect to one *wrong* logit at initialisation, where softmax gives p ≈ 1/V everywhere:
    (p − 0)/(b·s) = 1/(V·b·s). The divisor is the micro-batch that one backward sees (a
    per-GPU quantity), not the global batch. Chapter 04, "Gradients that underflow"."""
    return 1 / (vocab_size * batch * seq_len)


def logit_gradients(model: GPT, idx: torch.Tensor, targets: torch.Tensor, scale: float = 1.0,
                    dtype: torch.dtype = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of ``scale × loss`` with respect to the logits, as backward computes it under
    ``torch.autocast(dtype)`` (the head's output is low precision, so its gradient is too) and in
    fp32: (low-precision gradient, fp32 gradient). Compare their zeros to see underflow."""
    device_type = idx.device.type
    found = {}
    for autocast in (True, False):
        with torch.autocast(device_type, dtype=dtype, enabled=autocast):
            logits, loss = model(idx, targets)
        logits.register_hook(lambda g, autocast=autocast: found.__setitem__(autocast, g.detach()))
        (loss * scale).backward()
        model.zero_grad(set_to_none=True)
    return found[True], found[False]
