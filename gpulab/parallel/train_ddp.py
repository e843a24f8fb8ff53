"""A data-parallel training script, run the way torchrun runs yours (chapter 06, section 7).

    torchrun --standalone --nproc_per_node=2 -m gpulab.parallel.train_ddp --epochs 2

torchrun starts ``--nproc_per_node`` copies of the script and sets, in each, RANK (0 … n − 1
over all nodes), LOCAL_RANK (the GPU on this node), WORLD_SIZE, MASTER_ADDR and MASTER_PORT.
What the script adds to a one-process training loop:

- ``init_process_group()`` reads those variables: NCCL when there are GPUs, gloo on CPUs
  (``--backend gloo`` keeps every rank on the CPU, e.g. two ranks on a one-GPU machine);
- each rank computes on ``cuda:LOCAL_RANK``, and ``DistributedDataParallel`` wraps the model
  (its constructor broadcasts rank 0's weights, so every replica starts the same);
- a ``DistributedSampler`` hands each rank its own 1/n of the dataset, and
  ``sampler.set_epoch(epoch)`` reshuffles it each epoch: every rank draws the same
  permutation, from seed + epoch, and takes every n-th sample of it, so the shards never
  overlap (PyTorch docs, ``torch.utils.data.distributed.DistributedSampler``). Without
  ``set_epoch`` every epoch repeats epoch 0's order;
- the step is chapter 05's ``accumulate``: k micro-batches, the first k − 1 inside
  ``no_sync()``, every token weighed the same over the global batch.

Rank 0 prints what the ranks did, then one line ``summary: {json}`` for the notebook to read.
The all-reduce count comes from a communication hook that only counts (measuring, not training).
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)

    dist.init_process_group(args.backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = DistributedDataParallel(GPT(SMALL_GPT).to(device),
                                    device_ids=[local_rank] if device.type == "cuda" else None)
    state = {"all-reduces": 0}
    model.register_comm_hook(state, counting_hook)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    dataset = token_dataset(args.sequences, args.seq_len)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)   # this rank's 1/n of it
    loader = DataLoader(dataset, batch_size=args.micro_batch * args.accumulation, sampler=sampler)
    seen, steps, all_reduces = [], 0, []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)                    # a new order each epoch, the same on all ranks
        seen.append([])
        for ids, x, y in loader:
            micro_batches = list(zip(x.to(device).split(args.micro_batch),
                                     y.to(device).split(args.micro_batch)))
            state["all-reduces"] = 0
            loss_tokens = accumulate(model, micro_batches, world_size)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seen[-1] += ids.tolist()
            steps += 1
            all_reduces.append(state["all-reduces"])

    everyone = [None] * world_size
    dist.all_gather_object(everyone, {"rank": rank, "seen": seen, "all_reduces": all_reduces})
    if rank == 0:
        per_epoch = [sorted(i for r in everyone for i in r["seen"][e]) for e in range(args.epochs)]
        summary = {
            "world_size": world_size, "steps": steps, "tokens per step": int(loss_tokens),
            "global batch": args.micro_batch * args.accumulation * world_size,
            "samples per rank per epoch": len(seen[0]),
            "shards cover the dataset once": all(p == list(range(args.sequences)) for p in per_epoch),
            "all-reduces per step": sorted({n for r in everyone for n in r["all_reduces"]}),
            "first samples": {r["rank"]: [s[:4] for s in r["seen"]] for r in everyone},
        }
        print(f"{world_size} ranks, {args.epochs} epochs of {args.sequences} sequences, "
              f"global batch {summary['global batch']} = {args.micro_batch} x "
              f"{args.accumulation} micro-batches x {world_size} ranks: {steps} optimizer steps")
        for r in everyone:
            orders = "; ".join(f"epoch {e}: {s[:4]}..." for e, s in enumerate(r["seen"]))
            print(f"rank {r['rank']}: {len(r['seen'][0])} samples an epoch, starting {orders}")
        print(f"each epoch's shards together cover every sample once: "
              f"{summary['shards cover the dataset once']}")
        print(f"DDP all-reduces per optimizer step: {summary['all-reduces per step']}")
        print("summary: " + json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
