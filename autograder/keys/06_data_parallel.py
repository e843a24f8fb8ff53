"""Answer key for chapter 06, data parallelism. Instructor side: never released.

Every expected value is computed by gpulab's tested functions (ring collectives, ZeRO, the DP
scaling model) from the numbers the questions state; each mistake is the value a typical slip
produces, with the words the learner sees.
"""
import math

from gpulab import arith
from gpulab.arith import GB
from gpulab.checks import Item, Mistake

# The numbers stated in the questions (solutions/06_data_parallel, "Quiz" sections).
PSI_7B, GPUS_8, NVLINK = 7e9, 8, 450e9            # quizzes 1 and 3: bf16 gradients/params
MEASURED_BYTES, MEASURED_S = 1e9, 5e-3            # quiz 2: an all-reduce measured on 8 GPUs
PSI_ZERO = 7.5e9                                  # quizzes 5 and 7: the ZeRO paper's model
PSI_70B, BUDGET = 70e9, 60 * GB                   # quiz 6
COMPUTE, BACKWARD, COMM = 0.300, 0.200, 0.250     # quiz 8, seconds
F, B, RANKS, SEQ = 400e12, 50e9, 64, 2048         # quizzes 9-10
STAGES, MICRO = 4, 8                              # quiz 11

allreduce_ms = arith.allreduce_seconds(PSI_7B * 2, GPUS_8, NVLINK) * 1e3
algbw = arith.algorithm_bandwidth(MEASURED_BYTES, MEASURED_S)
min_tokens = arith.min_tokens_compute_bound(RANKS, B, F)


def zero_gb(n_gpus, stage, n_params=PSI_ZERO):
    return arith.zero_bytes_per_gpu(n_params, n_gpus, stage) / GB


def fewest_gpus(n_params, budget):
    return next(n for n in range(1, 10_000) if arith.zero_bytes_per_gpu(n_params, n, 3) <= budget)


ITEMS = [
    Item("06-allreduce-ms", allreduce_ms, "ms", rel_tol=0.01, mistakes=(
        Mistake(allreduce_ms / 2, "that is one pass over the ring; an all-reduce is a "
                                  "reduce-scatter plus an all-gather: 2·(n−1)/n·S/B."),
        Mistake(2 * PSI_7B * 2 / NVLINK * 1e3, "each rank sends (n−1)/n of the buffer per pass, "
                                               "not all of it: 2·(n−1)/n·S/B."),
        Mistake(allreduce_ms * 2, "bf16 gradients are 2 bytes each, not 4."),
    )),
    Item("06-busbw", arith.bus_bandwidth(algbw, "all_reduce", GPUS_8) / GB, "GB/s", rel_tol=0.01,
         mistakes=(
        Mistake(algbw / GB, "that is the algorithm bandwidth, size / time; nccl-tests' bus "
                            "bandwidth multiplies it by 2·(n−1)/n for all-reduce."),
        Mistake(2 * algbw / GB, "the factor is 2·(n−1)/n, not 2: with 8 ranks, 1.75."),
    )),
    Item("06-allgather-ms", arith.allgather_seconds(PSI_7B * 2, GPUS_8, NVLINK) * 1e3, "ms",
         rel_tol=0.01, mistakes=(
        Mistake(allreduce_ms, "that is an all-reduce (two passes); an all-gather is one: "
                              "(n−1)/n·S/B."),
        Mistake(PSI_7B * 2 / NVLINK * 1e3, "each rank receives the other (n−1)/n of the "
                                           "parameters, not all of them."),
    )),
    Item("06-reduce-scatter", 1 + 11, "", mistakes=(
        Mistake(0 + 10, "that is rank 0's piece (element 0 summed over the ranks); rank 1 gets "
                        "element 1's sum."),
        Mistake(0 + 1 + 10 + 11, "that sums everything; reduce-scatter gives each rank one "
                                 "piece of the element-wise sum."),
    )),
    Item("06-zero2-gb", zero_gb(GPUS_8, 2), "GB", rel_tol=0.01, mistakes=(
        Mistake(zero_gb(GPUS_8, 1), "that is stage 1 (only the optimizer states sharded); "
                                    "stage 2 shards the gradients too: 2Ψ + 14Ψ/N."),
        Mistake(zero_gb(GPUS_8, 3), "that is stage 3 (parameters sharded too); stage 2 keeps "
                                    "the full bf16 parameters on every GPU."),
        Mistake(zero_gb(GPUS_8, 0), "that is plain data parallelism (16 bytes per parameter on "
                                    "every GPU); ZeRO-2 shards gradients and optimizer states."),
    )),
    Item("06-zero3-gpus", fewest_gpus(PSI_70B, BUDGET), "GPUs", mistakes=(
        Mistake(fewest_gpus(PSI_70B, 80 * GB), "that fills all 80 GB; the question leaves "
                                               "room: at most 60 GB per GPU for the model state."),
        Mistake(math.floor(PSI_70B * 16 / BUDGET), "round up: with fewer GPUs than 16·Ψ / 60 GB "
                                                   "the shard is over budget."),
    )),
    Item("06-zero3-comm-gb", arith.zero_comm_bytes(PSI_ZERO, 3) / GB, "GB", rel_tol=0.01, mistakes=(
        Mistake(arith.zero_comm_bytes(PSI_ZERO, 2) / GB, "that is plain DP's (and stages 1-2's) "
                                                         "2Ψ; stage 3 also all-gathers the "
                                                         "parameters again in backward: 3Ψ."),
        Mistake(arith.zero_comm_bytes(PSI_ZERO, 3, bytes_per_value=4) / GB,
                "the parameters and gradients travel in bf16: 2 bytes per value."),
    )),
    Item("06-step-ms", arith.dp_step_seconds(COMPUTE, COMM, BACKWARD / COMPUTE) * 1e3, "ms",
         rel_tol=0.01, mistakes=(
        Mistake((COMPUTE + COMM) * 1e3, "that is without overlap; DDP all-reduces buckets "
                                        "while backward (200 ms) still runs."),
        Mistake(COMPUTE * 1e3, "the all-reduce (250 ms) is longer than the backward it hides "
                               "behind (200 ms): 50 ms stay exposed."),
    )),
    Item("06-min-tokens", min_tokens, "tokens", rel_tol=0.005, mistakes=(
        Mistake(arith.min_tokens_compute_bound(RANKS, B, F) * 4 / 6, "that compares the "
                "all-reduce with the whole step (6NT FLOPs); it overlaps only with backward (4NT)."),
        Mistake(arith.min_tokens_compute_bound(RANKS, B, F) * 2, "that compares with the "
                "forward (2NT); the all-reduce overlaps with backward (4NT)."),
        Mistake(2 * F / (2 * B), "close: include the ring's (n−1)/n factor, 63/64."),
    )),
    Item("06-min-batch", math.ceil(min_tokens / SEQ), "sequences", mistakes=(
        Mistake(math.floor(min_tokens / SEQ), "round up: a smaller batch leaves the all-reduce "
                                              "exposed."),
    )),
    Item("06-bubble", arith.pipeline_bubble_fraction(STAGES, MICRO), "", rel_tol=0.01, mistakes=(
        Mistake((STAGES - 1) / MICRO, "that is idle time relative to the useful time; as a "
                                      "fraction of the whole step it is (p−1)/(m+p−1)."),
        Mistake(STAGES / (MICRO + STAGES), "the bubble is p − 1 slots, not p: (p−1)/(m+p−1)."),
    )),
]
