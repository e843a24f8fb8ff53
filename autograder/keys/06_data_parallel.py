"""Answer key for chapter 06, data parallelism. Instructor side: never released.

Every expected value is computed by gpulab's tested functions (ring collectives, ZeRO, the DP
scaling model) from the numbers the questions state; each mistake is the value a typical slip
produces, with the words the learner sees.

The chapter's rule for the ring's (n−1)/n (stated in its conventions): every ring formula
carries it. With 8 ranks, dropping it is 14% off and graded wrong; with n = 32 or more it is at
most 3.2% off (1/n of the rounded figure), and the items on that many GPUs (06-min-tokens,
whose variants draw 32 to 256 ranks, and 06-zero3-comm-gb on 64) accept the rounded figure too:
their tolerance is 1.25/n, at least 2%.

Each item is preceded by "# Quiz N", the number of its "### Quiz N" heading in the notebook
(tests/test_keys.py checks that they agree).
"""
import math

from gpulab import arith, precision
from gpulab.arith import GB
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical

# The numbers stated in the questions (solutions/06_data_parallel, "Quiz" sections). Those in
# PARAMS are canonical values: a graded release with a course seed draws others for each student
# (gpulab.course.variants). The rest are the same for everyone (FIXED says why).
NVLINK = 450e9                                    # quizzes 2, 3 and 5: H100 NVLink 4, per direction
MEASURED_BYTES = 1e9                              # quiz 4: an all-reduce measured
SEQ = 2048                                        # quizzes 8-9
PSI_ZERO, ZERO_GPUS = 7.5e9, 64                   # quizzes 10 and 12: the ZeRO paper's example
STAGES, MICRO = 4, 8                              # quiz 13
BOTH_WAYS = ("900 GB/s is NVLink's two directions added; a ring sends each chunk one way, at "
             "450 GB/s per direction.")


def pieces(a0: int, a1: int, b0: int, b1: int) -> dict:
    return {"a0": a0, "a1": a1, "b0": b0, "b1": b1}


def step(compute: int, backward: int, comm: int) -> dict:
    return {"compute": compute, "backward": backward, "comm": comm}     # ms; comm > backward


def billions(n: float) -> dict:
    return {"n": n * 1e9, "name": f"{n:g}B", "text": f"{n:g} × 10⁹"}


PARAMS = {
    # Quiz 1: rank 0's and rank 1's two numbers (the element-0 sum never 0, never rank 1's answer)
    "pieces": Param(pieces(0, 1, 10, 11), (pieces(0, 1, 10, 11), pieces(2, 5, 20, 30), pieces(3, 7, 40, 9),
                                           pieces(1, 4, 6, 100), pieces(5, 2, 8, 30), pieces(7, 3, 1, 50))),
    "psi": Param(billions(7), tuple(billions(n) for n in (1, 3, 7, 8, 13, 34))),    # quizzes 2, 3, 5
    "nvlink_gpus": Param(8, (4, 8)),                                           # GPUs of one NVLink node
    "busbw_ranks": Param(8, (4, 8, 16)),                                       # quiz 4
    "busbw_ms": Param(5, (4, 5, 6, 8, 10)),
    "step": Param(step(300, 200, 250), (step(300, 200, 250), step(300, 200, 320), step(240, 160, 200),
                                        step(360, 240, 300), step(400, 260, 350), step(450, 300, 380),
                                        step(200, 130, 180))),                   # quiz 6
    "ranks": Param({"n": 64, "doubled": 128}, tuple({"n": n, "doubled": 2 * n} for n in (32, 64, 128, 256))),
    "nic": Param({"gbit": 400, "gbytes": 50}, ({"gbit": 200, "gbytes": 25}, {"gbit": 400, "gbytes": 50})),
    "flops_t": Param(400, (400, 500, 600)),     # F in 10¹² FLOP/s: one sequence leaves most exposed
    "zero2_gpus": Param(8, (4, 8, 16, 32)),                                     # quiz 10
    "big": Param({"n": 70e9, "name": "70B"}, ({"n": 34e9, "name": "34B"}, {"n": 70e9, "name": "70B"},
                                              {"n": 175e9, "name": "175B"})),   # quiz 11
    "budget_gb": Param(60, (45, 60, 75)),
}
QUESTIONS = {
    'ch06-md-06': '### Quiz 1: what reduce-scatter leaves on rank 1\n\nTwo ranks: rank 0 holds '
                  '[{pieces[a0]}, {pieces[a1]}], rank 1 holds [{pieces[b0]}, {pieces[b1]}]. After a '
                  'reduce-scatter with sum, what\nsingle number does rank 1 hold? (The next cell '
                  'runs it; answer first.)',
    'ch06-md-08': "### Quiz 2: all-reducing a {psi[name]} model's gradients\n\nA "
                  '{psi[name]}-parameter model ($\\Psi$ = {psi[text]}) is held in bf16, with fp32 '
                  'master weights in the\noptimizer (chapter 04). Its bf16 gradients are '
                  'all-reduced as they are, in bf16. How many **ms**\ndoes a ring all-reduce of '
                  'them take on {nvlink_gpus} H100s connected by NVLink 4, at 450 GB/s per '
                  'direction?\nIgnore latency.',
    'ch06-md-quiz-autocast': '### Quiz 3: the same gradients under torch.autocast\n\nThe same '
                             '{psi[name]} model is now trained with '
                             '`torch.autocast(dtype=torch.bfloat16)` and '
                             'plain\n`DistributedDataParallel`, with no *communication hook* (a '
                             'function that changes what DDP\nsends), on the same {nvlink_gpus} '
                             'H100s. How many **ms** does\nthe gradient all-reduce take? (Chapter '
                             '04: under autocast, what dtype do the parameters keep, and\nso their '
                             'gradients?)',
    'ch06-md-09': '### Quiz 4: from a measurement to bus bandwidth\n\nnccl-tests reports an '
                  'all-reduce of 1 GB ($10^9$ bytes) across {busbw_ranks} GPUs in {busbw_ms} ms. '
                  'What is the bus\nbandwidth in **GB/s**?',
    'ch06-md-10': '### Quiz 5: gathering the parameters\n\nUnder *ZeRO-3*, which section 5 '
                  'explains, each GPU keeps only a slice of the parameters: 1/{nvlink_gpus} of\nthe '
                  'bf16 parameters of the same {psi[name]} model. Before computing, it must '
                  'all-gather the full set. How\nmany **ms** does one all-gather take on the same '
                  'NVLink (450 GB/s per direction, {nvlink_gpus} GPUs)?',
    'ch06-md-18': '### Quiz 6: compute plus exposed communication\n\nA step computes for '
                  '{step[compute]} ms, of which backward is {step[backward]} ms. The gradient '
                  'all-reduce takes {step[comm]} ms, and\nDDP overlaps it with backward. How many '
                  '**ms** does the step take?',
    'ch06-md-19': '### Quiz 7: the smallest per-GPU batch that hides the all-reduce\n\n{ranks[n]} '
                  'GPUs, one per server, each server with one {nic[gbit]} Gb/s InfiniBand NIC, so '
                  '$B$ = {nic[gbytes]} GB/s per GPU.\nEach GPU achieves $F$ = {flops_t} × 10¹² '
                  'FLOP/s, and the gradients are bf16 ($q = 2$). How many\n**tokens** per GPU per '
                  'step make the backward pass as long as the all-reduce?',
    'ch06-md-quiz-remedy': '### Quiz 9: which change helps? (reasoning)\n\nThe run of Quizzes 7 and '
                           '8, {ranks[n]} GPUs with one {nic[gbytes]} GB/s NIC each, trains on one '
                           'sequence of 2048\ntokens per GPU per optimizer step. Its exposed '
                           'all-reduce takes most of each step. Which one\nchange cuts the share of '
                           'each step spent waiting on communication the most? Answer with '
                           'the\nletter as a string, e.g. `"a"`.\n\n- (a) {ranks[doubled]} GPUs, '
                           'still 2048 tokens per GPU per step;\n- (b) ZeRO stage 2 instead of '
                           'plain DDP;\n- (c) gradient accumulation over 4 micro-batches of 2048 '
                           "tokens per step, the first three\n  backward passes inside DDP's "
                           '`model.no_sync()`;\n- (d) the same accumulation over 4 micro-batches, '
                           'without `no_sync()`.',
    'ch06-md-25': '### Quiz 10: ZeRO-2 on {zero2_gpus} GPUs\n\nThe same 7.5B model (mixed-precision '
                  'Adam, $K = 12$) runs on {zero2_gpus} GPUs under ZeRO stage 2. How many\n**GB** '
                  'of model state does each GPU hold?',
    'ch06-md-26': '### Quiz 11: how many GPUs for a {big[name]} model under ZeRO-3?\n\nA '
                  '{big[name]} model is trained with mixed-precision Adam (16 bytes per parameter) '
                  'under ZeRO stage 3. You\nallow at most {budget_gb} GB of model state per GPU; '
                  'the rest is for activations. What is the fewest\nGPUs?',
}
# Quiz 9 is a choice whose answer no number changes; Quiz 12 is the ZeRO paper's own setting
# (7.5B on 64 GPUs, whose 3Ψ the prose quotes); Quiz 13 is the schedule an experiment runs;
# Quiz 14 reads a script printed in the question.
FIXED = {
    "06-dp-remedy": "a choice of four changes; 'c' whatever the run's numbers",
    "06-sampler-bug": "a reading of the script the question prints; the sampler cell measures it",
    "06-zero3-comm-gb": "the ZeRO paper's own example (7.5B on N_d = 64), whose 3Ψ the prose quotes",
    "06-bubble": "the 4 stages and 8 micro-batches the pipeline experiment runs",
}


def either_way(n_ranks: int) -> float:
    """A tolerance that accepts a ring figure with and without (n−1)/n, which differ by 1/n of
    the rounded one: 1.25/n, and never below 2% (the chapter's conventions: 32 ranks or more)."""
    return max(0.02, 1.25 / n_ranks)


def zero_gb(n_gpus, stage, n_params=PSI_ZERO):
    return arith.zero_bytes_per_gpu(n_params, n_gpus, stage) / GB


def fewest_gpus(n_params, budget, bytes_per_param=16):
    return math.ceil(n_params * bytes_per_param / budget)


def zero3_budget_slips(n_params: float, budget_gb: float) -> tuple[Mistake, ...]:
    """Quiz 11's two slips on the budget: rounding the GPU count down, and reading the budget
    as GiB (2^30 bytes, 7% more, so fewer GPUs). Where both give the same count, one message
    names both; where they differ, each value gets its own."""
    rounded_down = math.floor(n_params * 16 / (budget_gb * GB))
    in_gib = math.ceil(n_params * 16 / (budget_gb * 2**30))
    round_up = (f"with fewer GPUs than 16·Ψ / {budget_gb} GB each shard is over budget, so "
                "round up")
    gib = (f"{budget_gb} GB is {budget_gb} × 10⁹ bytes, not {budget_gb} GiB (2³⁰ bytes each, "
           "7% more)")
    if in_gib == rounded_down:
        return (Mistake(rounded_down, f"{round_up}; or {gib}."),)
    return (Mistake(rounded_down, f"{round_up}."),
            Mistake(in_gib, f"{gib}: a GiB budget is larger and needs fewer GPUs."))


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    PSI_7B, GPUS_8 = p["psi"]["n"], p["nvlink_gpus"]
    MEASURED_S, BUSBW_RANKS = p["busbw_ms"] / 1000, p["busbw_ranks"]
    COMPUTE, BACKWARD, COMM = (p["step"][k] / 1000 for k in ("compute", "backward", "comm"))
    F, B, RANKS = p["flops_t"] * 1e12, p["nic"]["gbytes"] * 1e9, p["ranks"]["n"]
    ZERO2_GPUS = p["zero2_gpus"]
    PSI_70B, BUDGET = p["big"]["n"], p["budget_gb"] * GB
    a0, a1, b0, b1 = (p["pieces"][k] for k in ("a0", "a1", "b0", "b1"))

    allreduce_ms = arith.allreduce_seconds(PSI_7B * 2, GPUS_8, NVLINK) * 1e3
    allgather_ms = arith.allgather_seconds(PSI_7B * 2, GPUS_8, NVLINK) * 1e3
    # torch.autocast keeps fp32 gradients (chapter 04), which plain DDP all-reduces as they are.
    autocast_grad_bytes = precision.autocast_state_bytes(PSI_7B)["grads"]
    autocast_ms = arith.allreduce_seconds(autocast_grad_bytes, GPUS_8, NVLINK) * 1e3
    algbw = arith.algorithm_bandwidth(MEASURED_BYTES, MEASURED_S)
    min_tokens = arith.min_tokens_compute_bound(RANKS, B, F)

    return [
        # Quiz 1
        Item("06-reduce-scatter", a1 + b1, "", mistakes=(
            Mistake(a0 + b0, "that is rank 0's piece (element 0 summed over the ranks); rank 1 gets "
                            "element 1's sum."),
            Mistake(a0 + a1 + b0 + b1, "that sums everything; reduce-scatter gives each rank one "
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
        Item("06-busbw", arith.bus_bandwidth(algbw, "all_reduce", BUSBW_RANKS) / GB, "GB/s", rel_tol=0.01,
             mistakes=(
            Mistake(algbw / GB, "that is the algorithm bandwidth, size / time; nccl-tests' bus "
                                "bandwidth multiplies it by 2·(n−1)/n for all-reduce."),
            Mistake(2 * algbw / GB, f"the factor is 2·(n−1)/n, not 2: with {BUSBW_RANKS} ranks, {2 * (BUSBW_RANKS - 1) / BUSBW_RANKS:g}."),
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
                                            f"while backward ({p['step']['backward']} ms) still runs."),
            Mistake(COMPUTE * 1e3, f"the all-reduce ({p['step']['comm']} ms) is longer than the backward it "
                                   f"hides behind ({p['step']['backward']} ms): "
                                   f"{p['step']['comm'] - p['step']['backward']} ms stay exposed."),
        )),
        # Quiz 7: the ring's (n−1)/n is 1/n of the rounded figure: 1.25/n (at least 2%) accepts
        # the many-ranks 8000 (the prose's and the docstring's figure) on 32 GPUs or more.
        Item("06-min-tokens", min_tokens, "tokens", rel_tol=either_way(RANKS), mistakes=(
            Mistake(min_tokens * 4 / 6, "that compares the all-reduce with the whole step (6NT "
                                        "FLOPs); it overlaps only with backward (4NT)."),
            Mistake(min_tokens * 2, "2x too large: either you compared with the forward (2NT) "
                                    "instead of backward (4NT), or took 4-byte gradients where the "
                                    "question says bf16."),
            Mistake(arith.min_tokens_compute_bound(RANKS, p["nic"]["gbit"] * 1e9, F),
                    f"{p['nic']['gbit']} Gb/s is bits per second: {p['nic']['gbytes']} GB/s."),
        )),
        # Quiz 8
        Item("06-min-batch", math.ceil(min_tokens / SEQ), "sequences", mistakes=(
            Mistake(math.floor(min_tokens / SEQ), "round up: a smaller batch leaves the all-reduce "
                                                  "exposed."),
        )),
        # Quiz 9: reasoning, no formula to plug into.
        Item("06-dp-remedy", "c", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "more GPUs at the same per-GPU batch leave each GPU's compute as it was, "
                         f"and the ring all-reduce barely changes ((n−1)/n goes from {RANKS - 1}/{RANKS} to "
                         f"{2 * RANKS - 1}/{2 * RANKS}): the share of communication stays."),
            Mistake("b", "ZeRO-2 sends the same 2Ψ per step (a reduce-scatter plus an all-gather is "
                         "an all-reduce): it saves memory, not time."),
            Mistake("d", "without no_sync() DDP all-reduces after every backward, so four "
                         "micro-batches cost four all-reduces: nothing gained."),
        )),
        # Quiz 10
        Item("06-zero2-gb", zero_gb(ZERO2_GPUS, 2), "GB", rel_tol=0.01, mistakes=(
            Mistake(zero_gb(ZERO2_GPUS, 1), "that is stage 1 (only the optimizer states sharded); "
                                        "stage 2 shards the gradients too: 2Ψ + 14Ψ/n."),
            Mistake(zero_gb(ZERO2_GPUS, 3), "that is stage 3 (parameters sharded too); stage 2 keeps "
                                        "the full bf16 parameters on every GPU."),
            Mistake(zero_gb(ZERO2_GPUS, 0), "that is plain data parallelism (16 bytes per parameter on "
                                        "every GPU); ZeRO-2 shards gradients and optimizer states."),
        )),
        # Quiz 11: rounding down and reading the budget as GiB are two slips; on the small
        # models they give the same number, on 175B they do not (58 vs 62 at 45 GB).
        Item("06-zero3-gpus", fewest_gpus(PSI_70B, BUDGET), "GPUs", mistakes=(
            *zero3_budget_slips(PSI_70B, p["budget_gb"]),
            Mistake(fewest_gpus(PSI_70B, BUDGET, 12), "12 bytes per parameter is the optimizer state "
                                                      "alone; ZeRO-3 shards all 16 (weights, "
                                                      "gradients and optimizer state)."),
            Mistake(fewest_gpus(PSI_70B, BUDGET, 2), "that shards the bf16 weights alone; ZeRO-3's "
                                                     "shard holds 16 bytes per parameter."),
        )),
        # Quiz 12: N = 64 stated; 2%, so that the paper's rounded 3Ψ (45 GB) passes too.
        Item("06-zero3-comm-gb", arith.zero_comm_bytes(PSI_ZERO, 3, n_gpus=ZERO_GPUS) / GB, "GB",
             rel_tol=either_way(ZERO_GPUS), mistakes=(
            Mistake(arith.zero_comm_bytes(PSI_ZERO, 2, n_gpus=ZERO_GPUS) / GB,
                    "that is plain DP's (and stages 1-2's) 2Ψ; stage 3 also all-gathers the "
                    "parameters again in backward: 3Ψ."),
            Mistake(arith.zero_comm_bytes(PSI_ZERO, 3, bytes_per_value=4, n_gpus=ZERO_GPUS) / GB,
                    "the parameters and gradients travel in bf16: 2 bytes per value."),
        )),
        # Quiz 13
        Item("06-bubble", arith.pipeline_bubble_fraction(STAGES, MICRO), "", rel_tol=0.01, mistakes=(
            Mistake((STAGES - 1) / MICRO, "that is Narayanan et al.'s bubble time fraction (p−1)/m: "
                                          "the idle time measured against the ideal, useful time. "
                                          "The question asks for the share of the whole step, idle "
                                          "time included: (p−1)/(m+p−1)."),
            Mistake(STAGES / (MICRO + STAGES), "the bubble is p − 1 slots, not p: (p−1)/(m+p−1)."),
        )),
        # Quiz 14: code reading, the training script without sampler.set_epoch(epoch).
        Item("06-sampler-bug", "c", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "DataLoader refuses shuffle=True together with a sampler (\"sampler option "
                         "is mutually exclusive with shuffle\"); the DistributedSampler shuffles."),
            Mistake("b", "the same seed on every rank is what DistributedSampler needs: every rank "
                         "draws the same permutation and takes every n-th sample of it, so the "
                         "shards never overlap. Different seeds would make them overlap."),
            Mistake("d", "the same torch.manual_seed(0) gives every replica the same initial "
                         "weights, which DDP's constructor would broadcast from rank 0 anyway; "
                         "the data each rank reads comes from the sampler."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
