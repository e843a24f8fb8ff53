"""Choosing the device, and what CUDA_VISIBLE_DEVICES does to it (chapter 01).

Notebooks call ``best_device()``. The rest shows how torch numbers the GPUs it may use:
``visible_gpus`` reads the variable in every form CUDA accepts (indices, GPU and MIG UUIDs,
abbreviated, mixed), ``physical_gpu`` maps torch's ``cuda:<i>`` back to the GPU behind it through
NVML, and ``visible_gpu_counts`` asks fresh processes how many GPUs they see when the variable is
set early or too late. Sizes are in GiB (2^30 bytes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import torch

GiB = 2**30
LEARNER_BUDGET_BYTES = 4 * GiB  # solution notebooks keep peak GPU memory under this
MIN_FREE_FRACTION = 0.10  # a GPU with less than this share free is taken, whatever its size


def best_device() -> torch.device:
    """The device notebooks use: the first visible GPU if torch can use one, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class VisibleGPU:
    """One device CUDA_VISIBLE_DEVICES lets CUDA see, located on the machine."""
    nvml_index: int               # the physical GPU: NVML's index (nvidia-smi's numbering); for
                                  # a MIG instance, the GPU it is carved from
    uuid: str | None = None       # that GPU's UUID, "GPU-...", when NVML was asked
    mig_uuid: str | None = None   # the MIG instance's UUID, "MIG-...", when the entry named one


def _leading_index(entry: str) -> int | None:
    """An index entry as CUDA reads it, like C's strtoul: the leading digits ("1gpu2" is 1, as
    torch's own parser models it); None when the entry does not start with a digit."""
    digits = re.match(r"\d+", entry)
    return int(digits.group()) if digits else None


def _nvml_table(nvml) -> list[tuple[int, str, list[str]]]:
    """(NVML index, GPU UUID, UUIDs of its MIG instances) for every GPU the driver lists."""
    table = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        migs = []
        try:
            mode = nvml.nvmlDeviceGetMigMode(handle)[0]      # (current, pending)
            mig_on = mode == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        except Exception:  # noqa: BLE001 (a GPU without MIG: NVMLError_NotSupported)
            mig_on = False
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle) if mig_on else 0):
            try:
                migs.append(_text(nvml.nvmlDeviceGetUUID(
                    nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))))
            except Exception:  # noqa: BLE001 (an empty slot: NVMLError_NotFound)
                continue
        table.append((index, _text(nvml.nvmlDeviceGetUUID(handle)), migs))
    return table


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older pynvml returns bytes


def _by_prefix(prefix: str, uuids: list[str]) -> int | None:
    """The position of the one UUID that starts with ``prefix`` (case-insensitive); None when
    none or several do: CUDA takes an abbreviated UUID only when it names one device."""
    found = [i for i, uuid in enumerate(uuids) if uuid.lower().startswith(prefix.lower())]
    return found[0] if len(found) == 1 else None


def visible_gpus(cuda_visible_devices: str, nvml=None) -> list[VisibleGPU]:
    """The devices CUDA sees with CUDA_VISIBLE_DEVICES=``cuda_visible_devices``, in the order
    torch numbers them cuda:0, cuda:1, ...

    Every form CUDA accepts (CUDA Programming Guide, "CUDA Environment Variables"): a comma-
    separated sequence of GPU indices ("2,3") or UUIDs as nvidia-smi prints them
    ("GPU-8932f937-d72c-..."), the UUID abbreviated to any prefix that names one GPU
    ("GPU-8932f937"), a MIG instance ("MIG-<uuid>", or "MIG-GPU-<uuid>/<GI>/<CI>" before driver
    R470; CUDA enumerates a single MIG instance, so the list ends there), entries of each kind
    mixed. CUDA ignores everything from the first invalid entry on ("0,2,-1,1" shows 0 and 2).

    Indices need no driver: they are CUDA's own numbering, nvidia-smi's only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID. UUIDs are looked up through NVML: ``nvml`` is the ``pynvml``
    module (nvidia-ml-py) or a stand-in with its functions; LookupError when it cannot be had.
    """
    entries = [e.strip() for e in cuda_visible_devices.split(",")]
    table = None
    if any(e.startswith(("GPU-", "MIG-")) for e in entries):
        table = _ask_nvml(nvml)
    visible: list[VisibleGPU] = []
    for entry in entries:
        index = _leading_index(entry)
        if index is not None:
            if table is not None and index >= len(table):
                break                                   # past the last GPU: invalid
            visible.append(VisibleGPU(index, table[index][1] if table else None))
            continue
        if entry.startswith("MIG-GPU-"):                # the R450/R460 form: GPU, GI, CI
            gpu = _by_prefix(entry[4:].split("/")[0], [uuid for _, uuid, _ in table])
            if gpu is not None:
                visible.append(VisibleGPU(table[gpu][0], table[gpu][1], entry))
            break                                       # a single MIG instance at most
        if entry.startswith("MIG-"):
            instances = [(i, uuid, mig) for i, uuid, migs in table for mig in migs]
            found = _by_prefix(entry, [mig for _, _, mig in instances])
            if found is not None:
                visible.append(VisibleGPU(*instances[found]))
            break
        if entry.startswith("GPU-"):
            gpu = _by_prefix(entry, [uuid for _, uuid, _ in table])
            if gpu is None:
                break
            visible.append(VisibleGPU(table[gpu][0], table[gpu][1]))
            continue
        break                                           # "", "-1", anything else
    return visible


def _ask_nvml(nvml) -> list[tuple[int, str, list[str]]]:
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 (no pynvml, no driver)
        raise LookupError(f"CUDA_VISIBLE_DEVICES names GPUs by UUID; finding them needs the "
                          f"NVIDIA driver through NVML (nvidia-ml-py): {type(error).__name__}: "
                          f"{error}") from error
    try:
        return _nvml_table(nvml)
    finally:
        nvml.nvmlShutdown()   # NVML counts its inits: a caller's own session stays open


def physical_gpu(cuda_visible_devices: str | None, torch_index: int, nvml=None) -> int:
    """The physical GPU behind torch's ``cuda:<torch_index>``, as NVML (and nvidia-smi) number
    it: torch renumbers the devices CUDA_VISIBLE_DEVICES lists from 0, in the listed order, so
    with "2,3" cuda:1 is GPU 3, and with "GPU-8932f937" cuda:0 is whichever GPU has that UUID.
    A MIG instance maps to the GPU it is carved from. Every form CUDA accepts: ``visible_gpus``.
    (An index is CUDA's; it matches nvidia-smi's when CUDA_DEVICE_ORDER=PCI_BUS_ID.)"""
    if cuda_visible_devices is None:
        return torch_index  # unset: every GPU visible, nothing renumbered
    listed = visible_gpus(cuda_visible_devices, nvml)
    if not 0 <= torch_index < len(listed):
        raise IndexError(f"cuda:{torch_index} does not exist with CUDA_VISIBLE_DEVICES="
                         f"{cuda_visible_devices!r} ({len(listed)} GPU(s) visible)")
    return listed[torch_index].nvml_index


# When a probe sets CUDA_VISIBLE_DEVICES: False, from the start; True, after torch.cuda.init()
# (torch starts CUDA, as the first tensor on a GPU does); "is_available", after
# torch.cuda.is_available() only, as every chapter's first cell does through best_device();
# "is_available, then init", the same, then torch starts CUDA.
LATE_SETTINGS = (False, True, "is_available", "is_available, then init")


def count_gpus_in_this_process(cuda_visible_devices: str | None, set_after_init=False) -> int:
    """What ``torch.cuda.device_count()`` says after CUDA_VISIBLE_DEVICES is set to
    ``cuda_visible_devices`` (None: removed) in this process, at the moment ``set_after_init``
    names (``LATE_SETTINGS``). ``visible_gpu_count`` runs it in a fresh process.

    The CUDA driver reads the variable once, when it initialises: at the first
    ``cudaGetDeviceCount``, which ``torch.cuda.is_available()`` already calls (torch's own comment
    on it: "initializes the CUDA Driver API via cuInit"). Torch 2.13 answers ``device_count()``
    from NVML, re-reading the variable on every call, until torch itself starts CUDA
    (``torch.cuda.init()`` or the first tensor on a GPU), and from CUDA's view after that
    (pytorch/pytorch#175355). So after ``is_available()`` a late change shows in
    ``device_count()`` while CUDA, and so ``cuda:<i>``, still uses what it read; once torch
    starts CUDA the count shows CUDA's view again."""
    if set_after_init not in LATE_SETTINGS:
        raise ValueError(f"set_after_init must be one of {LATE_SETTINGS}, not {set_after_init!r}")
    if set_after_init is True and torch.cuda.is_available():
        torch.cuda.init()              # CUDA starts here and reads CUDA_VISIBLE_DEVICES...
    elif set_after_init in ("is_available", "is_available, then init"):
        gpu = torch.cuda.is_available()  # the driver starts here and reads the variable...
    if cuda_visible_devices is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices  # ...so, late, CUDA ignores this
    if set_after_init == "is_available, then init" and gpu:
        torch.cuda.init()              # torch starts CUDA, which kept what it read
    return torch.cuda.device_count()


def _count_gpus_in_a_fresh_fork(at_start: str | None, cuda_visible_devices: str | None,
                                set_after_init) -> int:
    """One probe of ``visible_gpu_counts``, in a process forked from one that has imported torch
    but never started CUDA or NVML, so its CUDA starts from nothing, as in a new interpreter.
    ``at_start``: CUDA_VISIBLE_DEVICES as the probe starts (None: unset)."""
    if at_start is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = at_start
    return count_gpus_in_this_process(cuda_visible_devices, set_after_init)


# The probes' parent: imports torch once, forks one probe per setting (they run together), prints
# their replies. Not multiprocessing's forkserver: that re-imports the caller's __main__ in every
# child, which breaks a learner's script that has no `if __name__ == "__main__":` guard.
_PROBE_PARENT = """
import json, os, sys, traceback
from gpulab.device.choosing import _count_gpus_in_a_fresh_fork
children = []
for probe in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            reply = str(_count_gpus_in_a_fresh_fork(*probe))
        except BaseException:
            reply = traceback.format_exc()
        os.write(write, reply.encode())
        os._exit(0)
    os.close(write)
    children.append((pid, read))
replies = []
for pid, read in children:
    with os.fdopen(read) as pipe:
        replies.append(pipe.read())
    os.waitpid(pid, 0)
print(json.dumps(replies))
"""


def visible_gpu_counts(settings: dict) -> dict:
    """``torch.cuda.device_count()`` in fresh processes, one per entry of ``settings``:
    ``{label: (cuda_visible_devices, set_after_init)}`` -> ``{label: count}``. Each process runs
    with CUDA_VISIBLE_DEVICES set to ``cuda_visible_devices`` (None: unset) from the start
    (``set_after_init`` False) or only later, at the moment ``set_after_init`` names
    (``LATE_SETTINGS``: after ``torch.cuda.init()``, after ``torch.cuda.is_available()``).

    Fresh processes because CUDA reads the variable once per process. They are forked from one
    new Python process that imports torch once (3-4 CPU-seconds, instead of that per probe) and
    never starts CUDA: a fork of it is as fresh for CUDA as a new interpreter (torch refuses CUDA
    only in a fork of a process whose CUDA had started)."""
    probes = []
    for label, (cuda_visible_devices, set_after_init) in settings.items():
        if set_after_init not in LATE_SETTINGS:
            raise ValueError(f"{label!r}: set_after_init must be one of {LATE_SETTINGS}")
        # A late probe's CUDA starts under our own setting; the probe changes it afterwards.
        at_start = os.environ.get("CUDA_VISIBLE_DEVICES") if set_after_init else cuda_visible_devices
        probes.append((at_start, cuda_visible_devices, set_after_init))
    parent = subprocess.run([sys.executable, "-c", _PROBE_PARENT, json.dumps(probes)],
                            capture_output=True, text=True, timeout=120)
    if parent.returncode != 0:
        raise RuntimeError(f"the CUDA_VISIBLE_DEVICES probes failed:\n{parent.stderr}")
    counts = {}
    for label, reply in zip(settings, json.loads(parent.stdout.strip().splitlines()[-1])):
        if not reply.strip().isdigit():
            raise RuntimeError(f"the CUDA_VISIBLE_DEVICES probe {label!r} failed:\n{reply}")
        counts[label] = int(reply)
    return counts


def visible_gpu_count(cuda_visible_devices: str | None, set_after_init=False) -> int:
    """One probe of ``visible_gpu_counts``."""
    return visible_gpu_counts({0: (cuda_visible_devices, set_after_init)})[0]
