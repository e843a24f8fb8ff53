"""Answer key for chapter 05, checkpointing and accumulation. Instructor side: never released.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
import torch

from gpulab import arith
from gpulab.arith import MiB
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical
from gpulab.models import GPTConfig

# The numbers stated in the questions (solutions/05_checkpointing_accumulation, "Quiz" sections).
# Those in PARAMS are canonical values: a graded release with a course seed draws others for each
# student (gpulab.course.variants). The rest are the same for everyone (FIXED says why).
H, A = 4096, 32                                        # Quiz 1: a 16-bit model's width and heads
COURSE_GPT = GPTConfig(vocab_size=1000, block_size=128, n_layer=4, n_head=4, n_embd=256)
BUDGET, SEQ = 140 * MiB, 128                           # Quiz 10: fp32 AdamW, accumulating, every block


def count(n: float, text: str, name: str = "") -> dict:
    return {"n": n, "text": text, "name": name}


PARAMS = {
    "layers": Param(32, (24, 32, 40, 48, 60, 80)),                     # Quiz 1
    "seq": Param(2048, (1024, 1536, 2048, 3072, 4096)),                # Quizzes 1 and 6
    "micro_batch": Param(1, (1, 2, 4)),
    "model": Param(count(7e9, "7 × 10⁹", "7B"), (                       # Quizzes 2-3
        count(1e9, "1 × 10⁹", "1B"), count(3e9, "3 × 10⁹", "3B"), count(7e9, "7 × 10⁹", "7B"),
        count(13e9, "13 × 10⁹", "13B"), count(70e9, "70 × 10⁹", "70B"))),
    "tokens": Param(count(1e9, "10⁹"), (count(1e9, "10⁹"), count(2e9, "2 × 10⁹"), count(5e9, "5 × 10⁹"))),
    "blocks": Param(36, (16, 36, 64, 100, 144)),                       # Quiz 5: √L whole, L/2 even
    "global_micro": Param(4, (2, 4, 8)),                               # Quiz 7
    "global_accum": Param(8, (2, 4, 6, 8)),                            # never a GPU count below
    "global_gpus": Param(16, (16, 24, 32, 64)),
    "target_batch": Param(1024, (512, 1024, 2048, 4096)),              # Quiz 8: 2 steps or more
    "target_gpus": Param(8, (4, 8, 16)),
    "target_micro": Param(8, (4, 8, 16)),
    # Quiz 10: with the micro-batches that fit (25 checkpointed, 7 not), 2-8 steps, all different
    "one_gpu_batch": Param(64, (48, 60, 64, 120, 128, 150)),
}
QUESTIONS = {
    'ch05-md-04': '### Quiz 1: what full recomputation keeps\n\nA {layers}-layer model with hidden '
                  'size $h = 4096$, sequence length $s = {seq}$ and micro-batch $b = '
                  '{micro_batch}$\nstores 16-bit activations. It uses full recomputation: every '
                  'layer is checkpointed. How many\n**MiB** of layer activations does forward keep '
                  'for backward, in total over the {layers} layers?',
    'ch05-md-05': '### Quiz 2: what it costs in FLOPs\n\nYou train a {model[name]}-parameter model '
                  '($N$ = {model[text]}) on $D$ = {tokens[text]} tokens with full recomputation. '
                  'How\nmany training FLOPs does that take, by the rule above?',
    'ch05-md-07': "### Quiz 5: the best segment size, in Chen et al.'s model\n\nA network has $L = "
                  "{blocks}$ layers, cut into segments of $c$ layers. In Chen et al.'s model, "
                  "memory is\nabout $L/c + c$ units. One unit is a segment's input or one layer's "
                  'rebuilt activations, taken as\nequal. Which segment size **$c$** minimises it?',
    'ch05-md-k2': "### Quiz 6: when do segments of two blocks win?\n\nTake Quiz 1's model ($h = "
                  '4096$, $s = {seq}$, $b = {micro_batch}$, 16-bit) and give it $a = 32$ '
                  'attention\nheads. This time it does *not* use fused attention, so each block '
                  'stores its $s \\times s$ scores.\nA block then keeps $A = sbh\\,(34 + 5as/h)$ '
                  'bytes, and its input is $S = 2sbh$ bytes. With\n$M(c) = (L/c)\\,S + c\\,A$, at '
                  'what depth **$L$** do segments of 2 blocks keep exactly as much as\nsegments of '
                  '1? (Deeper than that, $c = 2$ keeps less.)',
    'ch05-md-12': '### Quiz 7: the global batch\n\nMicro-batch {global_micro}, {global_accum} '
                  'accumulation steps, {global_gpus} data-parallel GPUs. What is the global batch?',
    'ch05-md-13': '### Quiz 8: how many accumulation steps?\n\nYou want a global batch of '
                  '{target_batch} sequences. Each of {target_gpus} GPUs fits a micro-batch of '
                  '{target_micro}. How many\naccumulation steps?',
    'ch05-md-20': '### Quiz 10: from the budget to the accumulation steps\n\nUse the largest '
                  'micro-batch printed above for `checkpointing=True`. You want a global batch '
                  'of\nexactly {one_gpu_batch} on one GPU, so the micro-batch must divide '
                  '{one_gpu_batch}: take the largest divisor of {one_gpu_batch} that\nfits. How '
                  'many accumulation steps does that give?',
}
# The same for everyone: Quiz 3's answer (2/6) holds for every N and D, Quiz 4's (2/9) for every
# width, and with Quiz 9's they are predictions an experiment measures (the recomputation's FLOPs
# and step time; 4 micro-batches' gradients). Quiz 11 reads a loop printed in the question.
FIXED = {
    "05-recompute-overhead": "2/6 whatever N and D; the step-time experiment measures it",
    "05-early-stop-overhead": "2/9 for any width: the block's shape sets it; Experiment 1 counts it",
    "05-loss-factor": "the 4 micro-batches whose gradients the experiment accumulates",
    "05-wrong-line": "a reading of the loop the question prints; the ranks' run measures it",
}
# Quiz 11's loop, line by line: what each line does, for the learner who picks a right one.
LOOP_LINES = {
    1: "line 1 counts this rank's valid tokens (padding is -100), as the rule asks.",
    2: "line 2 is right: every rank must divide by the valid tokens of the whole global batch, "
       "so the count is summed over the ranks.",
    3: "line 3 only walks through the micro-batches.",
    4: "line 4 marks the last micro-batch, the one whose backward should all-reduce.",
    5: "line 5 is right: no_sync() on every micro-batch but the last, so DDP all-reduces once per "
       "optimizer step, after the gradients are summed.",
    6: "line 6 only runs the model (its logits, no loss).",
    7: "line 7 is right: a sum over the valid tokens (F.cross_entropy skips -100 by default), "
       "which line 8 divides by the global count, weighs every token the same.",
    9: "stepping once, after the loop, is right: one optimizer step per global batch.",
    10: "clearing the gradients after the step is right: the next step accumulates from zero.",
}


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    L, S, B = p["layers"], p["seq"], p["micro_batch"]
    N, D = p["model"]["n"], p["tokens"]["n"]
    BLOCKS, TARGET = p["blocks"], p["one_gpu_batch"]
    micro, accum, gpus = p["global_micro"], p["global_accum"], p["global_gpus"]
    wanted, wanted_gpus, wanted_micro = p["target_batch"], p["target_gpus"], p["target_micro"]

    SQRT = arith.sqrt_segment_size(BLOCKS)
    full_layer = arith.activation_bytes_per_layer(S, B, H, A, recompute="full")
    selective_layer = arith.activation_bytes_per_layer(S, B, H, A, recompute="selective")
    stored_layer = arith.activation_bytes_per_layer(S, B, H, A)           # scores stored: 34 + 5as/h
    plain, recomputed = arith.training_flops(N, D), arith.training_flops(N, D, recompute=True)
    # Quiz 4: a model that is all blocks; early stop skips each block's MLP output projection,
    # 4h² of 12h² weights: 2·8h² FLOPs recomputed per token against 6·12h² (h cancels; the same
    # 2/9 as arith.recompute_flops_per_token over 3·arith.block_forward_flops_per_token, s = 0).
    EARLY_STOP = 2 * (12 - 4) / (6 * 12)

    def k2_crossing(block_bytes: float, input_bytes: float = full_layer) -> float:
        """Depth L at which segments of 2 blocks keep as much as segments of 1 (Quiz 6):
        arith.segment_activation_bytes equal for c = 1 and 2, L·S + A = (L/2)·S + 2A, so L = 2A/S."""
        return 2 * block_bytes / input_bytes

    def accumulation_for_target(checkpointing) -> int:
        largest = arith.largest_micro_batch(BUDGET, COURSE_GPT, SEQ, torch.float32, "adamw",
                                            checkpointing=checkpointing, accumulating=True)
        micro = max(m for m in range(1, largest + 1) if TARGET % m == 0)
        return TARGET // micro

    return [
        Item("05-full-recompute-mib", L * full_layer / MiB, "MiB", rel_tol=0.005, mistakes=(
            Mistake(full_layer / MiB, f"that is one layer; the model has {L}."),
            Mistake(L * S * B * H / MiB, "that counts values; each 16-bit value is 2 bytes."),
            Mistake(L * selective_layer / MiB, "that is selective recomputation (34·s·b·h per layer); "
                                               "full recomputation keeps only each layer's input, 2·s·b·h."),
        )),
        Item("05-recompute-flops", recomputed, "FLOPs", rel_tol=0.01, mistakes=(
            Mistake(plain, "that is 6·N·D, without recomputation; the recomputed forward adds 2·N·D."),
            Mistake(plain + 6 * N * D, "recomputation repeats the forward (2·N·D), not the whole step."),
        )),
        Item("05-recompute-overhead", recomputed / plain - 1, "", rel_tol=0.01, mistakes=(
            Mistake(2 / 8, "2/8 is the extra forward's share of the new total; compared with the 6 "
                           "FLOPs per parameter-token without recomputation it is 2/6."),
            Mistake(100 * (recomputed / plain - 1), "that is a percentage; give a fraction."),
            Mistake(recomputed / plain, "that is the ratio (8/6); the increase is the ratio minus 1."),
        )),
        Item("05-early-stop-overhead", EARLY_STOP, "", rel_tol=0.01, mistakes=(
            Mistake(1 / 3, "that is the textbook rule, a whole forward again (8N against 6N); "
                           "early stop never recomputes the MLP's output projection, 4h² of each "
                           "block's 12h²."),
            Mistake(EARLY_STOP / 2, "that counts each recomputed weight once; a forward costs 2 "
                                    "FLOPs per weight per token, the step 6: 2·8h² against 6·12h²."),
            Mistake(16 / 88, "that is the recomputation's share of the new total; the increase is "
                             "measured against the step without checkpointing, 6·12h² per token."),
            Mistake(1 + EARLY_STOP, "that is the ratio of the two; the increase is the ratio minus 1."),
            Mistake(100 * EARLY_STOP, "that is a percentage; give a fraction."),
        )),
        Item("05-sqrt-segment", SQRT, "blocks", mistakes=(
            Mistake(BLOCKS, f"one segment of all {BLOCKS} blocks keeps 1 input but rebuilds {BLOCKS} "
                            f"blocks at once: {BLOCKS + 1} units."),
            Mistake(1, f"segments of one block keep all {BLOCKS} inputs: {BLOCKS + 1} units. Balance "
                       "the two terms."),
            Mistake(BLOCKS // 2, f"{BLOCKS // 2} gives 2 + {BLOCKS // 2} = {2 + BLOCKS // 2} units; the "
                                 "sum is smallest where L/c = c."),
            *(Mistake(k, f"c = {k} keeps {BLOCKS}/{k} + {k} = {BLOCKS / k + k:.3g} units; compare it with "
                         "its neighbours: L/c + c is smallest where L/c = c.")
              for k in (SQRT - 1, SQRT + 1)),
        )),
        Item("05-k2-layers", k2_crossing(stored_layer), "layers", rel_tol=0.01, mistakes=(
            Mistake(k2_crossing(selective_layer), "that leaves out the attention scores' 5as/h "
                    f"({5 * A * S // H} here): it holds with fused attention, but this model stores "
                    "the scores."),
            Mistake(stored_layer / full_layer, "that is A/S, the block-to-input ratio; segments of 2 "
                    "keep L/2 inputs but rebuild 2 blocks: L·S + A = (L/2)·S + 2A gives L = 2A/S."),
            Mistake(4 * stored_layer / full_layer, "that is where the continuous optimum √(L·S/A) "
                    "reaches 2; whole segments of 2 already beat segments of 1 where the two "
                    "memories are equal: L·S + A = (L/2)·S + 2A."),
            Mistake(selective_layer / full_layer, "that is A/S without the attention scores; set "
                    "L·S + A = (L/2)·S + 2A with A = s·b·h·(34 + 5as/h)."),
        )),
        Item("05-global-batch", arith.global_batch(micro, accum, gpus), "sequences", mistakes=(
            Mistake(micro * accum, f"multiply by the {gpus} data-parallel GPUs too: each runs its own "
                                   "micro-batches."),
            Mistake(micro * gpus, f"multiply by the {accum} accumulation steps too."),
        )),
        Item("05-accum-steps", arith.accumulation_steps(wanted, wanted_micro, wanted_gpus), "steps", mistakes=(
            Mistake(wanted // wanted_micro, f"each accumulation step processes {wanted_micro} sequences "
                                            f"on each of {wanted_gpus} GPUs: divide by both."),
        )),
        Item("05-loss-factor", 1 / 4, "", mistakes=(
            Mistake(4, "divide, do not multiply: each micro-batch's mean loss times 1/k."),
            Mistake(1, "without scaling, the accumulated gradient is the sum of 4 means: 4x too large."),
        )),
        Item("05-accum-for-64", accumulation_for_target(True), "steps", mistakes=(
            Mistake(accumulation_for_target(False), "that uses the micro-batch that fits without "
                                                    "checkpointing; this question uses checkpointing=True."),
        )),
        Item("05-wrong-line", 8, "", mistakes=tuple(
            Mistake(line, says) for line, says in LOOP_LINES.items())),
    ]


ITEMS = items(canonical(PARAMS))
