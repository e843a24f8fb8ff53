"""What grading trusts in the capstone (chapter 12): the plan's text, and a measurement the
judge makes itself.

Three items judge a learner's plan rather than a number: ``12-run-fits`` (the plan reaches the
target global batch and its measured peak is within the memory budget), ``12-run-time`` (and it
is at least the time budget's ``speedup`` times as fast as the naive run, on the same device),
``12-run-fast`` (the bonus tier, ``fast``). Their key items name ``judge_run`` as their judge
(``Item.judged_by``, gpulab.course.checks) and the budget as its argument.

What a graded run can and cannot forge. In ``make autograde`` the learner's kernel only records
the plan's text, as it records any answer (a string of at most 200 characters). The judge runs
in the grading process, outside the learner's kernel: it parses the text
(``Plan.parse``: known knobs and values only), and measures the plan itself, beside the naive
run, in a fresh Python process running the course's code (``run.measure_in_fresh_process``).
So no number the kernel prints, and no result file it writes, reaches the grade: a learner who
patches ``gpulab`` in their notebook changes what their notebook shows, not what the grader
measures. What remains is what a learner can do in the open: choose a plan. In self-study the
same judge runs in the learner's own kernel (the learner's own machine, which they trust).

The checks that need no run come first: a plan that is not text, does not parse, misses the
target global batch, or whose predicted peak (``plan.predicted_peak_bytes``) is over the budget
by more than the prediction's error (``PREDICTION_MARGIN``) is wrong without being run. Only a
plausible plan is measured (a few seconds), once per process and plan; for a time tier it
is short of, up to ``ATTEMPTS`` times, and the fastest counts (``measurement``).
"""

from __future__ import annotations

from gpulab.capstone.budget import budget_named
from gpulab.capstone.plan import Plan, PlanError, off_target, predicted_peak_bytes
from gpulab.capstone import run

ITEMS = ("12-run-fits", "12-run-time", "12-run-fast")
PREDICTION_MARGIN = 0.02       # the prediction is within 0.1% on a CPU, about 1% on a GPU
ATTEMPTS = 3                   # measurements of a plan short of a time tier, the fastest kept


class _Wrong(Exception):
    pass


def plan_problem(text, budget) -> str | None:
    """Why ``text`` cannot meet ``budget``, found without running it; None when it may."""
    try:
        plan = Plan.parse(text)
    except PlanError as error:
        return f"your plan cannot be read: {error}."
    if (wrong := off_target(plan, budget)) is not None:
        return f"your plan's {wrong.removeprefix('its ')}."
    peak = predicted_peak_bytes(plan, budget)
    if peak > budget.memory_bytes * (1 + PREDICTION_MARGIN):
        return (f"your plan's predicted peak is {peak / 2**20:.1f} MiB, over your budget of "
                f"{budget.memory_mib} MiB: a smaller micro-batch, checkpointing or bf16 shrinks it.")
    return None


def measurement(plan: Plan, budget, wanted: float | None = None) -> dict:
    """The judge's measurement of ``plan`` (``run.measure_in_fresh_process``). For a time tier
    (``wanted``, a speed-up), the fastest of up to ATTEMPTS measurements: a busy machine can
    only slow a run down, never speed it up, so the fastest is the fairest. A plan that reaches
    the tier, or is over the memory budget, is not measured again."""
    best = None
    for attempt in range(ATTEMPTS if wanted else 1):
        measured = run.measure_in_fresh_process(plan, budget, attempt=attempt)
        if best is None or (measured["speedup"] or 0) > (best["speedup"] or 0):
            best = measured
        if not measured["in_budget"] or (measured["speedup"] or 0) >= (wanted or 0):
            break
    return best


def judge_run(item, answer) -> str:
    """The verdict on a plan for one of ``ITEMS`` (module docstring); raises
    gpulab.course.checks.WrongAnswer with the reason when the plan does not pass."""
    from gpulab.course.checks import WrongAnswer

    budget = budget_named(item.judge_args)
    if answer is Ellipsis:
        raise WrongAnswer(f"{item.id}: not answered yet. Write your plan as a line of text, "
                          "e.g. \"micro_batch=4 accumulation=4 workers=2\".")
    problem = plan_problem(answer, budget)
    if problem is not None:
        raise WrongAnswer(f"{item.id}: {problem}")
    wanted = {"12-run-time": budget.speedup, "12-run-fast": budget.fast}.get(item.id)
    try:
        measured = measurement(Plan.parse(answer), budget, wanted)
    except Exception as error:         # the measuring process failed: say so, score nothing
        raise WrongAnswer(f"{item.id}: the run of your plan failed ({str(error)[:300]}).")
    peak = measured["peak_bytes"] / 2**20
    if not measured["in_budget"]:
        raise WrongAnswer(f"{item.id}: {measured['why']}.")
    if wanted is None:
        return (f"✔ {item.id}: right (global batch {budget.batch}, measured peak {peak:.2f} MiB "
                f"within {budget.memory_mib} MiB on {measured['device']}).")
    speedup = measured["speedup"]
    what = "the time budget" if item.id == "12-run-time" else "the bonus tier"
    if speedup is None or speedup < wanted:
        raise WrongAnswer(f"{item.id}: measured {speedup:.2f}x as fast as the naive run on "
                          f"{measured['device']}; {what} is {wanted}x. What stalls the step: "
                          "the data, or the compute?")
    return f"✔ {item.id}: right (measured {speedup:.2f}x as fast as the naive run; {what} {wanted}x)."
