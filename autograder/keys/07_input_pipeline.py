"""Answer key for chapter 07, the input pipeline, profiling and utilisation. Instructor side: never
copied into a release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.
"""
from gpulab import arith, pipeline
from gpulab.checks import Item, Mistake

# The numbers stated in the questions (solutions/07_input_pipeline, "Quiz" sections); seconds.
SAMPLE_LOAD, BATCH, COPY, COMPUTE = 0.002, 32, 0.003, 0.040      # Quizzes 1-3 and 8
LOAD = SAMPLE_LOAD * BATCH                                       # 64 ms per batch per worker
WORKERS = 4
SLOW_LOAD, SLOW_BATCH = 0.005, 64                                # Quiz 4: 320 ms per batch
BOUND_LOAD, BOUND_WORKERS, BOUND_COPY, BOUND_COMPUTE = 0.120, 2, 0.005, 0.050   # Quiz 5
SPEEDUP_WORKERS, CORES = 8, 2                                    # Quizzes 6 and 7
KERNELS, KERNEL_S, LAUNCH_S = 2000, 4e-6, 6e-6                   # Quiz 9
SMS = 132                                                        # H100 SXM, Quiz 10
TINY_N, TINY_RATE, PEAK = 64, 200_000, 989.4e12                  # Quiz 11: bf16 dense peak
COMPILE_S, STEP_BEFORE, STEP_AFTER = 60.0, 0.300, 0.200          # Quiz 12

serial_ms = pipeline.step_seconds(LOAD, COMPUTE, 0, COPY) * 1e3
overlap_s = pipeline.step_seconds(LOAD, COMPUTE, WORKERS, COPY, copy_overlapped=True)
summed_s = LOAD / WORKERS + COPY + COMPUTE
slow_batch = SLOW_LOAD * SLOW_BATCH
tiny_flops_per_s = arith.matmul_flops(TINY_N, TINY_N, TINY_N) * TINY_RATE


ITEMS = [
    Item("07-serial-step-ms", serial_ms, "ms", rel_tol=0.01, mistakes=(
        Mistake((LOAD + COMPUTE) * 1e3, "you left out the copy: with num_workers=0 and a pageable "
                                        "batch, the 3 ms copy waits for the load and the compute "
                                        "waits for the copy: all three add."),
        Mistake(max(LOAD, COPY, COMPUTE) * 1e3, "that is the slowest stage alone; with "
                "num_workers=0 the main process loads, copies and computes in turn, so the "
                "stages add: nothing overlaps."),
        Mistake(SAMPLE_LOAD * 1e3 + (COPY + COMPUTE) * 1e3, "the load is per sample: a batch of "
                                                            "32 costs 32 x 2 ms."),
    )),
    Item("07-overlap-step-ms", overlap_s * 1e3, "ms", rel_tol=0.01, mistakes=(
        Mistake(summed_s * 1e3, "you added the stage times; running side by side, the stages "
                "form a pipeline and its slowest stage sets the pace: take the max."),
        Mistake((COPY + COMPUTE) * 1e3, "the copy here is pinned and non_blocking on its own "
                "stream, so it overlaps the compute: take max(copy, compute), not their sum."),
        Mistake(LOAD * 1e3, "4 workers each build whole batches side by side: one arrives every "
                            "64 / 4 = 16 ms, faster than the compute."),
        Mistake(serial_ms, "that is the serial loop of Quiz 1; with workers and an overlapped "
                           "copy the stages run side by side."),
    )),
    Item("07-samples-per-s", BATCH / overlap_s, "samples/s", rel_tol=0.01, mistakes=(
        Mistake(BATCH / summed_s, "you added the stage times; the pipeline's pace is its slowest "
                                  "stage, 40 ms per batch of 32."),
        Mistake(BATCH / overlap_s / 1e3, "that is per millisecond; give samples per second."),
        Mistake(1 / overlap_s, "that is batches per second; each batch holds 32 samples."),
        Mistake(BATCH / (serial_ms / 1e3), "that is the serial loop's rate (Quiz 1); this loop "
                                           "overlaps its stages."),
    )),
    Item("07-workers-needed", pipeline.workers_needed(slow_batch, COMPUTE, COPY, copy_overlapped=True),
         "workers", mistakes=(
        Mistake(7, "7 workers deliver a 320 ms batch every 45.7 ms, slower than the 40 ms step: "
                   "round up, not down."),
        Mistake(SLOW_BATCH, "a worker builds a whole batch, not one sample: you need "
                            "load-per-batch / compute = 320 / 40 workers."),
        Mistake(9, "8 workers deliver a batch every 40 ms exactly, as fast as the compute: the "
                   "9th adds nothing."),
        Mistake(slow_batch * 1e3, "that is the batch's load time in ms; divide by the 40 ms step "
                                  "to get the workers needed."),
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
                              "8 workers wait side by side."),
        Mistake(SPEEDUP_WORKERS - 1.0, "workers = 0 loads in the main process, one batch at a "
                                       "time, like one worker: 8 workers are 8x that."),
    )),
    Item("07-cpu-speedup", pipeline.loading_speedup(SPEEDUP_WORKERS, CORES, io_bound=False), "x",
         rel_tol=0.01, mistakes=(
        Mistake(float(SPEEDUP_WORKERS), "workers beyond the core count: CPU-bound workers "
                "compute, and 8 of them share 2 cores, so at most 2 run at once."),
        Mistake(1.0, "2 cores can run 2 workers at once: twice the rate of loading in the main "
                     "process alone."),
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
                                "107 ms, not by the compute."),
    )),
    Item("07-launch-bound-ms", KERNELS * max(KERNEL_S, LAUNCH_S) * 1e3, "ms", rel_tol=0.01,
         mistakes=(
        Mistake(KERNELS * (KERNEL_S + LAUNCH_S) * 1e3, "you added launch and kernel time; the "
                "host launches kernel k+1 while the GPU runs kernel k, so they overlap and the "
                "slower of the two, 6 µs per kernel, sets the pace."),
        Mistake(KERNELS * KERNEL_S * 1e3, "that is the GPU's own work; it cannot start a kernel "
                "the host has not launched yet, and launching takes longer: 6 µs per kernel."),
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
        Mistake(tiny_flops_per_s / 2 / PEAK, "2x too small: each of the 64³ products is a "
                "multiply AND an add (2 FLOPs), and MFU divides by the dense 989.4 TFLOP/s, not "
                "the with-sparsity figure."),
    )),
    Item("07-compile-break-even", pipeline.compile_break_even_steps(COMPILE_S, STEP_BEFORE, STEP_AFTER),
         "steps", rel_tol=0.01, mistakes=(
        Mistake(COMPILE_S / STEP_BEFORE, "that divides by the old step time; each step pays back "
                                         "only what it saves, 0.3 - 0.2 = 0.1 s."),
        Mistake(COMPILE_S / STEP_AFTER, "that divides by the new step time; each step pays back "
                                        "only what it saves, 0.1 s."),
    )),
]
