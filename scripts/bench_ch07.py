"""Chapter 07's figures for `make bench` (a benchmark that prints, not a timed test; issue 18):

1. the step-time model (``pipeline.step_seconds``: the sum of load, copy and compute with no
   workers, the slowest stage with workers, the main process's hand-over of each batch included)
   against measured loops: 6 I/O-bound configurations (target: within 10% on the 2-core CPU) and
   3 CPU-bound ones with up to 4 workers, whose loading the model divides by min(W, free cores)
   (target: within 15%). For those the model takes the load as one worker pays it
   (``pipeline.worker_load_seconds``) and the cores that workers get on this machine now
   (``pipeline.free_cores``), both measured just before, as the notebook's Experiment 1 does;
2. an I/O-bound dataset (sleep latency per sample), 8 workers against 0 on this machine's cores
   (target: >= 4x);
3. the profiler's idle share of a serial loop, predicted by the model against read from the
   exported trace (target: within 5 percentage points);
4. the capstone ladder on the course GPT (``pipeline.course_ladder``): tokens/s, the fraction of
   the peak and the share of each rung spent waiting for data (target: no rung after the
   workers rung above 20%; on a CPU the fraction of its measured matmul rate, not an MFU; on a
   GPU MFU against the dense bf16 datasheet peak, when the GPU is in gpulab.device.hardware's
   table).

Run: ``.venv/bin/python scripts/bench_ch07.py`` (about a minute on an idle 2-core CPU). The
machine's load average is printed first: on a shared machine the timings carry its noise.
"""
from __future__ import annotations

import os
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from gpulab import arith, measure, pipeline
from gpulab.device import hardware
from gpulab.device import best_device
from gpulab.pipeline import trace

SAMPLE_LATENCY, BATCH = 0.005, 8                                      # 40 ms per batch
CONFIGS = [(0, 0.020), (1, 0.010), (2, 0.008), (4, 0.005), (2, 0.035), (4, 0.025)]
DECODE_CONFIGS = [(1, 0.005), (2, 0.005), (4, 0.005)]                # CPU-bound, 20 ms per batch


def model_vs_measured(device) -> tuple[float, float]:
    """Print each configuration; return the largest |measured / model - 1|, I/O- and CPU-bound."""
    cores = pipeline.usable_cores()
    rounds = pipeline.calibrate_rounds(0.0025)
    load = pipeline.load_seconds(pipeline.LatencyDataset(40, SAMPLE_LATENCY), BATCH, batches=3)
    decoding = pipeline.DecodeDataset(48 * BATCH, rounds)
    decode_load = pipeline.worker_load_seconds(decoding, BATCH, batches=16)
    free = pipeline.free_cores(decoding, BATCH, cores, batches=16)
    handover = pipeline.handover_seconds(pipeline.LatencyDataset(16 * BATCH, 0.0), BATCH)
    print(f"1. step-time model vs measured (load {load * 1e3:.1f} ms per batch of {BATCH}, "
          f"{decode_load * 1e3:.1f} ms decoding in a worker; hand-over {handover * 1e3:.2f} ms; "
          f"{free:.2f} of {cores} cores free for computing workers)")
    worst = {"I/O": 0.0, "CPU": 0.0}
    for kind, workers, compute in ([("I/O", w, c) for w, c in CONFIGS]
                                   + [("CPU", w, c) for w, c in DECODE_CONFIGS]):
        step = pipeline.StandInCompute(compute, device)
        compute_measured = measure.time_fn(step, device, warmup=1, repeats=3).median
        batch_load = load if kind == "I/O" else decode_load
        model = pipeline.step_seconds(batch_load, compute_measured, workers, handover=handover,
                                      cores=free if kind == "CPU" else None)
        loop = pipeline.measure_pipeline(SAMPLE_LATENCY, BATCH, workers, compute,
                                         steps=max(8, round(0.25 / model)), device=device,
                                         compute_step=step, decode_rounds=rounds if kind == "CPU" else 0)
        worst[kind] = max(worst[kind], abs(loop.step_seconds / model - 1))
        print(f"   {kind} W={workers} step {compute * 1e3:4.0f} ms: model {model * 1e3:6.1f} ms, sum of "
              f"stages {(batch_load + compute_measured) * 1e3:6.1f} ms, measured {loop.step_seconds * 1e3:6.1f} ms "
              f"({loop.step_seconds / model:.2f}x the model)")
    print(f"   largest gap: I/O-bound {worst['I/O']:.1%} (target <= 10%), CPU-bound {worst['CPU']:.1%} "
          f"(target <= 15%); load average now {os.getloadavg()[0]:.1f}")
    return worst["I/O"], worst["CPU"]


def io_speedup() -> float:
    dataset = pipeline.LatencyDataset(10_000, 0.004)                   # 64 ms per batch of 16
    rates = {w: pipeline.loading_rate(dataset, 16, w, batches=6 * max(w, 1)) for w in (0, 8)}
    speedup = rates[8] / rates[0]
    print(f"2. I/O-bound loading, 8 workers vs 0 on {pipeline.usable_cores()} cores: "
          f"{rates[0] * 16:,.0f} -> {rates[8] * 16:,.0f} samples/s = {speedup:.1f}x (target >= 4x)")
    return speedup


def idle_share_gap(device) -> float:
    data = pipeline.LatencyDataset(200, 0.003)
    step = pipeline.StandInCompute(0.012, device)
    load = pipeline.load_seconds(data, BATCH, batches=3)
    compute = measure.time_fn(step, device, warmup=1, repeats=3).median
    path = trace.new_trace_path("gpulab-bench-ch07-")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    batches = iter(pipeline.make_loader(data, BATCH, workers=0))
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=5, repeat=1),
                 on_trace_ready=lambda p: trace.export(p, path)) as prof:
        for _ in range(6):
            with record_function("data"):
                batch = next(batches)
            with record_function("compute"):
                step(batch)
            prof.step()
    measured = trace.idle_share(trace.load_events(path))
    predicted = pipeline.device_idle_share(load, compute, workers=0)
    gap = abs(measured.share - predicted)
    print(f"3. idle share of a serial loop: predicted {predicted:.1%}, read from the trace "
          f"{measured.share:.1%} ({gap * 100:.1f} percentage points; target <= 5)")
    return gap


def ladder(device) -> None:
    on_gpu = device.type == "cuda"
    config, seq, rungs = pipeline.course_ladder(on_gpu)
    if on_gpu:
        spec = hardware.lookup(torch.cuda.get_device_name(device))
        peak = hardware.peak_flops(spec, torch.bfloat16) if spec else None
        label = "MFU (dense bf16 datasheet peak)"
    else:
        peak = measure.matmul_throughput(512, torch.float32, device).flops_per_second
        label = "fraction of this CPU's measured matmul rate (not an MFU)"
    probe = pipeline.run_rung(config, rungs[0], seq, device, steps=8 if on_gpu else 6, warmup=2)      # data in memory
    batch_load = pipeline.LOAD_SHARE * probe["step_seconds"]
    print(f"4. the ladder on {device} ({label}); naive compute {probe['step_seconds'] * 1e3:.1f} ms, "
          f"a batch read {batch_load * 1e3:.1f} ms, data stage with {rungs[1].workers} workers "
          f"{batch_load / rungs[1].workers * 1e3:.1f} ms:")
    worst_wait = 0.0
    for i, rung in enumerate(rungs):
        r = pipeline.run_rung(config, rung, seq, device, steps=8 if on_gpu else 6,
                              sample_latency=batch_load / rung.batch_size)
        share = f"{arith.mfu(r['tokens_per_second'], r['flops_per_token'], peak):.1%}" if peak else "n/a"
        memory = f", peak {r['peak_bytes'] / 2**30:.2f} GiB" if r["peak_bytes"] else ""
        if i:
            worst_wait = max(worst_wait, r["wait_share"])
        print(f"   {rung.name:<22} {r['tokens_per_second']:>10,.0f} tokens/s  {share:>6}  "
              f"waiting {r['wait_share']:.0%}  warm-up {r['warmup_seconds']:.1f} s{memory}")
    print(f"   largest share waiting for data after the workers rung: {worst_wait:.0%} (target <= 20%)")


def main() -> None:
    device = best_device()
    print(f"chapter 07 figures on {device}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    start = time.perf_counter()
    model_vs_measured(device)
    io_speedup()
    idle_share_gap(device)
    ladder(device)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
