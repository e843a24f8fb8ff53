"""Answer key for chapter 04, mixed precision. Instructor side: never released.

Every expected value is computed by gpulab's tested functions (number formats from their bit
counts, checked against torch.finfo; GradScaler's rule, checked against GradScaler itself) from
the numbers the questions state; each mistake is the value a typical slip produces.
"""
import math

from gpulab import arith, precision
from gpulab.arith import GB
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical

fp32, fp16, bf16, e4m3 = (precision.FORMATS[n] for n in ("fp32", "fp16", "bf16", "fp8_e4m3"))

# The numbers stated in the questions (solutions/04_mixed_precision, "Quiz" sections). Those in
# PARAMS are canonical values: a graded release with a course seed draws others for each student
# (gpulab.course.variants). The rest are the same for everyone (FIXED says why).
IN_SHAPE, OUT_FEATURES = (8, 128, 256), 512   # quiz 13: nn.Linear(256, 512), input requires grad, bf16 autocast
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def sci(x: float) -> tuple[str, int]:
    """x to three significant figures: (mantissa, exponent), 1.2145e-9 -> ('1.21', -9). Three, so
    that Quiz 8's figure, copied as the answer to Quiz 7, is within Quiz 7's 1% (issue 29)."""
    mantissa, exponent = f"{x:.3g}".split("e")
    return mantissa, int(exponent)


def logits(vocab_name: str, vocab: int, batch: int, seq: int) -> dict:
    """Quiz 7's setting, and the gradient it gives, rounded as quiz 8 states it."""
    mantissa, exponent = sci(precision.initial_logit_gradient(vocab, batch, seq))
    return {"vocab_name": vocab_name, "vocab": vocab, "b": batch, "s": seq,
            "g": float(f"{mantissa}e{exponent}"), "g_short": f"{mantissa}e{exponent}",
            "g_text": f"{mantissa} × 10{str(exponent).translate(SUPERSCRIPT)}"}


VOCABS = (("GPT-2", 50257), ("Llama-2", 32000), ("Llama-3", 128256))   # published tokenizers
PARAMS = {
    "logits": Param(logits("GPT-2", 50257, 8, 2048), tuple(
        logits(name, vocab, batch, seq) for name, vocab in VOCABS for batch in (4, 8, 16)
        for seq in (1024, 2048, 4096))),
    "model": Param({"n": 7e9, "name": "7B"}, tuple({"n": n * 1e9, "name": f"{n}B"} for n in (1, 3, 7, 13, 34, 70))),
}
QUESTIONS = {
    "ch04-md-17": "### Quiz 7: how small is a logit gradient?\n\n{logits[vocab_name]}'s vocabulary has $V$ = "
                  "{logits[vocab]:,} entries. With micro-batch $b$ = {logits[b]} and sequence $s$ = "
                  "{logits[s]}, at\ninitialisation ($p \\approx 1/V$ everywhere), what is the gradient of "
                  "the mean loss with respect to one\n*wrong* entry's logit?",
    "ch04-md-18": "### Quiz 8: the loss scale that rescues it\n\nTake a gradient of {logits[g_text]}. What is "
                  "the smallest power-of-two loss scale $S$ for which\n$S$ × {logits[g_text]} is at least "
                  "fp16's smallest **normal** number (so it keeps its full 11\nsignificant bits)?",
    "ch04-md-30": "### Quiz 10: model state under Megatron's recipe\n\nHow many **GB** (10⁹ bytes) of model "
                  "state does a {model[name]}-parameter model need with bf16 weights,\nfp32 gradients, fp32 "
                  "master weights and fp32 Adam moments (`mixed_adam_fp32_grads`)?",
    "ch04-md-31": "### Quiz 11: what 16-bit weights save on model state\n\nFor the same {model[name]} model, "
                  "take the ZeRO paper's mixed recipe: 16-bit weights and\ngradients, an fp32 master copy of "
                  "the weights, fp32 Adam moments. How many **GB** of model state does it\nsave compared with "
                  "plain fp32 AdamW (everything fp32, no extra copy)? (Negative if it costs memory.)",
}
# The formats' constants are facts of the formats; 2049 is the first integer fp16 cannot hold;
# quiz 11's answer is 0 for every model (its point); the rest are what experiments measure.
FIXED = {
    "04-bf16-eps": "a constant of the bf16 format",
    "04-bf16-max": "a constant of the bf16 format",
    "04-fp16-subnormal": "a constant of the fp16 format",
    "04-e4m3-max": "a constant of the fp8 e4m3 format",
    "04-fp16-2049": "2049 = 2^11 + 1, the first integer fp16 cannot hold",
    "04-fp16-stall": "the running sum the experiment after it runs",
    "04-scale-after": "GradScaler's defaults and the steps the experiment replays",
    "04-saving-gb": "0 GB for every model size (the quiz's point); its slips vary with the model",
    "04-autocast-state-bytes": "bytes per parameter, the same for every layer; an experiment counts them",
    "04-score-bytes-cuda": "bytes per score, the same for every model (reasoning)",
    "04-autocast-linear-bytes": "the nn.Linear(256, 512) the experiment after it runs",
    "04-wrong-line": "a code-reading item: which line of a given loop is wrong (no numbers)",
    "04-clip-first-norm": "GradScaler's default S = 2^16 and the clip threshold of Quiz 15's loop",
}


def smallest_power_of_two_scale(value: float, target: float) -> float:
    return 2.0 ** math.ceil(math.log2(target / value))


inputs = math.prod(IN_SHAPE)
autocast_per_param = precision.autocast_state_bytes(1)["total"]   # quiz 12: one matmul weight
weight = IN_SHAPE[-1] * OUT_FEATURES


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    VOCAB, BATCH, SEQ = p["logits"]["vocab"], p["logits"]["b"], p["logits"]["s"]   # quizzes 7-8
    N_PARAMS = p["model"]["n"]                                                      # quizzes 10-11

    logit_grad = precision.initial_logit_gradient(VOCAB, BATCH, SEQ)   # p_j / (b·s), p_j ≈ 1/V
    rounded_grad = p["logits"]["g"]             # quiz 8 states the gradient rounded
    scale = smallest_power_of_two_scale(rounded_grad, fp16.smallest_normal)
    short_of_normal = "{}e{}".format(*sci(scale / 2 * rounded_grad))

    def state_gb(recipe: str) -> float:
        return arith.model_state_bytes(N_PARAMS, recipe)["total"] / GB

    return [
        Item("04-bf16-eps", bf16.eps, "", rel_tol=1e-6, mistakes=(
            Mistake(bf16.eps / 2, "that is half of epsilon (the unit roundoff, the largest relative "
                                  "rounding error); epsilon is the whole gap from 1 to the next number."),
            Mistake(fp16.eps, "that is fp16's epsilon (10 mantissa bits); bf16 keeps 7."),
            Mistake(fp32.eps, "that is fp32's epsilon (23 mantissa bits); bf16 keeps 7."),
        )),
        # 1e-3 accepts the summary's 3.39e38 and rejects 2^128 = 3.40e38 (0.4% off).
        Item("04-bf16-max", bf16.max, "", rel_tol=1e-3, mistakes=(
            Mistake(2.0 ** 128, "that is 2^128, about fp32's largest number; bf16's largest mantissa "
                                "is 1.1111111 in binary, 2 − 2^-7, not 2: (2 − 2^-7)·2^127."),
            Mistake(fp16.max, "that is fp16's largest number; bf16 has fp32's 8 exponent bits."),
            Mistake(2.0 ** 127, "2^127 is the largest power of two; the mantissa adds almost a factor "
                                "2: (2 − 2^-7)·2^127."),
        )),
        # 1% accepts the summary's 6.0e-8 (0.66% off) and 5.96e-8; the mistakes are 2x or more away.
        Item("04-fp16-subnormal", fp16.smallest_subnormal, "", rel_tol=0.01, mistakes=(
            Mistake(fp16.smallest_normal, "that is the smallest *normal* fp16 number, 2^-14; "
                                          "subnormals go 10 mantissa bits lower."),
            Mistake(fp16.eps, "that is epsilon, the gap at 1, not the smallest positive number."),
            Mistake(fp16.smallest_subnormal / 2, "one power of two too small: the smallest subnormal "
                                                 "is 2^(1 − bias − m) = 2^(1 − 15 − 10)."),
        )),
        Item("04-fp16-2049", precision.round_to(2049, "fp16"), "", mistakes=(
            Mistake(2049, "2049 = 2^11 + 1 needs 11 bits after the binary point; fp16 has 10, so "
                          "between 2048 and 4096 only even numbers exist."),
            Mistake(2050, "2049 is exactly halfway between 2048 and 2050: a tie rounds to the even "
                          "mantissa, which is 2048's."),
        )),
        Item("04-fp16-stall", precision.stall_point(2.0 ** -10, "fp16"), "", mistakes=(
            Mistake(1.0, "at 1 the gap between fp16 numbers is 2^-10, exactly the step, so the sum "
                         "still moves; the gap doubles at 2."),
            Mistake(4.0, "at 2 the gap is 2^-9: the step is exactly half a gap, and the tie rounds to "
                         "even, back to 2."),
            Mistake(fp16.max, "precision runs out long before range: the sum stops when the step is "
                              "half the gap at the sum."),
        )),
        Item("04-e4m3-max", e4m3.max, "", mistakes=(
            Mistake(240, "that reserves the top exponent for inf/NaN as IEEE formats do; e4m3 (\"fn\", "
                         "finite) uses it and reserves only mantissa 111: 1.75 · 2^8."),
            Mistake(480, "mantissa 111 with the top exponent is NaN in e4m3; the largest is 1.110 "
                         "in binary: 1.75 · 2^8."),
            Mistake(57344, "that is e5m2's largest number (5 exponent bits); e4m3 has 4."),
        )),
        Item("04-logit-grad", logit_grad, "", rel_tol=0.01, mistakes=(
            Mistake(1 / VOCAB, "that is the probability p_j; the loss is a mean over b·s tokens, so "
                               "each token's gradient is divided by b·s too."),
            Mistake(1 / (BATCH * SEQ), "that is 1/(b·s); multiply by the probability p_j ≈ 1/V of "
                                       "the wrong token."),
        )),
        Item("04-scale-to-normal", smallest_power_of_two_scale(rounded_grad, fp16.smallest_normal), "",
             mistakes=(
            Mistake(smallest_power_of_two_scale(rounded_grad, fp16.smallest_subnormal),
                    "that reaches the smallest *subnormal* (2^-24), where one bit of precision is "
                    "left; the question asks for the smallest normal number, 2^-14."),
            Mistake(smallest_power_of_two_scale(rounded_grad, fp16.smallest_normal) / 2,
                    f"one power of two too small: 2^{int(math.log2(scale)) - 1} · {p['logits']['g_short']} ≈ "
                    f"{short_of_normal} is still below 2^-14 ≈ 6.1e-5."),
            Mistake(fp16.smallest_normal / rounded_grad, "that scale is not a power of two; "
                                                         "round up to the next power of two."),
        )),
        Item("04-scale-after", precision.loss_scale_after([True] * 3 + [False] * 5000)[0], "", mistakes=(
            Mistake(2.0 ** 16 / 8, "that backs off three times but forgets the growth: every 2000 "
                                   "clean steps in a row double the scale."),
            Mistake(2.0 ** 16 / 8 * 2, "5000 clean steps hold two full runs of 2000, so the scale "
                                       "doubles twice."),
            Mistake(2.0 ** 16 * 4, "an overflow halves the scale (backoff 0.5) before the clean "
                                   "steps start."),
        )),
        Item("04-state-gb", state_gb("mixed_adam_fp32_grads"), "GB", rel_tol=0.01, mistakes=(
            Mistake(state_gb("mixed_adam"), "that is 16 bytes per parameter (16-bit gradients); this "
                                            "recipe keeps fp32 gradients: 2 + 4 + 12 = 18."),
            Mistake(N_PARAMS * 2 / GB, "that is only the bf16 weights; add gradients, master "
                                       "weights and Adam's two moments."),
        )),
        # Quiz 11 names the tensors and their dtypes, not the byte counts: the learner adds them up.
        Item("04-saving-gb", state_gb("fp32_adam") - state_gb("mixed_adam"), "GB", abs_tol=0.05, mistakes=(
            Mistake(state_gb("fp32_adam") / 2, "mixed precision does not halve the model state: "
                                               "the optimizer keeps fp32 master weights and moments."),
            Mistake(N_PARAMS * 4 / GB, "you halved the weights and the gradients (4 bytes saved) "
                                       "but forgot the fp32 master copy (4 bytes added)."),
            Mistake(state_gb("fp32_adam") - state_gb("mixed_adam_fp32_grads"),
                    "that is quiz 10's recipe, with fp32 gradients (it costs 2 bytes more per "
                    "parameter); this one keeps 16-bit gradients."),
        )),
        Item("04-autocast-state-bytes", autocast_per_param, "bytes", mistakes=(
            Mistake(arith.model_state_bytes(1, "mixed_adam")["total"],
                    "16 is the 16-bit-weights recipe (2 + 2 + 12), or autocast without its 16-bit copy "
                    "(4 + 4 + 8). Autocast keeps the fp32 weight (it is the master weight), an fp32 "
                    "gradient, Adam's fp32 m and v, and makes a 16-bit copy for the matmul that "
                    "autograd keeps until backward."),
            Mistake(4 + 8 + 2, "the gradient of an fp32 parameter is fp32: the cast's backward casts "
                               "the 16-bit gradient up, 4 bytes, not 0 or 2."),
            # 20 is also 18 + the bf16 gradient of the copy, which the question leaves out.
            Mistake(4 + 4 + 4 + 8, "if you counted a separate fp32 master copy: autocast has none, "
                                   "the fp32 parameter itself is what the optimizer updates. If you "
                                   "counted the bf16 gradient of the 16-bit copy: the question leaves "
                                   "it out (it lives only until the cast's backward writes the fp32 "
                                   ".grad)."),
            Mistake(4 + 4 + 4 + 8 + 2, "autocast has no separate fp32 master copy: the fp32 "
                                       "parameter itself is what the optimizer updates."),
        )),
        Item("04-score-bytes-cuda", precision.autocast_bytes_per_score("cuda"), "bytes", mistakes=(
            Mistake(precision.autocast_bytes_per_score("cpu"),
                    "that is the CPU (softmax runs in bf16 there). On CUDA softmax is on autocast's "
                    "float32 list: it saves an fp32 output, and att @ v saves its own bf16 copy."),
            Mistake(4, "that is softmax's fp32 output alone; att @ v is a matmul, so autocast casts "
                       "the probabilities back to bf16 and autograd saves that copy too (2 bytes)."),
            Mistake(8, "att @ v runs in bf16 (matmuls are on the 16-bit list): the copy it saves is "
                       "2 bytes, not 4."),
        )),
        Item("04-autocast-linear-bytes", 2 * inputs + 2 * weight, "bytes", mistakes=(
            Mistake(2 * inputs, "that is only the input; backward also needs the weight to compute the "
                                "input's gradient, and autocast saves its bf16 copy."),
            Mistake(4 * inputs + 4 * weight, "that is what fp32 saves; under autocast the saved "
                                             "tensors are the bf16 copies."),
            Mistake(2 * inputs + 2 * weight + 4 * inputs, "the fp32 input is not saved, only its "
                                                          "bf16 copy."),
        )),
        # Quiz 15 (code reading): clip_grad_norm_ before unscale_ measures the scaled gradients.
        Item("04-wrong-line", "d", "", choices=tuple("abcdefg"), mistakes=(
            Mistake("a", "running the forward (and only the forward) under autocast is right: the "
                         "backward ops use the dtypes autocast chose for the forward ones."),
            Mistake("b", "the loss computed inside autocast is fine: cross-entropy is on autocast's "
                         "fp32 list, so the loss itself is fp32."),
            Mistake("c", "scaling the loss before backward is right: it lifts fp16's small gradients "
                         "into range (Quiz 8). What comes after it sees gradients that are still × S."),
            Mistake("e", "scaler.step(optimizer) is the right call: it unscales (when unscale_ has not "
                         "run), skips inf/NaN and steps. But an earlier line has already used the "
                         "scaled gradients by then."),
            Mistake("f", "update() after step() is right: it halves or doubles S for the next step "
                         "(Quiz 9)."),
            Mistake("g", "zeroing the gradients after the step is right: before the next backward "
                         "is what matters."),
        )),
        # Quiz 16: clipped to norm 1 while × S, then ÷ S: 1/S.
        Item("04-clip-first-norm", 1.0 / 2**16, "", rel_tol=0.01, mistakes=(
            Mistake(1.0, "that is what the right order gives (unscale_, then clip to 1). Here the clip "
                         "ran first, on gradients × S, and scaler.step divided by S afterwards."),
            Mistake(4.0, "the clip does act: it sees the scaled norm, 4 × 2^16, far above 1.0."),
            Mistake(4.0 * 2**16, "that is the norm the clip saw; it scales the gradients down to 1.0, "
                                 "and scaler.step then divides them by S."),
            Mistake(4.0 / 2**16, "that would be an unclipped gradient divided by S twice; the clip "
                                 "cuts the scaled norm to 1.0, and S divides once."),
            Mistake(2.0**16, "scaler.step unscales before stepping: the optimizer never sees a "
                             "gradient × S."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
