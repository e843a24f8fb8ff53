"""Sequence parallelism: what tensor parallelism leaves whole, split along the sequence
(chapter 11, section 3).

Tensor parallelism leaves every rank computing the LayerNorms (and dropouts) of all s tokens,
and keeping their inputs: the 10·s·b·h bytes per layer that do not shrink with t (Korthikanti et
al. 2022, §4.2.2). Those operations treat each token alone, so each rank can run them on its own
s/t tokens. The all-reduce of each sub-layer is then cut in its two halves, which chapter 06
showed an all-reduce to be:

- after the row-parallel linear, a **reduce-scatter** along the sequence: each rank gets the sum
  for its s/t tokens only (the input of the next LayerNorm);
- before the column-parallel linear, an **all-gather** along the sequence: every rank gets all s
  tokens again (the linear needs them all).

A reduce-scatter and an all-gather move what one all-reduce does (chapter 06: an all-reduce is a
reduce-scatter followed by an all-gather), so the traffic stays; the activation memory becomes
1/t of all of it. Megatron keeps only each rank's s/t slice of the column-parallel linear's
input and gathers it once more in backward (``_GatheredLinear``; Korthikanti et al., §4.2.2: an
extra all-gather that Megatron overlaps with the weight gradient's computation). PyTorch's plan
(``SequenceParallel`` on the LayerNorms, ``PrepareModuleInput`` gathering before the
column-parallel linears; torchtitan's Llama plan) keeps the gathered input instead, s·b·h per
linear. ``activation_memory`` measures both against the formulas, with chapter 02's tracker.

Layouts are the course GPT's (batch, sequence, features): the sequence is dimension 1.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpulab.measure.memory import peak_memory
from gpulab.model_parallel.counting import CollectiveCounter
from gpulab.model_parallel.tensor_parallel import (CONFIG, ColumnParallelLinear, HeadShardedAttention,
                                                   RowParallelLinear, _run, qkv_rows, seeded_block,
                                                   seeded_input, shardable_attention,
                                                   tensor_parallel_block)
from gpulab.models import Block
from gpulab.parallel.dist import worker_device

# The memory experiment's sizes: every saved tensor a multiple of 512 bytes even split 4 ways
# (the tracker rounds each up to 512, as the CUDA allocator does), so formula and measurement
# can agree to the byte; the (s x s) scores make attention's share visible.
MEMORY_BATCH, MEMORY_SEQ = 2, 256
TP_DEGREES = (1, 2, 4)

all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _gather_sequence(shard: torch.Tensor, group) -> torch.Tensor:
    """(B, T/t, C) on each rank -> (B, T, C), the ranks' slices in rank order."""
    t = dist.get_world_size(group)
    first = shard.transpose(0, 1).contiguous()                  # (T/t, B, C): gather on dim 0
    whole = first.new_empty((t * first.shape[0], *first.shape[1:]))
    all_gather(whole, first, group=group)
    return whole.transpose(0, 1)                                # (B, T, C)


def _reduce_scatter_sequence(whole: torch.Tensor, group) -> torch.Tensor:
    """(B, T, C) partial sums on each rank -> (B, T/t, C): the sum, this rank's tokens only."""
    t = dist.get_world_size(group)
    first = whole.transpose(0, 1).contiguous()                  # (T, B, C)
    mine = first.new_empty((first.shape[0] // t, *first.shape[1:]))
    reduce_scatter(mine, first, group=group)
    return mine.transpose(0, 1)                                 # (B, T/t, C)


class _ReduceScatterInForward(torch.autograd.Function):
    """The row-parallel side: reduce-scatter along the sequence in forward, all-gather in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_sequence(grad, ctx.group), None


class _GatheredLinear(torch.autograd.Function):
    """The column-parallel side, as Megatron does it: all-gather the sequence, multiply, and save
    only this rank's slice of the input; backward gathers it again for the weight's gradient, and
    reduce-scatters the input's gradient (each rank's tokens, summed over the ranks' columns)."""

    @staticmethod
    def forward(ctx, shard, weight, bias, group):
        ctx.group = group
        ctx.save_for_backward(shard, weight)
        return F.linear(_gather_sequence(shard, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        shard, weight = ctx.saved_tensors
        whole = _gather_sequence(shard, ctx.group)              # the extra all-gather
        grad_weight = grad.flatten(0, 1).T @ whole.flatten(0, 1)
        grad_bias = grad.sum(dim=(0, 1))
        grad_input = _reduce_scatter_sequence(grad @ weight, ctx.group)
        return grad_input, grad_weight, grad_bias, None


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """``ColumnParallelLinear`` whose input is this rank's s/t tokens (``_GatheredLinear``)."""

    def forward(self, shard: torch.Tensor) -> torch.Tensor:
        return _GatheredLinear.apply(shard, self.weight, self.bias, self.group)


class SequenceParallelRowLinear(RowParallelLinear):
    """``RowParallelLinear`` that hands each rank the sum for its own s/t tokens."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _ReduceScatterInForward.apply(self.partial(x), self.group)
        return y if self.bias is None else y + self.bias


def sequence_parallel_block(block: Block, rank: int, tp: int, group) -> Block:
    """Rank ``rank``'s share of ``block`` (a copy) under tensor and sequence parallelism, by
    hand: input and output are this rank's s/t tokens of the residual stream. The LayerNorms
    and the row-parallel biases are whole on every rank but see only its tokens, so their
    gradients are partial sums: ``sync_replicated_grads`` adds them up after backward."""
    block = copy.deepcopy(block)
    block.zero_grad(set_to_none=True)
    hidden, attn = block.attn.c_proj.in_features, block.attn
    block.attn = HeadShardedAttention(
        SequenceParallelColumnLinear(attn.c_attn, rank, tp, group, rows=qkv_rows(hidden, rank, tp)),
        SequenceParallelRowLinear(attn.c_proj, rank, tp, group), hidden // attn.n_head, attn.future)
    block.mlp.c_fc = SequenceParallelColumnLinear(block.mlp.c_fc, rank, tp, group)
    block.mlp.c_proj = SequenceParallelRowLinear(block.mlp.c_proj, rank, tp, group)
    return block


def replicated_params(block: Block) -> list[nn.Parameter]:
    """The parameters every rank holds whole but computes with on its tokens only."""
    return [*block.ln_1.parameters(), *block.ln_2.parameters(), block.attn.c_proj.bias,
            block.mlp.c_proj.bias]


def sync_replicated_grads(block: Block, group) -> None:
    """Sum the partial gradients of ``replicated_params`` over the ranks: one all-reduce of
    their 6h values (Megatron does the same for its sequence-parallel LayerNorms)."""
    params = replicated_params(block)
    flat = torch.cat([p.grad.flatten() for p in params])
    dist.all_reduce(flat, group=group)
    for p, part in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(part.view_as(p.grad))


def block_plan_sequence_parallel() -> dict:
    """``parallelize_module``'s plan for one course GPT block (after ``shardable_attention``)
    with sequence parallelism, torchtitan's Llama plan in the course GPT's names: the
    LayerNorms on each rank's tokens, each sub-layer's input gathered to all tokens
    (``PrepareModuleInput``), its output reduce-scattered back (``output_layouts=Shard(1)``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    return {"ln_1": SequenceParallel(), "attn": PrepareModuleInput(**gather),
            "attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln_2": SequenceParallel(), "mlp": PrepareModuleInput(**gather),
            "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1))}


def parallelize_module_block_sequence_parallel(block: Block, mesh) -> Block:
    """``block`` (a copy) split over ``mesh`` by ``parallelize_module`` with sequence parallelism."""
    from torch.distributed.tensor.parallel import parallelize_module

    block = copy.deepcopy(block)
    block.zero_grad(set_to_none=True)
    block.attn = shardable_attention(block.attn, mesh.size())
    return parallelize_module(block, mesh, block_plan_sequence_parallel())


# --------------------------------------------------------------------------------------------
# The chapter's workers

def _my_tokens(x: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    size = x.shape[1] // tp
    return x[:, rank * size:(rank + 1) * size]


def compare_with_unsplit(rank: int, world_size: int) -> dict:
    """Worker: the unsplit block against sequence parallelism by hand and with
    ``parallelize_module``, t = world size, on chapter 11's block (``tensor_parallel.CONFIG``).
    For each: the largest |difference| of this rank's tokens of the output and of the input
    gradient, and of the LayerNorms' gradients after they are summed over the ranks, and what
    it handed to collectives."""
    from torch.distributed.device_mesh import init_device_mesh

    device, group = worker_device(rank), dist.group.WORLD
    block = seeded_block().to(device)
    x, dy = (t.to(device) for t in seeded_input())
    y_ref, dx_ref, _ = _run(block, x, dy)
    mine = lambda t: _my_tokens(t, rank, world_size)           # noqa: E731
    results = {}
    for name in ("by hand (Megatron)", "parallelize_module"):
        if name == "parallelize_module":
            split = parallelize_module_block_sequence_parallel(block, init_device_mesh(device.type, (world_size,)))
        else:
            split = sequence_parallel_block(block, rank, world_size, group)
        y, dx, counted = _run(split, mine(x).contiguous(), mine(dy).contiguous())
        with CollectiveCounter() as summing:
            if name != "parallelize_module":
                sync_replicated_grads(split, group)
            ln_grad = split.ln_1.weight.grad
            placement = str(getattr(ln_grad, "placements", "a plain tensor"))
            ln_grad = ln_grad.full_tensor() if hasattr(ln_grad, "full_tensor") else ln_grad
        results[name] = {"output": (y - mine(y_ref)).abs().max().item(),
                         "input grad": (dx - mine(dx_ref)).abs().max().item(),
                         "LayerNorm grad": (ln_grad - block.ln_1.weight.grad).abs().max().item(),
                         "collectives": counted.totals(), "LayerNorm grad placement": placement,
                         "summing the LayerNorm grads": summing.totals()}
    return results


def activation_memory(rank: int, world_size: int, degrees=TP_DEGREES) -> dict:
    """Worker: for each tensor-parallel degree t in ``degrees`` (ranks in groups of t
    consecutive ones; t = 1 alone), the bytes this rank's share of one block saves for backward,
    with tensor parallelism alone and with sequence parallelism (by hand), measured by chapter
    02's tracker (``peak_memory``: the most the saved tensors held, ``highest["activations"]``).
    The block has ``MEMORY_BATCH`` sequences of ``MEMORY_SEQ`` tokens."""
    device = worker_device(rank)
    block = seeded_block().to(device)
    x, dy = (t.to(device) for t in seeded_input(CONFIG, MEMORY_BATCH, MEMORY_SEQ))
    measured = {}
    for t in degrees:
        groups = [dist.new_group(list(range(first, first + t))) for first in range(0, world_size, t)] if t > 1 else []
        group, r = (groups[rank // t], rank % t) if t > 1 else (None, 0)
        measured[t] = {}
        for sequence_parallel in (False, True):
            if sequence_parallel and t > 1:
                split, inputs, grads = (sequence_parallel_block(block, r, t, group),
                                        _my_tokens(x, r, t).contiguous(), _my_tokens(dy, r, t).contiguous())
            else:
                split, inputs, grads = tensor_parallel_block(block, r, t, group), x, dy
            # x.clone(): the block's input is a tensor of the step, as in a whole model (the
            # tracker counts the named inputs apart, and the first LayerNorm saves its input)
            peak = peak_memory(lambda: split(inputs.clone()).backward(grads), device,
                               model=split, inputs=(inputs, grads))
            measured[t]["sequence parallel" if sequence_parallel else "tensor parallel"] = peak.highest["activations"]
    return measured


def section_3_worker(rank: int, world_size: int) -> dict:
    """Worker: chapter 11's section 3 in one process group (starting processes costs seconds):
    ``activation_memory``, ``compare_with_unsplit``, and the 2-D mesh recipe of the chapter's
    "In your training script" (``tensor_parallel.fsdp_and_tensor_parallel_step``)."""
    from gpulab.model_parallel.tensor_parallel import fsdp_and_tensor_parallel_step

    return {"memory": activation_memory(rank, world_size),
            "compare": compare_with_unsplit(rank, world_size),
            "fsdp + tp": fsdp_and_tensor_parallel_step(rank, world_size)}
