"""Answer key for chapter 03, throughput arithmetic. Instructor side: never copied into a release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
import math

from gpulab import arith, hardware
from gpulab.checks import Item, Mistake
from gpulab.models import GPT, GPTConfig

# The numbers stated in the questions (solutions/03_throughput, "Quiz" sections).
TOKENS, WIDTH, MLP_WIDTH = 2048, 4096, 11008          # a Llama-2-7B MLP up-projection
COURSE_GPT = GPTConfig(vocab_size=1000, block_size=128, n_layer=4, n_head=4, n_embd=256)
LLAMA_N, LLAMA_D = 6.74e9, 2e12                        # Llama-2-7B and its training tokens
TOKENS_PER_GPU_S, GPUS, RUN_MFU = 10_000, 1024, 0.40
H100 = hardware.GPUS["H100-SXM5-80GB"]
PEAK, BANDWIDTH = 989.4e12, 3.35e12                    # as stated: dense bf16, HBM3
SKINNY = (32, 8192, 8192)                              # [32, 8192] x [8192, 8192], bf16
ADD_ELEMENTS = 1e9                                     # z = x + y, bf16

matmul = arith.matmul_flops(TOKENS, WIDTH, MLP_WIDTH)
n_all = GPT.count_params(COURSE_GPT)
n_course = n_all - (COURSE_GPT.vocab_size + COURSE_GPT.block_size) * COURSE_GPT.n_embd  # no lookups
per_token = arith.training_flops(n_course, 1, n_layer=4, hidden=256, seq_len=128)
run_flops = arith.training_flops(LLAMA_N, LLAMA_D)
skinny_flops, skinny_bytes = arith.matmul_flops(*SKINNY), arith.matmul_bytes(*SKINNY, 2)
rows, depth, width = SKINNY
weights_bytes = 2 * depth * width                       # the [8192, 8192] weight alone
two_tensor_bytes = 2 * (rows * depth + depth * width)   # input and weight, output left out
add_bytes = 3 * ADD_ELEMENTS * 2                        # read x, read y, write z


def rows_to_compute_bound(peak: float = PEAK, bytes_per_value: int = 2) -> int:
    """Smallest B for which [B, 8192] x [8192, 8192] is compute-bound (arith.bound decides)."""
    return next(b for b in range(1, 100_000)
                if arith.bound(arith.matmul_flops(b, depth, width),
                               arith.matmul_bytes(b, depth, width, bytes_per_value),
                               peak, BANDWIDTH) == "compute")


critical = arith.critical_intensity(PEAK, BANDWIDTH)
rows_unrounded = critical / (1 - critical * (depth + width) / (depth * width))  # exact, before ⌈ ⌉


def days(mfu: float, peak: float = PEAK) -> float:
    return arith.training_days(LLAMA_N, LLAMA_D, GPUS, peak, mfu)


ITEMS = [
    Item("03-matmul-flops", matmul, "FLOPs", rel_tol=0.01, mistakes=(
        Mistake(matmul / 2, "2x too small: each of the k products is a multiply AND an add: 2 FLOPs."),
    )),
    Item("03-linear-train-flops", 3 * matmul, "FLOPs", rel_tol=0.01, mistakes=(
        Mistake(matmul, "that is the forward pass only; backward needs two more matmuls of the "
                        "same size (input and weight gradients): 6·T·P in all."),
        Mistake(2 * matmul, "backward is two matmuls (the input's gradient and the weights'), "
                            "so forward + backward is 3 forward passes, not 2."),
    )),
    Item("03-gpt-flops-per-token", per_token, "FLOPs", rel_tol=0.01, mistakes=(
        Mistake(6 * n_course, "that is 6N alone; add attention's 12·L·h·s per token."),
        Mistake(arith.training_flops(n_all, 1, n_layer=4, hidden=256, seq_len=128),
                "you counted the embedding tables in N; a lookup does no arithmetic."),
        Mistake(2 * n_course + 4 * 4 * 256 * 128, "that is the forward pass only; training is "
                                                   "three times the forward: 6N + 12·L·h·s."),
    )),
    Item("03-train-flops-7b", run_flops, "FLOPs", rel_tol=0.01, mistakes=(
        Mistake(2 * LLAMA_N * LLAMA_D, "that is 2·N·D, the forward pass only; training is 6·N·D."),
        Mistake(8 * LLAMA_N * LLAMA_D, "8·N·D counts a recomputed forward (hardware FLOPs); the "
                                       "question asks for C ≈ 6·N·D."),
    )),
    Item("03-mfu", arith.mfu(TOKENS_PER_GPU_S, 6 * LLAMA_N, PEAK), "", rel_tol=0.01, mistakes=(
        Mistake(arith.mfu(TOKENS_PER_GPU_S, 6 * LLAMA_N, 2 * PEAK),
                "you divided by the with-sparsity peak (1,979 TFLOP/s); MFU uses the dense peak."),
        Mistake(arith.mfu(TOKENS_PER_GPU_S, 2 * LLAMA_N, PEAK),
                "you counted 2N FLOPs per token (forward only); training is 6N."),
        Mistake(100 * arith.mfu(TOKENS_PER_GPU_S, 6 * LLAMA_N, PEAK),
                "that is a percentage; give a fraction (e.g. 0.5 for 50%)."),
    )),
    Item("03-run-days", days(RUN_MFU), "days", rel_tol=0.01, mistakes=(
        Mistake(days(RUN_MFU) * 24, "that is hours; divide by 24 for days."),
        Mistake(days(1.0), "that assumes 100% of the peak; divide by the 40% MFU too."),
        Mistake(days(RUN_MFU) * 86_400, "that is seconds; divide by 86,400 for days."),
    )),
    Item("03-critical-intensity", arith.critical_intensity(PEAK, BANDWIDTH), "FLOPs/byte",
         rel_tol=0.01, mistakes=(
        Mistake(arith.critical_intensity(2 * PEAK, BANDWIDTH),
                "2x too large: that uses the with-sparsity peak; use the dense 989.4 TFLOP/s."),
        Mistake(arith.critical_intensity(BANDWIDTH, PEAK), "upside down: it is peak FLOP/s divided "
                                                           "by bandwidth, FLOPs per byte."),
    )),
    # 0.2%: 31.75 passes to three figures; 32 (0.8% off) and 31.875 (0.4% off) are named slips.
    Item("03-intensity-b32", arith.arithmetic_intensity(skinny_flops, skinny_bytes), "FLOPs/byte",
         rel_tol=0.002, mistakes=(
        Mistake(skinny_flops / weights_bytes, "32 is the ≈ B shortcut, which is also what the "
                "weight's bytes alone give; the question counts all three tensors: the input and "
                "the output ([32, 8192] each) add bytes, so the intensity is a little under 32."),
        Mistake(skinny_flops / two_tensor_bytes, "you counted two of the three tensors: reading "
                "the input and the weight, and writing the [32, 8192] output, all move bytes."),
        Mistake(skinny_flops / (skinny_bytes / 2), "2x too large: you divided by the number of "
                                                   "values; each bf16 value is 2 bytes."),
        Mistake(skinny_flops / (2 * skinny_bytes), "2x too small: bf16 values are 2 bytes each, "
                                                   "not 4."),
    )),
    Item("03-bound-b32", arith.bound(skinny_flops, skinny_bytes, PEAK, BANDWIDTH), "",
         choices=("compute", "memory"), mistakes=(
        Mistake("compute", "its intensity (about 32 FLOPs/byte) is far below the H100's critical "
                           "intensity (about 295): the compute units wait for data."),
    )),
    # 0.2%, as for the intensity: the weights-only 40.07 µs is 0.8% short and a named slip.
    Item("03-roofline-us", arith.roofline_seconds(skinny_flops, skinny_bytes, PEAK, BANDWIDTH) * 1e6,
         "µs", rel_tol=0.002, mistakes=(
        Mistake(skinny_flops / PEAK * 1e6, "that is the compute time alone; the memory time is "
                                           "longer, and the roofline takes the larger of the two."),
        Mistake(weights_bytes / BANDWIDTH * 1e6, "that moves the weight's bytes alone; the input "
                "and the output ([32, 8192] each) must be read and written too."),
        Mistake(two_tensor_bytes / BANDWIDTH * 1e6, "you left one tensor out: read the input and "
                "the weight, and write the output."),
    )),
    Item("03-rows-compute-bound", rows_to_compute_bound(), "rows", mistakes=(
        Mistake(296, "that is the ≈ B shortcut (B ≥ 295.3); the exact intensity "
                     "2BDF / (2(BD + DF + BF)) stays below B, so a few more rows are needed."),
        Mistake(295, "that is the ≈ B shortcut, rounded down; solve the exact intensity "
                     "2BDF / (2(BD + DF + BF)) ≥ peak / bandwidth for B."),
        Mistake(math.floor(rows_unrounded), "rows come whole, and that many fall just short of "
                                            "the critical intensity: round up."),
        Mistake(rows_unrounded, "rows come whole: take the smallest whole number at least this."),
        # Twice the peak and twice the bytes per value both double the rows needed.
        Mistake(rows_to_compute_bound(peak=2 * PEAK), "about twice too many: did you use the "
                "with-sparsity peak (1,979 TFLOP/s) or 4 bytes per value? Use the dense 989.4 "
                "TFLOP/s and 2-byte bf16 values."),
        Mistake(rows_to_compute_bound(bytes_per_value=1), "you counted values, not bytes: each "
                                                          "bf16 value is 2 bytes."),
    )),
    Item("03-add-ms", add_bytes / BANDWIDTH * 1e3, "ms", rel_tol=0.01, mistakes=(
        Mistake(2 * ADD_ELEMENTS * 2 / BANDWIDTH * 1e3, "you counted the two inputs but not "
                                                        "writing the output: 3 x 10^9 values move."),
        # An add runs on the CUDA cores (in fp32 arithmetic), not on the tensor cores: 66.9 TFLOP/s.
        Mistake(ADD_ELEMENTS / H100.fp32_flops * 1e3, "that is the compute time (10^9 FLOPs on the "
                "CUDA cores); an add does 1 FLOP per 6 bytes moved, far below the critical "
                "intensity, so the memory time decides."),
        Mistake(ADD_ELEMENTS / PEAK * 1e3, "that divides the FLOPs by the tensor-core peak, which "
                "only matrix products use; and compute is not the limit anyway: an add does 1 "
                "FLOP per 6 bytes moved, so the memory time decides."),
    )),
]
