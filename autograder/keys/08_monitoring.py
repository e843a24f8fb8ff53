"""Answer key for chapter 08, watching and fixing a GPU job. Instructor side: never copied into a
release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
import math

from gpulab import failures, monitor
from gpulab.checks import Item, Mistake

GiB, MiB = 2**30, 2**20

# The numbers stated in the questions (solutions/08_monitoring, "Quiz" sections).
SMI_TOTAL_MIB, SMI_USED_MIB = 81559, 3210                     # Quiz 1: nvidia-smi's MiB
NEED_GB = 40 + 24                                             # Quiz 1: decimal GB, chapter 02
POWER_W, STEP_S, CAP_W = 650.0, 0.42, 700.0                   # Quiz 2
TOKENS_PER_STEP = 8 * 2048                                    # Quiz 3
POWER_CAP_BIT, HW_THERMAL_BIT = 0x4, 0x40                     # Quiz 4: nvml.h's bits
SW_THERMAL_BIT = 0x20
READ_MASK = 0x24                                              # Quiz 5
OOM_TOTAL, OOM_FREE, OOM_ALLOC, OOM_UNALLOC = 79.19, 1.06, 74.10, 2.95   # Quiz 6, GiB
FRAG_REQUEST, FRAG_TOTAL, FRAG_FREE, FRAG_ALLOC, FRAG_UNALLOC = 3.00, 79.19, 0.90, 61.20, 14.85  # Quiz 7
BATCH_BYTES = 256 * 3 * 224 * 224 * 4                         # Quiz 10: fp32 images
WORKERS, PREFETCH = 8, 2
LOSS0, GROWTH = 1.0, 2.25                                     # Quiz 11
INTERRUPTIONS, DAYS, GPUS_SEEN = 419, 54, 16_384              # Quiz 12: Llama 3 paper
JOB_GPUS = 2048
CKPT_MIN, MTBF_MIN = 3.0, 24 * 60.0                           # Quizzes 13 and 14

energy_j = monitor.energy_per_step(POWER_W, STEP_S)
headroom_gib = (SMI_TOTAL_MIB - SMI_USED_MIB) / 1024 - NEED_GB * 1e9 / GiB
oom_outside_gib = OOM_TOTAL - OOM_FREE - OOM_ALLOC - OOM_UNALLOC
frag_report = failures.OOMReport(*(round(x * GiB) for x in
                                   (FRAG_REQUEST, FRAG_TOTAL, FRAG_FREE, FRAG_ALLOC, FRAG_UNALLOC)))
gpu_mtbf_h = GPUS_SEEN * DAYS * 24 / INTERRUPTIONS
job_mtbf_h = failures.cluster_mtbf(gpu_mtbf_h, JOB_GPUS)
young_min = failures.young_interval(CKPT_MIN, MTBF_MIN)
max_interval_min = failures.max_interval_for_loss(MTBF_MIN, 0.01)


def _names(mask: int) -> str:
    return ", ".join(failures.decode_clock_events(mask))


ITEMS = [
    Item("08-headroom-gib", headroom_gib, "GiB", rel_tol=0.01, mistakes=(
        Mistake((SMI_TOTAL_MIB - SMI_USED_MIB) / 1024 - NEED_GB, "you subtracted 64 GB as if it "
                "were 64 GiB: chapter 02's bytes are decimal (64e9 B = 59.6 GiB), nvidia-smi's MiB "
                "binary: convert one to the other first."),
        Mistake((SMI_TOTAL_MIB - SMI_USED_MIB) / 1000 - NEED_GB * 1e9 / GiB, "nvidia-smi's MiB are "
                "binary: divide by 1024 to get GiB, not by 1000."),
        Mistake(SMI_TOTAL_MIB / 1024 - NEED_GB * 1e9 / GiB, "you left out the 3210 MiB already "
                "in use before your job starts (other processes, CUDA contexts)."),
    )),
    Item("08-energy-step-j", energy_j, "J", rel_tol=0.01, mistakes=(
        Mistake(monitor.energy_per_step(CAP_W, STEP_S), "that uses the 700 W cap; the energy "
                "is the power actually drawn, 650 W as the monitor measured, times the time."),
        Mistake(POWER_W * STEP_S * 1e3, "the step is 0.42 s, not 420: watts times seconds give "
                                        "joules."),
        Mistake(POWER_W / STEP_S, "energy is power TIMES time (1 J = 1 W·s), not divided."),
    )),
    Item("08-tokens-per-kwh", monitor.tokens_per_kwh(TOKENS_PER_STEP, energy_j), "tokens/kWh",
         rel_tol=0.01, mistakes=(
        Mistake(monitor.tokens_per_kwh(TOKENS_PER_STEP, energy_j) / 1e3, "that is per Wh: a kWh "
                "is 1000 Wh = 3.6e6 J."),
        Mistake(3.6e6 / energy_j, "that is steps per kWh; each step trains 8 x 2048 tokens."),
        Mistake(TOKENS_PER_STEP * 1e3 / energy_j, "a kWh is 3.6e6 J (1000 W for 3600 s), not "
                                                  "1000 J."),
    )),
    Item("08-clock-mask", POWER_CAP_BIT | HW_THERMAL_BIT, "", mistakes=(
        Mistake(44, "you wrote the hex digits 0x44 as a decimal number: 0x44 = 4·16 + 4 = 68."),
        Mistake(POWER_CAP_BIT | SW_THERMAL_BIT, "that is SwThermalSlowdown (0x20), the driver's "
                "own thermal slowdown; the question's is the hardware one, HwThermalSlowdown (0x40)."),
        Mistake(POWER_CAP_BIT * HW_THERMAL_BIT, "bits combine with OR (here the same as adding), "
                                                "not by multiplying."),
        Mistake(HW_THERMAL_BIT, "that is the thermal bit alone; the power cap (0x4) is set too."),
    )),
    Item("08-clock-cause", "both", "", choices=("power", "thermal", "both", "idle"), mistakes=(
        Mistake("power", f"0x24 = 0x20 + 0x4: besides SwPowerCap (0x4) the SwThermalSlowdown bit "
                         f"(0x20) is set ({_names(READ_MASK)})."),
        Mistake("thermal", "0x24 = 0x20 + 0x4: besides the thermal bit, SwPowerCap (0x4) is set: "
                           "the GPU also draws its full power limit."),
        Mistake("idle", "GpuIdle is bit 0x1, not set in 0x24 (= 0x20 + 0x4)."),
    )),
    Item("08-oom-outside-gib", oom_outside_gib, "GiB", rel_tol=0.02, abs_tol=0.005, mistakes=(
        Mistake(OOM_TOTAL - OOM_FREE - OOM_ALLOC, "you forgot the 2.95 GiB reserved by PyTorch "
                "but unallocated: PyTorch holds it (its cache), so it is not outside PyTorch."),
        Mistake(OOM_TOTAL - OOM_ALLOC, "the 1.06 GiB free is nobody's: subtract it too."),
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
        Mistake("other_process", "total − free − reserved = 79.19 − 0.90 − 76.05 = 2.24 GiB "
                "outside PyTorch: a CUDA context and little else. The memory is in PyTorch's cache."),
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
    Item("08-shm-gb", failures.shm_bytes_needed(WORKERS, PREFETCH, BATCH_BYTES) / 1e9, "GB",
         rel_tol=0.01, mistakes=(
        Mistake(WORKERS * BATCH_BYTES / 1e9, "each worker keeps prefetch_factor = 2 batches "
                                             "ready, not one: 8 x 2 batches."),
        Mistake(failures.shm_bytes_needed(WORKERS, PREFETCH, BATCH_BYTES) / GiB, "that is in GiB; "
                "the question asks for decimal GB (1e9 bytes)."),
        Mistake(failures.shm_bytes_needed(WORKERS, PREFETCH, BATCH_BYTES // 4) / 1e9, "the images "
                "are float32: 4 bytes per value, not 1."),
        Mistake(PREFETCH * BATCH_BYTES / 1e9, "all 8 workers fill shared memory at once."),
    )),
    Item("08-first-inf-step", failures.steps_to_overflow(LOSS0, GROWTH), "step", mistakes=(
        Mistake(failures.steps_to_overflow(LOSS0, GROWTH) - 1, "at step 13 the loss is "
                "2.25^13 = 37,877, still below fp16's 65,504: the first inf comes one step later."),
        Mistake(math.log(65504 / LOSS0) / math.log(GROWTH), "steps are whole numbers: round up "
                                                             "the log ratio to the next step."),
        Mistake(16, "that is for a loss that doubles; this one grows 2.25x per step."),
    )),
    Item("08-job-mtbf-h", job_mtbf_h, "h", rel_tol=0.01, mistakes=(
        Mistake(DAYS * 24 / INTERRUPTIONS, "that is the MTBF of the 16,384-GPU job; your job "
                "has 2,048 GPUs, 8 times fewer to fail: 8 times longer between failures."),
        Mistake(gpu_mtbf_h, "that is one GPU's MTBF; a job that stops when any of its 2,048 GPUs "
                            "fails fails 2,048 times as often."),
        Mistake(DAYS * 24 / INTERRUPTIONS * JOB_GPUS / GPUS_SEEN, "the failure rate scales with "
                "the number of GPUs: fewer GPUs, LONGER between failures."),
    )),
    Item("08-young-interval-min", young_min, "min", rel_tol=0.01, mistakes=(
        Mistake(math.sqrt(CKPT_MIN * MTBF_MIN), "Young's interval is √(2δM): you left out the 2, "
                "which comes from losing half an interval per failure on average."),
        Mistake(math.sqrt(2 * CKPT_MIN * 24), "M = 24 h must be in minutes like δ: 1440 min."),
        Mistake(math.sqrt(2 * CKPT_MIN / 60 * 24), "that is in hours; give minutes."),
        Mistake(2 * CKPT_MIN * MTBF_MIN, "take the square root: √(2δM)."),
    )),
    Item("08-max-interval-min", max_interval_min, "min", rel_tol=0.01, mistakes=(
        Mistake(0.01 * MTBF_MIN, "a failure loses half an interval on average, τ/2, so the loss "
                "per unit of time is τ/(2M) ≤ 1%: τ = 2 x 0.01 x M."),
        Mistake(0.01 * MTBF_MIN / 2, "the loss is τ/(2M) ≤ 0.01, so τ = 0.02·M (multiply by 2, "
                                     "do not divide)."),
        Mistake(0.02 * 24, "that is in hours; give minutes."),
    )),
]
