"""Tensor parallelism: one layer's matmuls split over t ranks (chapter 11, section 1).

Megatron-LM's layout (Shoeybi et al. 2019, §3, Figure 3), for a block of the course GPT
(``gpulab.models.Block``):

- the MLP's first linear is split by *columns* (its output features): rank r computes features
  [r·4h/t, (r+1)·4h/t) of every token, and GELU, which acts on each value alone, runs on them
  as they are;
- its second linear is split by *rows* (its input features), so rank r multiplies its own
  4h/t features by its own rows: a partial sum of the whole output. Adding the t partial sums is
  an all-reduce, Megatron's **g**;
- in backward the mirror image: the column-split linear's input gradient is a partial sum on
  each rank (each saw only its columns), so **f**, the identity in forward, all-reduces it;
- attention the same way, split by heads: the QKV projection by columns (each rank computes
  the queries, keys and values of its a/t heads), the output projection by rows.

So a block needs two all-reduces of b·s·h values in forward (two g) and two in backward (two f),
and no rank ever holds more than 1/t of a split weight. ``tensor_parallel_block`` builds that by
hand from a whole block (the same weights, cut); ``parallelize_module_block`` asks PyTorch's
``torch.distributed.tensor.parallel`` (``ColwiseParallel``, ``RowwiseParallel`` on a
``DeviceMesh``, the names torchtitan's Llama plan uses) to do it. ``compare_with_unsplit`` is the
chapter's worker: both, and the by-hand one without f, against the unsplit block. picotron
(huggingface/picotron, ``tensor_parallel/``) writes the same pieces for Llama.

The course GPT's attention reads its sizes from the config (as nanoGPT's does: split the fused
QKV output at h, view it as a heads): on a rank that holds 3h/t of those outputs both are
wrong. ``HeadShardedAttention`` is the same attention reading its sizes from its shard, and
``qkv_rows`` orders the fused weight's rows so that each rank's block of 3h/t rows holds its
heads' queries, keys and values. torchtitan's Llama needs neither: it has separate wq, wk, wv,
and views its heads as ``-1`` (torchtitan, ``models/llama3/model``).
"""

from __future__ import annotations

import copy
import logging
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from gpulab.model_parallel.counting import CollectiveCounter
from gpulab.models import GPT, Block, CausalSelfAttention, GPTConfig
from gpulab.parallel.dist import worker_device

# The block every experiment of the chapter splits: h = 64, a = 4 heads (so t = 2 or 4 divides
# them), run on b = 2 sequences of s = 32 tokens.
CONFIG = GPTConfig(vocab_size=64, block_size=256, n_layer=1, n_head=4, n_embd=64)
BATCH, SEQ = 2, 32


# --------------------------------------------------------------------------------------------
# Megatron's f and g

class _AllReduceInBackward(torch.autograd.Function):
    """f: the identity in forward; in backward, the sum of the ranks' input gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()                 # autograd may hand the same tensor elsewhere
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _AllReduceInForward(torch.autograd.Function):
    """g: the sum of the ranks' partial outputs in forward; the identity in backward (every rank
    needs the whole output's gradient, and has it)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_ranks(x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's f (``copy_to_tensor_model_parallel_region``). ``group`` None: one rank, no-op."""
    return x if group is None else _AllReduceInBackward.apply(x, group)


def reduce_from_ranks(x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's g (``reduce_from_tensor_model_parallel_region``). ``group`` None: no-op."""
    return x if group is None else _AllReduceInForward.apply(x, group)


# --------------------------------------------------------------------------------------------
# Split linears, cut from whole ones

def _rank_slice(size: int, rank: int, tp: int) -> slice:
    if size % tp:
        raise ValueError(f"{tp} ranks do not divide {size} features")
    return slice(rank * size // tp, (rank + 1) * size // tp)


class ColumnParallelLinear(nn.Module):
    """Rank ``rank``'s share of ``linear``'s output features: its rows of the weight (PyTorch
    stores a Linear's weight as (out, in)), ``rows`` if given, else the r-th block of out/t.
    The input is whole on every rank; f all-reduces its gradient in backward, unless
    ``all_reduce_input_grad`` is False (the slip the chapter measures)."""

    def __init__(self, linear: nn.Linear, rank: int, tp: int, group, rows=None,
                 all_reduce_input_grad: bool = True):
        super().__init__()
        rows = rows if rows is not None else _rank_slice(linear.out_features, rank, tp)
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        self.bias = nn.Parameter(linear.bias.detach()[rows].clone()) if linear.bias is not None else None
        self.group, self.all_reduce_input_grad = group, all_reduce_input_grad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.all_reduce_input_grad:
            x = copy_to_ranks(x, self.group)
        return F.linear(x, self.weight, self.bias)            # (B, T, out/t)


class RowParallelLinear(nn.Module):
    """Rank ``rank``'s share of ``linear``'s input features: its columns of the weight. Its
    input is the matching 1/t of the features (the column-parallel layer's output); g sums the
    ranks' partial outputs; the bias, whole on every rank, is added once, after the sum."""

    def __init__(self, linear: nn.Linear, rank: int, tp: int, group):
        super().__init__()
        columns = _rank_slice(linear.in_features, rank, tp)
        self.weight = nn.Parameter(linear.weight.detach()[:, columns].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.group = group

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the output, before the ranks add theirs."""
        return F.linear(x, self.weight)                       # (B, T, out), one of t terms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_ranks(self.partial(x), self.group)
        return y if self.bias is None else y + self.bias


# --------------------------------------------------------------------------------------------
# Attention split by heads

def qkv_rows(hidden: int, rank: int, tp: int) -> torch.Tensor:
    """The rows of the fused QKV weight (queries, then keys, then values, h rows each) that
    belong to rank ``rank``'s heads: its h/t queries, its h/t keys, its h/t values."""
    mine = _rank_slice(hidden, rank, tp)
    return torch.cat([torch.arange(part * hidden + mine.start, part * hidden + mine.stop)
                      for part in range(3)])


class HeadShardedAttention(nn.Module):
    """The course GPT's attention (``gpulab.models.CausalSelfAttention``, dropout 0) computing
    the heads its QKV projection gives it: sizes read from the shard, not the config.
    ``c_attn`` and ``c_proj`` are whatever splits them: ``ColumnParallelLinear`` and
    ``RowParallelLinear`` by hand, or plain Linears that ``parallelize_module`` shards."""

    def __init__(self, c_attn: nn.Module, c_proj: nn.Module, head_size: int, future: torch.Tensor):
        super().__init__()
        self.c_attn, self.c_proj, self.head_size = c_attn, c_proj, head_size
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.c_attn(x)                                      # (B, T, 3h/t): this rank's heads
        B, T, width = qkv.shape
        heads = width // (3 * self.head_size)
        q, k, v = (part.view(B, T, heads, self.head_size).transpose(1, 2).contiguous()
                   for part in qkv.chunk(3, dim=2))               # 3 x (B, a/t, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_size))  # (B, a/t, T, T)
        att = F.softmax(att.masked_fill(self.future[:T, :T], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, heads * self.head_size)
        return self.c_proj(y)                                     # g (or a reduce-scatter) inside


def shardable_attention(attn: CausalSelfAttention, tp: int) -> HeadShardedAttention:
    """The same attention, same weights, ready for ``parallelize_module``: the fused QKV
    weight's rows reordered so that a split into t equal blocks of rows (``ColwiseParallel``'s
    ``Shard(0)``) gives each rank whole heads (``qkv_rows``)."""
    if attn.dropout:
        raise ValueError("HeadShardedAttention has no dropout: build the GPT with dropout=0")
    hidden = attn.c_proj.in_features
    order = torch.cat([qkv_rows(hidden, r, tp) for r in range(tp)])
    c_attn = copy.deepcopy(attn.c_attn)
    with torch.no_grad():
        c_attn.weight.copy_(attn.c_attn.weight[order])
        c_attn.bias.copy_(attn.c_attn.bias[order])
    return HeadShardedAttention(c_attn, copy.deepcopy(attn.c_proj), hidden // attn.n_head, attn.future)


# --------------------------------------------------------------------------------------------
# A whole block, split: by hand, and with parallelize_module

def tensor_parallel_block(block: Block, rank: int, tp: int, group,
                          all_reduce_input_grad: bool = True) -> Block:
    """Rank ``rank``'s share of ``block`` under Megatron's tensor parallelism, built by hand from
    the block's own weights (a copy; ``block`` is left whole). LayerNorms stay whole on every
    rank. ``group`` None with tp = 1 is the block itself, uncut."""
    block = copy.deepcopy(block)
    block.zero_grad(set_to_none=True)         # a copy of a block that has run keeps its grads
    hidden, attn = block.attn.c_proj.in_features, block.attn
    block.attn = HeadShardedAttention(
        ColumnParallelLinear(attn.c_attn, rank, tp, group, rows=qkv_rows(hidden, rank, tp),
                             all_reduce_input_grad=all_reduce_input_grad),
        RowParallelLinear(attn.c_proj, rank, tp, group), hidden // attn.n_head, attn.future)
    block.mlp.c_fc = ColumnParallelLinear(block.mlp.c_fc, rank, tp, group,
                                          all_reduce_input_grad=all_reduce_input_grad)
    block.mlp.c_proj = RowParallelLinear(block.mlp.c_proj, rank, tp, group)
    return block


def block_plan() -> dict:
    """``parallelize_module``'s plan for one course GPT block after ``shardable_attention``:
    Megatron's layout, in the names torchtitan's Llama plan uses (``apply_tp``)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}


def parallelize_module_block(block: Block, mesh) -> Block:
    """``block`` (a copy) split over ``mesh`` by ``torch.distributed.tensor.parallel``: its
    split weights become DTensors holding this rank's shard."""
    from torch.distributed.tensor.parallel import parallelize_module

    block = copy.deepcopy(block)
    block.zero_grad(set_to_none=True)
    block.attn = shardable_attention(block.attn, mesh.size())
    return parallelize_module(block, mesh, block_plan())


# --------------------------------------------------------------------------------------------
# The chapter's worker

def seeded_block(config: GPTConfig = CONFIG) -> Block:
    """The first block of a GPT built with seed 0, on the CPU: the same weights on every rank."""
    torch.manual_seed(0)
    return GPT(config).blocks[0]


def seeded_input(config: GPTConfig = CONFIG, batch: int = BATCH, seq: int = SEQ):
    """The block's input x and a gradient dy to send back into its output (seeded: the same on
    every rank). A random dy exercises every weight, where ``y.sum()`` would not."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, seq, config.n_embd, generator=g)
    return x, torch.randn(batch, seq, config.n_embd, generator=g)


def _whole(tensor) -> torch.Tensor:
    """A DTensor's whole value (gathered); a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _run(model: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """Forward and backward, counted: (output, input gradient, the counter)."""
    x = x.clone().requires_grad_()
    with CollectiveCounter() as counted:
        y = model(x)
        y.backward(dy)
    return _whole(y).detach(), x.grad, counted


def _weight_grad_gaps(split: Block, whole: Block, rank: int, tp: int) -> dict[str, float]:
    """Largest |difference| between this rank's gradient of each split weight and the matching
    slice of the unsplit block's, by weight."""
    hidden = whole.attn.c_proj.in_features
    pairs = {"mlp.c_fc": (split.mlp.c_fc.weight, whole.mlp.c_fc.weight.grad[_rank_slice(4 * hidden, rank, tp)]),
             "mlp.c_proj": (split.mlp.c_proj.weight, whole.mlp.c_proj.weight.grad[:, _rank_slice(4 * hidden, rank, tp)]),
             "attn.c_attn": (split.attn.c_attn.weight, whole.attn.c_attn.weight.grad[qkv_rows(hidden, rank, tp)]),
             "attn.c_proj": (split.attn.c_proj.weight, whole.attn.c_proj.weight.grad[:, _rank_slice(hidden, rank, tp)])}
    gaps = {}
    for name, (weight, expected) in pairs.items():
        grad = weight.grad
        if hasattr(grad, "to_local"):                 # a DTensor: this rank's shard
            grad = grad.to_local()
        gaps[name] = (grad - expected).abs().max().item()
    return gaps


VARIANTS = ("by hand", "by hand, f left out", "parallelize_module")


def compare_with_unsplit(rank: int, world_size: int) -> dict:
    """Worker: the same block, input and output gradient on every rank; the unsplit block run
    whole as the reference, then each of ``VARIANTS`` split over all ranks (t = world size).
    For each: the largest |difference| of its output, its input gradient and this rank's weight
    gradients (by weight) from the reference's, and what it handed to collectives
    (``CollectiveCounter.totals``)."""
    from torch.distributed.device_mesh import init_device_mesh

    device = worker_device(rank)
    block = seeded_block().to(device)
    x, dy = (t.to(device) for t in seeded_input())
    y_ref, dx_ref, _ = _run(block, x, dy)
    group = dist.group.WORLD
    made = {
        "by hand": lambda: tensor_parallel_block(block, rank, world_size, group),
        "by hand, f left out": lambda: tensor_parallel_block(block, rank, world_size, group,
                                                             all_reduce_input_grad=False),
        "parallelize_module": lambda: parallelize_module_block(
            block, init_device_mesh(device.type, (world_size,))),
    }
    results = {}
    for name in VARIANTS:
        split = made[name]()
        y, dx, counted = _run(split, x, dy)
        results[name] = {"output": (y - y_ref).abs().max().item(),
                         "input grad": (dx - dx_ref).abs().max().item(),
                         "weight grads": _weight_grad_gaps(split, block, rank, world_size),
                         "collectives": counted.totals(),
                         "weight shape": tuple(getattr(split.mlp.c_fc.weight, "to_local",
                                                       lambda: split.mlp.c_fc.weight)().shape)}
    results["whole weight shape"] = tuple(block.mlp.c_fc.weight.shape)
    results["b·s·h"] = x.numel()
    return results


# --------------------------------------------------------------------------------------------
# Two dimensions at once: FSDP2 over one, tensor parallelism over the other

RECIPE_CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
RECIPE_BATCH = 4                                     # sequences in the global batch


def fsdp_and_tensor_parallel_step(rank: int, world_size: int, tp: int = 2) -> dict:
    """Worker: the chapter's "In your training script" lines, one AdamW step of a small course
    GPT on a 2-D mesh: ``tp`` ranks of tensor parallelism inside (``parallelize_module``, the
    ``block_plan``), ``world_size // tp`` of FSDP2 outside (``fully_shard`` on the "dp" mesh
    dimension). Each data-parallel rank trains on its own sequences of the global batch; the
    ``tp`` ranks of one data-parallel rank on the same ones. Against the reference, the whole
    model trained one step on the whole global batch in this process: the loss, the largest
    |difference| of the gradients (FSDP2 averages them over "dp"), and of the parameters after
    the step (AdamW's first step divides each gradient by its own size, so float rounding in
    tiny gradients shows there). Also a split weight's placements and shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    device = worker_device(rank)
    mesh = init_device_mesh(device.type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = GPT(RECIPE_CONFIG).to(device)
    reference = copy.deepcopy(model)

    for block in model.blocks:                       # the lines of the chapter, as they are
        block.attn = shardable_attention(block.attn, tp)
        parallelize_module(block, mesh["tp"], block_plan())
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(2)
    idx = torch.randint(RECIPE_CONFIG.vocab_size, (RECIPE_BATCH, RECIPE_CONFIG.block_size + 1), generator=g)
    x, y = idx[:, :-1].contiguous().to(device), idx[:, 1:].contiguous().to(device)
    dp_rank, dp = mesh["dp"].get_local_rank(), mesh["dp"].size()
    mine = slice(dp_rank * RECIPE_BATCH // dp, (dp_rank + 1) * RECIPE_BATCH // dp)
    loss = model(x[mine], y[mine])[1]
    loss.backward()
    ref_loss = reference(x, y)[1]
    ref_loss.backward()

    # Gathering a 2-D sharded tensor takes two all-gathers, which torch logs a warning about on
    # every rank; what is gathered here is only looked at.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    undo = torch.cat([qkv_rows(RECIPE_CONFIG.n_embd, r, tp) for r in range(tp)]).argsort()
    expected = dict(reference.named_parameters())

    def gap(of) -> float:
        """Largest |difference| between of(split parameter) and of(the reference's), whole."""
        worst = 0.0
        for name, param in model.named_parameters():
            whole = _whole(of(param)).detach()
            if ".attn.c_attn." in name:               # shardable_attention's row order, undone
                whole = whole[undo]
            worst = max(worst, (whole - of(expected[name]).detach()).abs().max().item())
        return worst

    grad_gap = gap(lambda p: p.grad)
    optimizer.step()                                  # the fp32 shards, each on its own rank
    torch.optim.AdamW(reference.parameters(), lr=1e-2).step()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss, group=mesh["dp"].get_group())
    weight = model.blocks[0].mlp.c_fc.weight
    return {"mesh": tuple(mesh.mesh.shape), "placements": str(weight.placements),
            "shard": tuple(weight.to_local().shape), "whole": tuple(weight.shape),
            "loss": mean_loss.item() / dp, "reference loss": ref_loss.item(),
            "gradients, max |difference|": grad_gap,
            "parameters after the step, max |difference|": gap(lambda p: p)}
