"""Datasheet figures of common NVIDIA datacenter GPUs: one table, one row per GPU, each row with its sources.

Notebooks use it to put the vendor's numbers next to what the learner measures::

    import torch
    from gpulab.device import hardware
    spec = hardware.lookup(torch.cuda.get_device_name())   # None if the GPU is not in the table
    spec.bf16_flops / spec.memory_bandwidth                 # critical arithmetic intensity, FLOPs/byte

Units (every field is a plain number in SI base units)
-------------------------------------------------------
- bytes, bytes/s, FLOP/s. Rates are decimal: 1 GB/s = 10**9 B/s, 1 TFLOP/s = 10**12 FLOP/s.
  NVIDIA quotes bandwidth and FLOP/s in decimal units, and so do we.
- On-chip sizes (shared memory per SM, L2) are binary, because that is what they are: the CUDA
  C++ Programming Guide's "228 KB" means 228 * 1024 bytes; the A100's "40 MB" L2 is reported by
  deviceQuery as 41943040 bytes (40 MiB), and torch prints L2_cache_size=50MB for an H100 SXM,
  where torch's "MB" is l2CacheSize // 2**20, i.e. MiB.
- ``memory_bytes`` is the HBM capacity *as the vendor labels it* ("80 GB"), read as decimal:
  80 * 10**9 bytes = 74.5 GiB. Beware: HBM stacks are built from binary-sized DRAM dies, so the
  physical memory behind the "80 GB" label is about 80 GiB, and PyTorch reports more than 74.5
  GiB: torch.cuda.get_device_properties(0).total_memory is 81920 MiB on an A100-SXM4-80GB and
  about 81090 MiB (79.2 GiB) on an H100 SXM; about 143156 MiB (139.8 GiB) on an H200 "141 GB".
  Compare measured memory with what torch reports, not with this label.

Peak FLOP/s are dense. Datasheets print tensor-core figures "with sparsity" (2:4 structured
sparsity, which ordinary training does not use); those are twice the dense peak, so we halve them.
``fp32_flops`` is the non-tensor-core FP32 (CUDA core) peak; ``tf32_flops`` is the tensor-core
TF32 peak that torch uses for float32 matmuls when TF32 is allowed.

PCIe: datasheets quote the two directions added together ("PCIe Gen4: 64 GB/s",
"PCIe Gen5: 128 GB/s"). One direction of a x16 link, which is what a host-to-device copy uses, is
half that: 32 GB/s (Gen4) and 64 GB/s (Gen5). ``pcie_bandwidth_per_direction`` stores the half.
NVLink is stored as quoted: the total over all links, both directions added (A100 600 GB/s =
12 links x 25 GB/s x 2 directions; H100 900 GB/s = 18 links x 25 GB/s x 2), so one direction is
half of ``nvlink_bandwidth``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUSpec", "GPUS", "lookup"]

# Unit helpers, so that the table reads like the datasheet.
KiB = 2**10  # bytes
MiB = 2**20  # bytes
GB = 10**9  # bytes (capacity as labelled)
GB_S = 1e9  # bytes per second
TB_S = 1e12  # bytes per second
TFLOPS = 1e12  # FLOP/s

# Sources, cited by the rows below.
A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet, "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
AMPERE_WHITEPAPER = (
    "NVIDIA A100 Tensor Core GPU Architecture whitepaper, "
    "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"
)
H100_DATASHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet, "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
)
HOPPER_WHITEPAPER = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, "
    "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
)
H200_DATASHEET = (
    "NVIDIA H200 Tensor Core GPU datasheet, "
    "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
)
CUDA_GUIDE = (
    "CUDA C++ Programming Guide, Compute Capabilities (technical specifications per compute capability), "
    "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#compute-capabilities"
)


@dataclass(frozen=True)
class GPUSpec:
    """Vendor figures of one GPU model. SI units throughout; see the module docstring."""

    name: str  # marketing name, as in the datasheet column heading
    architecture: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_threads_per_sm: int  # resident threads (64 warps x 32 on these GPUs)
    warp_size: int
    registers_per_sm: int  # 32-bit registers (65536 = a 256 KiB register file)
    max_shared_memory_per_sm_bytes: int  # largest shared-memory carve-out of the L1/shared array
    l2_cache_bytes: int
    memory_bytes: int  # HBM capacity as labelled, read as decimal GB (see module docstring)
    memory_bandwidth: float  # HBM, bytes/s
    pcie_bandwidth_per_direction: float  # bytes/s, one direction (half the datasheet figure)
    nvlink_bandwidth: float | None  # bytes/s, all links, both directions added, as quoted
    bf16_flops: float  # dense tensor-core peak, FLOP/s
    fp16_flops: float  # dense tensor-core peak, FLOP/s
    tf32_flops: float  # dense tensor-core peak, FLOP/s
    fp32_flops: float  # non-tensor (CUDA core) peak, FLOP/s
    sources: tuple[str, ...]


# Per-SM limits by compute capability, from the CUDA C++ Programming Guide's table
# (also NVIDIA/cccl's arch_traits.cuh): 8.0 and 9.0 both allow 64 resident warps (2048
# threads) and 64K 32-bit registers per SM; shared memory per SM up to 164 KB (8.0), 228 KB (9.0).
_AMPERE_SM = dict(
    architecture="Ampere",
    compute_capability=(8, 0),
    max_threads_per_sm=2048,
    warp_size=32,
    registers_per_sm=64 * KiB,
    max_shared_memory_per_sm_bytes=164 * KiB,
)
_HOPPER_SM = dict(
    architecture="Hopper",
    compute_capability=(9, 0),
    max_threads_per_sm=2048,
    warp_size=32,
    registers_per_sm=64 * KiB,
    max_shared_memory_per_sm_bytes=228 * KiB,
)

GPUS: dict[str, GPUSpec] = {
    # A100 SXM 80GB. 108 SMs, 40 MB L2, 1410 MHz boost: Ampere whitepaper. Memory, bandwidth,
    # NVLink, PCIe, FLOP/s: datasheet ("A100 80GB SXM" column); the datasheet prints BF16/FP16
    # 312 | 624* and TF32 156 | 312*, where * is with sparsity; we keep the dense 312 and 156.
    "A100-SXM4-80GB": GPUSpec(
        name="NVIDIA A100 80GB SXM",
        **_AMPERE_SM,
        sm_count=108,
        l2_cache_bytes=40 * MiB,
        memory_bytes=80 * GB,  # HBM2e
        memory_bandwidth=2_039 * GB_S,
        pcie_bandwidth_per_direction=64 * GB_S / 2,  # "PCIe Gen4: 64GB/s" is both directions
        nvlink_bandwidth=600 * GB_S,
        bf16_flops=312 * TFLOPS,
        fp16_flops=312 * TFLOPS,
        tf32_flops=156 * TFLOPS,
        fp32_flops=19.5 * TFLOPS,
        sources=(A100_DATASHEET, AMPERE_WHITEPAPER, CUDA_GUIDE),
    ),
    # H100 SXM5 80GB. 132 SMs, 50 MB L2 and the exact dense peaks (BF16/FP16 989.4, TF32 494.7,
    # FP32 66.9 TFLOP/s, at 1830 MHz tensor / 1980 MHz boost): Hopper whitepaper. The datasheet
    # rounds and prints with sparsity: BF16 1,979*, TF32 989*, FP32 67. Memory 80 GB HBM3,
    # 3.35 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s: datasheet.
    "H100-SXM5-80GB": GPUSpec(
        name="NVIDIA H100 SXM",
        **_HOPPER_SM,
        sm_count=132,
        l2_cache_bytes=50 * MiB,
        memory_bytes=80 * GB,  # HBM3
        memory_bandwidth=3.35 * TB_S,
        pcie_bandwidth_per_direction=128 * GB_S / 2,  # "PCIe Gen5: 128GB/s" is both directions
        nvlink_bandwidth=900 * GB_S,
        bf16_flops=989.4 * TFLOPS,
        fp16_flops=989.4 * TFLOPS,
        tf32_flops=494.7 * TFLOPS,
        fp32_flops=66.9 * TFLOPS,
        sources=(H100_DATASHEET, HOPPER_WHITEPAPER, CUDA_GUIDE),
    ),
    # H100 PCIe 80GB. 114 SMs, 50 MB L2, 80 GB HBM2e at 2,000 GB/s, dense BF16/FP16 756 and
    # TF32 378 TFLOP/s (whitepaper "756/1513", "378/756": dense/sparse), FP32 51.2 (datasheet
    # rounds to 51): Hopper whitepaper and the H100 datasheet's "H100 PCIe" column. Its 600 GB/s
    # NVLink needs an NVLink bridge and joins two cards only.
    "H100-PCIe-80GB": GPUSpec(
        name="NVIDIA H100 PCIe",
        **_HOPPER_SM,
        sm_count=114,
        l2_cache_bytes=50 * MiB,
        memory_bytes=80 * GB,  # HBM2e
        memory_bandwidth=2.0 * TB_S,
        pcie_bandwidth_per_direction=128 * GB_S / 2,
        nvlink_bandwidth=600 * GB_S,  # with an NVLink bridge (2 cards)
        bf16_flops=756 * TFLOPS,
        fp16_flops=756 * TFLOPS,
        tf32_flops=378 * TFLOPS,
        fp32_flops=51.2 * TFLOPS,
        sources=(H100_DATASHEET, HOPPER_WHITEPAPER, CUDA_GUIDE),
    ),
    # H200 SXM 141GB. Datasheet ("H200 SXM" column): 141 GB HBM3e, 4.8 TB/s, NVLink 900 GB/s,
    # PCIe Gen5 128 GB/s, FP32 67, TF32 989*, BF16/FP16 1,979* TFLOP/s (* with sparsity; halved
    # here to 494.5 and 989.5 -- the same GH100 figures as the H100 SXM's 494.7 / 989.4, up to the
    # datasheet's rounding). The datasheet gives neither SM count nor L2: 132 SMs is the H100 SXM5
    # configuration of the same GH100 die and what torch reports on an H200
    # (multi_processor_count=132). L2 is 60 MB, not the H100's 50 MB: the H200 uses all six HBM
    # stacks (12 memory controllers) of GH100, and the full GH100 has 60 MB of L2 (Hopper
    # whitepaper); torch on an H200 reports L2_cache_size=60MB (MiB). Device-query figures, not
    # datasheet ones.
    "H200-SXM-141GB": GPUSpec(
        name="NVIDIA H200 SXM",
        **_HOPPER_SM,
        sm_count=132,
        l2_cache_bytes=60 * MiB,
        memory_bytes=141 * GB,  # HBM3e
        memory_bandwidth=4.8 * TB_S,
        pcie_bandwidth_per_direction=128 * GB_S / 2,
        nvlink_bandwidth=900 * GB_S,
        bf16_flops=1_979 * TFLOPS / 2,
        fp16_flops=1_979 * TFLOPS / 2,
        tf32_flops=989 * TFLOPS / 2,
        fp32_flops=67 * TFLOPS,
        sources=(H200_DATASHEET, HOPPER_WHITEPAPER, CUDA_GUIDE),
    ),
}

# torch.cuda.get_device_name() strings seen for each row. Exact matches only: "NVIDIA H200 NVL",
# "NVIDIA H100 NVL", "NVIDIA A100-SXM4-40GB" and "NVIDIA A100 80GB PCIe" are different products
# (other clocks, memory or bandwidth) and must not borrow these rows.
_DEVICE_NAMES = {
    "nvidia a100-sxm4-80gb": "A100-SXM4-80GB",
    "nvidia h100 80gb hbm3": "H100-SXM5-80GB",  # the SXM5 part; the PCIe card has HBM2e
    "nvidia h100 pcie": "H100-PCIe-80GB",
    "nvidia h200": "H200-SXM-141GB",
}


def lookup(name: str) -> GPUSpec | None:
    """The table row for a torch device name (or a table key), or None if the GPU is not in the table.

    >>> lookup("NVIDIA H100 80GB HBM3").sm_count
    132
    """
    key = " ".join(name.split()).lower()
    key = _DEVICE_NAMES.get(key, key)
    for short_name, spec in GPUS.items():
        if short_name.lower() == key.lower():
            return spec
    return None


# ------------------------------------------------------------------------------------------
# Peak FLOP/s by dtype (chapter 03, "MFU" and "The roofline")

# dtype name -> the GPUSpec field holding its dense peak. float32 is the CUDA-core figure:
# torch runs float32 matmuls on the CUDA cores unless TF32 is switched on (off by default since
# PyTorch 1.12; in torch 2.9 and later torch.backends.cuda.matmul.fp32_precision = "tf32", or
# torch.set_float32_matmul_precision("high"), which sets it; the older
# torch.backends.cuda.matmul.allow_tf32 = True still works but is deprecated); then ask for "tf32".
_PEAK_FIELDS = {
    "bfloat16": "bf16_flops", "bf16": "bf16_flops",
    "float16": "fp16_flops", "fp16": "fp16_flops", "half": "fp16_flops",
    "float32": "fp32_flops", "fp32": "fp32_flops", "float": "fp32_flops",
    "tf32": "tf32_flops",
}


def peak_flops(spec: GPUSpec, dtype) -> float:
    """Dense datasheet peak of ``spec`` in FLOP/s for ``dtype``.

    ``dtype``: torch.bfloat16, torch.float16 or torch.float32 (or their names, "bf16", "fp16",
    "fp32"), or the string "tf32" for tensor-core TF32. bf16/fp16/tf32 are tensor-core peaks;
    float32 is the non-tensor-core (CUDA core) peak, which is what float32 matmuls get unless
    TF32 is enabled. Sparsity is never counted (see the module docstring). No torch import: the
    dtype is read by name, so ``str(torch.bfloat16)`` ("torch.bfloat16") works too.

    >>> peak_flops(GPUS["H100-SXM5-80GB"], "bfloat16") / 1e12
    989.4
    """
    if not isinstance(spec, GPUSpec):
        raise ValueError(f"spec must be a GPUSpec (e.g. lookup(...) or GPUS[...]), got {spec!r}")
    name = str(dtype).removeprefix("torch.").lower()
    field = _PEAK_FIELDS.get(name)
    if field is None:
        raise ValueError(f"no peak figure for dtype {dtype!r} in the table: use torch.bfloat16, "
                         f"torch.float16, torch.float32 or 'tf32' (fp64, int8 and fp8 peaks are "
                         f"not tabulated)")
    return getattr(spec, field)


__all__.append("peak_flops")
