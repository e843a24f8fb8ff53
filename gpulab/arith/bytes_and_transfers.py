"""Bytes and transfers (chapter 01): tensor sizes, copy times, resident warps.

Part of ``gpulab.arith`` (see its docstring for the conventions); import it as
``from gpulab import arith`` and call ``arith.<name>``, as the notebooks do.
"""

from __future__ import annotations

import math

import torch


KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; try 'float32', 'bfloat16', 'float16', 'int8'")
    return found


def bytes_per_element(dtype: torch.dtype | str) -> int:
    """Bytes one value of ``dtype`` occupies: 4 for float32, 2 for bfloat16/float16, 1 for int8.

    Source: IEEE 754 (binary32, binary16), Google's bfloat16 format; PyTorch reports the same as
    ``torch.tensor([], dtype=d).element_size()`` (also ``d.itemsize``). Chapter 01, "dtype sizes".
    """
    return _dtype(dtype).itemsize


def tensor_bytes(shape: tuple[int, ...], dtype: torch.dtype | str) -> int:
    """Bytes of a dense, contiguous tensor: (product of the shape) x (bytes per element).

    This is what ``t.numel() * t.element_size()`` returns. The CUDA caching allocator rounds each
    allocation up to a multiple of 512 bytes (PyTorch docs, "CUDA semantics: memory management"),
    which matters only for tiny tensors. Chapter 01, "How big is a tensor?".
    """
    return math.prod(shape) * bytes_per_element(dtype)


def transfer_seconds(n_bytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Time to move ``n_bytes`` over a link of ``bandwidth`` bytes/s: latency + bytes/bandwidth.

    The simplest link model (a fixed start-up cost plus a bandwidth term; Hockney, 1994), used for
    PCIe copies in chapter 01 and for collectives in chapter 06.
    """
    return latency + n_bytes / bandwidth


def batches_per_second(batch_bytes: float, bandwidth: float) -> float:
    """How many batches of ``batch_bytes`` a link of ``bandwidth`` bytes/s can deliver per second.

    An upper bound: the link is busy only with this batch stream. Chapter 01, "Feeding the GPU".
    """
    return bandwidth / batch_bytes


def resident_warps(sm_count: int, max_threads_per_sm: int, warp_size: int = 32) -> int:
    """Most warps a GPU can keep resident at once: SMs x (threads per SM / threads per warp).

    Source: CUDA C++ Programming Guide, "Compute capabilities" table (2048 threads per SM and
    32 threads per warp for compute capability 8.0 and 9.0). Chapter 01, "The GPU in plain words".
    """
    return sm_count * (max_threads_per_sm // warp_size)
