"""Chapter 07's figures for `make bench` (a benchmark that prints, not a timed test; issue 18):

1. the step-time model (``pipeline.step_seconds``: the sum of load, copy and compute with no
   workers, the slowest stage with workers) against measured loops, over 6 configurations
   (target: within 10% on the 2-core CPU);
2. an I/O-bound dataset (sleep latency per sample), 8 workers against 0 on this machine's cores
   (target: >= 4x);
3. the profiler's idle share of a serial loop, predicted by the model against read from the
   exported trace (target: within 5 percentage points);
4. the capstone ladder on the course GPT: tokens/s and the fraction of the peak per rung (on a
   CPU the fraction of its measured matmul rate, not an MFU; on a GPU MFU against the dense bf16
   datasheet peak, when the GPU is in gpulab.device.hardware's table).

Run: ``.venv/bin/python scripts/bench_ch07.py`` (about a minute on an idle 2-core CPU). The
machine's load average is printed first: on a shared machine the timings carry its noise.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from gpulab import arith, measure, pipeline
from gpulab.device import hardware
from gpulab.device import best_device
from gpulab.models import GPTConfig
from gpulab.pipeline import trace

SAMPLE_LATENCY, BATCH = 0.005, 8                                      # 40 ms per batch
CONFIGS = [(0, 0.020), (1, 0.010), (2, 0.008), (4, 0.005), (2, 0.035), (4, 0.025)]


def model_vs_measured(device) -> float:
    """Print each configuration; return the largest |measured / model - 1|."""
    load = pipeline.load_seconds(pipeline.LatencyDataset(40, SAMPLE_LATENCY), BATCH, batches=3)
    print(f"1. step-time model vs measured (load {load * 1e3:.1f} ms per batch of {BATCH}, measured)")
    worst = 0.0
    for workers, compute in CONFIGS:
        step = pipeline.StandInCompute(compute, device)
        compute_measured = measure.time_fn(step, device, warmup=1, repeats=3).median
        steps = max(8, round(0.25 / max(load / max(workers, 1), compute)))
        loop = pipeline.measure_pipeline(SAMPLE_LATENCY, BATCH, workers, compute, steps=steps,
                                         device=device, compute_step=step)
        model = pipeline.step_seconds(load, compute_measured, workers)
        worst = max(worst, abs(loop.step_seconds / model - 1))
        print(f"   W={workers} step {compute * 1e3:4.0f} ms: model {model * 1e3:6.1f} ms, sum of "
              f"stages {(load + compute_measured) * 1e3:6.1f} ms, measured {loop.step_seconds * 1e3:6.1f} ms "
              f"({loop.step_seconds / model:.2f}x the model)")
    print(f"   largest gap over {len(CONFIGS)} configurations: {worst:.1%} (target <= 10%)")
    return worst


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
    path = Path(tempfile.gettempdir()) / "gpulab_bench_ch07_trace.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    batches = iter(pipeline.make_loader(data, BATCH, workers=0))
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=5, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
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
    if on_gpu:
        config, seq = GPTConfig(vocab_size=8192, block_size=256, n_layer=12, n_head=12, n_embd=768), 256
        big = max(2, arith.largest_micro_batch(2.5 * 2**30, config, seq, torch.float32, "adamw"))
        small = max(1, big // 2)
        rungs = [pipeline.Rung("naive", small),
                 pipeline.Rung("+ workers, pinned", small, 2, True),
                 pipeline.Rung("+ TF32", small, 2, True, tf32=True),
                 pipeline.Rung("+ bf16 autocast", small, 2, True, autocast=torch.bfloat16, tf32=True),
                 pipeline.Rung("+ fused AdamW", small, 2, True, "adamw_fused", torch.bfloat16, True),
                 pipeline.Rung("+ torch.compile", small, 2, True, "adamw_fused", torch.bfloat16, True, True),
                 pipeline.Rung(f"+ micro-batch {big}", big, 2, True, "adamw_fused", torch.bfloat16, True, True)]
        spec = hardware.lookup(torch.cuda.get_device_name(device))
        peak = hardware.peak_flops(spec, torch.bfloat16) if spec else None
        label = "MFU (dense bf16 datasheet peak)"
    else:
        config, seq = GPTConfig(vocab_size=1000, block_size=128, n_layer=4, n_head=4, n_embd=256), 64
        rungs = [pipeline.Rung("naive", 4), pipeline.Rung("+ 2 workers", 4, 2),
                 pipeline.Rung("+ foreach AdamW", 4, 2, optimizer="adamw_foreach"),
                 pipeline.Rung("+ fused AdamW", 4, 2, optimizer="adamw_fused"),
                 pipeline.Rung("+ micro-batch 8", 8, 2, optimizer="adamw_fused")]
        peak = measure.matmul_throughput(512, torch.float32, device).flops_per_second
        label = "fraction of this CPU's measured matmul rate (not an MFU)"
    print(f"4. the ladder on {device} ({label}):")
    for rung in rungs:
        r = pipeline.run_rung(config, rung, seq, device, steps=3, sample_latency=0.050)
        share = f"{arith.mfu(r['tokens_per_second'], r['flops_per_token'], peak):.1%}" if peak else "n/a"
        memory = f", peak {r['peak_bytes'] / 2**30:.2f} GiB" if r["peak_bytes"] else ""
        print(f"   {rung.name:<22} {r['tokens_per_second']:>10,.0f} tokens/s  {share:>6}  "
              f"warm-up {r['warmup_seconds']:.1f} s{memory}")


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
