"""Answer key for chapter 02, VRAM arithmetic. Instructor side: never copied into a release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
import torch

from gpulab import arith
from gpulab.arith import GB, GiB, MiB
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical
from gpulab.models import GPT, GPTConfig

# The numbers stated in the questions (solutions/02_vram_arithmetic, "Quiz" sections). Those in
# PARAMS are canonical values: a graded release with a course seed draws others for each student
# (gpulab.course.variants). The rest are the same for everyone (FIXED says why).
LLAMA2_7B = 6_738_415_616                       # parameters of Llama-2-7B
H, A, LAYERS = 4096, 32, 32                     # a Llama-2-7B-sized layer, 16-bit, with dropout
COURSE_GPT = GPTConfig(vocab_size=1000, block_size=128, n_layer=4, n_head=4, n_embd=256)
# Section 7: fp32 AdamW, predicted at batch 8 and 16. 145 MiB puts the answer, 9, 4.2% under the
# budget and batch 10 3.2% over it: more than the prediction's error (0.1% on a CPU, 1% on a GPU).
SEQ, BUDGET = 128, 145 * MiB

PARAMS = {
    "free_gib": Param(80, (24, 32, 40, 48, 64, 80)),                   # a card with this free
    "seq": Param(2048, (1024, 2048, 3072, 4096)),                      # the layer's s
    "micro_batch": Param(1, (1, 2, 3, 4)),                             # and b
    # float32 values in one tensor; none a multiple of 128, so the allocator always rounds up
    "alloc_values": Param(1000, (300, 600, 700, 1000, 1500, 2500, 3000, 5000)),
}
QUESTIONS = {
    "ch02-md-09": "### Quiz 4: the largest model one card can train\n\nA GPU has {free_gib} GiB free. "
                  "Ignoring activations and temporaries, how many **parameters** at most can\nit train "
                  "with `mixed_adam`?",
    "ch02-md-11": "### Quiz 5: one Llama-2-7B-sized layer\n\nA layer with $h = 4096$ and $a = 32$ heads, "
                  "sequence length $s = {seq}$, micro-batch $b = {micro_batch}$,\n16-bit activations with "
                  "dropout (the formula above, as written). How many **GiB** does it save\nfor backward?"
                  "\n\n\"Llama-2-7B-sized\" means Llama-2-7B's $h$, $a$ and number of layers, in the "
                  "GPT-style layer the\nformula counts. The sequence length is the quiz's own. Llama's own "
                  "layer differs, as the block\nafter this quiz explains.",
    "ch02-md-35": "### Quiz 13: the allocator's rounding\n\nHow many bytes does the CUDA caching allocator "
                  "count for a `float32` tensor of {alloc_values} values?",
}
# Llama-2-7B is a published model, and Quiz 3's figure is the prediction section 10 measures;
# Quizzes 9-12 are about the course GPT that the chapter's experiments measure (with a budget of
# 145 MiB): other numbers there would set a learner's prediction against another measurement.
FIXED = {
    "02-llama7b-mixed-gb": "Llama-2-7B, a published model (Quizzes 1-3 share it)",
    "02-llama7b-fp32-grads-gb": "Llama-2-7B, a published model (Quizzes 1-3 share it)",
    "02-llama7b-bf16-gb": "Llama-2-7B, a published model; the prediction section 10 measures",
    "02-gpt-params": "the course GPT, which the experiments measure",
    "02-gpt-state-mib": "the course GPT's state, the prediction Experiment 1 measures",
    "02-first-step-gap-mib": "the course GPT's moments, the prediction the experiment after it measures",
    "02-largest-batch": "the 145 MiB budget, the prediction the experiment after it measures",
}


def state_gb(recipe: str) -> float:
    return arith.model_state_bytes(LLAMA2_7B, recipe)["total"] / GB


def largest_batch_inputs() -> tuple[float, float]:
    """The fixed part and the per-sample cost the notebook prints (peak is linear in the batch)."""
    peak_8, peak_16 = (arith.predict_training_memory(COURSE_GPT, b, SEQ, torch.float32, "adamw")["peak"]
                       for b in (8, 16))
    per_sample = (peak_16 - peak_8) / 8
    return peak_8 - 8 * per_sample, per_sample


fixed, per_sample = largest_batch_inputs()
samples_that_fit = (BUDGET - fixed) / per_sample       # 9.57: not a whole batch
largest_batch = int(samples_that_fit)
course_params = GPT.count_params(COURSE_GPT)
h, L, V = COURSE_GPT.n_embd, COURSE_GPT.n_layer, COURSE_GPT.vocab_size
fp32_adamw = arith.model_state_bytes(course_params, "fp32_adam")   # 4 + 4 + 8 bytes per parameter
state_between_steps = fp32_adamw["params"] + fp32_adamw["optimizer"]  # zero_grad freed the grads

def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    FREE_GIB, S, B, ALLOC_VALUES = p["free_gib"], p["seq"], p["micro_batch"], p["alloc_values"]

    def per_layer(**kwargs) -> int:
        return arith.activation_bytes_per_layer(S, B, H, A, **kwargs)

    return [
        Item("02-llama7b-mixed-gb", state_gb("mixed_adam"), "GB", rel_tol=0.005, mistakes=(
            Mistake(LLAMA2_7B * 2 / GB, "that is only the bf16 weights. Add the gradients (2 bytes) and "
                                        "the optimizer's fp32 master weights and two moments (12 bytes)."),
            Mistake(state_gb("mixed_adam_fp32_grads"), "18 bytes per parameter is the fp32-gradient "
                    "recipe (Megatron-LM); mixed_adam keeps gradients in 2 bytes: 2 + 2 + 12."),
            Mistake(LLAMA2_7B * 12 / GB, "that is only the optimizer state (12 bytes); add the weights "
                                         "and gradients, 2 bytes each."),
        )),
        Item("02-llama7b-fp32-grads-gb", state_gb("mixed_adam_fp32_grads"), "GB", rel_tol=0.005, mistakes=(
            Mistake(state_gb("mixed_adam"), "that is mixed_adam (16 bytes); this recipe keeps the "
                                            "gradients in fp32: 2 + 4 + 12 = 18 bytes per parameter."),
            Mistake(LLAMA2_7B * 20 / GB, "20 bytes adds a separate fp32 accumulation buffer; this recipe "
                                         "keeps the fp32 gradients themselves: 2 + 4 + 12."),
        )),
        Item("02-llama7b-bf16-gb", state_gb("bf16_adam"), "GB", rel_tol=0.005, mistakes=(
            Mistake(state_gb("mixed_adam"), "pure bf16 has no fp32 master copy and keeps both moments "
                                            "in bf16: 2 + 2 + 2 + 2 = 8 bytes per parameter."),
            Mistake(LLAMA2_7B * 10 / GB, "10 bytes (bf16 weights, fp32 moments, no gradients) is How to "
                                         "Scale Your Model's count; here everything is bf16 and "
                                         "gradients count: 2 + 2 + 2 + 2."),
        )),
        Item("02-max-params", FREE_GIB * GiB / arith.model_state_bytes(1, "mixed_adam")["total"],
             "parameters", rel_tol=0.005, mistakes=(
            Mistake(FREE_GIB * GB / 16, f"you read {FREE_GIB} GiB as {FREE_GIB} × 10^9 bytes; a GiB is 2^30 bytes."),
            Mistake(FREE_GIB * GiB / 2, "that counts only the 2-byte weights; mixed_adam needs 16 "
                                        "bytes per parameter."),
            Mistake(FREE_GIB * GiB / 18, "18 bytes per parameter is the fp32-gradient recipe; "
                                         "mixed_adam is 16."),
        )),
        Item("02-act-layer-gib", per_layer() / GiB, "GiB", rel_tol=0.005, mistakes=(
            Mistake(per_layer(recompute="selective") / GiB,
                    f"you left out the attention scores' term 5as/h: here it is {5 * A * S // H}, more than the 34."),
            Mistake(per_layer() / GB, "you divided by 10^9 (GB); the question asks for GiB (2^30)."),
        )),
        Item("02-act-model-gib", LAYERS * per_layer() / GiB, "GiB", rel_tol=0.005, mistakes=(
            Mistake(per_layer() / GiB, "that is one layer; the model has 32."),
            Mistake(LAYERS * per_layer(recompute="selective") / GiB,
                    "you left out the attention scores' term 5as/h in every layer."),
        )),
        Item("02-act-selective-gib", per_layer(recompute="selective") / GiB, "GiB", rel_tol=0.005, mistakes=(
            Mistake(per_layer() / GiB, "that is without recomputation; selective recomputation drops "
                                       "the 5as/h scores term and keeps 34·s·b·h."),
            Mistake(per_layer(recompute="full") / GiB, "that is full recomputation (the layer input "
                                                       "only); selective keeps 34·s·b·h."),
        )),
        Item("02-act-full-mib", per_layer(recompute="full") / MiB, "MiB", rel_tol=0.005, mistakes=(
            Mistake(S * B * H / MiB, "that counts values; each 16-bit value is 2 bytes."),
            Mistake(per_layer(recompute="selective") / MiB,
                    "that is selective recomputation; full recomputation keeps only the layer input, 2·s·b·h."),
        )),
        Item("02-gpt-params", course_params, "parameters", mistakes=(
            Mistake(course_params - V * h, "you tied the head to the token embedding; this GPT's head "
                                           "has its own V·h weights."),
            # Every bias and LayerNorm weight left out: 13h per block and the final LayerNorm's 2h.
            Mistake(course_params - L * 13 * h - 2 * h, "you left out the biases and LayerNorm weights: "
                                                        "13h per block and the final LayerNorm's 2h."),
            Mistake(12 * L * h * h, "that is 12·L·h² alone; add the embeddings (V·h + T·h), the head "
                                    "(V·h), the biases and LayerNorms (13h per block, 2h final)."),
        )),
        Item("02-gpt-state-mib", state_between_steps / MiB, "MiB", rel_tol=0.005, mistakes=(
            Mistake(fp32_adamw["total"] / MiB, "that includes the gradients; zero_grad(set_to_none=True) "
                                               "frees them between steps: weights and two moments only."),
            Mistake(fp32_adamw["params"] / MiB, "that is the weights alone; add AdamW's two fp32 "
                                                "moments, 4 bytes each per parameter."),
            Mistake(fp32_adamw["optimizer"] / MiB, "that is AdamW's two moments alone; add the fp32 "
                                                   "weights."),
        )),
        # Quiz 11 (reasoning): the second step's backward starts with AdamW's moments alive; the
        # first's does not (they are created inside the first step()). Everything else is the same.
        Item("02-first-step-gap-mib", fp32_adamw["optimizer"] / MiB, "MiB", rel_tol=0.01, mistakes=(
            Mistake(fp32_adamw["params"] / MiB, "that is one parameter-sized tensor. AdamW creates two "
                                                "moments per parameter (m and v), 4 bytes each."),
            Mistake(state_between_steps / MiB, "the weights are alive in both steps; only AdamW's "
                                               "moments are missing from the first step's backward."),
            Mistake(fp32_adamw["total"] / MiB, "the weights are alive in both steps, and at the start "
                                               "of backward no gradient exists yet in either; only "
                                               "AdamW's two moments differ."),
        )),
        Item("02-largest-batch", largest_batch, "samples", mistakes=(
            Mistake(samples_that_fit, "that is how many samples' worth of memory the budget holds, "
                                      "a fraction; a batch holds whole samples, so take the floor."),
            Mistake(largest_batch + 1, "rounded up: that batch does not fit. Take the floor."),
            Mistake(int(BUDGET // per_sample), "you forgot the fixed part (weights, AdamW moments, "
                                               "buffers): subtract it from the budget first."),
        )),
        Item("02-alloc-rounding", arith.allocator_bytes(ALLOC_VALUES * 4), "bytes", mistakes=(
            Mistake(ALLOC_VALUES * 4, "that is what was asked for; the caching allocator rounds every "
                                      "block up to a multiple of 512 bytes."),
            Mistake(ALLOC_VALUES * 4 * 8, "8x too large: you counted bits."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
