"""Predict, then measure: the learner's own prediction printed beside the formula and the
measurement, with the gap explained when it is larger than the experiment's stated tolerance.

An experiment ends with one such line per quantity::

    print(predict.line("batch, float32 (MiB)", measured, formula, mine, tolerance=0.01,
                       gap="the allocator gave the tensor a whole block: see above"))

``mine`` is the learner's answer (a quiz variable or a ``my_prediction = ...`` cell), or None
when it is not answered yet: the line then compares with the formula and says so. A notebook
reads an answer variable only after checking it, as in ``None if name is ... else name``.
An experiment that predicts several quantities prints them as one small table instead, the rows
outside their tolerance marked::

    print(predict.table([predict.Row("all-reduce, 2 ranks", measured, formula, mine), ...]))
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


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


@dataclass(frozen=True)
class Row:
    """One predicted quantity: what it is, the measurement, the formula's value (None where the
    course has none for this device), the learner's prediction (None or ``...``: not answered),
    how close the measurement is expected to come (relative: 0.05 = 5%), the likely reason for a
    gap larger than that, and the unit printed after each number (e.g. " B")."""

    what: str
    measured: float
    formula: float | None
    mine: object = None
    tolerance: float = 0.05
    gap: str = ""
    unit: str = ""

    @property
    def prediction(self) -> float | None:
        return _as_prediction(self.mine)

    @property
    def ratio(self) -> float:
        """measured / (the learner's prediction, or the formula where there is none)."""
        reference = self.formula if self.prediction is None else self.prediction
        if reference is None:
            return math.nan            # nothing to compare with: no prediction and no formula
        if self.measured == reference:
            return 1.0                 # also 0 GPUs predicted and 0 found
        return self.measured / reference if reference else math.inf

    @property
    def outside(self) -> bool:
        """The measurement is further from the reference than the tolerance (never for NaN)."""
        return abs(self.ratio - 1) > self.tolerance

    @property
    def formula_matches(self) -> bool:
        """The formula matches the measurement and the learner's prediction differs from the
        formula by more than the tolerance: recheck the working. (A prediction that agrees with
        the formula is not a slip, even when the measurement lies between the two tolerances.)"""
        return (self.prediction is not None and bool(self.formula)
                and abs(self.measured / self.formula - 1) <= self.tolerance
                and abs(self.prediction / self.formula - 1) > self.tolerance)


def line(what: str, measured: float, formula: float | None, mine=None, tolerance: float = 0.05,
         gap: str = "", unit: str = "") -> str:
    """One line: ``what``: your prediction | formula | measured | measured / your prediction.

    Outside ``tolerance``, a second line says so and gives ``gap``, the likely reason the caller
    knows for this experiment. Where the learner's prediction is off but the formula matches, a
    third line says to recheck the working rather than blame the machine. The arguments are
    those of ``Row``. Several quantities at once: ``table``.
    """
    row = Row(what, measured, formula, mine, tolerance, gap, unit)
    if row.prediction is not None:
        yours = f"your prediction {_number(row.prediction, unit)}"
    elif formula is not None:
        yours = "your prediction: none yet, the formula stands in"
    else:
        yours = "your prediction: none yet (no formula for this device either)"
    lines = [f"{what}: {yours} | formula {_number(formula, unit)} | measured "
             f"{_number(measured, unit)} | measured/{'formula' if row.prediction is None else 'yours'} "
             f"{row.ratio:.3f}"]
    if row.outside:
        lines.append(f"  gap over the ±{tolerance * 100:g}% tolerance" + (f": {gap}" if gap else "."))
        if row.formula_matches:
            lines.append("  the formula matches the measurement: recheck your own working "
                         "(the quiz's feedback names the likely slip).")
    return "\n".join(lines)


def table(rows: list[Row]) -> str:
    """Several predicted quantities as one small table: a row each, with the learner's
    prediction, the formula, the measurement and their ratio. A row outside its tolerance is
    marked ◀ and its likely reason is printed under the table; when every row agrees, the table
    says so in one line. Where no row has a prediction of the learner's yet, one note says that the
    formula stands in (instead of a note on every row)."""
    header = ("", "yours", "formula", "measured", "ratio")
    body = [(r.what, _number(r.prediction, r.unit) if r.prediction is not None else "-",
             _number(r.formula, r.unit), _number(r.measured, r.unit), f"{r.ratio:.3f}") for r in rows]
    widths = [max(len(cells[i]) for cells in [header, *body]) for i in range(len(header))]
    lines = ["  ".join([header[0].ljust(widths[0]), *(h.rjust(w) for h, w in zip(header[1:], widths[1:]))])]
    for row, cells in zip(rows, body):
        lines.append("  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))])
                     + ("  ◀" if row.outside else ""))
    if not any(r.prediction is not None for r in rows):
        lines.append("No prediction of yours yet: each ratio is measured / formula.")
    else:
        lines.append("ratio = measured / your prediction (measured / formula where you gave none).")
    outside = [r for r in rows if r.outside]
    if not outside:
        lines.append("Every row is within its tolerance.")
    for r in outside:
        lines.append(f"◀ {r.what}: off by more than ±{r.tolerance * 100:g}%" + (f": {r.gap}" if r.gap else "."))
        if r.formula_matches:
            lines.append("  the formula matches the measurement: recheck your own working "
                         "(the quiz's feedback names the likely slip).")
    return "\n".join(lines)
