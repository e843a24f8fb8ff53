"""Answer key for chapter 03, throughput arithmetic. Instructor side: never copied into a release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
import math

from gpulab import arith
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical
from gpulab.device import hardware
from gpulab.models import GPT, GPTConfig

# The numbers the questions state (solutions/03_throughput, "Quiz" sections) are the canonical
# values of PARAMS; a graded release with a course seed draws other values for each student
# (gpulab.course.variants). Records are published models, so that every variant states true facts.
H100 = hardware.GPUS["H100-SXM5-80GB"]
PEAK, BANDWIDTH = 989.4e12, 3.35e12                    # as stated: dense bf16, HBM3
VOCAB, BLOCK, HEADS = 1000, 128, 4                     # the course GPT's fixed sizes
ROWS = 32                                              # the skinny matmul's rows (items say b32)


def mlp(name: str, width: int, mlp_width: int) -> dict:
    return {"name": name, "width": width, "mlp_width": mlp_width}


def course_gpt(n_layer: int, n_embd: int) -> dict:
    """A course GPT's sizes and the parameter counts the question states (computed, not typed)."""
    config = GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=n_layer, n_head=HEADS, n_embd=n_embd)
    n_all = GPT.count_params(config)
    return {"n_layer": n_layer, "n_embd": n_embd, "n_all": n_all,
            "n": n_all - (VOCAB + BLOCK) * n_embd}     # no lookups


def run(name: str, n: float, n_text: str, d: float, d_text: str) -> dict:
    return {"name": name, "n": n, "n_text": n_text, "d": d, "d_text": d_text}


def elements(n: float, text: str, three: str, flops: str) -> dict:
    return {"n": n, "text": text, "three": three, "flops": flops}


PARAMS = {
    # MLP up-projections of published models (their config.json: hidden, intermediate size).
    "layer": Param(mlp("Llama-2-7B", 4096, 11008), (
        mlp("Llama-2-7B", 4096, 11008), mlp("Llama-2-13B", 5120, 13824),
        mlp("Llama-3-8B", 4096, 14336), mlp("Llama-2-70B", 8192, 28672))),
    "tokens": Param(2048, (1024, 1536, 2048, 3072, 4096)),
    "gpt": Param(course_gpt(4, 256), tuple(course_gpt(n_layer, n_embd)
                                           for n_layer in (2, 4, 6, 8) for n_embd in (128, 256, 384, 512))),
    # Published runs of 7-8B models (Touvron et al. 2023a, Table 2; 2023b; Meta's Llama 3 card).
    "run": Param(run("Llama-2-7B", 6.74e9, "6.74 × 10⁹", 2e12, "2 × 10¹²"), (
        run("LLaMA-7B", 6.7e9, "6.7 × 10⁹", 1e12, "1 × 10¹²"),
        run("Llama-2-7B", 6.74e9, "6.74 × 10⁹", 2e12, "2 × 10¹²"),
        run("Llama-3-8B", 8.03e9, "8.03 × 10⁹", 15e12, "1.5 × 10¹³"))),
    "tokens_per_gpu_s": Param(10_000, (7_000, 8_000, 9_000, 10_000, 11_000, 12_000)),
    "gpus": Param(1024, (512, 768, 1024, 1536, 2048)),
    "mfu_pct": Param(40, (30, 35, 40, 45, 50)),
    "depth": Param(8192, (4096, 5120, 6144, 8192, 10240, 12288)),
    "add": Param(elements(1e9, "10⁹", "3 x 10^9", "10^9"), (
        elements(2.5e8, "2.5 × 10⁸", "7.5 x 10^8", "2.5 x 10^8"),
        elements(5e8, "5 × 10⁸", "1.5 x 10^9", "5 x 10^8"),
        elements(1e9, "10⁹", "3 x 10^9", "10^9"),
        elements(2e9, "2 × 10⁹", "6 x 10^9", "2 x 10^9"),
        elements(4e9, "4 × 10⁹", "1.2 x 10^10", "4 x 10^9"))),
}

QUESTIONS = {
    "ch03-md-04": "### Quiz 1: one matmul\n\nThe up-projection of a {layer[name]} MLP multiplies {tokens} "
                  "tokens of width {layer[width]} by a [{layer[width]}, {layer[mlp_width]}]\nweight. "
                  "How many **FLOPs** is that forward matmul?",
    "ch03-md-05": "### Quiz 2: the same layer, trained\n\nHow many FLOPs does one training step of that "
                  "layer take for those {tokens} tokens, forward and\nbackward?",
    "ch03-md-06": "### Quiz 3: the course GPT, per token\n\nThe course GPT with `GPTConfig(vocab_size=1000, "
                  "block_size=128, n_layer={gpt[n_layer]}, n_head=4, n_embd={gpt[n_embd]})`\nhas "
                  "{gpt[n_all]:,} parameters. Two of its weights are lookup tables: the token embedding (1000 × "
                  "{gpt[n_embd]})\nand the position embedding (128 × {gpt[n_embd]}). Looking up a row does "
                  "no arithmetic, so $6N$ counts the\nother $N$ = {gpt[n]:,}. (The head, {gpt[n_embd]} × 1000, "
                  "is a real matmul and counts.) How many\ntraining FLOPs per token does it take at sequence "
                  "length 128, **including** attention's\n$12\\,L\\,h\\,s$?",
    "ch03-md-07": "### Quiz 4: a whole training run\n\n{run[name]} ($N$ = {run[n_text]}) was trained on $D$ = "
                  "{run[d_text]} tokens. With $C \\approx 6ND$, how many FLOPs is\nthat?",
    "ch03-md-09": "### Quiz 5: what MFU is that?\n\nA {run[name]} run ($N$ = {run[n_text]}, use $6N$ FLOPs per "
                  "token) processes {tokens_per_gpu_s:,} tokens per second on\neach H100 SXM (dense bf16 "
                  "peak 989.4 TFLOP/s). What is its MFU, as a **fraction** (e.g. 0.5)?",
    "ch03-md-10": "### Quiz 6: how many days?\n\nHow many **days** does the run of Quiz 4 take on {gpus} "
                  "H100 SXM GPUs at {mfu_pct}% MFU (peak 989.4\nTFLOP/s dense bf16)?",
    "ch03-md-13": "### Quiz 8: a skinny matmul\n\nWhat is the arithmetic intensity (FLOPs per byte) of a "
                  "bf16 matmul [32, {depth}] × [{depth}, {depth}]?\nCount reading both inputs and writing "
                  "the output once.",
    "ch03-md-rows": "### Quiz 11: how many rows make it compute-bound?\n\nKeep the bf16 weight [{depth}, "
                    "{depth}] of Quiz 8 and give the input more rows: [$m$, {depth}] × [{depth},\n{depth}]. "
                    "What is the **smallest whole number of rows** $m$ for which the matmul is compute-bound "
                    "on\nan H100 SXM (989.4 TFLOP/s dense bf16, 3.35 TB/s)? Count all three tensors, as in "
                    "Quiz 8. (Is\n\"intensity ≈ $m$\" good enough here?)",
    "ch03-md-16": "### Quiz 12: an element-wise add\n\n`z = x + y` on two bf16 vectors of {add[text]} elements "
                  "each, on an H100 SXM (3.35 TB/s). How many\n**milliseconds** does it take at least? "
                  "(Count every byte read and written.)",
}
# The same for everyone: the H100's published figures, and a two-way choice (a skinny matmul is
# memory-bound at every size drawn; numbers cannot make a copied word wrong).
FIXED = {
    "03-critical-intensity": "the H100 SXM's published peak and bandwidth",
    "03-bound-b32": "a choice of two words, and the answer ('memory') at every size drawn",
}


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    TOKENS, WIDTH, MLP_WIDTH = p["tokens"], p["layer"]["width"], p["layer"]["mlp_width"]
    gpt = p["gpt"]
    n_layer, n_embd, n_all, n_course = gpt["n_layer"], gpt["n_embd"], gpt["n_all"], gpt["n"]
    LLAMA_N, LLAMA_D = p["run"]["n"], p["run"]["d"]
    TOKENS_PER_GPU_S, GPUS, RUN_MFU = p["tokens_per_gpu_s"], p["gpus"], p["mfu_pct"] / 100
    SKINNY = (ROWS, p["depth"], p["depth"])                # [32, D] x [D, D], bf16
    ADD_ELEMENTS = p["add"]["n"]                           # z = x + y, bf16

    matmul = arith.matmul_flops(TOKENS, WIDTH, MLP_WIDTH)
    per_token = arith.training_flops(n_course, 1, n_layer=n_layer, hidden=n_embd, seq_len=BLOCK)
    run_flops = arith.training_flops(LLAMA_N, LLAMA_D)
    skinny_flops, skinny_bytes = arith.matmul_flops(*SKINNY), arith.matmul_bytes(*SKINNY, 2)
    rows, depth, width = SKINNY
    weights_bytes = 2 * depth * width                       # the [D, D] weight alone
    two_tensor_bytes = 2 * (rows * depth + depth * width)   # input and weight, output left out
    add_bytes = 3 * ADD_ELEMENTS * 2                        # read x, read y, write z

    def rows_to_compute_bound(peak: float = PEAK, bytes_per_value: int = 2) -> int:
        """Smallest m for which [m, D] x [D, D] is compute-bound (arith.bound decides)."""
        return next(b for b in range(1, 100_000)
                    if arith.bound(arith.matmul_flops(b, depth, width),
                                   arith.matmul_bytes(b, depth, width, bytes_per_value),
                                   peak, BANDWIDTH) == "compute")

    critical = arith.critical_intensity(PEAK, BANDWIDTH)

    def days(mfu: float, peak: float = PEAK) -> float:
        return arith.training_days(LLAMA_N, LLAMA_D, GPUS, peak, mfu)

    return [
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
            Mistake(arith.training_flops(n_all, 1, n_layer=n_layer, hidden=n_embd, seq_len=BLOCK),
                    "you counted the embedding tables in N; a lookup does no arithmetic."),
            Mistake(2 * n_course + 4 * n_layer * n_embd * BLOCK,
                    "that is the forward pass only; training is three times the forward: 6N + 12·L·h·s."),
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
            Mistake(days(1.0), f"that assumes 100% of the peak; divide by the {p['mfu_pct']}% MFU too."),
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
            Mistake(skinny_flops / weights_bytes, "32 is the ≈ m shortcut, which is also what the "
                    "weight's bytes alone give; the question counts all three tensors: the input and "
                    f"the output ([32, {depth}] each) add bytes, so the intensity is a little under 32."),
            Mistake(skinny_flops / two_tensor_bytes, "you counted two of the three tensors: reading "
                    f"the input and the weight, and writing the [32, {depth}] output, all move bytes."),
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
                    f"and the output ([32, {depth}] each) must be read and written too."),
            Mistake(two_tensor_bytes / BANDWIDTH * 1e6, "you left one tensor out: read the input and "
                    "the weight, and write the output."),
        )),
        # ±1 row: the answer moves by one with the 4th significant figure of the critical
        # intensity (the summary's ≈ 295 gives 318, the exact 295.3 gives 319).
        Item("03-rows-compute-bound", rows_to_compute_bound(), "rows", abs_tol=1.0, mistakes=(
            # (The shortcut rounded down, one row less, gets the same words: within the ±1.)
            Mistake(math.ceil(critical), "that is the ≈ m shortcut (m ≥ the critical intensity); the "
                         "exact intensity 2mkn / (2(mk + kn + mn)) stays below m, so a few more rows "
                         "are needed: solve it for m."),
            # Twice the peak and twice the bytes per value both double the rows needed.
            Mistake(rows_to_compute_bound(peak=2 * PEAK), "about twice too many: did you use the "
                    "with-sparsity peak (1,979 TFLOP/s) or 4 bytes per value? Use the dense 989.4 "
                    "TFLOP/s and 2-byte bf16 values."),
            Mistake(rows_to_compute_bound(bytes_per_value=1), "you counted values, not bytes: each "
                                                              "bf16 value is 2 bytes."),
        )),
        Item("03-add-ms", add_bytes / BANDWIDTH * 1e3, "ms", rel_tol=0.01, mistakes=(
            Mistake(2 * ADD_ELEMENTS * 2 / BANDWIDTH * 1e3, "you counted the two inputs but not "
                                                            f"writing the output: {p['add']['three']} values move."),
            # An add runs on the CUDA cores (in fp32 arithmetic), not on the tensor cores: 66.9 TFLOP/s.
            Mistake(ADD_ELEMENTS / H100.fp32_flops * 1e3, f"that is the compute time ({p['add']['flops']} FLOPs on the "
                    "CUDA cores); an add does 1 FLOP per 6 bytes moved, far below the critical "
                    "intensity, so the memory time decides."),
            Mistake(ADD_ELEMENTS / PEAK * 1e3, "that divides the FLOPs by the tensor-core peak, which "
                    "only matrix products use; and compute is not the limit anyway: an add does 1 "
                    "FLOP per 6 bytes moved, so the memory time decides."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
