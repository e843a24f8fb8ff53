"""Answer key for chapter 05, checkpointing and accumulation. Instructor side: never released.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
import torch

from gpulab import arith
from gpulab.arith import MiB
from gpulab.checks import Item, Mistake
from gpulab.models import GPTConfig

# The numbers stated in the questions (solutions/05_checkpointing_accumulation, "Quiz" sections).
L, S, B, H, A = 32, 2048, 1, 4096, 32                  # quiz 1: a 32-layer 16-bit model
N, D = 7e9, 1e9                                        # quizzes 2-3
BLOCKS = 36                                            # quiz 4 (quiz 5 reuses quiz 1's model)
COURSE_GPT = GPTConfig(vocab_size=1000, block_size=128, n_layer=4, n_head=4, n_embd=256)
BUDGET, SEQ, TARGET = 140 * MiB, 128, 64               # quiz 9: fp32 AdamW, accumulating, every block

full_layer = arith.activation_bytes_per_layer(S, B, H, A, recompute="full")
selective_layer = arith.activation_bytes_per_layer(S, B, H, A, recompute="selective")
stored_layer = arith.activation_bytes_per_layer(S, B, H, A)           # scores stored: 34 + 5as/h
plain, recomputed = arith.training_flops(N, D), arith.training_flops(N, D, recompute=True)


def k2_crossing(block_bytes: float, input_bytes: float = full_layer) -> float:
    """Depth L at which segments of 2 blocks keep as much as segments of 1 (quiz 5):
    arith.segment_activation_bytes equal for k = 1 and 2, L·S + A = (L/2)·S + 2A, so L = 2A/S."""
    return 2 * block_bytes / input_bytes


def accumulation_for_target(checkpointing) -> int:
    largest = arith.largest_micro_batch(BUDGET, COURSE_GPT, SEQ, torch.float32, "adamw",
                                        checkpointing=checkpointing, accumulating=True)
    micro = max(m for m in range(1, largest + 1) if TARGET % m == 0)
    return TARGET // micro


ITEMS = [
    Item("05-full-recompute-mib", L * full_layer / MiB, "MiB", rel_tol=0.005, mistakes=(
        Mistake(full_layer / MiB, "that is one layer; the model has 32."),
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
    Item("05-sqrt-segment", arith.sqrt_segment_size(BLOCKS), "blocks", mistakes=(
        Mistake(BLOCKS, "one segment of all 36 blocks keeps 1 input but rebuilds 36 blocks at once: "
                        "37 units."),
        Mistake(1, "segments of one block keep all 36 inputs: 37 units. Balance the two terms."),
        Mistake(BLOCKS // 2, "18 gives 2 + 18 = 20 units; the sum is smallest where L/k = k."),
    )),
    Item("05-k2-layers", k2_crossing(stored_layer), "layers", rel_tol=0.01, mistakes=(
        Mistake(k2_crossing(selective_layer), "that leaves out the attention scores' 5as/h "
                "(80 here): it holds with fused attention, but this model stores the scores."),
        Mistake(stored_layer / full_layer, "that is A/S, the block-to-input ratio; segments of 2 "
                "keep L/2 inputs but rebuild 2 blocks: L·S + A = (L/2)·S + 2A gives L = 2A/S."),
        Mistake(4 * stored_layer / full_layer, "that is where the continuous optimum √(L·S/A) "
                "reaches 2; whole segments of 2 already beat segments of 1 where the two "
                "memories are equal: L·S + A = (L/2)·S + 2A."),
        Mistake(selective_layer / full_layer, "that is A/S without the attention scores; set "
                "L·S + A = (L/2)·S + 2A with A = s·b·h·(34 + 5as/h)."),
    )),
    Item("05-global-batch", arith.global_batch(4, 8, 16), "sequences", mistakes=(
        Mistake(4 * 8, "multiply by the 16 data-parallel GPUs too: each runs its own micro-batches."),
        Mistake(4 * 16, "multiply by the 8 accumulation steps too."),
    )),
    Item("05-accum-steps", arith.accumulation_steps(1024, 8, 8), "steps", mistakes=(
        Mistake(1024 // 8, "each accumulation step processes 8 sequences on each of 8 GPUs: "
                           "divide by both."),
    )),
    Item("05-loss-factor", 1 / 4, "", mistakes=(
        Mistake(4, "divide, do not multiply: each micro-batch's mean loss times 1/k."),
        Mistake(1, "without scaling, the accumulated gradient is the sum of 4 means: 4x too large."),
    )),
    Item("05-accum-for-64", accumulation_for_target(True), "steps", mistakes=(
        Mistake(accumulation_for_target(False), "that uses the micro-batch that fits without "
                                                "checkpointing; this question uses checkpointing=True."),
    )),
]
