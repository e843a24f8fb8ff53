"""Predict, then measure: the learner's prediction, the formula's and the measurement on one line.

An experiment in chapters 03 and 05 starts from a number the learner wrote down first (an
answered quiz or a ``my_prediction = ...`` cell) and ends with ``compare``::

    compare("step time", measured=0.48, formula=0.31, yours=0.35, unit="s", tolerance=0.25,
            gap="the formula counts matmul FLOPs only; ...")

which prints

    step time (s)      your prediction    formula   measured   measured / yours
                                  0.35       0.31       0.48               1.37
    The measurement is more than a factor 1.25 from your prediction.
    The measurement is more than a factor 1.25 from the formula: the formula counts matmul ...

An unanswered prediction (``yours=None``) falls back to the formula, and the output says so.
"""

from __future__ import annotations

import math
import numbers


def ratio_is_within(ratio: float, tolerance: float) -> bool:
    """True when ``ratio`` lies between 1/(1 + tolerance) and 1 + tolerance: symmetric in the
    sense that 2x too fast and 2x too slow are equally far off (tolerance 1.0)."""
    return 1 / (1 + tolerance) <= ratio <= 1 + tolerance


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def compare(what: str, measured: float, formula: float, yours: float | None = None,
            unit: str = "", tolerance: float = 0.25, gap: str = "") -> float:
    """Print "your prediction | formula | measured | measured / prediction" and return that ratio.

    ``yours`` is the learner's prediction, or None when they made none: then the formula stands
    in for it and a line says so. A verdict follows for your prediction and for the formula,
    each within ``tolerance`` of the measurement or not (0.25: within a factor 1.25 either way,
    ``ratio_is_within``); when the formula is off, ``gap`` explains what it leaves out.
    """
    measured, formula = _number(measured, "measured"), _number(formula, "formula")
    tolerance = _number(tolerance, "tolerance")
    if yours is not None:
        yours = _number(yours, "your prediction")
    prediction = formula if yours is None else yours
    if prediction <= 0 or measured <= 0:
        raise ValueError(f"predictions and measurements must be positive, got {prediction!r} "
                         f"and {measured!r}")
    ratio = measured / prediction
    label = f"{what} ({unit})" if unit else what
    against = "formula" if yours is None else "yours"
    shown = "-" if yours is None else f"{yours:.4g}"
    print(f"{label:<34}{'your prediction':>16}{'formula':>11}{'measured':>11}"
          f"{'measured / ' + against:>20}")
    print(f"{'':<34}{shown:>16}{formula:>11.4g}{measured:>11.4g}{ratio:>20.3g}")
    if yours is None:
        print("You have not made this prediction yet, so the formula stands in for it. Write "
              "yours above and rerun: the point is to test your own model.")
    factor = f"a factor {1 + tolerance:.3g}"
    if yours is not None:
        print(f"The measurement is {'within' if ratio_is_within(ratio, tolerance) else 'more than'} "
              f"{factor} {'of' if ratio_is_within(ratio, tolerance) else 'from'} your prediction.")
    formula_ratio = measured / formula
    if ratio_is_within(formula_ratio, tolerance):
        print(f"The formula holds here: the measurement is within {factor} of it.")
    else:
        print(f"The measurement is more than {factor} from the formula" + (f": {gap}" if gap else "."))
    return ratio
