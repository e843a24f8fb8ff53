"""Cross-checks of gpulab.device.hardware: derived figures must agree with published ones.

Each test recomputes a number from the table and compares it with a figure printed somewhere
else (formula sheet, datasheet, whitepaper), so a typo, a unit slip or a with-sparsity figure in
the table makes a test fail. No GPU and no torch needed.
"""

import dataclasses

import pytest

from gpulab.device.hardware import GPUS, GPUSpec, lookup

A100 = GPUS["A100-SXM4-80GB"]
H100 = GPUS["H100-SXM5-80GB"]
H100_PCIE = GPUS["H100-PCIe-80GB"]
H200 = GPUS["H200-SXM-141GB"]


def test_table_has_the_four_rows_keyed_by_short_name():
    assert {"A100-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIe-80GB", "H200-SXM-141GB"} <= set(GPUS)
    assert all(isinstance(spec, GPUSpec) for spec in GPUS.values())


def test_rows_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.bf16_flops = 1979e12  # type: ignore[misc]


def test_h100_sxm_critical_intensity_bf16_is_about_295():
    # formulas.md (Roofline): 989e12 / 3.35e12 ~ 295 FLOPs/byte
    assert H100.bf16_flops / H100.memory_bandwidth == pytest.approx(295, abs=1)


def test_a100_critical_intensity_bf16_is_about_153():
    # 312 TFLOP/s / 2,039 GB/s (A100 80GB SXM datasheet)
    assert A100.bf16_flops / A100.memory_bandwidth == pytest.approx(153, abs=1)


@pytest.mark.parametrize("key", sorted(GPUS))
def test_bf16_peak_is_twice_tf32_peak(key):
    # Ampere and Hopper tensor cores: TF32 runs at half the 16-bit rate
    # (A100 datasheet 312 vs 156; Hopper whitepaper 989.4 vs 494.7).
    spec = GPUS[key]
    assert spec.bf16_flops == pytest.approx(2 * spec.tf32_flops, rel=2e-3)


@pytest.mark.parametrize("key", sorted(GPUS))
def test_fp16_peak_equals_bf16_peak(key):
    spec = GPUS[key]
    assert spec.fp16_flops == spec.bf16_flops


# Tensor-core BF16 figures as the datasheets print them, *with sparsity*.
WITH_SPARSITY_BF16 = {
    "A100-SXM4-80GB": 624e12,  # A100 datasheet "312 | 624*"
    "H100-SXM5-80GB": 1979e12,  # H100 datasheet "1,979 teraFLOPS*"
    "H100-PCIe-80GB": 1513e12,  # H100 datasheet (PCIe column) "1,513 teraFLOPS*"
    "H200-SXM-141GB": 1979e12,  # H200 datasheet "1,979 TFLOPS*"
}


@pytest.mark.parametrize("key", sorted(WITH_SPARSITY_BF16))
def test_sparsity_trap_bf16_is_the_dense_half(key):
    spec, sparse = GPUS[key], WITH_SPARSITY_BF16[key]
    assert spec.bf16_flops != pytest.approx(sparse, rel=0.05), "with-sparsity figure in the table"
    assert spec.bf16_flops == pytest.approx(sparse / 2, rel=1e-3)


@pytest.mark.parametrize("key", sorted(GPUS))
def test_no_dense_16_bit_peak_above_one_petaflop(key):
    # No Ampere or Hopper GPU reaches 1 PFLOP/s dense BF16; a value above it is a sparsity figure.
    assert GPUS[key].bf16_flops < 1e15


def test_a100_peaks_follow_from_sm_count_and_clock():
    # Ampere whitepaper: 1,024 dense FP16 FMA per clock per SM (4 tensor cores), 64 FP32 cores
    # per SM, 1,410 MHz boost. One FMA = 2 FLOPs.
    clock = 1.410e9
    assert A100.sm_count * 1024 * 2 * clock == pytest.approx(A100.bf16_flops, rel=2e-3)
    assert A100.sm_count * 64 * 2 * clock == pytest.approx(A100.fp32_flops, rel=2e-3)


def test_h100_sxm_peaks_follow_from_sm_count_and_clock():
    # Hopper whitepaper: 2x A100's per-SM tensor rate (2,048 dense FP16 FMA/clk/SM) at 1,830 MHz,
    # 128 FP32 cores per SM at 1,980 MHz.
    assert H100.sm_count * 2048 * 2 * 1.830e9 == pytest.approx(H100.bf16_flops, rel=1e-3)
    assert H100.sm_count * 128 * 2 * 1.980e9 == pytest.approx(H100.fp32_flops, rel=1e-3)


def test_h200_has_the_h100_sxm_compute_and_more_memory():
    # Same GH100 configuration: the H200 datasheet's FLOP/s equal the H100 SXM's up to rounding.
    assert H200.sm_count == H100.sm_count
    for field in ("bf16_flops", "fp16_flops", "tf32_flops", "fp32_flops"):
        assert getattr(H200, field) == pytest.approx(getattr(H100, field), rel=2e-3), field
    assert H200.memory_bytes == 141e9
    assert H200.memory_bandwidth == 4.8e12
    assert H200.memory_bandwidth / H100.memory_bandwidth == pytest.approx(1.43, abs=0.01)


def test_h100_pcie_is_the_smaller_part():
    assert (H100_PCIE.sm_count, H100.sm_count) == (114, 132)
    assert H100_PCIE.memory_bandwidth == 2.0e12
    assert H100_PCIE.bf16_flops < H100.bf16_flops


def test_quoted_80_gb_is_74_5_gib():
    # The datasheet label "80 GB" read as decimal bytes, expressed in GiB (2**30 bytes).
    for spec in (A100, H100, H100_PCIE):
        assert spec.memory_bytes == 80 * 10**9
        assert round(spec.memory_bytes / 2**30, 1) == 74.5


def test_bandwidths_are_decimal_bytes_per_second():
    assert A100.memory_bandwidth == 2_039e9  # "2,039 GB/s"
    assert H100.memory_bandwidth == 3.35e12  # "3.35 TB/s"
    assert A100.nvlink_bandwidth == 600e9
    assert H100.nvlink_bandwidth == H200.nvlink_bandwidth == 900e9


def test_pcie_is_stored_per_direction():
    # Datasheets: "PCIe Gen4: 64GB/s", "PCIe Gen5: 128GB/s" -- both directions added.
    assert A100.pcie_bandwidth_per_direction == 64e9 / 2
    for spec in (H100, H100_PCIE, H200):
        assert spec.pcie_bandwidth_per_direction == 128e9 / 2
        assert spec.pcie_bandwidth_per_direction == 2 * A100.pcie_bandwidth_per_direction  # Gen5 = 2x Gen4


def test_on_chip_sizes_are_binary():
    assert A100.l2_cache_bytes == 41_943_040  # deviceQuery on an A100: "L2 Cache Size: 41943040 bytes"
    assert H100.l2_cache_bytes == 50 * 2**20
    assert A100.max_shared_memory_per_sm_bytes == 164 * 1024  # CUDA guide, compute capability 8.0
    assert H100.max_shared_memory_per_sm_bytes == 228 * 1024  # CUDA guide, compute capability 9.0


@pytest.mark.parametrize("key", sorted(GPUS))
def test_sm_limits(key):
    spec = GPUS[key]
    assert spec.warp_size == 32
    assert spec.max_threads_per_sm == 64 * spec.warp_size  # 64 resident warps on 8.0 and 9.0
    assert spec.registers_per_sm * 4 == 256 * 1024  # 64K 32-bit registers = 256 KB register file
    assert spec.compute_capability == {"Ampere": (8, 0), "Hopper": (9, 0)}[spec.architecture]


@pytest.mark.parametrize("key", sorted(GPUS))
def test_every_row_cites_sources_with_urls(key):
    sources = GPUS[key].sources
    assert isinstance(sources, tuple) and sources
    assert all("https://" in source for source in sources)
    assert any("datasheet" in source.lower() for source in sources)


@pytest.mark.parametrize(
    "device_name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA H200", "H200-SXM-141GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
        ("H100-SXM5-80GB", "H100-SXM5-80GB"),  # a table key works too
    ],
)
def test_lookup_maps_torch_device_names(device_name, key):
    assert lookup(device_name) is GPUS[key]


@pytest.mark.parametrize(
    "device_name",
    [
        "NVIDIA GeForce GTX 1080",
        "NVIDIA H200 NVL",  # different product (lower power and clocks)
        "NVIDIA H100 NVL",
        "NVIDIA A100-SXM4-40GB",  # 40 GB part: 1,555 GB/s, not 2,039
        "",
    ],
)
def test_lookup_returns_none_for_gpus_not_in_the_table(device_name):
    assert lookup(device_name) is None
