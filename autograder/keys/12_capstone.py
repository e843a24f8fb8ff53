"""Answer key for chapter 12, the capstone. Instructor side: never released.

Every expected value is computed by gpulab's tested functions from the student's budget (one
of gpulab.capstone.budget.BUDGETS, drawn per student with a course seed; the canonical one
otherwise); each mistake is the value a typical slip produces, with the words the learner sees.
The three run items judge the student's plan by a measurement the grader makes itself
(gpulab.capstone.grading: what grading trusts, and why).
"""
import math

from gpulab import arith
from gpulab.arith import MiB
from gpulab.capstone import budget as budgets
from gpulab.capstone.grading import plan_problem
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical
from gpulab.models import GPT

PARAMS = {
    "budget": Param(budgets.CANONICAL.record(), tuple(b.record() for b in budgets.BUDGETS)),
}
QUESTIONS = {
    "ch12-md-budget": (
        "### Your budget\n\n"
        "| | |\n|---|---|\n"
        "| model | the course GPT: {budget[n_layer]} blocks of width $h = {budget[n_embd]}$, 4 heads, "
        "a vocabulary of 1,000 tokens |\n"
        "| target global batch | {budget[batch]} sequences of {budget[seq]} tokens per optimizer step |\n"
        "| memory budget | {budget[memory_mib]} MiB at the peak of a training step |\n"
        "| data | loading one global batch takes {budget[load_share]} times the naive step's compute |\n"
        "| time budget | at least {budget[speedup]}× as fast as the naive run; the bonus tier {budget[fast]}× |\n\n"
        "The code cells read the same budget as `budget` (budget {budget[name]})."),
}
# The same for everyone: Quiz 12 reads a loop the question prints, and the three run items
# accept any plan that meets the student's own budget, judged by the grader's measurement
# (a classmate's plan may well meet it too: it is graded by its run, not by its text).
FIXED = {
    "12-loop-global-batch": "a reading of the loop the question prints",
    "12-run-fits": "any plan within the student's own budget; the grader measures it",
    "12-run-time": "any plan within the student's own budget; the grader measures it",
    "12-run-fast": "any plan within the student's own budget; the grader measures it",
}
RIGHT_PLAN = "any plan that meets your budget"       # what a judged item's value says
JUDGE = "gpulab.capstone.grading:judge_run"
LOOP_BATCH, LOOP_STEPS = 16, 4                        # Quiz 12's loop


def largest_dividing(budget, checkpointing: bool, accumulating: bool = True) -> int:
    """The largest micro-batch that divides the target global batch and whose predicted peak
    fits the memory budget (fp32, AdamW). With ``accumulating``, a micro-batch smaller than the
    global batch is sized for accumulation: its later micro-batches run with every gradient
    alive (chapter 05)."""
    def peak(m: int) -> int:
        return arith.predict_training_memory(budget.config(), m, budget.seq, "float32", "adamw",
                                             checkpointing=checkpointing,
                                             accumulating=accumulating and m < budget.batch)["peak"]
    fitting = [m for m in range(1, budget.batch + 1)
               if budget.batch % m == 0 and peak(m) <= budget.memory_bytes]
    return max(fitting, default=0)


def items(p: dict) -> list[Item]:
    """The key for the budget in ``p`` (canonical: the chapter's own)."""
    b = budgets.budget_named(p["budget"]["name"])
    config, B, s, share = b.config(), b.batch, b.seq, b.load_share
    P = GPT.count_params(config)
    naive = arith.predict_training_memory(config, B, s, "float32", "adamw")
    naive_accumulating = arith.predict_training_memory(config, B, s, "float32", "adamw", accumulating=True)
    naive_ckpt = arith.predict_training_memory(config, B, s, "float32", "adamw", checkpointing=True)
    micro = largest_dividing(b, checkpointing=False)
    micro_no_grads = largest_dividing(b, checkpointing=False, accumulating=False)
    micro_ckpt = largest_dividing(b, checkpointing=True)
    flops = arith.gpt_step_flops_per_token(config, s)
    compute_ms = B * s * flops / budgets.REFERENCE_FLOPS * 1e3
    naive_step_ms = compute_ms * (1 + share)
    workers = 2                                                   # Quizzes 10-11's plan
    plan_step_ms = max(share * compute_ms / workers, compute_ms)
    added_ms = share * compute_ms / workers + compute_ms
    accumulation_slips = {}          # a value two slips give is diagnosed as the first
    for value, says in ((B // micro_no_grads, "that divides by the micro-batch that fits only "
                         "without the accumulated gradients; use Quiz 4's."),
                        (micro, "that is the micro-batch; the accumulation steps are the global "
                                "batch divided by it.")):
        if value != B // micro:
            accumulation_slips.setdefault(value, says)
    judged = dict(value=RIGHT_PLAN, unit="", judged_by=JUDGE, judge_args=b.name)
    naive_plan = f"micro_batch={B} accumulation=1 workers={math.ceil(share) + 1}"
    off_target = f"micro_batch={micro} accumulation={max(1, B // micro // 2)} workers={math.ceil(share) + 1}"

    return [
        Item("12-tokens-per-step", B * s, "tokens", mistakes=(
            Mistake(B, f"that counts sequences; each of the {B} has {s} tokens."),
            Mistake(s, f"that is one sequence; the step sees {B} of them."),
        )),
        Item("12-state-mib", 16 * P / MiB, "MiB", rel_tol=0.002, mistakes=(
            Mistake(12 * P / MiB, "that leaves out the gradients: at the end of backward every "
                                  "parameter has its fp32 gradient too, 4 + 4 + 4 + 4 bytes."),
            Mistake(8 * P / MiB, "that is the weights and gradients; add AdamW's two fp32 moments."),
            Mistake(4 * P / MiB, "that is the weights alone: 16 bytes per parameter in all."),
        )),
        Item("12-naive-peak-mib", naive["peak"] / MiB, "MiB", rel_tol=0.01, mistakes=(
            Mistake(naive_accumulating["peak"] / MiB,
                    "accumulating=True models a later micro-batch of an accumulated step, with "
                    "every gradient alive; the naive run takes the whole batch in one pass."),
            Mistake(naive_ckpt["peak"] / MiB, "the naive run checkpoints nothing."),
            Mistake(16 * P / MiB, "that is the model state alone; the peak adds the whole "
                                  "batch's activations."),
        )),
        Item("12-largest-micro", micro, "sequences", mistakes=(
            Mistake(micro_no_grads, "that micro-batch fits a single pass, but an accumulated "
                    "step's later micro-batches run with every gradient alive: "
                    "predict_training_memory(..., accumulating=True)."),
        )),
        Item("12-accum", B // micro, "steps", mistakes=tuple(
            Mistake(value, says) for value, says in accumulation_slips.items())),
        Item("12-ckpt-micro", micro_ckpt, "sequences", mistakes=(
            Mistake(micro, "that is the largest without checkpointing (Quiz 4); with every block "
                           "checkpointed the activations shrink to the blocks' inputs."),
        )),
        Item("12-naive-compute-ms", compute_ms, "ms", rel_tol=0.01, mistakes=(
            Mistake(B * s * 6 * P / budgets.REFERENCE_FLOPS * 1e3,
                    "6·N with N every parameter counts the embedding tables, which do no "
                    "arithmetic, and leaves out attention's own matmuls: "
                    "arith.gpt_step_flops_per_token counts what runs."),
            Mistake(compute_ms / 3, "that is forward alone; backward costs twice forward."),
            Mistake(B * s * arith.gpt_step_flops_per_token(config, s, True) / budgets.REFERENCE_FLOPS * 1e3,
                    "that counts the recomputation of checkpointing; the naive run has none."),
        )),
        Item("12-naive-step-ms", naive_step_ms, "ms", rel_tol=0.01, mistakes=(
            Mistake(compute_ms, "that is the compute alone; without workers the loop also waits "
                                "for each batch to load."),
            Mistake(share * compute_ms, "that is the loading alone; without workers the compute "
                                        "comes after it."),
        )),
        Item("12-workers-needed", math.ceil(share), "workers", mistakes=(
            Mistake(math.floor(share), f"rounded down: {math.floor(share)} workers deliver a "
                                       f"batch every {share / math.floor(share):.2f} compute "
                                       "times, so loading still sets the pace. Round up."),
        )),
        Item("12-plan-step-ms", plan_step_ms, "ms", rel_tol=0.01, mistakes=(
            Mistake(added_ms, "with workers, loading runs beside the compute: the slower of the "
                              "two sets the pace; they do not add."),
            Mistake(naive_step_ms, "that is the step without workers (Quiz 8)."),
        )),
        Item("12-plan-tokens-per-s", B * s / (plan_step_ms / 1e3), "tokens/s", rel_tol=0.01, mistakes=(
            Mistake(B * s / (added_ms / 1e3), "that adds loading and compute in the plan's step; "
                                              "with workers the slower one sets the pace."),
            Mistake(B / (plan_step_ms / 1e3), "that counts sequences per second; each has "
                                              f"{s} tokens."),
            Mistake(B * s / plan_step_ms, "that is per millisecond; a second is 1000 ms."),
        )),
        Item("12-loop-global-batch", LOOP_BATCH * LOOP_STEPS, "sequences", mistakes=(
            Mistake(LOOP_BATCH, f"{LOOP_BATCH} is what one pass takes (the DataLoader's "
                                f"batch_size); {LOOP_STEPS} such passes add up before each step."),
            Mistake(LOOP_STEPS, f"that is the accumulation steps; each pass takes {LOOP_BATCH} sequences."),
        )),
        Item("12-run-fits", **judged, mistakes=(
            Mistake(naive_plan, plan_problem(naive_plan, b)),
            Mistake(off_target, plan_problem(off_target, b)),
        )),
        Item("12-run-time", **judged, mistakes=(Mistake(naive_plan, plan_problem(naive_plan, b)),)),
        Item("12-run-fast", **judged, mistakes=(Mistake(naive_plan, plan_problem(naive_plan, b)),)),
    ]


ITEMS = items(canonical(PARAMS))
