"""Gradient accumulation on data-parallel ranks, as a training script writes it (chapter 05).

``accumulate`` is the loop a learner puts in a DDP training script: k micro-batches, the first
k − 1 inside ``model.no_sync()`` so that DDP all-reduces once per optimizer step, and every token
weighted the same over all micro-batches and all ranks: each rank sums its token losses and
divides by the valid tokens of the whole global batch, counted and all-reduced first, times the
number of ranks, because DDP *averages* the ranks' gradients (PyTorch docs,
``DistributedDataParallel``: "gradients are averaged"; the HF Trainer does the same with
``average_tokens_across_devices``). chapter 06's torchrun script (``gpulab.parallel.train_ddp``)
calls it.

``accumulation_on_ranks`` is a worker for ``gpulab.parallel.dist.launch``: on gloo ranks it runs
that loop, the same loop without the ranks' factor, and the first loop people write (a mean per
micro-batch divided by k, no ``no_sync``), counts DDP's all-reduces in each, and compares each
gradient with one process's gradient of the whole global batch.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from gpulab.checkpointing.accumulation import (IGNORE_INDEX, SMALL_GPT, full_batch_gradients,
                                               padded_batch)
from gpulab.models import GPT


def accumulate(model, micro_batches, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over one optimizer step's micro-batches [(inputs, targets), ...] of
    this rank, leaving the global batch's mean-token-loss gradient in ``.grad`` (DDP-wrapped
    ``model``). Returns the valid tokens of the global batch and this rank's summed token loss
    (detached, for the log: all-reduce it and divide by the first to print the global batch's
    mean loss, as chapter 06's script does). The optimizer step is the caller's."""
    # The lines chapter 05 prints (tests/test_checkpointing.py keeps the two the same, but for
    # the lines marked "for the log"); -100 is IGNORE_INDEX, F.cross_entropy's default.
    summed = 0                                                   # for the log
    n_valid = sum((y != -100).sum() for _, y in micro_batches)   # this rank's valid tokens
    dist.all_reduce(n_valid)                                     # ... of every rank
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():   # all-reduce once, at the end
            logits, _ = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
            (loss * world_size / n_valid).backward()             # DDP averages: undo it
            summed = summed + loss.detach()                      # for the log
    return n_valid, summed


def _first_attempt(model, micro_batches) -> None:
    """The loop most people write first: each micro-batch's mean loss over k, no no_sync."""
    for x, y in micro_batches:
        (model(x, y)[1] / len(micro_batches)).backward()


def _counting_hook(state, bucket):
    state["all-reduces"] += 1
    return default_hooks.allreduce_hook(None, bucket)       # None: the default process group


def _gradients(module) -> torch.Tensor:
    grads = torch.cat([p.grad.flatten() for p in module.parameters()])
    module.zero_grad(set_to_none=True)
    return grads


def accumulation_on_ranks(rank: int, world_size: int, micro_batches: int = 4, rows: int = 2,
                          seq_len: int = 32) -> dict:
    """Worker: one optimizer step's accumulation on ``world_size`` gloo ranks, three ways.

    The global batch, world_size × micro_batches × rows sequences of ``seq_len``, is the same
    on every rank (seeded); each rank takes its slice. Its padding is uneven: rank r's
    micro-batch i keeps seq_len / 2^(i + r) valid tokens (at least 2), so a per-micro-batch
    or per-rank mean weighs tokens unequally. Returns, per way, the all-reduces DDP ran (a
    counting communication hook), the largest |difference| from one process's gradient of the
    whole batch, and the gradient as a multiple of that one (least squares: 1 when right, 0.5
    when it is half). Chapter 05, "In your training script".
    """
    torch.manual_seed(0)
    model = GPT(SMALL_GPT)
    valid = [max(2, seq_len >> (i + r)) for r in range(world_size) for i in range(micro_batches)
             for _ in range(rows)]
    idx, targets = padded_batch(SMALL_GPT, valid, seq_len, seed=1)
    reference = torch.cat([g.flatten() for g in full_batch_gradients(model, idx, targets).values()])
    per_rank = micro_batches * rows
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    parts = list(zip(idx[mine].split(rows), targets[mine].split(rows)))

    ddp = DistributedDataParallel(model)            # broadcasts rank 0's weights: all start equal
    state = {"all-reduces": 0}
    ddp.register_comm_hook(state, _counting_hook)
    ways = {"no_sync, tokens of all ranks x ranks": lambda: accumulate(ddp, parts, world_size),
            "no_sync, tokens of all ranks (no x ranks)": lambda: accumulate(ddp, parts, 1),
            "mean per micro-batch / k, no no_sync": lambda: _first_attempt(ddp, parts)}
    out = {"valid tokens per micro-batch": [int((y != IGNORE_INDEX).sum()) for _, y in parts],
           "largest gradient": reference.abs().max().item()}
    for way, run in ways.items():
        state["all-reduces"] = 0
        run()
        grads = _gradients(model)
        out[way] = {"all-reduces": state["all-reduces"],
                    "max |difference|": (grads - reference).abs().max().item(),
                    "times the full batch's": (grads @ reference / (reference @ reference)).item()}
    return out
