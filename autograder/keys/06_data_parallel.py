"""Answer key for chapter 06, data parallelism. Instructor side: never released.

Every expected value is computed by gpulab's tested functions (ring collectives, ZeRO, the DP
scaling model) from the numbers the questions state; each mistake is the value a typical slip
produces, with the words the learner sees.

The chapter's rule for the ring's (n−1)/n (stated in its conventions): every ring formula
carries it. With 8 ranks, dropping it is 14% off and graded wrong; with 64 it is 1.6% off, and
the items on 64 GPUs (06-min-tokens, 06-zero3-comm-gb) accept the paper's rounded figure too
(tolerance 2%).

Each item is preceded by "# Quiz N", the number of its "### Quiz N" heading in the notebook
(tests/test_keys.py checks that they agree).
"""
import math

from gpulab import arith, precision
from gpulab.arith import GB
from gpulab.checks import Item, Mistake

# The numbers stated in the questions (solutions/06_data_parallel, "Quiz" sections).
PSI_7B, GPUS_8, NVLINK = 7e9, 8, 450e9            # quizzes 2, 3 and 5
MEASURED_BYTES, MEASURED_S = 1e9, 5e-3            # quiz 4: an all-reduce measured on 8 GPUs
COMPUTE, BACKWARD, COMM = 0.300, 0.200, 0.250     # quiz 6, seconds
F, B, RANKS, SEQ = 400e12, 50e9, 64, 2048         # quizzes 7-9
PSI_ZERO, ZERO_GPUS = 7.5e9, 64                   # quizzes 10 (on 8 GPUs) and 12
PSI_70B, BUDGET = 70e9, 60 * GB                   # quiz 11
STAGES, MICRO = 4, 8                              # quiz 13

allreduce_ms = arith.allreduce_seconds(PSI_7B * 2, GPUS_8, NVLINK) * 1e3
allgather_ms = arith.allgather_seconds(PSI_7B * 2, GPUS_8, NVLINK) * 1e3
# torch.autocast keeps fp32 gradients (chapter 04), which plain DDP all-reduces as they are.
autocast_grad_bytes = precision.autocast_state_bytes(PSI_7B)["grads"]
autocast_ms = arith.allreduce_seconds(autocast_grad_bytes, GPUS_8, NVLINK) * 1e3
algbw = arith.algorithm_bandwidth(MEASURED_BYTES, MEASURED_S)
min_tokens = arith.min_tokens_compute_bound(RANKS, B, F)
BOTH_WAYS = ("900 GB/s is NVLink's two directions added; a ring sends each chunk one way, at "
             "450 GB/s per direction.")


def zero_gb(n_gpus, stage, n_params=PSI_ZERO):
    return arith.zero_bytes_per_gpu(n_params, n_gpus, stage) / GB


def fewest_gpus(n_params, budget, bytes_per_param=16):
    return math.ceil(n_params * bytes_per_param / budget)


ITEMS = [
    # Quiz 1
    Item("06-reduce-scatter", 1 + 11, "", mistakes=(
        Mistake(0 + 10, "that is rank 0's piece (element 0 summed over the ranks); rank 1 gets "
                        "element 1's sum."),
        Mistake(0 + 1 + 10 + 11, "that sums everything; reduce-scatter gives each rank one "
                                 "piece of the element-wise sum."),
    )),
    # Quiz 2
    Item("06-allreduce-ms", allreduce_ms, "ms", rel_tol=0.01, mistakes=(
        Mistake(allreduce_ms / 2, "half the time: either one pass over the ring (an all-reduce "
                                  "is a reduce-scatter plus an all-gather: 2·(n−1)/n·S/B), or "
                                  "900 GB/s, which is NVLink's two directions added; a ring "
                                  "sends one way, 450 GB/s."),
        Mistake(2 * PSI_7B * 2 / NVLINK * 1e3, "each rank sends (n−1)/n of the buffer per pass, "
                                               "not all of it: 2·(n−1)/n·S/B."),
        Mistake(allreduce_ms * 2, "bf16 gradients are 2 bytes each, not 4."),
    )),
    # Quiz 3
    Item("06-autocast-allreduce-ms", autocast_ms, "ms", rel_tol=0.01, mistakes=(
        Mistake(allreduce_ms, "that all-reduces 2-byte gradients (or uses 900 GB/s, both "
                              "directions added). torch.autocast leaves the parameters fp32, so "
                              "backward produces fp32 gradients, and plain DDP all-reduces them "
                              "as they are: 4 bytes each. A bf16 compression hook would halve it."),
        Mistake(2 * autocast_grad_bytes / NVLINK * 1e3, "each rank sends (n−1)/n of the buffer "
                                                        "per pass, not all of it: 2·(n−1)/n·S/B."),
    )),
    # Quiz 4
    Item("06-busbw", arith.bus_bandwidth(algbw, "all_reduce", GPUS_8) / GB, "GB/s", rel_tol=0.01,
         mistakes=(
        Mistake(algbw / GB, "that is the algorithm bandwidth, size / time; nccl-tests' bus "
                            "bandwidth multiplies it by 2·(n−1)/n for all-reduce."),
        Mistake(2 * algbw / GB, "the factor is 2·(n−1)/n, not 2: with 8 ranks, 1.75."),
    )),
    # Quiz 5
    Item("06-allgather-ms", allgather_ms, "ms", rel_tol=0.01, mistakes=(
        Mistake(allreduce_ms, "that is an all-reduce (two passes); an all-gather is one: "
                              "(n−1)/n·S/B."),
        Mistake(PSI_7B * 2 / NVLINK * 1e3, "each rank receives the other (n−1)/n of the "
                                           "parameters, not all of them."),
        Mistake(allgather_ms / 2, BOTH_WAYS),
    )),
    # Quiz 6
    Item("06-step-ms", arith.dp_step_seconds(COMPUTE, COMM, BACKWARD / COMPUTE) * 1e3, "ms",
         rel_tol=0.01, mistakes=(
        Mistake((COMPUTE + COMM) * 1e3, "that is without overlap; DDP all-reduces buckets "
                                        "while backward (200 ms) still runs."),
        Mistake(COMPUTE * 1e3, "the all-reduce (250 ms) is longer than the backward it hides "
                               "behind (200 ms): 50 ms stay exposed."),
    )),
    # Quiz 7: 2%, so that the many-ranks 8000 (the prose's and the docstring's figure) passes.
    Item("06-min-tokens", min_tokens, "tokens", rel_tol=0.02, mistakes=(
        Mistake(min_tokens * 4 / 6, "that compares the all-reduce with the whole step (6NT "
                                    "FLOPs); it overlaps only with backward (4NT)."),
        Mistake(min_tokens * 2, "2x too large: either you compared with the forward (2NT) "
                                "instead of backward (4NT), or took 4-byte gradients where the "
                                "question says bf16."),
        Mistake(arith.min_tokens_compute_bound(RANKS, 400e9, F), "400 Gb/s is bits per second: "
                                                                 "50 GB/s."),
    )),
    # Quiz 8
    Item("06-min-batch", math.ceil(min_tokens / SEQ), "sequences", mistakes=(
        Mistake(math.floor(min_tokens / SEQ), "round up: a smaller batch leaves the all-reduce "
                                              "exposed."),
    )),
    # Quiz 9: reasoning, no formula to plug into.
    Item("06-dp-remedy", "c", "", choices=("a", "b", "c", "d"), mistakes=(
        Mistake("a", "more GPUs at the same per-GPU batch leave each GPU's compute as it was, "
                     "and the ring all-reduce barely changes ((n−1)/n goes from 63/64 to "
                     "127/128): the share of communication stays."),
        Mistake("b", "ZeRO-2 sends the same 2Ψ per step (a reduce-scatter plus an all-gather is "
                     "an all-reduce): it saves memory, not time."),
        Mistake("d", "without no_sync() DDP all-reduces after every backward, so four "
                     "micro-batches cost four all-reduces: nothing gained."),
    )),
    # Quiz 10
    Item("06-zero2-gb", zero_gb(GPUS_8, 2), "GB", rel_tol=0.01, mistakes=(
        Mistake(zero_gb(GPUS_8, 1), "that is stage 1 (only the optimizer states sharded); "
                                    "stage 2 shards the gradients too: 2Ψ + 14Ψ/N."),
        Mistake(zero_gb(GPUS_8, 3), "that is stage 3 (parameters sharded too); stage 2 keeps "
                                    "the full bf16 parameters on every GPU."),
        Mistake(zero_gb(GPUS_8, 0), "that is plain data parallelism (16 bytes per parameter on "
                                    "every GPU); ZeRO-2 shards gradients and optimizer states."),
    )),
    # Quiz 11
    Item("06-zero3-gpus", fewest_gpus(PSI_70B, BUDGET), "GPUs", mistakes=(
        Mistake(math.floor(PSI_70B * 16 / BUDGET), "round up (and 60 GB is 60 × 10⁹ bytes, not "
                                                   "60 GiB): with fewer GPUs than 16·Ψ / 60 GB "
                                                   "each shard is over budget."),
        Mistake(fewest_gpus(PSI_70B, BUDGET, 12), "12 bytes per parameter is the optimizer state "
                                                  "alone; ZeRO-3 shards all 16 (weights, "
                                                  "gradients and optimizer state)."),
        Mistake(fewest_gpus(PSI_70B, BUDGET, 2), "that shards the bf16 weights alone; ZeRO-3's "
                                                 "shard holds 16 bytes per parameter."),
    )),
    # Quiz 12: N = 64 stated; 2%, so that the paper's rounded 3Ψ (45 GB) passes too.
    Item("06-zero3-comm-gb", arith.zero_comm_bytes(PSI_ZERO, 3, n_gpus=ZERO_GPUS) / GB, "GB",
         rel_tol=0.02, mistakes=(
        Mistake(arith.zero_comm_bytes(PSI_ZERO, 2, n_gpus=ZERO_GPUS) / GB,
                "that is plain DP's (and stages 1-2's) 2Ψ; stage 3 also all-gathers the "
                "parameters again in backward: 3Ψ."),
        Mistake(arith.zero_comm_bytes(PSI_ZERO, 3, bytes_per_value=4, n_gpus=ZERO_GPUS) / GB,
                "the parameters and gradients travel in bf16: 2 bytes per value."),
    )),
    # Quiz 13
    Item("06-bubble", arith.pipeline_bubble_fraction(STAGES, MICRO), "", rel_tol=0.01, mistakes=(
        Mistake((STAGES - 1) / MICRO, "that is idle time relative to the useful time; as a "
                                      "fraction of the whole step it is (p−1)/(m+p−1)."),
        Mistake(STAGES / (MICRO + STAGES), "the bubble is p − 1 slots, not p: (p−1)/(m+p−1)."),
    )),
]
