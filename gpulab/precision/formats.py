"""Number formats (chapter 04): what each format can hold, and what rounding to it does to a
number and to a running sum.

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
(fp32's 8-bit exponent, fp16's 10-bit mantissa) when ``torch.backends.cuda.matmul.fp32_precision``
is ``"tf32"`` (torch 2.9 and later; the older ``allow_tf32`` flag is deprecated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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
