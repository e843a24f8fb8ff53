"""Answer key for chapter 08, watching and fixing a GPU job. Instructor side: never copied into a
release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
import math

from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical
from gpulab.device import health
from gpulab.monitoring import failures, monitor

GiB, MiB = 2**30, 2**20

# The numbers stated in the questions (solutions/08_monitoring, "Quiz" sections). Those in
# PARAMS are canonical values: a graded release with a course seed draws others for each student
# (gpulab.course.variants). The rest are the same for everyone (FIXED says why).
SMI_TOTAL_MIB = 81559                                         # Quiz 1: an H100 80GB, nvidia-smi's MiB
READ_MASK = 0x24                                              # Quiz 5
FRAG_REQUEST, FRAG_TOTAL, FRAG_ALLOC, FRAG_UNALLOC = 3.00, 79.19, 61.20, 14.85   # Quiz 7, GiB
FRAG_FREE = 900 / 1024                                        # the message's "900.00 MiB", in GiB
CHANNELS, SIDE, FP32 = 3, 224, 4                              # Quiz 10: fp32 images
LOSS0, GROWTH = 1.0, 2.25                                     # Quiz 11
INTERRUPTIONS, DAYS, GPUS_SEEN = 419, 54, 16_384              # Quiz 12: Llama 3 paper


def need(state_gb: int, activations_gb: int) -> dict:
    """Quiz 1: chapter 02's prediction, decimal GB."""
    return {"state_gb": state_gb, "activations_gb": activations_gb, "gb": state_gb + activations_gb}


def power(power_w: int, cap_w: int) -> dict:
    """Quiz 2: the mean draw the monitor shows, at least 5% under the cap (a distinct slip)."""
    return {"power_w": power_w, "cap_w": cap_w}


def step(seqs: int, seq_len: int, step_s: float) -> dict:
    """Quizzes 2-3: a batch and its step time (10k-60k tokens/s: a small model on one GPU)."""
    return {"seqs": seqs, "seq_len": seq_len, "step_s": step_s}


THERMAL_SWAP = {
    0x40: (0x20, "that is SwThermalSlowdown (0x20), the driver's own thermal slowdown; the "
                 "question's is the hardware one, HwThermalSlowdown (0x40)."),
    0x20: (0x40, "that is HwThermalSlowdown (0x40), the hardware's own thermal cut; the "
                 "question's is the driver's, SwThermalSlowdown (0x20)."),
}


def mask(situation: str, first: tuple, second: tuple) -> dict:
    """Quiz 4: two clock-event reasons (nvml.h's bits, health.CLOCK_EVENTS), each (bit, how a
    slip names it); the second is the one a learner may give alone. The answer is the mask a GPU
    reports, with HwSlowdown (0x8) wherever a hardware slowdown is active
    (health.reported_clock_events)."""
    return {"situation": situation, "first": first, "second": second}


def oom(total: float, free: float, allocated: float, unallocated: float, where: str) -> dict:
    """Quiz 6: a CUDA OOM message's numbers, GiB (the canonical one is printed above the quiz)."""
    return {"total": total, "free": free, "allocated": allocated, "unallocated": unallocated,
            "where": where}


def workers(n: int, word: str) -> dict:
    return {"n": n, "word": word}


ELSEWHERE = "a message in the same format"
PARAMS = {
    "used_mib": Param(3210, (1240, 3210, 4626, 6418, 8002)),                     # Quiz 1
    "need": Param(need(40, 24), (need(40, 24), need(36, 20), need(48, 16), need(30, 30),
                                 need(44, 24), need(28, 32))),
    "power": Param(power(650, 700), (power(650, 700), power(610, 700), power(380, 400),   # Quiz 2
                                     power(920, 1000), power(300, 350))),
    "step": Param(step(8, 2048, 0.42), (step(8, 2048, 0.42), step(4, 4096, 0.55),         # Quizzes 2-3
                                        step(16, 1024, 0.38), step(8, 4096, 0.9),
                                        step(16, 2048, 0.75), step(32, 1024, 0.6))),
    "mask": Param(
        mask("is at its power limit and past its **hardware** thermal threshold",
             (0x4, "the power cap"), (0x40, "the thermal bit")), (
        mask("is at its power limit and past its **hardware** thermal threshold",
             (0x4, "the power cap"), (0x40, "the thermal bit")),
        mask("is at its power limit while the chassis applies its external **power brake**",
             (0x4, "the power cap"), (0x80, "the power-brake bit")),
        mask("is past its **hardware** thermal threshold while the chassis applies its external "
             "**power brake**", (0x80, "the power brake"), (0x40, "the thermal bit")),
        mask("is past the driver's **software** thermal limit while the chassis applies its "
             "external **power brake**", (0x80, "the power brake"), (0x20, "the thermal bit")),
        mask("is at its power limit and runs at the **application clocks** someone set with "
             "`nvidia-smi -ac`", (0x4, "the power cap"), (0x2, "the application-clocks bit")))),
    "oom": Param(oom(79.19, 1.06, 74.10, 2.95, "the message above"), (                      # Quiz 6
        oom(79.19, 1.06, 74.10, 2.95, "the message above"),
        oom(79.19, 0.56, 70.42, 6.71, ELSEWHERE),
        oom(79.19, 2.31, 63.88, 1.24, ELSEWHERE),         # another process holds about 10 GiB
        oom(39.39, 0.41, 36.12, 1.87, ELSEWHERE),
        oom(39.39, 1.14, 30.05, 0.62, ELSEWHERE),         # about 7 GiB outside
        oom(23.65, 0.32, 21.40, 1.09, ELSEWHERE))),
    "workers": Param(workers(8, "eight"), (workers(6, "six"), workers(8, "eight"),          # Quiz 10
                                           workers(12, "twelve"), workers(16, "sixteen"))),
    "prefetch": Param(2, (2, 3)),                     # 4 would make two slips the same number
    "images": Param(256, (64, 128, 192, 256, 384, 512)),
    "job_gpus": Param(2048, (512, 1024, 2048, 4096, 8192)),                                # Quiz 12
    "ckpt_min": Param(3, (2, 3, 5, 10)),                                                   # Quiz 13
    "mtbf_h": Param(24, (8, 12, 24, 36, 48)),                                               # Quizzes 13-14
    "loss_pct": Param(1, (0.5, 1, 2)),                                                      # Quiz 14
}
QUESTIONS = {
    "ch08-md-q-headroom": "### Quiz 1: headroom, in the right units\n\n`nvidia-smi` shows `{used_mib}MiB / "
                          "81559MiB` on an H100 before your job starts. Chapter 02's\narithmetic says your "
                          "run needs {need[state_gb]} GB of model state and {need[activations_gb]} GB of "
                          "activations (decimal GB). How\nmany **GiB** of headroom remain once it runs "
                          "(ignore your own CUDA context)?",
    "ch08-md-q-energy": "### Quiz 2: energy per step\n\nDuring training the monitor shows a mean of "
                        "{power[power_w]} W on a GPU whose cap is {power[cap_w]} W; a step takes\n"
                        "{step[step_s]} s. How many **joules** does one step use on this GPU?",
    "ch08-md-q-kwh": "### Quiz 3: tokens per kilowatt-hour\n\nEach step of Quiz 2 trains a batch of "
                     "{step[seqs]} sequences of {step[seq_len]} tokens. How many **tokens per kWh**\n"
                     "does this GPU train?",
    "ch08-md-q-mask": "### Quiz 4: build a mask\n\nDuring a run the GPU {mask[situation]}. Current "
                      "drivers also set HwSlowdown (0x8)\nwhenever HwThermalSlowdown (0x40) or "
                      "HwPowerBrakeSlowdown (0x80) is active (section 3).\nWhat value (as a number, e.g. "
                      "`0x10` or `16`) does `nvmlDeviceGetCurrentClocksEventReasons`\nreturn, with no "
                      "other reason active?",
    "ch08-md-q-oom-outside": "### Quiz 6: memory outside PyTorch\n\nFrom {oom[where]} (total {oom[total]:.2f} "
                             "GiB, {oom[free]:.2f} GiB free, {oom[allocated]:.2f} GiB allocated by PyTorch, "
                             "{oom[unallocated]:.2f} GiB\nreserved by PyTorch but unallocated): how many "
                             "**GiB** are held outside PyTorch's allocator?",
    "ch08-md-q-shm": "### Quiz 10: shared memory for {workers[word]} workers\n\n`num_workers={workers[n]}`, "
                     "`prefetch_factor={prefetch}`, batches of {images} fp32 images of 3 × 224 × 224. How "
                     "many **GB**\n(10⁹ bytes) of `/dev/shm` can the batches in flight take?",
    "ch08-md-q-mtbf": "### Quiz 12: your job's mean time between failures\n\nYour job runs on {job_gpus:,} "
                      "GPUs that fail as often as Llama 3's did (419 interruptions in 54 days on\n16,384 "
                      "GPUs). How many **hours** between failures do you expect?",
    "ch08-md-q-young": "### Quiz 13: Young's interval\n\nA checkpoint takes {ckpt_min} minutes to write, and "
                       "the job fails on average once every {mtbf_h} hours. What\ncheckpoint interval, in "
                       "**minutes**, does Young's formula give?",
    "ch08-md-q-maxint": "### Quiz 14: at most {loss_pct}% lost to crashes\n\nFor the same job (one failure "
                        "per {mtbf_h} h on average), what is the longest checkpoint interval, in\n"
                        "**minutes**, for which the work redone after failures stays at or below "
                        "{loss_pct}% of the run (count only\nthe rework, not the time spent writing "
                        "checkpoints)?",
}
FIXED = {
    "08-clock-cause": "a choice of four words, reading the mask 0x24 the chapter's text also decodes",
    "08-oom-fix": "a choice of four fixes; the message's numbers illustrate fragmentation, and the "
                  "right word ('expandable_segments') is the same for any numbers that do",
    "08-assert-env": "a choice of four environment variables: a fact about CUDA and PyTorch",
    "08-no-kernel-fix": "a choice of four fixes for a published GPU and a published torch build",
    "08-first-inf-step": "Experiment 3 trains this run and measures the step the learner predicts",
    "08-leak-line": "a choice of four lines in a fixed piece of code (code reading)",
}


def _names(mask: int) -> str:
    return ", ".join(health.decode_clock_events(mask))


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    SMI_USED_MIB, NEED_GB = p["used_mib"], p["need"]["gb"]           # Quiz 1: MiB; decimal GB
    POWER_W, CAP_W = float(p["power"]["power_w"]), float(p["power"]["cap_w"])   # Quiz 2
    STEP_S = p["step"]["step_s"]
    TOKENS_PER_STEP = p["step"]["seqs"] * p["step"]["seq_len"]       # Quiz 3
    (FIRST_BIT, first_name), (SECOND_BIT, second_name) = p["mask"]["first"], p["mask"]["second"]  # Quiz 4
    OOM_TOTAL, OOM_FREE = p["oom"]["total"], p["oom"]["free"]        # Quiz 6, GiB
    OOM_ALLOC, OOM_UNALLOC = p["oom"]["allocated"], p["oom"]["unallocated"]
    WORKERS, PREFETCH = p["workers"]["n"], p["prefetch"]            # Quiz 10
    BATCH_BYTES = p["images"] * CHANNELS * SIDE * SIDE * FP32
    JOB_GPUS = p["job_gpus"]                                         # Quiz 12
    CKPT_MIN, MTBF_MIN = float(p["ckpt_min"]), p["mtbf_h"] * 60.0    # Quizzes 13 and 14
    LOSS = p["loss_pct"] / 100

    energy_j = monitor.energy_per_step(POWER_W, STEP_S)
    headroom_gib = (SMI_TOTAL_MIB - SMI_USED_MIB) / 1024 - NEED_GB * 1e9 / GiB
    reasons = FIRST_BIT | SECOND_BIT
    clock_mask = health.reported_clock_events(reasons)                 # 0x8 with a hardware slowdown
    oom_outside_gib = OOM_TOTAL - OOM_FREE - OOM_ALLOC - OOM_UNALLOC
    frag_report = failures.OOMReport(*(round(x * GiB) for x in
                                       (FRAG_REQUEST, FRAG_TOTAL, FRAG_FREE, FRAG_ALLOC, FRAG_UNALLOC)))
    gpu_mtbf_h = GPUS_SEEN * DAYS * 24 / INTERRUPTIONS
    job_mtbf_h = failures.cluster_mtbf(gpu_mtbf_h, JOB_GPUS)
    young_min = failures.young_interval(CKPT_MIN, MTBF_MIN)
    max_interval_min = failures.max_interval_for_loss(MTBF_MIN, LOSS)

    hex_digits = f"{clock_mask:x}"
    mask_slips = []
    if clock_mask >= 16 and hex_digits.isdigit():       # 0x44 read as 44
        mask_slips.append(Mistake(int(hex_digits), f"you wrote the hex digits {clock_mask:#x} as a "
                                  f"decimal number: {clock_mask:#x} = {clock_mask >> 4}·16 + "
                                  f"{clock_mask & 15} = {clock_mask}."))
    if reasons != clock_mask:                            # the two bits, without HwSlowdown
        mask_slips.append(Mistake(reasons, f"those are the two reasons' bits, {reasons:#x}; a GPU also "
                                  "reports HwSlowdown (0x8) whenever HwThermalSlowdown or "
                                  f"HwPowerBrakeSlowdown is active: {reasons:#x} | 0x8 = {clock_mask:#x}."))
    if SECOND_BIT in THERMAL_SWAP:                       # the other thermal bit
        other, says = THERMAL_SWAP[SECOND_BIT]
        mask_slips.append(Mistake(health.reported_clock_events(FIRST_BIT | other), says))
    mask_slips += [
        Mistake(clock_mask | 0x1, f"that sets GpuIdle (0x1) too: {clock_mask | 0x1:#x} = {clock_mask:#x} | 0x1; "
                                  "a GPU running a job is not idle."),
        Mistake(FIRST_BIT * SECOND_BIT, "bits combine with OR (here the same as adding), "
                                        "not by multiplying."),
        Mistake(health.reported_clock_events(SECOND_BIT),
                f"that is {second_name} alone; {first_name} ({FIRST_BIT:#x}) is set too."),
    ]
    shm_bytes = failures.shm_bytes_needed(WORKERS, PREFETCH, BATCH_BYTES)
    mtbf_text = f"{p['mtbf_h']} h"
    need_gib = NEED_GB * 1e9 / GiB

    return [
        Item("08-headroom-gib", headroom_gib, "GiB", rel_tol=0.01, mistakes=(
            Mistake((SMI_TOTAL_MIB - SMI_USED_MIB) / 1024 - NEED_GB, f"you subtracted {NEED_GB} GB as if it "
                    f"were {NEED_GB} GiB: chapter 02's bytes are decimal ({NEED_GB}e9 B = {need_gib:.1f} GiB), "
                    "nvidia-smi's MiB binary: convert one to the other first."),
            Mistake((SMI_TOTAL_MIB - SMI_USED_MIB) / 1000 - NEED_GB * 1e9 / GiB, "nvidia-smi's MiB are "
                    "binary: divide by 1024 to get GiB, not by 1000."),
            Mistake(SMI_TOTAL_MIB / 1024 - NEED_GB * 1e9 / GiB, f"you left out the {SMI_USED_MIB} MiB "
                    "already in use before your job starts (other processes, CUDA contexts)."),
        )),
        Item("08-energy-step-j", energy_j, "J", rel_tol=0.01, mistakes=(
            Mistake(monitor.energy_per_step(CAP_W, STEP_S), f"that uses the {CAP_W:g} W cap; the energy "
                    f"is the power actually drawn, {POWER_W:g} W as the monitor measured, times the time."),
            Mistake(POWER_W * STEP_S * 1e3, f"the step is {STEP_S:g} s, not {STEP_S * 1e3:g}: watts times "
                                            "seconds give joules."),
            Mistake(POWER_W / STEP_S, "energy is power TIMES time (1 J = 1 W·s), not divided."),
        )),
        Item("08-tokens-per-kwh", monitor.tokens_per_kwh(TOKENS_PER_STEP, energy_j), "tokens/kWh",
             rel_tol=0.01, mistakes=(
            Mistake(monitor.tokens_per_kwh(TOKENS_PER_STEP, energy_j) / 1e3, "that is per Wh: a kWh "
                    "is 1000 Wh = 3.6e6 J."),
            Mistake(3.6e6 / energy_j, f"that is steps per kWh; each step trains {p['step']['seqs']} x "
                                      f"{p['step']['seq_len']} tokens."),
            Mistake(TOKENS_PER_STEP * 1e3 / energy_j, "a kWh is 3.6e6 J (1000 W for 3600 s), not "
                                                      "1000 J."),
        )),
        Item("08-clock-mask", clock_mask, "", mistakes=tuple(mask_slips)),
        Item("08-clock-cause", "both", "", choices=("power", "thermal", "both", "idle"), mistakes=(
            Mistake("power", f"0x24 = 0x20 + 0x4: besides SwPowerCap (0x4) the SwThermalSlowdown bit "
                             f"(0x20) is set ({_names(READ_MASK)})."),
            Mistake("thermal", "0x24 = 0x20 + 0x4: besides the thermal bit, SwPowerCap (0x4) is set: "
                               "the GPU also draws its full power limit."),
            Mistake("idle", "GpuIdle is bit 0x1, not set in 0x24 (= 0x20 + 0x4)."),
        )),
        Item("08-oom-outside-gib", oom_outside_gib, "GiB", rel_tol=0.02, abs_tol=0.005, mistakes=(
            Mistake(OOM_TOTAL - OOM_FREE - OOM_ALLOC, f"you forgot the {OOM_UNALLOC:.2f} GiB reserved by "
                    "PyTorch but unallocated: PyTorch holds it (its cache), so it is not outside PyTorch."),
            Mistake(OOM_TOTAL - OOM_ALLOC, f"the {OOM_FREE:.2f} GiB free is nobody's: subtract it too."),
            Mistake(OOM_TOTAL - OOM_FREE, "that is everything in use; take away what PyTorch holds "
                                          "(allocated + reserved but unallocated)."),
        )),
        Item("08-oom-fix", failures.oom_fix(frag_report), "",
             choices=("expandable_segments", "smaller_batch", "empty_cache", "other_process"),
             mistakes=(
            Mistake("smaller_batch", "that would work, at a cost in throughput, but look again: "
                    "PyTorch already holds 14.85 GiB reserved but unallocated, five times the 3 GiB "
                    "asked for. The memory is there, in pieces: fragmentation."),
            Mistake("empty_cache", "before raising, the allocator already returned every wholly free "
                    "segment to the driver; the 14.85 GiB left are free pieces of partly used "
                    "segments, which empty_cache cannot release either."),
            Mistake("other_process", "900 MiB free is 0.88 GiB, so total − free − reserved = "
                    "79.19 − 0.88 − 76.05 = 2.26 GiB is outside PyTorch: a CUDA context and little "
                    "else. The memory is in PyTorch's cache."),
        )),
        Item("08-assert-env", "cuda_launch_blocking", "",
             choices=("cuda_launch_blocking", "torch_use_cuda_dsa", "cuda_visible_devices",
                      "pytorch_cuda_alloc_conf"), mistakes=(
            Mistake("torch_use_cuda_dsa", "TORCH_USE_CUDA_DSA is a build flag: it works only when "
                    "PyTorch itself is compiled with it. At run time, CUDA_LAUNCH_BLOCKING=1 makes each "
                    "launch wait for its kernel."),
            Mistake("cuda_visible_devices", "that chooses which GPUs the process sees (chapter 01); "
                    "it does not change when errors are reported."),
            Mistake("pytorch_cuda_alloc_conf", "that configures the caching allocator (e.g. "
                    "expandable_segments); this is a kernel error, not a memory one."),
        )),
        Item("08-no-kernel-fix", "new_torch_build", "",
             choices=("new_torch_build", "new_driver", "cuda_visible_devices", "smaller_batch"),
             mistakes=(
            Mistake("new_driver", "the driver can only run the kernels the torch binary carries; "
                    "this build has machine code up to sm_90 and no PTX, nothing for sm_120. A torch "
                    "build listing sm_120 (a newer CUDA build) is needed."),
            Mistake("cuda_visible_devices", "the only GPU is the sm_120 one: hiding it runs on the "
                    "CPU, it does not make kernels appear."),
            Mistake("smaller_batch", "'no kernel image' is not about memory: torch has no compiled "
                    "code for this GPU's architecture."),
        )),
        Item("08-shm-gb", shm_bytes / 1e9, "GB", rel_tol=0.01, mistakes=(
            Mistake(WORKERS * BATCH_BYTES / 1e9, f"each worker keeps prefetch_factor = {PREFETCH} batches "
                                                 f"ready, not one: {WORKERS} x {PREFETCH} batches."),
            Mistake(shm_bytes / GiB, "that is in GiB; the question asks for decimal GB (1e9 bytes)."),
            Mistake(failures.shm_bytes_needed(WORKERS, PREFETCH, BATCH_BYTES // 4) / 1e9, "the images "
                    "are float32: 4 bytes per value, not 1."),
            Mistake(PREFETCH * BATCH_BYTES / 1e9, f"all {WORKERS} workers fill shared memory at once."),
        )),
        Item("08-first-inf-step", failures.steps_to_overflow(LOSS0, GROWTH), "step", mistakes=(
            Mistake(failures.steps_to_overflow(LOSS0, GROWTH) - 1, "at step 13 the loss is "
                    "2.25^13 = 37,877, still below fp16's 65,504: the first inf comes one step later."),
            Mistake(math.log(65504 / LOSS0) / math.log(GROWTH), "steps are whole numbers: round up "
                                                                 "the log ratio to the next step."),
            Mistake(16, "that is for a loss that doubles; this one grows 2.25x per step."),
        )),
        # 3.5%: the chapter's "every 3.1 hours", or 3 h, times the GPU ratio is right too.
        Item("08-job-mtbf-h", job_mtbf_h, "h", rel_tol=0.035, mistakes=(
            Mistake(DAYS * 24 / INTERRUPTIONS, f"that is the MTBF of the {GPUS_SEEN:,}-GPU job; your job "
                    f"has {JOB_GPUS:,} GPUs, {GPUS_SEEN // JOB_GPUS} times fewer to fail: "
                    f"{GPUS_SEEN // JOB_GPUS} times longer between failures."),
            Mistake(gpu_mtbf_h, f"that is one GPU's MTBF; a job that stops when any of its {JOB_GPUS:,} GPUs "
                                f"fails fails {JOB_GPUS:,} times as often."),
            Mistake(DAYS * 24 / INTERRUPTIONS * JOB_GPUS / GPUS_SEEN, "the failure rate scales with "
                    "the number of GPUs: fewer GPUs, LONGER between failures."),
        )),
        # Quiz 15: the logits kept for later hold each step's [B, T, V] on the GPU.
        Item("08-leak-line", "d", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "the forward's activations are freed by the backward on the next line: "
                         "nothing from (a) outlives the step unless something keeps a reference."),
            Mistake("b", "backward frees the graph's saved tensors (retain_graph=False is the "
                         "default); the gradients it writes are the same tensors every step."),
            Mistake("c", "zero_grad(set_to_none=True) releases the gradients; it cannot make memory "
                         "grow."),
        )),
        Item("08-young-interval-min", young_min, "min", rel_tol=0.01, mistakes=(
            Mistake(math.sqrt(CKPT_MIN * MTBF_MIN), "Young's interval is √(2δM): you left out the 2, "
                    "which comes from losing half an interval per failure on average."),
            Mistake(math.sqrt(2 * CKPT_MIN * p["mtbf_h"]), f"M = {mtbf_text} must be in minutes like δ: "
                                                           f"{MTBF_MIN:g} min."),
            Mistake(math.sqrt(2 * CKPT_MIN / 60 * p["mtbf_h"]), "that is in hours; give minutes."),
            Mistake(2 * CKPT_MIN * MTBF_MIN, "take the square root: √(2δM)."),
        )),
        Item("08-max-interval-min", max_interval_min, "min", rel_tol=0.01, mistakes=(
            Mistake(LOSS * MTBF_MIN, "a failure loses half an interval on average, τ/2, so the loss "
                    f"per unit of time is τ/(2M) ≤ {p['loss_pct']}%: τ = 2 x {LOSS:g} x M."),
            Mistake(LOSS * MTBF_MIN / 2, f"the loss is τ/(2M) ≤ {LOSS:g}, so τ = {2 * LOSS:g}·M "
                                         "(multiply by 2, do not divide)."),
            Mistake(2 * LOSS * p["mtbf_h"], "that is in hours; give minutes."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
