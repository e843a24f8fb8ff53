"""A data-parallel training script, run the way torchrun runs yours (chapter 06, section 7).

    torchrun --standalone --nproc_per_node=2 -m gpulab.parallel.train_ddp --epochs 2

torchrun starts ``--nproc_per_node`` copies of the script and sets, in each, RANK (0 … n − 1
over all nodes), LOCAL_RANK (the GPU on this node), WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
What the script adds to a one-process training loop:

- ``init_process_group()`` reads those variables: NCCL when there are GPUs, gloo on CPUs
  (``--backend gloo`` keeps every rank on the CPU, e.g. two ranks on a one-GPU machine);
- each rank computes on ``cuda:LOCAL_RANK``, and ``DistributedDataParallel`` wraps the model.
  Its constructor broadcasts rank 0's parameters and buffers (``init_sync=True``, the default),
  so the replicas start the same whatever each rank's seed; the script seeds each rank
  differently, so that random ops such as dropout draw different masks on different ranks;
- a ``DistributedSampler`` hands each rank its own 1/n of the dataset, and
  ``sampler.set_epoch(epoch)`` reshuffles it each epoch: every rank draws the same
  permutation, from seed + epoch, and takes every n-th sample of it, so the shards never
  overlap (PyTorch docs, ``torch.utils.data.distributed.DistributedSampler``). Without
  ``set_epoch`` every epoch repeats epoch 0's order. ``drop_last=True`` on the DataLoader
  drops a last batch smaller than the others;
- the step is chapter 05's ``accumulate``: k micro-batches, the first k − 1 inside
  ``no_sync()``, every token weighed the same over the global batch;
- the loss printed is the global batch's mean: each rank's summed token loss, all-reduced,
  over all ranks' tokens (one rank's own loss would be a noisy sample of it);
- ``--checkpoint PATH``: rank 0 alone saves the model (``model.module``, without DDP's
  wrapper) and the optimizer after every epoch, the others wait at a barrier; at start every
  rank loads PATH if it exists and resumes after its epoch. That is what makes
  ``torchrun --max-restarts=3`` useful: a restarted run starts the script again from the top;
- at the end, DDP is freed before its process group is destroyed (``main``).

Rank 0 prints what the ranks did, then one line ``summary: {json}`` for the notebook to read.
The all-reduce count comes from a communication hook that only counts (measuring, not training).
"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gpulab.checkpointing.accumulation import SMALL_GPT
from gpulab.checkpointing.ddp_accumulation import accumulate
from gpulab.models import GPT


def token_dataset(n_sequences: int, seq_len: int) -> TensorDataset:
    """(sample id, input tokens, target tokens) for ``n_sequences`` random sequences."""
    tokens = torch.randint(SMALL_GPT.vocab_size, (n_sequences, seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    return TensorDataset(torch.arange(n_sequences), tokens[:, :-1], tokens[:, 1:])


def counting_hook(state, bucket):                  # measuring only: count DDP's all-reduces
    state["all-reduces"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--backend", choices=("nccl", "gloo"),   # gloo: every rank on the CPU
                        default="nccl" if torch.cuda.is_available() else "gloo")
    parser.add_argument("--checkpoint", help="a file to save after each epoch and resume from")
    args = parser.parse_args(argv)

    dist.init_process_group(args.backend)
    train(args)
    # DDP sits in a reference cycle, so Python frees it only at some later garbage collection.
    # If that comes after destroy_process_group(), DDP's reducer drops the group's last
    # reference while holding the GIL, and gloo's destructor waits for its worker threads, one
    # of which waits for the GIL to free a finished all-gather's tensors: the process hangs for
    # good (PyTorch issue 56297). So DDP, whose last reference went with train's frame, is freed
    # here first. Measured with torch 2.13, one gloo rank, 300 rounds of DDP, a backward and
    # all_gather_object: destroy first hung within the 300 (as make test did in CI); DDP
    # freed first, all 300 ended.
    gc.collect()
    dist.destroy_process_group()


def train(args) -> None:
    """One rank's run. DDP lives in this frame only: main frees it before destroying the group."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(rank)                         # DDP broadcasts rank 0's weights anyway
    model = DistributedDataParallel(GPT(SMALL_GPT).to(device),
                                    device_ids=[local_rank] if device.type == "cuda" else None)
    state = {"all-reduces": 0}
    model.register_comm_hook(state, counting_hook)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):       # a restart: resume
        saved = torch.load(args.checkpoint, map_location=device)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first_epoch = saved["epoch"] + 1
    if first_epoch >= args.epochs:
        print(f"{args.checkpoint} has finished all {args.epochs} epochs already")
        return

    dataset = token_dataset(args.sequences, args.seq_len)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)   # this rank's 1/n of it
    loader = DataLoader(dataset, batch_size=args.micro_batch * args.accumulation, sampler=sampler,
                        drop_last=True)
    seen, steps, all_reduces, losses = [], 0, [], []
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)                    # a new order each epoch, the same on all ranks
        seen.append([])
        for ids, x, y in loader:
            micro_batches = list(zip(x.to(device).split(args.micro_batch),
                                     y.to(device).split(args.micro_batch)))
            state["all-reduces"] = 0
            loss_tokens, loss_sum = accumulate(model, micro_batches, world_size)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            dist.all_reduce(loss_sum)               # every rank's summed token loss
            losses.append(loss_sum.item() / loss_tokens.item())      # the global batch's mean
            seen[-1] += ids.tolist()
            steps += 1
            all_reduces.append(state["all-reduces"])
        if args.checkpoint:
            if rank == 0:                           # one copy: every replica holds the same
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch}, args.checkpoint)
            dist.barrier()                          # no rank reads it before it is written

    everyone = [None] * world_size
    dist.all_gather_object(everyone, {"rank": rank, "seen": seen, "all_reduces": all_reduces})
    if rank == 0:
        per_epoch = [sorted(i for r in everyone for i in r["seen"][e]) for e in range(len(seen))]
        summary = {
            "world_size": world_size, "steps": steps, "tokens per step": int(loss_tokens),
            "global batch": args.micro_batch * args.accumulation * world_size,
            "first epoch": first_epoch,
            "samples per rank per epoch": len(seen[0]),
            "shards cover the dataset once": all(p == list(range(args.sequences)) for p in per_epoch),
            "all-reduces per step": sorted({n for r in everyone for n in r["all_reduces"]}),
            "first samples": {r["rank"]: [s[:4] for s in r["seen"]] for r in everyone},
            "loss per step": [round(loss, 4) for loss in losses],
        }
        print(f"{world_size} ranks, epochs {first_epoch} to {args.epochs - 1} of {args.sequences} "
              f"sequences, global batch {summary['global batch']} = {args.micro_batch} x "
              f"{args.accumulation} micro-batches x {world_size} ranks: {steps} optimizer steps")
        for r in everyone:
            orders = "; ".join(f"epoch {first_epoch + e}: {s[:4]}..." for e, s in enumerate(r["seen"]))
            print(f"rank {r['rank']}: {len(r['seen'][0])} samples an epoch, starting {orders}")
        print(f"each epoch's shards together cover every sample once: "
              f"{summary['shards cover the dataset once']}")
        print(f"DDP all-reduces per optimizer step: {summary['all-reduces per step']}")
        print(f"loss (mean over the global batch), first and last step: {losses[0]:.4f}, {losses[-1]:.4f}")
        print("summary: " + json.dumps(summary))


if __name__ == "__main__":
    main()
