"""What slip a wrong number points to: the words a quiz's feedback gives (chapters 01-10).

``diagnose(answer, item)`` tries, in order: the key's own typical mistakes (``Mistake``), a whole
number one off a whole-number key (a counting or rounding slip), the ratios that mean one slip
(8x: bits for bytes; 1.074: GB for GiB; 1000x: a prefix), each only where the item's unit lets
that slip happen (``unit_kind``: no GiB for a count of GPUs, no prefix for a count of steps),
and last how far off the answer is. It never shows the expected value.

``item`` is a ``gpulab.course.checks.Item`` (read for ``value``, ``unit``, ``rel_tol``,
``abs_tol`` and ``mistakes``); this module imports nothing of gpulab, so checks can import it.
"""

from __future__ import annotations

import math
import re


def _close(a: float, b: float, item) -> bool:
    return math.isclose(a, b, rel_tol=max(item.rel_tol, 1e-9), abs_tol=item.abs_tol)


def percent(rel_tol: float) -> str:
    """A relative tolerance in percent with its significant digits: 0.005 -> '0.5%',
    0.0002 -> '0.02%', 0.1 -> '10%' (a fixed one decimal would print 0.0002 as '0.0%')."""
    pct = rel_tol * 100
    if pct >= 1:
        return f"{pct:.3g}%"
    decimals = 1 - math.floor(math.log10(pct))          # two significant digits
    return f"{pct:.{decimals}f}".rstrip("0").rstrip(".") + "%"




# Which slips a wrong answer can point to depends on what the item's unit measures: a GB-vs-GiB
# slip needs a prefixed byte unit, a prefix slip (1000x) a unit that takes prefixes; a count of
# GPUs, steps or blocks has neither, and a whole number one off it is a counting or rounding
# slip (15 for 14 is within 0.3% of 2^30/10^9 by accident: issue 29).
PREFIXED_BYTES, BYTES, TIME, SCALED, COUNT, FRACTION, PERCENT, PLAIN = (
    "prefixed bytes", "bytes", "time", "scaled", "count", "fraction", "percent", "plain")
_TIME_UNITS = {"s", "ms", "µs", "us", "ns", "min", "h", "day", "days"}
_COUNT_UNITS = {   # whole things counted one by one (never written with k/M/G in a quiz)
    "gpu", "gpus", "block", "blocks", "layer", "layers", "row", "rows", "sample", "samples",
    "sequence", "sequences", "step", "steps", "warp", "warps", "worker", "workers", "rank",
    "ranks", "node", "nodes", "kernel", "kernels", "segment", "segments", "micro-batches",
    "batches", "epochs", "heads", "checkpoints",
}


def unit_kind(unit: str, value: float = 0.0) -> str:
    """What an item measures, from its unit (and, unitless, its value): 'prefixed bytes' (GB,
    MiB/s), 'bytes' (bytes, bits, bytes/param), 'time' (ms, h), 'count' (GPUs, steps),
    'percent' (%), 'fraction' (unitless, at most 1 in size: MFU, a share), 'plain' (other
    unitless numbers: an index, a speedup 'x') or 'scaled' (anything else that takes k/M/G
    prefixes: FLOPs, J, tokens/s, parameters)."""
    words = unit.strip()
    if re.search(r"(?<![A-Za-z])[kKMGTP]i?B(?![A-Za-z])", words):
        return PREFIXED_BYTES
    if re.search(r"\b(bytes?|bits?)\b", words):
        return BYTES
    if words in _TIME_UNITS:
        return TIME
    if words.lower() in _COUNT_UNITS:
        return COUNT
    if words == "%":
        return PERCENT
    if words == "":
        return FRACTION if 0 < abs(value) <= 1 else PLAIN
    if words == "x" or words.startswith("x "):
        return PLAIN
    return SCALED


_BYTE_KINDS = {PREFIXED_BYTES, BYTES}
_PREFIX_KINDS = {PREFIXED_BYTES, BYTES, TIME, SCALED}
_PER_VALUE_KINDS = {PREFIXED_BYTES, BYTES, TIME}      # where "2 bytes vs 4" can be the slip
_OTHER_KINDS = {SCALED, COUNT, FRACTION, PERCENT, PLAIN}

# Ratios (your answer / the right one) that usually mean one specific slip, and the kinds of
# quantity where that slip can happen.
_TELLTALE_RATIOS = [
    (8, _BYTE_KINDS, "8x too large: did you count bits instead of bytes?"),
    (1 / 8, _BYTE_KINDS, "8x too small: did you count bytes where bits were asked, or divide by 8 twice?"),
    (2**30 / 1e9, {PREFIXED_BYTES}, "about 7% too large: did you divide by 10^9 (GB) where GiB (2^30 bytes) was asked?"),
    (1e9 / 2**30, {PREFIXED_BYTES}, "about 7% too small: did you divide by 2^30 (GiB) where GB (10^9 bytes) was asked?"),
    (2**20 / 1e6, {PREFIXED_BYTES}, "about 5% too large: did you divide by 10^6 (MB) where MiB (2^20 bytes) was asked?"),
    (1e6 / 2**20, {PREFIXED_BYTES}, "about 5% too small: did you divide by 2^20 (MiB) where MB (10^6 bytes) was asked?"),
    (2**40 / 1e12, {PREFIXED_BYTES}, "about 10% too large: TB (10^12) used where TiB (2^40 bytes) was asked?"),
    (1e12 / 2**40, {PREFIXED_BYTES}, "about 10% too small: TiB (2^40) used where TB (10^12 bytes) was asked?"),
    (1000, _PREFIX_KINDS, "1000x too large: check the unit prefix (ms vs s, MB vs GB, k vs M)."),
    (1 / 1000, _PREFIX_KINDS, "1000x too small: check the unit prefix (s vs ms, GB vs MB, M vs k)."),
    (1e6, _PREFIX_KINDS, "a million times too large: check the unit (µs vs s, bytes vs MB?)."),
    (1e-6, _PREFIX_KINDS, "a million times too small: check the unit (s vs µs, MB vs bytes?)."),
    (1e9, _PREFIX_KINDS, "a billion times too large: check the unit prefix (bytes vs GB, FLOPs vs GFLOPs)."),
    (1e-9, _PREFIX_KINDS, "a billion times too small: check the unit prefix (GB vs bytes, GFLOPs vs FLOPs)."),
    (1024, _BYTE_KINDS, "1024x too large: one binary prefix step off (KiB, MiB, GiB)?"),
    (1 / 1024, _BYTE_KINDS, "1024x too small: one binary prefix step off (KiB, MiB, GiB)?"),
    (100, {FRACTION}, "100x too large: a percentage given where a fraction was asked (40% is 0.4)?"),
    (1 / 100, {PERCENT}, "100x too small: a fraction given where a percentage was asked (0.4 is 40%)?"),
    (2, _PER_VALUE_KINDS, "2x too large: a factor of two slipped in (2 bytes vs 4? both directions?)."),
    (1 / 2, _PER_VALUE_KINDS, "2x too small: a factor of two is missing (2 bytes vs 4? both directions?)."),
    (2, _OTHER_KINDS, "2x too large: a factor of two slipped in. Recheck each factor."),
    (1 / 2, _OTHER_KINDS, "2x too small: a factor of two is missing. Recheck each factor."),
    (4, _PER_VALUE_KINDS, "4x too large: bytes per value off (4 for fp32, 2 for bf16/fp16, 1 for fp8)?"),
    (1 / 4, _PER_VALUE_KINDS, "4x too small: bytes per value off (4 for fp32, 2 for bf16/fp16, 1 for fp8)?"),
    (4, _OTHER_KINDS, "4x too large: a factor of four slipped in. Recheck each factor."),
    (1 / 4, _OTHER_KINDS, "4x too small: a factor of four is missing. Recheck each factor."),
]


def _whole(x: float) -> bool:
    return abs(x - round(x)) <= 1e-9 * max(1.0, abs(x))


def _one_off(answer: float, expected: float, kind: str) -> str | None:
    """The counting or rounding diagnosis for a whole number one away from a whole-number key
    (3 and up: 1 for 2 is as likely a missing factor of two)."""
    if not (_whole(answer) and _whole(expected)) or round(abs(answer - expected)) != 1:
        return None
    if max(abs(answer), abs(expected)) < 2.5:
        return None
    more = answer > expected
    if kind in (COUNT, PLAIN):
        return (f"one too {'many' if more else 'few'}: a counting slip (n things have n − 1 gaps "
                "between them), or a rounding one (a whole number that must be enough rounds up)?")
    return (f"off by one (too {'large' if more else 'small'}): did you round an intermediate "
            "result, or count one thing too many or too few? Round only at the end.")


def diagnose(answer: float, item) -> str:
    """The likely mistake behind a wrong numeric answer, in words (no expected value shown).

    The key's own mistakes come first; then a whole number one off a whole-number key (a
    counting or rounding slip); then the ratios that mean a slip, each only where the item's
    unit allows it (``unit_kind``); then how far off the answer is."""
    for mistake in item.mistakes:
        if _close(answer, mistake.value, item) or math.isclose(answer, mistake.value, rel_tol=1e-6):
            return mistake.says
    expected = float(item.value)
    kind = unit_kind(item.unit, expected)
    if expected == 0 or answer == 0:
        return _one_off(answer, expected, kind) or "not right. Recheck the formula and the units."
    if (answer < 0) != (expected < 0):
        return "the sign is wrong."
    ratio = answer / expected
    unit_slip = next((says for telltale, kinds, says in _TELLTALE_RATIOS
                      if kind in kinds and math.isclose(ratio, telltale, rel_tol=0.003)), None)
    if (counting := _one_off(answer, expected, kind)) is not None:
        if unit_slip is not None:          # a unit slip, rounded to a whole number, fits too
            return f"{counting} Or {unit_slip[0].lower()}{unit_slip[1:]}"
        return counting
    if unit_slip is not None:
        return unit_slip
    if 0.5 < ratio < 2:
        direction = "too large" if ratio > 1 else "too small"
        allowed = "the exact value" if item.rel_tol <= 1e-9 else f"within {percent(item.rel_tol)}"
        return f"close, but {direction}; this item needs {allowed}. Recheck each factor."
    magnitude = abs(math.log10(abs(ratio)))
    direction = "too large" if abs(ratio) > 1 else "too small"
    return f"{direction}, by {'more than 10x' if magnitude > 1 else 'between 2x and 10x'}. Recheck the formula and the units."
