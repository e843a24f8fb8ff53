"""Pipeline parallelism: the course GPT cut into stages, one per rank (chapter 11, section 4).

Each of p ranks holds a contiguous slice of the blocks, a *stage*: the first also embeds the
tokens, the last also applies the final LayerNorm and the head. A step's batch is cut into m
micro-batches; a stage sends each micro-batch's output activations to the next one (b·s·h
values, point to point) and receives their gradients back in backward. Nothing else travels.

The schedule decides the order in which a stage runs its forwards (F) and backwards (B):

- GPipe (Huang et al. 2019): all m forwards, then all m backwards. A stage waits p − 1 slots
  for the pipeline to fill and as long for it to drain: the bubble, (p − 1)/(m + p − 1) of the
  step, and it holds the activations of all m micro-batches at once;
- 1F1B (PipeDream-Flush, Narayanan et al. 2021, §2.2.1): after p − i forwards, stage i
  alternates one backward and one forward. The same bubble; at most p − i micro-batches in
  flight;
- interleaved 1F1B (§2.2.2): each rank holds v smaller stages (here v = 2: rank r holds stages
  r and r + p), so the fill and drain take 1/v as long: (p − 1)/(v·m + p − 1).

``torch.distributed.pipelining`` (``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``) runs them; ``TimedStage`` writes down when each forward and backward
ran, which is the trace the chapter measures the bubble from (``idle_fractions``). picotron
(huggingface/picotron, ``pipeline_parallel/``) writes GPipe ("AFAB") and 1F1B by hand.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpulab.measure import synchronize
from gpulab.measure.memory import peak_memory
from gpulab.model_parallel.counting import CollectiveCounter
from gpulab.models import GPT, GPTConfig
from gpulab.parallel.dist import worker_device

# Four blocks of h = 128: each stage's micro-batch takes milliseconds on one CPU core, long
# next to a send between processes, so that the idle time is the schedule's, not the wires'.
# A small vocabulary keeps the last stage's head and loss light, so the stages are even.
CONFIG = GPTConfig(vocab_size=64, block_size=64, n_layer=4, n_head=4, n_embd=128)
MICRO_BATCH, SEQ = 2, 64
VIRTUAL_STAGES = 2                                 # stages per rank in the interleaved schedule
TIMED_STEPS = 2                                    # after a first step that warms up
# What the chapter runs, (schedule, m): GPipe over m for the bubble's curve, 1F1B where it can
# start (m >= p) for its memory, interleaving once. About 10 CPU-seconds on 2 ranks.
RUNS = (("GPipe", 1), ("GPipe", 2), ("GPipe", 4), ("GPipe", 8), ("1F1B", 4), ("1F1B", 8),
        ("interleaved 1F1B", 4))
SCHEDULES = ("GPipe", "1F1B", "interleaved 1F1B")


class GPTStage(nn.Module):
    """Stage ``stage`` of ``n_stages`` of ``model``: its blocks [stage·L/n, (stage+1)·L/n),
    the embeddings on the first, the final LayerNorm and the head on the last. It shares the
    model's modules (no copy)."""

    def __init__(self, model: GPT, stage: int, n_stages: int):
        super().__init__()
        L = model.config.n_layer
        if L % n_stages:
            raise ValueError(f"{n_stages} stages do not divide the {L} blocks")
        self.first, self.last = stage == 0, stage == n_stages - 1
        if self.first:
            self.wte, self.wpe = model.wte, model.wpe
        self.blocks = nn.ModuleList(model.blocks[stage * L // n_stages:(stage + 1) * L // n_stages])
        if self.last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:                                    # token ids (B, T) -> (B, T, C)
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x   # (B, T, V) on the last


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The course GPT's loss, on one micro-batch: mean cross-entropy over its tokens."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _timed_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        """A ``PipelineStage`` that appends (kind, micro-batch, start, end, stage) to ``timeline``
        for each forward ("F") and backward ("B") it computes: this rank's trace. Times are
        ``time.perf_counter()``, the same clock in every process of one machine (Linux's
        CLOCK_MONOTONIC), so the ranks' traces line up. On a GPU each span waits for the
        device before it starts and ends (``synchronize``): kernels run after they are launched."""

        def __init__(self, *args, timeline: list, **kwargs):
            super().__init__(*args, **kwargs)
            self.timeline = timeline

        def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
            synchronize(self.device)
            start = time.perf_counter()
            out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
            synchronize(self.device)
            self.timeline.append(("F", fwd_chunk_id, start, time.perf_counter(), self.stage_index))
            return out

        def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
            synchronize(self.device)
            start = time.perf_counter()
            out = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
            synchronize(self.device)
            self.timeline.append(("B", bwd_chunk_id, start, time.perf_counter(), self.stage_index))
            return out

    return TimedStage


def idle_fractions(timelines: list[list[tuple]]) -> list[float]:
    """Each rank's idle share of one step, from all ranks' traces of it: the step runs from the
    first computation on any rank to the last; a rank is busy while it computes a forward or a
    backward, idle otherwise (waiting for a micro-batch or a gradient, or done)."""
    start = min(span[2] for timeline in timelines for span in timeline)
    end = max(span[3] for timeline in timelines for span in timeline)
    return [1 - sum(span[3] - span[2] for span in timeline) / (end - start) for timeline in timelines]


def replayed_idle_fractions(timelines: list[list[tuple]], n_stages: int) -> list[float]:
    """The idle shares the same step would have had if every message arrived at once: each
    rank's computations replayed in the order they ran, each lasting what it measured, and each
    starting as soon as its rank is free and its input exists (a forward of micro-batch j on stage
    s after the forward of j on stage s − 1; a backward after the backward of j on stage s + 1, or
    on the last stage after its own forward). Where this matches ``idle_fractions``, the idle
    time is the schedule's, with these compute times; where the compute times are uneven (a
    shared CPU), both move away from (p − 1)/(m + p − 1) together."""
    done, clock, replayed = {}, [0.0] * len(timelines), [[] for _ in timelines]
    pending = [sorted(timeline, key=lambda span: span[2]) for timeline in timelines]
    while any(pending):
        progressed = False
        for rank, queue in enumerate(pending):
            while queue:
                kind, micro, start, end, stage = queue[0]
                if kind == "F":
                    needs = ("F", micro, stage - 1) if stage > 0 else None
                else:
                    needs = ("B", micro, stage + 1) if stage < n_stages - 1 else ("F", micro, stage)
                if needs is not None and needs not in done:
                    break
                begin = max(clock[rank], done[needs] if needs else 0.0)
                clock[rank] = done[(kind, micro, stage)] = begin + (end - start)
                replayed[rank].append((kind, micro, begin, clock[rank], stage))
                queue.pop(0)
                progressed = True
        if not progressed:
            raise ValueError("the traces' order cannot be replayed: a computation waits for one that never ran")
    return idle_fractions(replayed)


def in_flight(timeline: list[tuple]) -> int:
    """The most micro-batches a rank held at once: forwards done whose backward was not."""
    held = most = 0
    for kind, *_ in sorted(timeline, key=lambda span: span[2]):   # by start time
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


def _schedule(name: str, stages: list, n_microbatches: int):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if name == "interleaved 1F1B":
        return ScheduleInterleaved1F1B(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    single = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}[name]
    return single(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)


def _batch(n_microbatches: int, device):
    """The step's tokens and targets, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(CONFIG.vocab_size, (n_microbatches * MICRO_BATCH, SEQ + 1), generator=g)
    return idx[:, :-1].contiguous().to(device), idx[:, 1:].contiguous().to(device)


def run_schedule(rank: int, world_size: int, schedule: str, n_microbatches: int,
                 steps: int = TIMED_STEPS, check: bool = False, measure_memory: bool = False) -> dict:
    """One schedule with m micro-batches on p = ``world_size`` ranks, in this rank: a first
    step (with ``check``, compared with the unsplit model: the largest |difference| of this
    rank's gradients from one process's on the whole batch), then ``steps`` timed steps (their
    traces), the point-to-point elements of the last one (``CollectiveCounter``), and with
    ``measure_memory`` one more step under chapter 02's tracker (the most its saved tensors
    held)."""
    device = worker_device(rank)
    v = VIRTUAL_STAGES if schedule == "interleaved 1F1B" else 1
    n_stages = world_size * v
    torch.manual_seed(0)
    model = GPT(CONFIG).to(device)
    reference = copy.deepcopy(model)
    mine = [rank + k * world_size for k in range(v)]             # rank r: stages r, r + p, ...
    modules = [GPTStage(model, s, n_stages) for s in mine]
    timeline: list[tuple] = []
    TimedStage = _timed_stage_class()
    stages = [TimedStage(m, s, n_stages, device, timeline=timeline) for m, s in zip(modules, mine)]
    pipeline = _schedule(schedule, stages, n_microbatches)
    x, y = _batch(n_microbatches, device)

    def step():
        for module in modules:
            module.zero_grad(set_to_none=True)
        if rank == 0:
            pipeline.step(x, **({"target": y, "losses": []} if world_size == 1 else {}))
        elif rank == world_size - 1:
            pipeline.step(target=y, losses=[])
        else:
            pipeline.step()

    step()
    gap = None
    if check:
        reference(x, y)[1].backward()
        names = {id(p): n for n, p in model.named_parameters()}
        expected = dict(reference.named_parameters())
        gap = max((p.grad - expected[names[id(p)]].grad).abs().max().item()
                  for module in modules for p in module.parameters())
    traces = []
    for _ in range(steps):
        dist.barrier()
        timeline.clear()
        with CollectiveCounter() as counted:
            step()
        traces.append(list(timeline))
    result = {"traces": traces, "gradient gap": gap, "point to point": counted.totals(),
              "in flight": in_flight(traces[-1])}
    if measure_memory:
        dist.barrier()
        result["saved bytes"] = peak_memory(step, device, model=nn.ModuleList(modules)).highest["activations"]
    return result


def compare_schedules(rank: int, world_size: int, runs=RUNS) -> dict:
    """Worker: ``run_schedule`` for each (schedule, m) in ``runs``, in one process group. The
    largest m of each schedule is checked against one process; saved bytes are measured for
    GPipe with m = 1 (one micro-batch's worth) and for GPipe and 1F1B with their largest m.
    Keys: (schedule, m)."""
    largest = {name: max(m for s, m in runs if s == name) for name, _ in runs}
    results = {}
    for schedule, m in runs:
        last = m == largest[schedule]
        memory = (schedule == "GPipe" and m == 1) or (schedule != "interleaved 1F1B" and last)
        results[(schedule, m)] = run_schedule(rank, world_size, schedule, m, check=last,
                                              measure_memory=memory)
    return results
