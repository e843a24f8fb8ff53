"""Choosing the device, and what CUDA_VISIBLE_DEVICES does to it (chapter 01).

Notebooks call ``best_device()``. The rest shows how torch numbers the GPUs it may use:
``physical_gpu`` maps torch's ``cuda:<i>`` back to the GPU behind it, and ``visible_gpu_counts``
asks fresh processes how many GPUs they see when the variable is set early or too late.
Sizes are in GiB (2^30 bytes).
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

GiB = 2**30
LEARNER_BUDGET_BYTES = 4 * GiB  # solution notebooks keep peak GPU memory under this
MIN_FREE_FRACTION = 0.10  # a GPU with less than this share free is taken, whatever its size


def best_device() -> torch.device:
    """The device notebooks use: the first visible GPU if torch can use one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def physical_gpu(cuda_visible_devices: str | None, torch_index: int) -> int:
    """The CUDA device index behind torch's ``cuda:<torch_index>``: torch renumbers the GPUs that
    CUDA_VISIBLE_DEVICES lists from 0, in the listed order, so with "2,3" cuda:1 is GPU 3.
    (CUDA's index matches nvidia-smi's when CUDA_DEVICE_ORDER=PCI_BUS_ID.)"""
    if cuda_visible_devices is None:
        return torch_index  # unset: every GPU visible, nothing renumbered
    listed = []
    for entry in cuda_visible_devices.split(","):
        if not entry.strip().isdigit():
            break  # CUDA ignores everything from the first invalid entry on ("", "-1", UUIDs here)
        listed.append(int(entry))
    if not 0 <= torch_index < len(listed):
        raise IndexError(f"cuda:{torch_index} does not exist with CUDA_VISIBLE_DEVICES="
                         f"{cuda_visible_devices!r} ({len(listed)} GPU(s) visible)")
    return listed[torch_index]


def count_gpus_in_this_process(cuda_visible_devices: str | None, set_after_init: bool) -> int:
    """What ``torch.cuda.device_count()`` says after CUDA_VISIBLE_DEVICES is set to
    ``cuda_visible_devices`` (None: removed) in this process; with ``set_after_init``, only after
    CUDA has been initialised. ``visible_gpu_count`` runs it in a fresh process.

    Before CUDA is initialised, torch (2.13) answers ``device_count()`` from NVML and re-reads the
    variable on every call, so a late change would still show. What is fixed once is CUDA's own
    view: the driver reads the variable when CUDA initialises (``torch.cuda.init()``, or the first
    tensor on a GPU). To show that, initialise CUDA first, then set the variable."""
    if set_after_init and torch.cuda.is_available():
        torch.cuda.init()              # CUDA starts here and reads CUDA_VISIBLE_DEVICES...
    if cuda_visible_devices is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices  # ...so, late, this is ignored
    return torch.cuda.device_count()


_COUNT_GPUS = """
import sys
from gpulab.device import count_gpus_in_this_process
value = None if sys.argv[1] == "unset" else sys.argv[1]
print(count_gpus_in_this_process(value, set_after_init=sys.argv[2] == "late"))
"""


def visible_gpu_counts(settings: dict) -> dict:
    """``torch.cuda.device_count()`` in fresh Python processes, one per entry of ``settings``:
    ``{label: (cuda_visible_devices, set_after_init)}`` -> ``{label: count}``. Each process runs
    with CUDA_VISIBLE_DEVICES set to ``cuda_visible_devices`` (None: unset) either from the start
    or, with ``set_after_init``, only after it has initialised CUDA. Fresh processes because CUDA
    reads the variable once per process; started together because each spends seconds importing
    torch."""
    probes = {}
    for label, (cuda_visible_devices, set_after_init) in settings.items():
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if not set_after_init and cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        elif set_after_init:  # CUDA starts under our own setting; the child changes it afterwards
            env.update({k: v for k, v in os.environ.items() if k == "CUDA_VISIBLE_DEVICES"})
        value = "unset" if cuda_visible_devices is None else cuda_visible_devices
        probes[label] = subprocess.Popen(
            [sys.executable, "-c", _COUNT_GPUS, value, "late" if set_after_init else "early"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    counts = {}
    for label, probe in probes.items():
        out, err = probe.communicate(timeout=120)
        if probe.returncode != 0:
            raise RuntimeError(f"the CUDA_VISIBLE_DEVICES probe {label!r} failed:\n{err}")
        counts[label] = int(out.strip().splitlines()[-1])
    return counts


def visible_gpu_count(cuda_visible_devices: str | None, set_after_init: bool = False) -> int:
    """One probe of ``visible_gpu_counts``."""
    return visible_gpu_counts({0: (cuda_visible_devices, set_after_init)})[0]
