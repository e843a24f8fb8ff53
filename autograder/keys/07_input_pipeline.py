"""Answer key for chapter 07, the input pipeline, profiling and utilisation. Instructor side: never
copied into a release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
from gpulab import arith, pipeline
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical

# The numbers stated in the questions (solutions/07_input_pipeline, "Quiz" sections); seconds.
# Those in PARAMS are canonical values (in ms, µs or s as the questions state them): a graded
# release with a course seed draws others for each student (gpulab.course.variants). The rest are the
# same for everyone (FIXED says why).
BOUND_LOAD, BOUND_WORKERS, BOUND_COPY, BOUND_COMPUTE = 0.120, 2, 0.005, 0.050   # Quiz 5
SMS = 132                                                        # H100 SXM, Quiz 10
PEAK = 989.4e12                                                  # Quiz 11: bf16 dense peak


def loop(sample_ms: int, batch: int, copy_ms: int, compute_ms: int, workers: int) -> dict:
    """Quizzes 1-3 and 8: a batch loaded per worker always faster than the compute (Quiz 2's
    slowest stage), and no slip's value within a tolerance of the answer or of another slip."""
    return {"sample_ms": sample_ms, "batch": batch, "copy_ms": copy_ms, "compute_ms": compute_ms,
            "workers": workers, "load_ms": sample_ms * batch}


def slow(wait_ms: int, batch: int, step_ms: int) -> dict:
    """Quiz 4's streamed dataset: the batch's load is not a whole number of steps (at least a
    fifth of a step from one), so the answer is never an exact tie, which section 1 warns jitter
    would slow."""
    return {"wait_ms": wait_ms, "batch": batch, "step_ms": step_ms, "load_ms": wait_ms * batch}


def steps(before_ms: int, after_ms: int) -> dict:
    return {"before_ms": before_ms, "after_ms": after_ms}


def stream(samples: int, batch: int, workers: int) -> dict:
    """Quiz 13's unsharded IterableDataset: the samples fill whole batches, also when split among
    the workers, and no slip's count (one pass, one worker's share, samples) equals another's."""
    return {"samples": samples, "batch": batch, "workers": workers}


PARAMS = {
    "loop": Param(loop(2, 32, 3, 40, 4), tuple(loop(*numbers) for numbers in (
        (2, 32, 3, 40, 4), (1, 24, 2, 60, 6), (2, 24, 4, 50, 6), (2, 32, 5, 80, 6), (2, 64, 2, 30, 8),
        (3, 16, 5, 50, 8), (3, 24, 4, 60, 8), (3, 32, 2, 60, 6), (3, 32, 4, 80, 4), (3, 64, 4, 60, 6),
        (3, 64, 8, 40, 8), (4, 16, 5, 30, 6), (4, 32, 5, 50, 6)))),
    "slow": Param(slow(5, 60, 40), (slow(5, 60, 40), slow(4, 50, 30), slow(6, 64, 36), slow(3, 80, 50),
                                    slow(5, 40, 30), slow(10, 36, 50), slow(4, 70, 45))),    # Quiz 4
    "many_workers": Param(8, (6, 8, 12, 16)),                         # Quizzes 6-7
    "cores": Param(2, (2, 3, 4)),
    "kernels": Param(2000, (500, 1000, 2000, 3000, 5000)),            # Quiz 9
    "kernel_us": Param(4, (2, 3, 4, 5)),
    "launch_us": Param(6, (6, 8, 10)),                                # longer than any kernel
    "tiny_n": Param(64, (32, 64, 128)),                               # Quiz 11
    "tiny_rate": Param(200_000, (100_000, 150_000, 200_000, 300_000, 400_000)),
    "compile_s": Param(60, (30, 45, 60, 90, 120)),                    # Quiz 12
    "steps": Param(steps(300, 200), (steps(300, 200), steps(250, 200), steps(400, 250), steps(500, 300),
                                     steps(120, 80))),
    "stream": Param(stream(1000, 10, 4), (stream(1000, 10, 4), stream(800, 10, 4), stream(1200, 10, 3),  # Quiz 13
                                          stream(960, 8, 4), stream(1000, 20, 2), stream(720, 12, 6))),
}
ITERABLE_QUIZ = (
    "### Quiz 13: read the code: a stream of samples\n\nA dataset streams tokenised samples from "
    "one file, and the loop reads it through\n{stream[workers]} worker processes:\n\n```python\n"
    "class Stream(IterableDataset):\n    def __iter__(self):\n"
    "        for i in range({stream[samples]}):        # the file holds {stream[samples]:,} samples\n"
    "            yield torch.tensor(i)\n\n"
    "loader = DataLoader(Stream(), batch_size={stream[batch]}, num_workers={stream[workers]})\n"
    "batches = sum(1 for batch in loader)\n```\n\nHow many **batches** does one pass over `loader` "
    "yield?")
QUESTIONS = {
    "ch07-md-q1": "### Quiz 1: the serial loop\n\nA loop loads samples at {loop[sample_ms]} ms each, in batches "
                  "of {loop[batch]}, with `num_workers=0`; copying a batch to the\nGPU takes {loop[copy_ms]} ms "
                  "(pageable memory) and the GPU's forward, backward and update take {loop[compute_ms]} ms. How "
                  "many\n**milliseconds** does a step take?",
    "ch07-md-q2": "### Quiz 2: the same loop, overlapped\n\nSame stages, but now `num_workers={loop[workers]}`, "
                  "`pin_memory=True`, and the copy is issued with\n`non_blocking=True` on a second *CUDA stream* "
                  "(a second queue of GPU work, section 3), so that\nit runs beside the compute. How many "
                  "**milliseconds** per step in steady state?",
    "ch07-md-q4": "### Quiz 4: how many workers?\n\nAnother dataset streams its samples from object storage: "
                  "{slow[wait_ms]} ms of waiting per sample, in batches\nof {slow[batch]}. The GPU step (copy "
                  "overlapped) takes {slow[step_ms]} ms. What is the **smallest number of workers** with\n"
                  "which loading no longer slows the step?",
    "ch07-md-q6": "### Quiz 6: I/O-bound loading, {many_workers} workers on {cores} cores\n\nLoading alone (the "
                  "step does nothing), an I/O-bound dataset (each sample waits on network\nstorage) on a "
                  "machine with {cores} free cores: how many **times** more batches per second do\n"
                  "`num_workers={many_workers}` deliver than `num_workers=0`?",
    "ch07-md-q7": "### Quiz 7: CPU-bound loading, {many_workers} workers on {cores} cores\n\nThe same, for a "
                  "CPU-bound dataset (each sample is decoded: pure computation), with {cores} free cores\nand "
                  "nothing else running: how many **times** more batches per second with "
                  "`num_workers={many_workers}` than\nwith `num_workers=0`?",
    "ch07-md-q8": "### Quiz 8: the idle share of the serial loop\n\nIn the loop of Quiz 1 (`num_workers=0`: "
                  "load {loop[load_ms]} ms, copy {loop[copy_ms]} ms, compute {loop[compute_ms]} ms), what share of the\n"
                  "step does the GPU compute **nothing**, as a fraction? (No kernel runs while the batch is "
                  "loaded\nor copied.)",
    "ch07-md-q9": "### Quiz 9: a launch-bound step\n\nA small model's step runs {kernels} kernels of {kernel_us} "
                  "µs each on the GPU; the host needs {launch_us} µs to launch\neach (Python, the dispatcher, "
                  "`cudaLaunchKernel`) and never waits for the GPU within the step. How\nmany "
                  "**milliseconds** does a step take?",
    "ch07-md-q11": "### Quiz 11: its MFU\n\nA loop of bf16 matmuls [{tiny_n}, {tiny_n}] × [{tiny_n}, {tiny_n}] "
                   "runs {tiny_rate:,} of them per second on an H100 SXM, which\nshows 100% utilisation. "
                   "What fraction of the dense bf16 peak (989.4 TFLOP/s) is that, as a\n**fraction**?",
    "ch07-md-q12": "### Quiz 12: when does `torch.compile` pay?\n\nCompiling a model takes {compile_s} s; it "
                   "cuts the step from {steps[before_ms]} ms to {steps[after_ms]} ms. After how many "
                   "**steps** has\nthe compilation paid for itself?",
    "ch07-md-q13": ITERABLE_QUIZ,
}
# Quiz 5 is a choice among three stages, Quiz 10 a reasoning item whose answer (100%) no number
# changes, Quiz 14 a choice among four lines of code.
FIXED = {
    "07-bound-stage": "a choice of three words ('data'); its diagnostics name its numbers",
    "07-util-percent": "100% whatever the kernel: NVML counts time, not SMs (reasoning)",
    "07-clock-line": "a choice of four lines in a fixed piece of code (code reading)",
}


TIMES = {2: "twice", 3: "three times", 4: "four times"}


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    SAMPLE_LOAD, BATCH = p["loop"]["sample_ms"] / 1000, p["loop"]["batch"]           # Quizzes 1-3 and 8
    COPY, COMPUTE = p["loop"]["copy_ms"] / 1000, p["loop"]["compute_ms"] / 1000
    LOAD = SAMPLE_LOAD * BATCH                                       # per batch per worker
    WORKERS = p["loop"]["workers"]
    SLOW_LOAD, SLOW_BATCH, SLOW_STEP = p["slow"]["wait_ms"] / 1000, p["slow"]["batch"], p["slow"]["step_ms"] / 1000
    SPEEDUP_WORKERS, CORES = p["many_workers"], p["cores"]          # Quizzes 6 and 7
    KERNELS, KERNEL_S, LAUNCH_S = p["kernels"], p["kernel_us"] / 1e6, p["launch_us"] / 1e6   # Quiz 9
    TINY_N, TINY_RATE = p["tiny_n"], p["tiny_rate"]                  # Quiz 11
    COMPILE_S = float(p["compile_s"])                                # Quiz 12
    STEP_BEFORE, STEP_AFTER = p["steps"]["before_ms"] / 1000, p["steps"]["after_ms"] / 1000

    serial_ms = pipeline.step_seconds(LOAD, COMPUTE, 0, COPY) * 1e3
    overlap_s = pipeline.step_seconds(LOAD, COMPUTE, WORKERS, COPY, copy_overlapped=True)
    summed_s = LOAD / WORKERS + COPY + COMPUTE
    slow_batch = SLOW_LOAD * SLOW_BATCH
    tiny_flops_per_s = arith.matmul_flops(TINY_N, TINY_N, TINY_N) * TINY_RATE
    needed = pipeline.workers_needed(slow_batch, SLOW_STEP, COPY, copy_overlapped=True)
    load_ms, slow_ms, step_ms = p["loop"]["load_ms"], p["slow"]["load_ms"], p["slow"]["step_ms"]
    saved = p["steps"]["before_ms"] - p["steps"]["after_ms"]
    STREAM, STREAM_BATCH, STREAM_WORKERS = p["stream"]["samples"], p["stream"]["batch"], p["stream"]["workers"]
    sharded_batches = STREAM // STREAM_BATCH                         # what the author meant

    return [
        Item("07-serial-step-ms", serial_ms, "ms", rel_tol=0.01, mistakes=(
            Mistake((LOAD + COMPUTE) * 1e3, "you left out the copy: with num_workers=0 and a pageable "
                                            f"batch, the {p['loop']['copy_ms']} ms copy waits for the load and the compute "
                                            "waits for the copy: all three add."),
            Mistake(max(LOAD, COPY, COMPUTE) * 1e3, "that is the slowest stage alone; with "
                    "num_workers=0 the main process loads, copies and computes in turn, so the "
                    "stages add: nothing overlaps."),
            Mistake(SAMPLE_LOAD * 1e3 + (COPY + COMPUTE) * 1e3, "the load is per sample: a batch of "
                    f"{BATCH} costs {BATCH} x {p['loop']['sample_ms']} ms."),
        )),
        Item("07-overlap-step-ms", overlap_s * 1e3, "ms", rel_tol=0.01, mistakes=(
            Mistake(summed_s * 1e3, "you added the stage times; running side by side, the stages "
                    "form a pipeline and its slowest stage sets the pace: take the max."),
            Mistake((COPY + COMPUTE) * 1e3, "the copy here is pinned and non_blocking on its own "
                    "stream, so it overlaps the compute: take max(copy, compute), not their sum."),
            Mistake(LOAD * 1e3, f"{WORKERS} workers each build whole batches side by side: one arrives "
                    f"every {load_ms} / {WORKERS} = {load_ms / WORKERS:g} ms, faster than the compute."),
            Mistake(serial_ms, "that is the serial loop of Quiz 1; with workers and an overlapped "
                               "copy the stages run side by side."),
        )),
        Item("07-samples-per-s", BATCH / overlap_s, "samples/s", rel_tol=0.01, mistakes=(
            Mistake(BATCH / summed_s, "you added the stage times; the pipeline's pace is its slowest "
                                      f"stage, {p['loop']['compute_ms']} ms per batch of {BATCH}."),
            Mistake(BATCH / overlap_s / 1e3, "that is per millisecond; give samples per second."),
            Mistake(1 / overlap_s, f"that is batches per second; each batch holds {BATCH} samples."),
            Mistake(BATCH / (serial_ms / 1e3), "that is the serial loop's rate (Quiz 1); this loop "
                                               "overlaps its stages."),
        )),
        Item("07-workers-needed", needed, "workers", mistakes=(
            Mistake(needed - 1, f"{needed - 1} workers deliver a {slow_ms} ms batch every "
                                f"{slow_ms / (needed - 1):.1f} ms, slower than the {step_ms} ms step: "
                                "round up, not down."),
            Mistake(SLOW_BATCH, "a worker builds a whole batch, not one sample. You need the "
                                f"batch's load over the step, {slow_ms} / {step_ms}, rounded up."),
            Mistake(needed + 1, f"{needed} workers already deliver a {slow_ms} ms batch every "
                                f"{slow_ms / needed:.1f} ms, faster than the {step_ms} ms step. A "
                                f"{needed + 1}th worker would only add margin against jitter; the "
                                "question asks for the smallest number that keeps up."),
            Mistake(slow_batch * 1e3, f"that is the batch's load time in ms; divide by the {step_ms} "
                                      "ms step to get the workers needed."),
        )),
        Item("07-bound-stage",
             pipeline.bottleneck(BOUND_LOAD, BOUND_COMPUTE, BOUND_WORKERS, BOUND_COPY), "",
             choices=("data", "copy", "compute"), mistakes=(
            Mistake("compute", "the compute (50 ms, 55 with its copy) is the longest single stage, "
                               "but 2 workers deliver a 120 ms batch only every 60 ms: the data "
                               "stage is slower."),
            Mistake("copy", "the 5 ms copy is the shortest stage: the data stage (120 / 2 = 60 ms per "
                            "batch) is the slowest."),
        )),
        Item("07-io-speedup", pipeline.loading_speedup(SPEEDUP_WORKERS, CORES, io_bound=True), "x",
             rel_tol=0.01, mistakes=(
            Mistake(float(CORES), "that caps the workers at the cores, which holds for CPU-bound "
                                  "work; an I/O-bound worker waits, and waiting needs no core: "
                                  f"{SPEEDUP_WORKERS} workers wait side by side."),
            Mistake(SPEEDUP_WORKERS - 1.0, "workers = 0 loads in the main process, one batch at a "
                                           f"time, like one worker: {SPEEDUP_WORKERS} workers are {SPEEDUP_WORKERS}x that."),
        )),
        Item("07-cpu-speedup", pipeline.loading_speedup(SPEEDUP_WORKERS, CORES, io_bound=False), "x",
             rel_tol=0.01, mistakes=(
            Mistake(float(SPEEDUP_WORKERS), "workers beyond the core count: CPU-bound workers "
                    f"compute, and {SPEEDUP_WORKERS} of them share {CORES} cores, so at most {CORES} run at once."),
            Mistake(1.0, f"{CORES} cores can run {CORES} workers at once: {TIMES[CORES]} the rate of "
                         "loading in the main process alone."),
        )),
        Item("07-idle-share", pipeline.device_idle_share(LOAD, COMPUTE, 0, COPY), "", rel_tol=0.01,
             mistakes=(
            Mistake(LOAD / (LOAD + COPY + COMPUTE), "you left out the copy: during it the SMs "
                    "compute nothing either (the kernels wait for their input)."),
            Mistake(COMPUTE / (LOAD + COPY + COMPUTE), "that is the busy share; the question asks "
                                                       "for the idle share, 1 minus it."),
            Mistake(100 * pipeline.device_idle_share(LOAD, COMPUTE, 0, COPY),
                    "that is a percentage; give a fraction (e.g. 0.5 for 50%)."),
            Mistake(LOAD / COMPUTE, "a share is part of the whole step: divide by the step's "
                                    f"{round(serial_ms)} ms, not by the compute."),
        )),
        Item("07-launch-bound-ms", KERNELS * max(KERNEL_S, LAUNCH_S) * 1e3, "ms", rel_tol=0.01,
             mistakes=(
            Mistake(KERNELS * (KERNEL_S + LAUNCH_S) * 1e3, "you added launch and kernel time; the "
                    "host launches kernel k+1 while the GPU runs kernel k, so they overlap and the "
                    f"slower of the two, {p['launch_us']} µs per kernel, sets the pace."),
            Mistake(KERNELS * KERNEL_S * 1e3, "that is the GPU's own work; it cannot start a kernel "
                    f"the host has not launched yet, and launching takes longer: {p['launch_us']} µs per kernel."),
            Mistake(KERNELS * max(KERNEL_S, LAUNCH_S), "that is in seconds; give the step in "
                                                       "milliseconds."),
        )),
        Item("07-util-percent", 100.0, "%", rel_tol=0.005, mistakes=(
            Mistake(100 / SMS, "that is the share of the SMs in use; NVML's utilisation is the share "
                    "of time during which any kernel runs, however few SMs it occupies."),
            Mistake(1.0, "the question asks for a percentage, as nvidia-smi prints it: 100, not 1."),
            Mistake(0.0, "a kernel is running the whole time: NVML counts any running kernel as "
                         "busy, whatever its size."),
        )),
        Item("07-tiny-mfu", arith.mfu(TINY_RATE, arith.matmul_flops(TINY_N, TINY_N, TINY_N), PEAK),
             "", rel_tol=0.01, mistakes=(
            Mistake(1.0, "that reads utilisation as MFU: the GPU is busy 100% of the time, but "
                         "these tiny matmuls do a minute fraction of its peak FLOPs."),
            Mistake(100 * tiny_flops_per_s / PEAK, "that is a percentage; give a fraction."),
            # Counting 64³ FLOPs per matmul and dividing by the with-sparsity peak give the same value.
            Mistake(tiny_flops_per_s / 2 / PEAK, f"2x too small: each of the {TINY_N}³ products is a "
                    "multiply AND an add (2 FLOPs), and MFU divides by the dense 989.4 TFLOP/s, not "
                    "the with-sparsity figure."),
        )),
        # Quiz 13: every worker runs its own copy of __iter__, and nothing splits the stream.
        Item("07-stream-batches", pipeline.unsharded_batches(STREAM, STREAM_BATCH, STREAM_WORKERS),
             "batches", mistakes=(
            Mistake(sharded_batches, f"that is {STREAM:,} / {STREAM_BATCH}, one pass over the file; but each of the "
                    f"{STREAM_WORKERS} workers runs its own copy of __iter__ from the start, and nothing in it "
                    "splits the samples (torch.utils.data.get_worker_info() would): every sample comes "
                    f"{STREAM_WORKERS} times."),
            Mistake(STREAM / (STREAM_WORKERS * STREAM_BATCH), "that is what one worker would yield if the "
                    f"{STREAM_WORKERS} workers split the samples, which this __iter__ does not do; and the "
                    "loader hands over every worker's batches: each worker yields all "
                    f"{STREAM:,} samples."),
            Mistake(STREAM * STREAM_WORKERS, "that counts samples; the loader yields batches of "
                                             f"{STREAM_BATCH}."),
        )),
        # Quiz 14: the clock is read while the GPU still runs the queued forwards.
        Item("07-clock-line", "c", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "the synchronize on the line before (a) makes the clock start with nothing "
                         "queued: that part is right. The problem is where it stops."),
            Mistake("b", "launching asynchronously is what a GPU loop should do; the timing goes wrong "
                         "only because the clock is read at (c) before the queued kernels have run: "
                         "torch.cuda.synchronize() before (c)."),
            Mistake("d", ".item() does wait for the GPU, but after (c) has read the clock: the elapsed "
                         "time is already only the launching. Synchronise before (c)."),
        )),
        Item("07-compile-break-even", pipeline.compile_break_even_steps(COMPILE_S, STEP_BEFORE, STEP_AFTER),
             "steps", rel_tol=0.01, mistakes=(
            Mistake(COMPILE_S / STEP_BEFORE, "that divides by the old step time; each step pays back "
                                             f"only what it saves, {STEP_BEFORE:g} - {STEP_AFTER:g} = {saved / 1000:g} s."),
            Mistake(COMPILE_S / STEP_AFTER, "that divides by the new step time; each step pays back "
                                            f"only what it saves, {saved / 1000:g} s."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
