"""A learner's share of a shared GPU (workshop mode, `make workshop`).

The workshop's hub gives each learner's server one GPU or MIG instance through
``CUDA_VISIBLE_DEVICES`` and a memory cap through ``GPULAB_GPU_MEMORY_FRACTION``: a fraction of
that device's memory. ``import gpulab`` reads the variable and caps PyTorch's caching allocator
on every visible device with ``torch.cuda.set_per_process_memory_fraction``; an allocation
beyond the cap raises ``torch.OutOfMemoryError`` in the learner's own kernel instead of taking
the card from the room.

The cap is queued for the moment CUDA initialises (``torch.cuda._lazy_call``, the queue
``torch.cuda.manual_seed`` uses), so it starts no CUDA context. Nor does it import torch: when
gpulab comes first, the cap is queued right after torch's own import (``_CapAfterTorchImport``),
so ``import gpulab`` stays as cheap as without a workshop.

What it does not isolate: the cap is the caching allocator's bookkeeping in one process, not
the hardware's, and the learner's own: a learner may raise the variable, or allocate outside
PyTorch. Each process's CUDA context (a few hundred MiB), memory a library allocates outside
PyTorch's allocator, and processes that never import gpulab are not counted; compute (SMs) and
memory bandwidth are shared, first come first served. What the learner cannot change is which
device their processes can open (the workshop's device walls: another learner's GPU or MIG
slice is closed to them whatever CUDA_VISIBLE_DEVICES says). MIG instances add the hardware's
walls: memory, SMs, L2 and bandwidth of their own (docs/workshop.md, "What stays shared").

``share_lines`` also tells the doctor the learner's walls on the machine, read from the
learner's own cgroup: the memory all their processes and scratch files share, and the tasks.

This module imports nothing heavy, so reading the share costs no torch import.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import warnings
from pathlib import Path

FRACTION_ENV = "GPULAB_GPU_MEMORY_FRACTION"
applied_fraction: float | None = None   # what cap_from_environment queued, for the doctor


def memory_fraction(environ=os.environ) -> float | None:
    """The cap the host set, as a fraction in (0, 1]; None when there is none. A value that is
    not such a number is reported with a warning and ignored (it must not stop the kernel)."""
    text = environ.get(FRACTION_ENV, "").strip()
    if not text:
        return None
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        warnings.warn(f"{FRACTION_ENV}={text!r} is not a fraction in (0, 1]: no GPU memory cap.")
        return None
    return fraction


def cap(fraction: float) -> None:
    """Cap PyTorch's caching allocator at ``fraction`` of each visible device's memory, now if
    CUDA is running, else when it starts."""
    global applied_fraction
    import torch

    def apply():
        for index in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, index)

    torch.cuda._lazy_call(apply)
    applied_fraction = fraction


def cap_from_environment() -> None:
    """What ``import gpulab`` runs when GPULAB_GPU_MEMORY_FRACTION is set: the cap now if torch
    is imported already, else right after torch is (no CUDA use can come before that)."""
    fraction = memory_fraction()
    if fraction is None:
        return
    if "torch" in sys.modules:
        cap(fraction)
    elif not any(isinstance(f, _CapAfterTorchImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _CapAfterTorchImport(fraction))


class _CapAfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds torch with the other finders and wraps its loader, so that the cap is queued the
    moment torch's own ``__init__`` has run. Removes itself on first use."""

    def __init__(self, fraction: float):
        self.fraction = fraction

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_cap(module):
            exec_module(module)
            cap(self.fraction)

        spec.loader.exec_module = exec_then_cap
        return spec


def share_lines(total_bytes: int | None, environ=os.environ, proc: Path = Path("/proc"),
                cgroups: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """The doctor's lines about the learner's share, in its layout; [] outside a workshop.
    ``total_bytes``: the memory of the learner's first visible device, when known."""
    lines = []
    fraction = memory_fraction(environ)
    if fraction is not None:
        size = "" if total_bytes is None else f" = {fraction * total_bytes / 2**30:.1f} GiB"
        lines.append(f"  {'workshop GPU share':<27}{fraction:g} of cuda:0's memory{size}, the "
                     f"host's cap ({FRACTION_ENV})")
    walls = environ.get("GPULAB_WORKSHOP_WALLS")
    if walls and walls != "off":
        memory = own_cgroup_limit("memory", proc, cgroups)
        tasks = own_cgroup_limit("pids", proc, cgroups)
        if memory is not None:
            lines.append(f"  {'workshop memory':<27}{memory / 2**30:.2f} GiB for all your processes "
                         f"and your /tmp, /var/tmp, /dev/shm files together ({walls}); past it "
                         "the largest process, usually a kernel, is stopped")
        if tasks is not None:
            lines.append(f"  {'workshop tasks':<27}{tasks} processes and threads at most ({walls})")
    return lines


def own_cgroups(proc: Path = Path("/proc")) -> dict[str, str]:
    """This process's cgroups, /proc/self/cgroup as {controller: path} in the file's order (the
    v2 hierarchy's under ""); {} when it cannot be read."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def own_cgroup_limit(controller: str, proc: Path = Path("/proc"),
                     cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """This process's memory (bytes) or pids limit from its own cgroup, v1 or v2 (systemd's
    scopes are v2 cgroups); None when there is none or it cannot be read."""
    v1, v2 = {"memory": ("memory.limit_in_bytes", "memory.max"),
              "pids": ("pids.max", "pids.max")}[controller]
    for name, path in own_cgroups(proc).items():
        if name == controller:
            limit = cgroups / controller / path.lstrip("/") / v1
        elif name == "" and (cgroups / "cgroup.controllers").exists():
            limit = cgroups / path.lstrip("/") / v2
        else:
            continue
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**62:      # v1 writes "no limit" as a huge number
            return int(text)
    return None
