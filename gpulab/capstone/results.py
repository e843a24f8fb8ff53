"""The file of a learner's runs (chapter 12, section 8): one line of JSON per run, beside the
notebook, read back with limits.

``record(measurement)`` appends a run to ``capstone-runs.jsonl`` in the notebook's folder; the
chapter's history (self-study) and the workshop's leaderboard read it back with
``parse_runs``. A learner can write anything into that file, so reading it trusts nothing:

- at most ``MAX_FILE_BYTES``, of which the last ``MAX_RUNS`` lines, each at most
  ``MAX_LINE_CHARS``; anything else is not read (the board also reads only a regular file the
  learner owns, workshop/progress.py);
- a line is a run only if it is a JSON object with exactly the keys of ``Run``, each of its
  type and range; its plan must parse (``Plan.parse``) and its budget must be one of
  ``BUDGETS``; other lines are counted as refused, never shown;
- what a run claims of its own measurement (its speed-up, say) is shown as its claim. The
  board ranks learners by its own measurement of their plan (workshop/progress.py), so a
  forged number lifts no one; the history is the learner's own.

Nothing here renders HTML: the board escapes every string it shows.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from gpulab.capstone.budget import budget_named
from gpulab.capstone.plan import Plan, PlanError

RESULT_FILE = "capstone-runs.jsonl"
MAX_FILE_BYTES = 256 * 2**10
MAX_LINE_CHARS = 2000
MAX_RUNS = 200
MAX_TEXT = 300                 # characters of a free-text field (the device, why)


@dataclass(frozen=True)
class Run:
    """One run as the file keeps it. Sizes in MiB (2^20 bytes), times in ms."""

    when: str                  # UTC, ISO 8601
    budget: str
    plan: str
    device: str
    peak_mib: float
    naive_peak_mib: float
    step_ms: float | None      # None: not timed (the plan is over budget, or off the target)
    naive_step_ms: float | None
    tokens_per_s: float | None
    naive_tokens_per_s: float | None
    speedup: float | None
    in_budget: bool
    why: str

    @property
    def meets_time(self) -> bool:
        return self.in_budget and self.speedup is not None and \
            self.speedup >= budget_named(self.budget).speedup


def run_of(measurement: dict) -> Run:
    """A ``Run`` from ``gpulab.capstone.run.measure``'s result."""
    m = measurement
    ms = lambda s: None if s is None else s * 1e3          # noqa: E731
    return Run(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), m["budget"], m["plan"],
               m["device"], m["peak_bytes"] / 2**20, m["naive_peak_bytes"] / 2**20,
               ms(m["step_s"]), ms(m["naive_step_s"]), m["tokens_per_s"],
               m["naive_tokens_per_s"], m["speedup"], bool(m["in_budget"]), m["why"][:MAX_TEXT])


def record(measurement: dict, folder: Path | str = ".") -> Run:
    """Append the run to the result file in ``folder`` (the notebook's); returns it."""
    run = run_of(measurement)
    with open(Path(folder) / RESULT_FILE, "a") as f:
        f.write(json.dumps(asdict(run)) + "\n")
    return run


# ------------------------------------------------------------------------------------------
# Reading it back, trusting nothing

_NUMBERS = {"peak_mib": 1e6, "naive_peak_mib": 1e6, "step_ms": 1e7, "naive_step_ms": 1e7,
            "tokens_per_s": 1e12, "naive_tokens_per_s": 1e12, "speedup": 1e4}
_OPTIONAL = {"step_ms", "naive_step_ms", "tokens_per_s", "naive_tokens_per_s", "speedup"}
_KEYS = {f.name for f in fields(Run)}


def _number(value, top: float, optional: bool) -> bool:
    if value is None:
        return optional
    return type(value) in (int, float) and math.isfinite(value) and 0 <= value <= top


def parse_line(line: str) -> Run | None:
    """The run one line describes, or None when it is not one (module docstring)."""
    if len(line) > MAX_LINE_CHARS:
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or set(data) != _KEYS:
        return None
    for key in ("when", "budget", "plan", "device", "why"):
        if not isinstance(data[key], str) or len(data[key]) > MAX_TEXT:
            return None
    if not all(_number(data[k], top, k in _OPTIONAL) for k, top in _NUMBERS.items()):
        return None
    if type(data["in_budget"]) is not bool:
        return None
    try:
        budget_named(data["budget"])
        data["plan"] = Plan.parse(data["plan"]).text()
    except (KeyError, PlanError):
        return None
    return Run(**data)


def parse_runs(data: bytes) -> tuple[list[Run], int]:
    """(the runs, how many lines were refused) of a result file's bytes: the last MAX_RUNS
    lines of at most MAX_FILE_BYTES."""
    if len(data) > MAX_FILE_BYTES:
        return [], 1
    text = data.decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()][-MAX_RUNS:]
    runs = [parse_line(line) for line in lines]
    return [r for r in runs if r is not None], sum(r is None for r in runs)


def history(folder: Path | str = ".") -> list[Run]:
    """The runs recorded in ``folder``'s result file, oldest first ([] when there is none)."""
    path = Path(folder) / RESULT_FILE
    if not path.is_file():
        return []
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    return parse_runs(data)[0]


def history_table(runs: list[Run]) -> str:
    """The runs as a small table: plan, peak, step time, speed-up, verdict."""
    if not runs:
        return "No runs recorded yet."
    rows = [("when (UTC)", "budget", "peak MiB", "step ms", "speed-up", "verdict", "plan")]
    for r in runs:
        verdict = ("meets both budgets" if r.meets_time else
                   "fits, too slow" if r.in_budget else "over budget")
        rows.append((r.when.replace("T", " ").rstrip("Z"), r.budget, f"{r.peak_mib:.2f}",
                     "-" if r.step_ms is None else f"{r.step_ms:.0f}",
                     "-" if r.speedup is None else f"{r.speedup:.2f}x", verdict, r.plan))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                     for row in rows)


def plot_history(runs: list[Run], budget, ax=None):
    """Each run's speed-up over the naive run (bars, in the order run), the time budget and
    the bonus tier as lines; a run over the memory budget is drawn hatched at 0."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    mine = [r for r in runs if r.budget == budget.name]
    heights = [r.speedup if r.in_budget and r.speedup is not None else 0.0 for r in mine]
    colours = ["#3f9d5a" if r.meets_time else "#e0a030" if r.in_budget else "#bbbbbb" for r in mine]
    ax.bar(range(1, len(mine) + 1), heights, color=colours)
    for i, r in enumerate(mine, start=1):
        if not r.in_budget:
            ax.text(i, 0.05, "over\nbudget", ha="center", va="bottom", fontsize=8)
    ax.axhline(budget.speedup, color="#24466b", linestyle="--", label=f"time budget {budget.speedup}x")
    ax.axhline(budget.fast, color="#24466b", linestyle=":", label=f"bonus tier {budget.fast}x")
    ax.set_xlabel("run (oldest first)")
    ax.set_ylabel("speed-up over the naive run")
    ax.set_title(f"Your runs for budget {budget.name}")
    ax.legend(loc="upper left", fontsize=8)
    return ax
