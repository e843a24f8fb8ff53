"""Data parallelism by hand, next to PyTorch's DDP and its sharded cousins (chapter 06).

Data parallelism in one sentence: every rank holds the whole model, takes its own slice of the
global batch, and before the optimizer step the ranks average their gradients with an
all-reduce, so every rank applies the same update and the replicas stay identical. ``train``
does exactly that by hand (one all-reduce per gradient tensor, or one for all of them flattened
into a bucket), or lets ``DistributedDataParallel`` do it, which buckets the gradients and
starts each bucket's all-reduce while backward is still computing the rest (Li et al. 2020,
"PyTorch Distributed", VLDB).

The functions named as workers run inside ``gpulab.parallel.dist.launch``; ``train_one_process`` is the
reference without any parallelism, for the same global batches (``compare_modes`` runs it on
rank 0, alone, after the parallel trainings). ``fsdp2_mixed_precision_step``
is chapter 06's FSDP2 recipe (bf16 compute, fp32 reduction, accumulation without sync), which
``sharded_state`` runs after counting the shards.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gpulab.measure import synchronize
from gpulab.models import GPT, GPTConfig
from gpulab.parallel.dist import worker_device, worker_mesh
from gpulab.precision import sample_batch, text_corpus

# A 2-layer byte-level GPT: small enough for 2 CPU processes to train in seconds.
CONFIG = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=64)
MODES = ("by hand, per tensor", "by hand, one bucket", "DDP")
# DDP with a communication hook that all-reduces bf16 copies of the fp32 gradients: half the
# bytes, but no longer equal to the one-process run (bf16 keeps 8 significant bits).
COMPRESSED = "DDP, bf16 compression hook"
ONE_PROCESS = "one process, whole batch"   # the reference: no parallelism at all


def seeded_gpt(device) -> GPT:
    """The GPT every rank and the one-process reference start from: built on the CPU with seed
    0, then moved. Built on ``cuda:r`` directly, its weights would come from that GPU's random
    generator, which differs from the CPU's: same seed, different weights."""
    torch.manual_seed(0)
    return GPT(CONFIG).to(device)


def global_batch(step: int, batch: int, seq_len: int, data: torch.Tensor, device):
    """The same global batch on every rank for a given step (seeded by the step)."""
    return sample_batch(data, batch, seq_len, torch.Generator().manual_seed(1000 + step), device)


def all_reduce_gradients(model: torch.nn.Module, world_size: int, one_bucket: bool) -> int:
    """Average the gradients over the ranks: sum them with all-reduce, divide by the ranks.
    Returns the bytes this rank handed to all-reduce (the gradients as they are: fp32 here)."""
    grads = [p.grad for p in model.parameters()]
    if one_bucket:                     # one large message: pays the per-message latency once
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    else:                              # one message per tensor: simple, latency-bound
        for g in grads:
            dist.all_reduce(g)
    for g in grads:
        g.div_(world_size)
    return sum(g.numel() * g.element_size() for g in grads)


def _counted(hook, sent_dtype):
    """A DDP communication hook that runs ``hook`` and adds the bytes it all-reduces, each
    bucket's values in ``sent_dtype`` (None: the gradients' own dtype), to state["bytes"]."""
    def counted(state, bucket):
        grads = bucket.buffer()
        state["bytes"] += grads.numel() * (sent_dtype or grads.dtype).itemsize
        return hook(None, bucket)      # None: the default process group
    return counted


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()


def train(rank: int, world_size: int, mode: str, steps: int = 10, batch: int = 16,
          seq_len: int = 64, lr: float = 0.05, bucket_cap_mb: float = 0.1) -> dict:
    """Worker: train a fresh GPT (same seed on every rank) with SGD for ``steps`` steps, each
    rank on its slice of the global batch, synchronising gradients as ``mode`` says. Returns
    the final parameters (flattened, on the CPU), the median step time, the bytes this rank
    handed to all-reduce in the last step and, by hand, the median time spent in all-reduce."""
    if mode not in MODES + (COMPRESSED,):
        raise ValueError(f"mode must be one of {MODES + (COMPRESSED,)}, got {mode!r}")
    if batch % world_size:
        raise ValueError(f"the global batch {batch} must divide evenly over {world_size} ranks")
    device = worker_device(rank)
    data = text_corpus(200_000)
    model = seeded_gpt(device)
    by_hand = mode.startswith("by hand")
    sent = {"bytes": 0}
    if not by_hand:
        # Small buckets so that this small model has several, and overlap can happen. The hook
        # is DDP's own default (allreduce_hook) or bf16_compress_hook, counted.
        model = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
        hook, dtype = ((default_hooks.bf16_compress_hook, torch.bfloat16) if mode == COMPRESSED
                       else (default_hooks.allreduce_hook, None))
        model.register_comm_hook(sent, _counted(hook, dtype))
    else:
        for p in model.parameters():   # start identical, as DDP's constructor ensures
            dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    step_times, comm_times = [], []
    for step in range(steps):
        idx, targets = global_batch(step, batch, seq_len, data, device)
        mine = slice(rank * batch // world_size, (rank + 1) * batch // world_size)
        sent["bytes"] = 0
        start = time.perf_counter()
        _, loss = model(idx[mine], targets[mine])
        loss.backward()
        if by_hand:
            # On a GPU both calls only enqueue work: wait for backward's kernels before the
            # clock starts, and for the all-reduce itself (NCCL's stream) before it stops. The
            # barrier keeps out the wait for a slower rank to finish its backward.
            synchronize(device)
            dist.barrier()
            comm_start = time.perf_counter()
            sent["bytes"] = all_reduce_gradients(model, world_size,
                                                 one_bucket=mode == "by hand, one bucket")
            synchronize(device)
            comm_times.append(time.perf_counter() - comm_start)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        step_times.append(time.perf_counter() - start)
    module = model if by_hand else model.module
    return {"params": _flat_params(module),
            "step_seconds": statistics.median(step_times[1:]),      # the first step warms up
            "comm_seconds": statistics.median(comm_times[1:]) if comm_times else None,
            "allreduce_bytes": sent["bytes"]}


def compare_modes(rank: int, world_size: int, steps: int = 10, batch: int = 16,
                  seq_len: int = 64) -> dict:
    """Worker: ``train`` in every mode, one after the other in the same process group; then
    rank 0 alone trains ``train_one_process``, the reference, under ONE_PROCESS (its parameters).
    Here rather than in the notebook's kernel, whose first optimizer would import torch._dynamo
    (2.5 CPU-s) that the ranks' fork server has already imported."""
    results = {mode: train(rank, world_size, mode, steps, batch, seq_len)
               for mode in MODES + (COMPRESSED,)}
    if rank == 0:
        results[ONE_PROCESS] = train_one_process(steps, batch, seq_len)
    return results


def train_one_process(steps: int = 10, batch: int = 16, seq_len: int = 64, lr: float = 0.05,
                      device="cpu") -> torch.Tensor:
    """The reference: one process, the whole global batch each step. Final parameters."""
    data = text_corpus(200_000)
    model = seeded_gpt(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        idx, targets = global_batch(step, batch, seq_len, data, device)
        model(idx, targets)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return _flat_params(model)


@contextlib.contextmanager
def harmless_fsdp2_warnings_silenced():
    """Two UserWarnings these workers would print on every rank, silenced inside this block only.
    The GPT's logits are a view of the head's output, which FSDP2 flags in case something modifies
    them in place (nothing here does); CommDebugMode's module tracker registers full backward
    hooks on modules whose inputs need no gradient (token ids), which torch notes in backward."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        warnings.filterwarnings("ignore", message=r"Full backward hook is firing")
        yield


def fsdp2_mixed_precision_step(inputs: torch.Tensor, targets: torch.Tensor, mesh,
                               micro_batches: int = 4, keep_gathered: bool = False) -> dict:
    """One optimizer step of FSDP2 with bf16 compute, fp32 gradient reduction and accumulation
    without communication: the lines of chapter 06's "In your training script", plus the lines
    that look (marked). ``inputs`` and ``targets`` (the next token of each input): this rank's
    batch, split into ``micro_batches``.

    ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: each unit's parameters are
    all-gathered and computed with in bf16, the gradients reduce-scattered in fp32, and the
    optimizer steps the fp32 shards, which are the master weights (no extra copy: PyTorch docs,
    ``MixedPrecisionPolicy``). ``set_requires_gradient_sync(False)`` skips the reduce-scatter
    (FSDP1's ``no_sync``); the unsharded gradients then accumulate on each rank, in
    ``reduce_dtype``, until the micro-batch that syncs. It does not skip the all-gathers: with
    ``reshard_after_forward`` at its default (None in torch 2.13: True for the blocks, False
    for the root, whose parameters backward needs first) every micro-batch gathers every unit
    in forward and every block again in backward. ``keep_gathered=True`` adds
    ``set_reshard_after_backward(False)`` until the last micro-batch: the parameters stay
    gathered from one micro-batch's backward to the next one's forward (more memory, fewer
    all-gathers; ``FSDPModule.set_reshard_after_backward``, torch 2.13). The collectives of each
    micro-batch are counted with ``torch.distributed.tensor.debug.CommDebugMode``.
    Returns what each rank saw."""
    with harmless_fsdp2_warnings_silenced():
        return _fsdp2_step(inputs, targets, mesh, micro_batches, keep_gathered)


def _fsdp2_step(inputs, targets, mesh, micro_batches: int, keep_gathered: bool) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    model = seeded_gpt(inputs.device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)   # steps the fp32 shards

    seen = {"compute dtype": set(), "all-gathers": [], "reduce-scatters": []}   # looking
    model.blocks[0].mlp.c_fc.register_forward_pre_hook(
        lambda module, args: seen["compute dtype"].add(str(module.weight.dtype)))
    rows = len(inputs) // micro_batches
    parts = list(zip(inputs.split(rows), targets.split(rows)))
    for i, (x, y) in enumerate(parts):
        last = i == len(parts) - 1
        model.set_requires_gradient_sync(last)                      # reduce-scatter at the end
        if keep_gathered:
            model.set_reshard_after_backward(last)                  # gathered until then
        with CommDebugMode() as comm:                               # looking: count collectives
            loss = model(x, y)[1]
            if i == 0:                                              # looking: after forward,
                seen["block sharded after forward"] = isinstance(model.blocks[0].mlp.c_fc.weight,
                                                                 DTensor)
                seen["root sharded after forward"] = isinstance(model.wte.weight, DTensor)
            (loss / len(parts)).backward()
        counts = {str(op): n for op, n in comm.get_comm_counts().items()}
        seen["all-gathers"].append(counts.get("c10d._allgather_base_", 0))
        seen["reduce-scatters"].append(counts.get("c10d._reduce_scatter_base_", 0))
        if i == len(parts) - 2:                                     # looking: nothing reduced yet
            seen["gradients before the last micro-batch"] = sum(p.grad is not None
                                                                for p in model.parameters())
    seen["gradients after it"] = sum(p.grad is not None for p in model.parameters())
    seen["gradient dtype"] = sorted({str(p.grad.dtype) for p in model.parameters()})
    seen["parameter dtype"] = sorted({str(p.dtype) for p in model.parameters()})
    seen["gradient sum of this rank's shards"] = sum(p.grad.to_local().double().sum().item()
                                                     for p in model.parameters())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seen["compute dtype"] = sorted(seen["compute dtype"])
    seen["parameter tensors"] = len(list(model.parameters()))
    seen["units"] = 1 + len(model.blocks)                           # the root and each block
    return seen


def save_sharded(model, optimizer, folder) -> None:
    """Save an FSDP2 model and its optimizer: every rank writes its own shards, in parallel, to
    ``folder`` (torch.distributed.checkpoint). ``get_state_dict`` names each tensor as in the
    unsharded model, so the checkpoint loads on any number of ranks. Chapter 06, section 7."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=folder)


def load_sharded(model, optimizer, folder) -> None:
    """The other way: each rank reads the shards it holds from ``folder`` into ``model`` (already
    sharded with ``fully_shard``) and ``optimizer``, in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=folder)                  # fills the tensors in place
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


def next_token_batch(rows: int, seq_len: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token sequences as (inputs, targets), each target the token after its input, as
    a language model trains: ``rows`` sequences of ``seq_len`` tokens, seeded."""
    tokens = torch.randint(0, CONFIG.vocab_size, (rows, seq_len + 1),
                           generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def sharded_state(rank: int, world_size: int) -> dict:
    """Worker: what each rank holds when the optimizer state (ZeroRedundancyOptimizer, ZeRO
    stage 1) or the parameters (FSDP2 ``fully_shard``, ZeRO stage 3) are sharded. Counts
    elements, after one training step so that Adam's state exists. Then, in the same process
    group, ``fsdp2_mixed_precision_step`` with the default resharding (under "fsdp2 recipe") and
    with the parameters kept gathered between micro-batches ("fsdp2 recipe, kept gathered")."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    device = worker_device(rank)
    x, y = next_token_batch(2, 32, seed=rank, device=device)
    model = seeded_gpt(device)
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    model(x, y)[1].backward()
    zero.step()
    state = sum(t.numel() for s in zero.optim.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)   # exp_avg and exp_avg_sq, not the step count

    sharded = seeded_gpt(device)
    mesh = worker_mesh(world_size, device)   # the ranks' real device, not fully_shard's guess
    for block in sharded.blocks:       # each block its own unit: gathered just before it runs
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    local = sum(p.to_local().numel() for p in sharded.parameters())
    with harmless_fsdp2_warnings_silenced():
        sharded(x, y)[1].backward()    # forward and backward gather and re-shard each unit
    batch = next_token_batch(4, 16, seed=100 + rank, device=device)
    return {"params": GPT.count_params(CONFIG), "zero_adam_state": state, "fsdp_params": local,
            "fsdp2 recipe": fsdp2_mixed_precision_step(*batch, mesh),
            "fsdp2 recipe, kept gathered": fsdp2_mixed_precision_step(*batch, mesh, keep_gathered=True)}
