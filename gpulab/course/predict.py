"""Predict, then measure: the learner's own prediction printed beside the formula and the
measurement, with the gap explained when it is larger than the experiment's stated tolerance.

Every experiment in the course ends with one such line per quantity::

    print(predict.line("batch, float32 (MiB)", measured, formula, mine, tolerance=0.01,
                       gap="the allocator gave the tensor a whole block: see above"))

``mine`` is the learner's answer (a quiz variable or a ``my_prediction = ...`` cell), or None
when it is not answered yet: the line then compares with the formula and says so. A notebook
reads an answer variable only after checking it, as in ``None if name is ... else name``.
"""

from __future__ import annotations

import math
import numbers


def _number(x, unit: str = "") -> str:
    if x is None:
        return "n/a"
    return (f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.4g}") + unit  # .4g would print 68480 as 6.848e+04


def _as_prediction(mine) -> float | None:
    """The learner's prediction as a float, or None when there is none we can use."""
    if mine is None or mine is Ellipsis or isinstance(mine, bool):
        return None
    if not isinstance(mine, numbers.Real) or not math.isfinite(float(mine)):
        return None
    return float(mine)


def line(what: str, measured: float, formula: float | None, mine=None, tolerance: float = 0.05,
         gap: str = "", unit: str = "") -> str:
    """One line: ``what``: your prediction | formula | measured | measured / your prediction.

    ``tolerance`` is relative (0.05 = 5%): how close the measurement is expected to come. Outside
    it, a second line says so and gives ``gap``, the likely reason the caller knows for this
    experiment. Where the learner's prediction is off but the formula matches, a third line says
    to recheck the working rather than blame the machine. ``formula`` is None where the course
    has no formula for this device (the ratio is then against your prediction alone); ``unit``
    is printed after each number (e.g. " B").
    """
    given = _as_prediction(mine)
    reference = formula if given is None else given
    if reference is None:
        ratio = math.nan            # nothing to compare with: no prediction and no formula
    elif measured == reference:
        ratio = 1.0                 # also 0 GPUs predicted and 0 found
    else:
        ratio = measured / reference if reference else math.inf
    if given is not None:
        yours = f"your prediction {_number(given, unit)}"
    elif formula is not None:
        yours = "your prediction: none yet, the formula stands in"
    else:
        yours = "your prediction: none yet (no formula for this device either)"
    lines = [f"{what}: {yours} | formula {_number(formula, unit)} | measured "
             f"{_number(measured, unit)} | measured/{'formula' if given is None else 'yours'} "
             f"{ratio:.3f}"]
    if reference is not None and abs(ratio - 1) > tolerance:
        lines.append(f"  gap over the ±{tolerance * 100:g}% tolerance"
                     + (f": {gap}" if gap else "."))
        if given is not None and formula and abs(measured / formula - 1) <= tolerance:
            lines.append("  the formula matches the measurement: recheck your own working "
                         "(the quiz's feedback names the likely slip).")
    return "\n".join(lines)
