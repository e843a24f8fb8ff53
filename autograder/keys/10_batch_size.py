"""Answer key for chapter 10, batch size and learning. Instructor side: never released.

Every expected value is computed by gpulab's tested functions (gpulab.batch_size) from the
numbers the questions state; each mistake is the value a typical slip produces, with the words
the learner sees. Each item is preceded by "# Quiz N", the number of its "### Quiz N" heading in
the notebook (tests/test_keys.py checks that they agree).
"""
from gpulab.batch_size import lr_scaling, noise_scale, planning, tradeoff
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical

# The numbers stated in the questions (solutions/10_batch_size, "Quiz" sections). Those in
# PARAMS are canonical values: a graded release with a course seed draws others for each student
# (gpulab.course.variants). The rest are the same for everyone (FIXED says why).
GPT3_WARMUP_TOKENS, GPT3_SEQ = 375e6, 2048            # Quiz 7: GPT-3, appendix B and Table 2.1
LINE_BUG = 9                                          # Quiz 12: the loop's numbered lines


def probe(micro: int, ranks: int, small: float, big: float) -> dict:
    """Quiz 1: a data-parallel run's two squared gradient norms (each well above the other's
    1/ranks share, so |G|² comes out positive), as printed, to 3 figures."""
    return {"micro": micro, "ranks": ranks, "big_batch": micro * ranks, "small": small, "big": big}


def limits(s_min: int, e_min: float, e_text: str) -> dict:
    """Quizzes 2-3: S_min steps and E_min tokens to a target (B_crit = E_min/S_min tokens)."""
    return {"s_min": s_min, "e_min": e_min, "e_text": e_text}


def two_runs(b1: int, s1: int, b2: int, s2: int) -> dict:
    """Quiz 4: two runs to the same target, steps S = S_min + E_min/B exactly at both."""
    return {"b1": b1, "s1": s1, "b2": b2, "s2": s2}


def base(batch: int, lr: float, lr_text: str) -> dict:
    return {"batch": batch, "lr": lr, "lr_text": lr_text}


def gpt3(name: str, seqs: int, table: float, table_text: str) -> dict:
    """Quiz 7: a GPT-3 model of Table 2.1, whose batch in tokens is a whole number of 2,048-token
    sequences when its "M" is read as 2^20 (0.5M = 256 sequences); the paper itself gives no
    sequence count. 175B's 3.2M is a whole number of sequences in neither reading, so it is not
    drawn (issue 36, erratum 9: 1,536 x 2,048 = 3.1M)."""
    return {"name": name, "seqs": seqs, "tokens": seqs * GPT3_SEQ, "table": table, "table_text": table_text}


def per_step(micro: int, accumulation: int, ranks: int, seq: int) -> dict:
    return {"micro": micro, "accumulation": accumulation, "ranks": ranks, "seq": seq}


def fit(b_crit: int, micro: int, seq: int) -> dict:
    """Quiz 10: B_crit in tokens and one GPU's micro-batch: a whole number of GPUs, 16 or more."""
    return {"b_crit": b_crit, "micro": micro, "seq": seq}


def start(multiple: float, text: str) -> dict:
    return {"m": multiple, "text": text}


PARAMS = {
    "probe": Param(probe(32, 8, 0.0130, 0.00400), (                              # Quiz 1
        probe(32, 8, 0.0130, 0.00400), probe(16, 8, 0.0250, 0.00480), probe(64, 4, 0.00900, 0.00380),
        probe(32, 16, 0.0180, 0.00310), probe(16, 16, 0.0410, 0.00450), probe(64, 8, 0.00620, 0.00210))),
    "limits": Param(limits(20_000, 4e9, "4 × 10⁹"), (                            # Quizzes 2-3
        limits(10_000, 2e9, "2 × 10⁹"), limits(20_000, 4e9, "4 × 10⁹"), limits(25_000, 1e10, "10¹⁰"),
        limits(40_000, 6e9, "6 × 10⁹"), limits(50_000, 4e10, "4 × 10¹⁰"), limits(15_000, 3e9, "3 × 10⁹"))),
    "two_runs": Param(two_runs(256, 10_000, 1024, 4_000), (                       # Quiz 4
        two_runs(256, 10_000, 1024, 4_000), two_runs(128, 5_000, 512, 2_000),
        two_runs(512, 25_000, 4096, 7_500), two_runs(256, 12_000, 1024, 5_250),
        two_runs(64, 7_000, 256, 2_500))),
    "sgd": Param(base(256, 0.1, "0.1"), (base(256, 0.1, "0.1"), base(128, 0.05, "0.05"),    # Quiz 5
                                         base(512, 0.2, "0.2"), base(256, 0.04, "0.04"),
                                         base(1024, 0.4, "0.4"), base(64, 0.025, "0.025"))),
    "adam": Param(base(512, 3e-4, "3 × 10⁻⁴"), (base(512, 3e-4, "3 × 10⁻⁴"),               # Quiz 6
                                               base(256, 6e-4, "6 × 10⁻⁴"), base(1024, 1.5e-4, "1.5 × 10⁻⁴"),
                                               base(512, 2e-4, "2 × 10⁻⁴"), base(2048, 1e-4, "10⁻⁴"),
                                               base(128, 1.2e-3, "1.2 × 10⁻³"))),
    "gpt3": Param(gpt3("Small (125M)", 256, 0.5e6, "0.5M"), (                       # Quiz 7
        gpt3("Small (125M)", 256, 0.5e6, "0.5M"), gpt3("XL (1.3B)", 512, 1e6, "1M"),
        gpt3("6.7B", 1024, 2e6, "2M"))),
    "per_step": Param(per_step(4, 8, 64, 4096), (                                  # Quiz 9
        per_step(4, 8, 64, 4096), per_step(2, 12, 48, 4096), per_step(8, 6, 96, 2048),
        per_step(1, 16, 24, 8192), per_step(2, 3, 128, 8192), per_step(4, 5, 32, 2048))),
    "fit": Param(fit(4_194_304, 8, 4096), (fit(4_194_304, 8, 4096), fit(2_097_152, 8, 4096),   # Quiz 10
                                           fit(8_388_608, 16, 2048), fit(4_194_304, 16, 8192),
                                           fit(16_777_216, 8, 4096), fit(3_145_728, 8, 4096))),
    "start": Param(start(1, "the critical batch size"), (                            # Quiz 11
        start(0.25, "a quarter of the critical batch size"), start(0.5, "half the critical batch size"),
        start(1, "the critical batch size"), start(2, "twice the critical batch size"),
        start(4, "4 times the critical batch size"), start(8, "8 times the critical batch size"))),
}
QUESTIONS = {
    "ch10-md-q-two-batch": "### Quiz 1: the noise scale from two gradient norms\n\n{probe[ranks]} data-parallel "
                           "ranks each compute the gradient of a micro-batch of {probe[micro]} sequences,\nand the "
                           "all-reduce averages them into the gradient of the global batch of {probe[big_batch]}. "
                           "Averaged\nover many steps, the squared norm of one rank's gradient is {probe[small]:.3g}, "
                           "and that of the\naveraged gradient is {probe[big]:.3g}. What is the gradient noise "
                           "scale, in **sequences**?",
    "ch10-md-q-steps": "### Quiz 2: steps at the critical batch size\n\nTo reach a target loss, a run needs "
                       "{limits[s_min]:,} steps with an infinite batch (the fewest\nsteps) and "
                       "{limits[e_text]} tokens with a tiny one (the fewest tokens). How many **steps** does "
                       "it need at\nthe critical batch size?",
    "ch10-md-q-two-runs": "### Quiz 4: the critical batch size from two runs\n\nTwo runs reach the same target "
                          "loss. At a batch of {two_runs[b1]:,} sequences one took {two_runs[s1]:,} steps;\nat "
                          "{two_runs[b2]:,} sequences the other took {two_runs[s2]:,}. Both lie on the curve of "
                          "section 1. What is the\ncritical batch size, in **sequences**?",
    "ch10-md-q-linear": "### Quiz 5: the linear rule at 8× the batch\n\nSGD with momentum was tuned at a batch "
                        "of {sgd[batch]} images with learning rate {sgd[lr_text]}. You move to 8× the\nbatch. "
                        "What learning rate does the linear rule give?",
    "ch10-md-q-sqrt": "### Quiz 6: the square-root rule at 8× the batch\n\nAdamW was tuned at a batch of "
                      "{adam[batch]} sequences with learning rate {adam[lr_text]}. You move to 8× the batch.\n"
                      "What learning rate does the square-root rule give?",
    "ch10-md-q-warmup": "### Quiz 7: a warm-up in tokens, in steps\n\nGPT-3 {gpt3[name]} warmed its learning "
                        "rate up over the first 375 million tokens. Its batch\nwas {gpt3[seqs]:,} sequences of "
                        "2,048 tokens: Table 2.1 gives it as {gpt3[table_text]} tokens, with M read as\n2²⁰ (the "
                        "paper gives no count of sequences). Had the batch been at that full size from the\n"
                        "first step, how many **optimizer steps** would the warm-up have lasted?",
    "ch10-md-q-tokens": "### Quiz 9: tokens per optimizer step\n\nA run uses micro-batches of {per_step[micro]} "
                        "sequences of {per_step[seq]:,} tokens, {per_step[accumulation]} accumulation steps and "
                        "{per_step[ranks]}\ndata-parallel ranks. How many **tokens** does one optimizer step "
                        "train on?",
    "ch10-md-q-gpus": "### Quiz 10: GPUs up to the critical batch size\n\nA run's critical batch size is "
                      "{fit[b_crit]:,} tokens. Each GPU fits a micro-batch of {fit[micro]} sequences\nof "
                      "{fit[seq]:,} tokens, and you do not accumulate. With how many **GPUs** is the global "
                      "batch equal to the\ncritical batch size?",
    "ch10-md-q-doubling": "### Quiz 11: what doubling the GPUs buys\n\nA run's global batch is {start[text]}. "
                          "You double the GPUs, each keeping its\nmicro-batch, so the global batch doubles. By "
                          "what **factor** does the number of steps to the target fall\n(the steps at the old "
                          "batch divided by the steps at the new one)?",
}
# The same for everyone: a choice that Experiment 3 measured, and a fixed piece of code to read.
FIXED = {
    "10-spike-fix": "a choice of four remedies for the run Experiment 3 trains and measures",
    "10-wrong-line": "one fixed training loop to read, its lines numbered",
}


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    pr = p["probe"]
    g2, trace = noise_scale.two_batch_estimates(pr["small"], pr["big"], pr["micro"], pr["big_batch"])
    s_min, e_min = p["limits"]["s_min"], p["limits"]["e_min"]
    b_crit = tradeoff.critical_batch(s_min, e_min)
    r = p["two_runs"]
    fit_s, fit_e = tradeoff.fit_steps_examples([r["b1"], r["b2"]], [r["s1"], r["s2"]])
    sgd, adam = p["sgd"], p["adam"]
    seqs, tokens = p["gpt3"]["seqs"], p["gpt3"]["tokens"]
    ps = p["per_step"]
    per_step_tokens = planning.tokens_per_step(ps["micro"], ps["accumulation"], ps["ranks"], ps["seq"])
    f = p["fit"]
    gpus = planning.gpus_for_batch(f["b_crit"], f["micro"], f["seq"])
    m = p["start"]["m"]
    speedup = planning.doubling_speedup(m, 1.0)

    return [
        # Quiz 1
        Item("10-two-batch-noise-scale", noise_scale.simple_noise_scale(trace, g2), "sequences", rel_tol=0.01,
             mistakes=(
            Mistake(trace / pr["big"], "that divides tr Σ by |G_big|², which still holds the noise tr Σ/B_big; "
                    "the signal |G|² is (B_big·|G_big|² − B_small·|G_small|²)/(B_big − B_small)."),
            Mistake((pr["small"] - pr["big"]) / pr["big"], "the difference of the two norms is tr Σ times "
                    "(1/B_small − 1/B_big): divide by that, and use the estimate of |G|², not |G_big|²."),
            Mistake(trace / pr["small"], "that divides by |G_small|², which is mostly noise; the signal is "
                    "(B_big·|G_big|² − B_small·|G_small|²)/(B_big − B_small)."),
        )),
        # Quiz 2
        Item("10-steps-at-bcrit", tradeoff.steps_at_batch(s_min, b_crit, b_crit), "steps", rel_tol=0.01, mistakes=(
            Mistake(s_min, "that is one of the two terms of S = S_min + E_min/B; at B = B_crit = E_min/S_min "
                           "the second equals the first: add them."),
            Mistake(s_min / 2, "at the critical batch a run needs more steps than with an infinite batch, "
                               "not fewer: S = S_min(1 + B_crit/B)."),
            Mistake(e_min / s_min, "that is B_crit itself (tokens per step); the question asks for the steps "
                                   "at that batch."),
        )),
        # Quiz 3
        Item("10-tokens-at-bcrit", tradeoff.examples_at_batch(e_min, b_crit, b_crit), "tokens", rel_tol=0.01,
             mistakes=(
            Mistake(e_min, "E_min is what a tiny batch needs; at B = B_crit, E = E_min(1 + B/B_crit) = 2·E_min."),
            Mistake(e_min / 2, "a bigger batch wastes examples, it never saves them: E = E_min(1 + B/B_crit)."),
        )),
        # Quiz 4
        Item("10-bcrit-from-two-runs", tradeoff.critical_batch(fit_s, fit_e), "sequences", rel_tol=0.01, mistakes=(
            Mistake(fit_e, f"that is E_min ({fit_e:,.0f} sequences); B_crit = E_min/S_min, with S_min = "
                           f"{fit_s:,.0f} steps."),
            Mistake(fit_s, "that is S_min, the steps with an infinite batch; B_crit = E_min/S_min."),
            Mistake(r["b1"] * r["s1"] / r["s2"], "that divides one run's examples by the other run's steps; "
                    "solve S₁ = S_min + E_min/B₁ and S₂ = S_min + E_min/B₂ for both unknowns first."),
        )),
        # Quiz 5
        Item("10-linear-lr-8x", lr_scaling.linear_rule(sgd["lr"], sgd["batch"], 8 * sgd["batch"]), "", rel_tol=0.01,
             mistakes=(
            Mistake(lr_scaling.sqrt_rule(sgd["lr"], sgd["batch"], 8 * sgd["batch"]), "that is the square-root "
                    "rule, for Adam; the linear rule (SGD) multiplies the learning rate by the batch's factor."),
            Mistake(sgd["lr"], "unchanged, each step of the bigger batch moves no further than before: eight "
                               "times fewer steps then cover an eighth of the distance."),
            Mistake(sgd["lr"] / 8, "the other way round: a bigger batch takes a larger learning rate."),
        )),
        # Quiz 6
        Item("10-sqrt-lr-8x", lr_scaling.sqrt_rule(adam["lr"], adam["batch"], 8 * adam["batch"]), "", rel_tol=0.01,
             mistakes=(
            Mistake(lr_scaling.linear_rule(adam["lr"], adam["batch"], 8 * adam["batch"]), "that is the linear "
                    "rule, for SGD; for Adam multiply by the square root of the factor, √8 ≈ 2.83."),
            Mistake(adam["lr"], "unchanged is too small. A batch 8 times bigger should move the weights "
                                "about 8 times as far per step; Adam's own normaliser gives √8 of that, and the "
                                "square-root rule supplies the other √8."),
            Mistake(adam["lr"] / 8 ** 0.5, "the other way round: multiply by √8, do not divide."),
            Mistake(adam["lr"] * 8 ** 2, "square root, not square: × √8 ≈ 2.83."),
        )),
        # Quiz 7
        Item("10-warmup-steps", lr_scaling.warmup_steps(GPT3_WARMUP_TOKENS, tokens), "steps", rel_tol=0.01,
             mistakes=(
            Mistake(GPT3_WARMUP_TOKENS / seqs, "that counts sequences per step as if they were tokens: a step "
                    f"trains on {seqs:,} × 2,048 = {tokens:,} tokens."),
            Mistake(GPT3_WARMUP_TOKENS / GPT3_SEQ, "that is the number of sequences in 375 million tokens; "
                    f"divide by the {seqs:,} sequences a step takes too."),
            Mistake(GPT3_WARMUP_TOKENS / p["gpt3"]["table"], f"that reads Table 2.1's {p['gpt3']['table_text']} "
                    f"as decimal millions; a step is {seqs:,} × 2,048 = {tokens:,} tokens exactly."),
        )),
        # Quiz 8
        Item("10-spike-fix", "sqrt_and_warmup", "",
             choices=("sqrt_and_warmup", "linear_rule", "bigger_batch", "more_steps"), mistakes=(
            Mistake("linear_rule", "that is what the run did (4 × the batch, 4 × the rate): for AdamW it "
                    "overshoots, and without a warm-up the first steps blow the loss up."),
            Mistake("bigger_batch", "a bigger batch would take an even larger learning rate by the same rule, "
                    "and past B_crit it wastes tokens; the trouble is the rate, not the batch."),
            Mistake("more_steps", "more steps only pay for the damage the first steps did; the cure is a "
                    "rate that does not overshoot, reached gradually."),
        )),
        # Quiz 9
        Item("10-tokens-per-step", per_step_tokens, "tokens", mistakes=(
            Mistake(per_step_tokens // ps["seq"], f"that is sequences per step; each has {ps['seq']:,} tokens."),
            Mistake(per_step_tokens // ps["accumulation"], f"every rank runs {ps['accumulation']} micro-batches "
                    "before the step: multiply by the accumulation steps too."),
            Mistake(per_step_tokens // ps["ranks"], f"that is one rank's share; the {ps['ranks']} ranks' "
                    "gradients are averaged into one step."),
        )),
        # Quiz 10
        Item("10-gpus-at-bcrit", gpus, "GPUs", mistakes=(
            Mistake(f["b_crit"] / f["micro"], f"B_crit is in tokens: one GPU holds {f['micro']} × "
                    f"{f['seq']:,} = {f['micro'] * f['seq']:,} tokens."),
            Mistake(f["b_crit"] / f["seq"], f"that is B_crit in sequences; each GPU holds {f['micro']} of them."),
        )),
        # Quiz 11
        Item("10-doubling-speedup", speedup, "", rel_tol=0.01, mistakes=(
            Mistake(2, "a factor of 2 is perfect scaling, which holds only far below B_crit: "
                       "S = S_min(1 + B_crit/B) at both batches."),
            Mistake(1 / speedup, "that is the new steps over the old; the question divides the old by the new."),
            Mistake(1, "the steps still fall a little: S = S_min(1 + B_crit/B) keeps decreasing as B grows."),
        )),
        # Quiz 12
        Item("10-wrong-line", LINE_BUG, "line", mistakes=(
            Mistake(3, "line 3 is right: the global batch is micro-batch × accumulation × ranks, the "
                       "batch the optimizer steps with."),
            Mistake(4, "line 4 is right: AdamW takes the square-root rule from the batch it was tuned at."),
            Mistake(6, "line 6 is right: 2,000 warm-up steps from 1% of the peak, Llama 2's length; it "
                       "counts scheduler steps, which is why where .step() is called matters."),
            Mistake(8, "line 8 is right: each micro-batch's mean loss divided by the accumulation steps "
                       "adds up to the mean over the whole batch (chapter 05)."),
            Mistake(11, "line 11 is right: the optimizer steps once per accumulated batch."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
