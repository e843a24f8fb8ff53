"""The run that measures a plan (chapter 12, sections 5 and 7): its peak memory, and its step
time and tokens per second beside the naive run's, on the same device, in the same process.

``measure(plan, budget)`` does, in order:

1. the peak of one steady-state step of the plan and of the naive run
   (``gpulab.measure.training_step_peak``: the storage tracker on a CPU, the CUDA allocator on
   a GPU; chapter 02);
2. the naive step's compute, with the batch already in memory (the median of a few steps):
   it sets what loading costs on this device, ``load_share`` times that per global batch;
3. the naive run, data and all: the baseline;
4. the plan, data and all.

Steps 2 to 4 happen only when step 1 found the plan within the memory budget and its global
batch is the target; otherwise nothing is timed, and the result says why.

A run is a real training loop: a ``TokenDataset`` that waits ``latency`` per sequence (chapter
07), a DataLoader with the plan's workers, ``accumulation`` micro-batches of ``micro_batch``
sequences whose losses are divided by ``accumulation``, one optimizer step, gradients cleared.
Each step is timed on its own (the device synchronised at its end) after a warm-up of one step
per worker plus one; the median step is the result, so that one slow step on a busy machine
does not decide it.

``measure_in_fresh_process`` runs the same in a new Python process (``python -m
gpulab.capstone.run``) and reads back its JSON: what the grader and the workshop's board call,
so that nothing of the caller's process (a learner's kernel, say) takes part, and what the
notebook calls too, so that the learner's figures come from the same code. Results are kept
per process: the same plan and budget are measured once.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time

from gpulab.capstone.budget import budget_named
from gpulab.capstone.plan import Plan, naive, off_target

STEPS = 4                      # timed optimizer steps of the plan
NAIVE_STEPS = 3                # of the naive run (mostly waiting for data: steadier)
CALIBRATION_STEPS = 3
RESULT_CHARS = 20_000          # what is read back from the measuring process's output
TIMEOUT_S = 300


def run_loop(config, plan: Plan, seq_len: int, latency: float, steps: int, device) -> list[float]:
    """Seconds of each of ``steps`` optimizer steps of ``plan`` (after the warm-up), data
    loaded through a DataLoader that waits ``latency`` seconds per sequence."""
    import torch

    from gpulab import measure
    from gpulab.measure.memory import make_optimizer
    from gpulab.models import GPT
    from gpulab.pipeline.datasets import TokenDataset
    from gpulab.pipeline.loop import make_loader, shutdown

    torch.manual_seed(0)
    dtype = getattr(torch, plan.dtype_name)
    model = GPT(config, dtype=dtype, device=device, checkpointing=plan.checkpointing == "every")
    optimizer = make_optimizer(model, plan.optimizer)
    # Warm-up: until every worker has delivered once and the first step's one-time costs
    # (AdamW's state) are paid; then the workers run ahead of the loop as they will from then on.
    warmup = max(1, math.ceil((plan.workers + 1) / plan.accumulation))
    micro_batches = (warmup + steps) * plan.accumulation + 2 * max(plan.workers, 1)
    dataset = TokenDataset(micro_batches * plan.micro_batch, seq_len, config.vocab_size, latency)
    iterator = iter(make_loader(dataset, plan.micro_batch, plan.workers))

    def step() -> None:
        for _ in range(plan.accumulation):
            idx, targets = (t.to(device) for t in next(iterator))
            loss = model(idx, targets)[1] / plan.accumulation    # the mean over the global batch
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = []
    try:
        for _ in range(warmup):
            step()
        measure.synchronize(device)
        for _ in range(steps):
            start = time.perf_counter()
            step()
            measure.synchronize(device)
            seconds.append(time.perf_counter() - start)
    finally:
        shutdown(iterator)
    return seconds


def naive_compute_seconds(config, budget, device, steps: int = CALIBRATION_STEPS) -> float:
    """The naive step's compute with its batch already in memory: the median of ``steps``."""
    import torch

    from gpulab import measure
    from gpulab.measure.memory import make_optimizer, train_step
    from gpulab.models import GPT

    torch.manual_seed(0)
    model = GPT(config, device=device)
    optimizer = make_optimizer(model, "adamw")
    idx, targets = (torch.randint(config.vocab_size, (budget.batch, budget.seq), device=device)
                    for _ in range(2))
    train_step(model, optimizer, idx, targets)                 # warm-up: AdamW's state
    seconds = []
    for _ in range(steps):
        measure.synchronize(device)
        start = time.perf_counter()
        train_step(model, optimizer, idx, targets)
        measure.synchronize(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def peak_bytes(plan: Plan, budget, device) -> tuple[int, str]:
    """The measured peak of one steady-state step of ``plan`` (chapter 02), and how it was
    measured."""
    import torch

    from gpulab import measure
    run = measure.training_step_peak(budget.config(), budget.batch, budget.seq,
                                     getattr(torch, plan.dtype_name), plan.optimizer,
                                     checkpointing=plan.checkpointing == "every", device=device,
                                     micro_batches=plan.accumulation)
    return run.peak, run.method


def measure(plan: Plan, budget, steps: int = STEPS, device=None) -> dict:
    """Measure ``plan`` beside the naive run, in this process (module docstring). A dict of
    plain numbers and strings (JSON), with ``in_budget``, ``speedup`` and ``why`` (what kept
    the plan from being timed, or ""). A plan off the target or over the memory budget is not
    timed, and neither is the naive run then: their times are None."""
    from gpulab.device import best_device

    device = best_device() if device is None else device
    config = budget.config()
    start = time.perf_counter()
    baseline = naive(budget)
    plan_peak, method = peak_bytes(plan, budget, device)
    naive_peak, _ = peak_bytes(baseline, budget, device)
    why = [off_target(plan, budget)] if off_target(plan, budget) else []
    if plan_peak > budget.memory_bytes:
        why.append(f"its measured peak is {plan_peak / 2**20:.2f} MiB, over the budget of "
                   f"{budget.memory_mib} MiB")
    result = {"plan": plan.text(), "budget": budget.name, "device": str(device),
              "memory_method": method, "steps": steps, "peak_bytes": plan_peak,
              "naive_peak_bytes": naive_peak, "naive_compute_s": None,
              "latency_per_sequence_s": None, "naive_step_s": None, "naive_tokens_per_s": None,
              "naive_steps_s": [], "plan_steps_s": [], "step_s": None, "tokens_per_s": None,
              "speedup": None, "in_budget": not why, "why": "; ".join(why)}
    if not why:               # only a plan that meets the memory budget and the target is timed
        compute = naive_compute_seconds(config, budget, device)
        latency = budget.load_share * compute / budget.batch
        naive_steps = run_loop(config, baseline, budget.seq, latency, min(steps, NAIVE_STEPS), device)
        plan_steps = run_loop(config, plan, budget.seq, latency, steps, device)
        naive_step, plan_step = statistics.median(naive_steps), statistics.median(plan_steps)
        tokens = budget.tokens_per_step
        result.update(naive_compute_s=compute, latency_per_sequence_s=latency,
                      naive_step_s=naive_step, naive_tokens_per_s=tokens / naive_step,
                      naive_steps_s=naive_steps, plan_steps_s=plan_steps, step_s=plan_step,
                      tokens_per_s=tokens / plan_step, speedup=naive_step / plan_step)
    result["seconds"] = time.perf_counter() - start
    return result


# ------------------------------------------------------------------------------------------
# In a fresh process, and kept per process

_measured: dict[tuple[str, str, int, int], dict] = {}


def measure_in_fresh_process(plan: Plan, budget, steps: int = STEPS,
                             timeout: float = TIMEOUT_S, env: dict | None = None,
                             attempt: int = 0, **popen) -> dict:
    """``measure`` in a new Python process (``python -m gpulab.capstone.run``), read back from
    the last line of its output (at most RESULT_CHARS). Kept per process: the same plan,
    budget, steps and ``attempt`` are measured once (ask for attempt 1, 2... to measure again).
    ``env`` replaces the environment; ``popen`` goes to ``subprocess.run`` (the workshop's
    board runs it as another user). RuntimeError when the process fails or says nothing
    readable."""
    key = (plan.text(), budget.name, steps, attempt)
    if key not in _measured:
        command = [sys.executable, "-m", "gpulab.capstone.run", plan.text(), budget.name, str(steps)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env if env is not None else dict(os.environ), **popen)
        last = done.stdout[-RESULT_CHARS:].strip().splitlines()[-1:] or [""]
        try:
            result = json.loads(last[0])
        except ValueError:
            result = None
        if done.returncode != 0 or not isinstance(result, dict):
            raise RuntimeError(f"the measuring process failed (exit {done.returncode}): "
                               f"{done.stderr[-500:].strip()}")
        _measured[key] = result
    return _measured[key]


def _finite_or_none(x):
    return x if x is None or (isinstance(x, (int, float)) and math.isfinite(x)) else None


def main(argv: list[str]) -> None:
    text, name, steps = argv
    result = measure(Plan.parse(text), budget_named(name), int(steps))
    print(json.dumps({k: _finite_or_none(v) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main(sys.argv[1:])
