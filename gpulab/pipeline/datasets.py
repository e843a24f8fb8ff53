"""Synthetic datasets for chapter 07: a known cost per sample (a wait, or a fixed amount of
computing), nothing downloaded; and the streams and random draws of its section 8 (a stream that
every worker reads whole, the same stream read once across workers and ranks, a random
augmentation), which DataLoader workers can import."""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info


# ------------------------------------------------------------------------------------------
# Synthetic datasets: a known cost per sample, nothing downloaded


def _sample(index: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.full(shape, float(index))


class LatencyDataset(Dataset):
    """I/O-bound: each sample waits ``latency`` seconds (``time.sleep``), as a read from network
    storage or a remote object store waits, then returns a (``shape``) tensor filled with its
    index. Waiting takes no core, so workers scale past the core count."""

    def __init__(self, n: int, latency: float, shape: tuple[int, ...] = (64,)):
        self.n, self.latency, self.shape = n, latency, tuple(shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.latency)
        return _sample(index, self.shape)

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        # A batched read: the DataLoader asks for a batch's indices at once, and one wait of
        # latency x batch stands for them (one wake-up per batch, not per sample, so that a busy
        # machine's scheduling delays do not add up sample by sample).
        time.sleep(self.latency * len(indices))
        return [_sample(index, self.shape) for index in indices]


def busy_work(rounds: int) -> int:
    """A fixed amount of pure-Python arithmetic (a linear congruential generator), standing in for
    decoding and augmenting a sample: it needs a core for all of its time."""
    x = 12345
    for _ in range(rounds):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def calibrate_rounds(seconds: float, probe_rounds: int = 20_000) -> int:
    """Rounds of ``busy_work`` that take about ``seconds`` in this process now (the best of three
    probes, so a busy moment on a shared machine does not inflate it)."""
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        busy_work(probe_rounds)
        best = min(best, time.perf_counter() - start)
    return max(1, round(seconds / best * probe_rounds))


class DecodeDataset(Dataset):
    """CPU-bound: each sample does ``rounds`` of ``busy_work`` (a fixed amount of computing, like
    decoding a JPEG), then returns a (``shape``) tensor filled with its index. W workers share the
    free cores: beyond the core count they only take turns."""

    def __init__(self, n: int, rounds: int, shape: tuple[int, ...] = (64,)):
        self.n, self.rounds, self.shape = n, rounds, tuple(shape)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        busy_work(self.rounds)
        return _sample(index, self.shape)


class TokenDataset(Dataset):
    """Language-model samples: (input ids, targets shifted by one) of ``seq_len`` tokens, random
    but fixed by the index, after ``latency`` seconds of waiting per sample (reading a shard).
    A batch is read at once (``__getitems__``, as ``LatencyDataset``): one wait of latency x
    batch, so that a busy machine's wake-up delays do not add up sample by sample."""

    def __init__(self, n: int, seq_len: int, vocab_size: int, latency: float = 0.0):
        self.n, self.seq_len, self.vocab_size, self.latency = n, seq_len, vocab_size, latency

    def __len__(self) -> int:
        return self.n

    def _tokens(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        tokens = torch.randint(self.vocab_size, (self.seq_len + 1,), generator=generator)
        return tokens[:-1], tokens[1:]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.latency:
            time.sleep(self.latency)
        return self._tokens(index)

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.latency:
            time.sleep(self.latency * len(indices))
        return [self._tokens(index) for index in indices]


# ------------------------------------------------------------------------------------------
# Streams and random draws (section 8, "In your training script")


class Stream(IterableDataset):
    """A stream of ``n`` samples (0, 1, ..., n - 1, standing for the samples of one file), written
    as people first write one: with W DataLoader workers, each worker runs its own copy of
    ``__iter__`` from the start, so every sample comes W times (``unsharded_batches``)."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.tensor(i)


def unsharded_batches(samples: int, batch_size: int, workers: int) -> int:
    """Batches in one pass over ``DataLoader(Stream(samples), batch_size, num_workers=workers)``:
    each of the W workers (one process with ``workers=0``) batches the whole stream itself, so
    W x ceil(samples / batch_size)."""
    return max(workers, 1) * math.ceil(samples / batch_size)


class ShardedStream(IterableDataset):
    """The same stream, each sample read once across every worker of every rank: with W workers
    on each of R ranks there are W x R readers, and reader ``rank * W + worker`` takes every
    (W x R)-th sample from its own offset. With files, slice the list of files the same way.
    The rank is read when the dataset is made, in the training process: a worker started with
    spawn or forkserver has no process group, and would read rank 0 there."""

    def __init__(self, n: int):
        self.n = n
        if dist.is_available() and dist.is_initialized():     # in the training process
            self.rank, self.ranks = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.ranks = 0, 1

    def __iter__(self):                                   # runs in each worker
        info = get_worker_info()                          # None in the main process
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        reader, readers = self.rank * workers + worker, self.ranks * workers
        for i in range(reader, self.n, readers):
            yield torch.tensor(i)


class RandomAugment(Dataset):
    """``n`` samples, each a random draw from the loading process's own generator, as a random
    crop or flip draws: in a DataLoader worker that generator is seeded base_seed + worker id,
    base_seed drawn from the loader's ``generator`` (torch/utils/data/_utils/worker.py)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(())
