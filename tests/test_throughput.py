"""Chapter 03, throughput arithmetic: the formulas against figures their sources publish, and the
measurements for self-consistency on whatever device is here (CPU in CI; GPU checks skip)."""
import pytest
import torch
import torch.nn.functional as F

from gpulab import arith, measure
from gpulab.device.hardware import GPUS, lookup, peak_flops
from gpulab.models import GPT, GPTConfig

H100 = GPUS["H100-SXM5-80GB"]
A100 = GPUS["A100-SXM4-80GB"]


# ---------------------------------------------------------------------------- FLOPs


def test_matmul_flops_and_bytes_by_hand():
    assert arith.matmul_flops(4096, 4096, 4096) == 2 * 4096**3 == 137_438_953_472
    assert arith.matmul_flops(2, 3, 5) == 60                      # 10 outputs x 3 multiply-adds
    assert arith.matmul_bytes(4096, 4096, 4096) == 2 * 3 * 4096**2  # bf16: A, B read, C written
    assert arith.matmul_bytes(2, 3, 5, bytes_per_value=4) == 4 * (6 + 15 + 10)


def test_training_flops_6nd_and_8nd_with_recomputation():
    # Kaplan et al. 2020: C = 6ND (forward 2ND, backward 4ND); full recomputation adds a
    # forward: 8ND hardware FLOPs (formulas.md, Compute).
    assert arith.training_flops(1e9, 1e9) == 6e18
    assert arith.training_flops(1e9, 1e9, recompute=True) == 8e18


def test_attention_term_for_gpt3_175b():
    # GPT-3 175B (Brown et al. 2020, Table 2.1): 96 layers, d_model 12288, context 2048.
    N, L, h, s = 175e9, 96, 12288, 2048
    per_token = arith.training_flops(N, 1, n_layer=L, hidden=h, seq_len=s)
    attention = per_token - arith.training_flops(N, 1)
    assert attention == 12 * L * h * s == 28_991_029_248            # 2.9e10 FLOPs per token
    assert attention / (6 * N) == pytest.approx(0.0276, abs=1e-4)   # under 3% at this length
    # formulas.md's per-sequence form: 6·s·N + 12·L·h·s²
    assert arith.training_flops(N, s, n_layer=L, hidden=h, seq_len=s) == pytest.approx(
        6 * s * N + 12 * L * h * s**2)
    # recomputation repeats the attention forward too: 16·L·h·s
    recomputed = arith.training_flops(N, 1, n_layer=L, hidden=h, seq_len=s, recompute=True)
    assert recomputed - arith.training_flops(N, 1, recompute=True) == 16 * L * h * s


def test_palm_540b_mfu():
    # PaLM (Chowdhery et al. 2022), appendix B: 238.3K tokens/s on 6144 TPU v4 chips of
    # 275 TFLOP/s; "45.7% without self-attention ((238.3×6×540)/(275×6144)) or 46.2% with it".
    # PaLM 540B: 118 layers, 48 heads of size 256 (attention width 12288, not d_model 18432).
    peak = 6144 * 275e12
    assert arith.mfu(238.3e3, arith.training_flops(540e9, 1), peak) == pytest.approx(0.457, abs=5e-4)
    with_attention = arith.training_flops(540e9, 1, n_layer=118, hidden=48 * 256, seq_len=2048)
    assert arith.mfu(238.3e3, with_attention, peak) == pytest.approx(0.462, abs=5e-4)
    # with d_model as the width the term is too big and the published 46.2% is missed
    too_wide = arith.training_flops(540e9, 1, n_layer=118, hidden=18432, seq_len=2048)
    assert arith.mfu(238.3e3, too_wide, peak) > 0.464


# ---------------------------------------------------------------------------- roofline


def test_h100_critical_intensity_is_about_295():
    # formulas.md, Roofline: 989e12 / 3.35e12 ≈ 295 FLOPs/byte
    ridge = arith.critical_intensity(peak_flops(H100, torch.bfloat16), H100.memory_bandwidth)
    assert ridge == pytest.approx(295, abs=1)
    assert arith.critical_intensity(A100.bf16_flops, A100.memory_bandwidth) == pytest.approx(153, abs=1)


@pytest.mark.parametrize("B", [1, 16, 256])
def test_matmul_intensity_is_about_batch_size(B):
    # formulas.md: [B,D]x[D,F] in bf16 has intensity 2BDF / (2(BD + DF + BF)), ≈ B when B ≪ D, F.
    D = F_ = 8192
    intensity = arith.arithmetic_intensity(arith.matmul_flops(B, D, F_), arith.matmul_bytes(B, D, F_))
    assert intensity == pytest.approx(2 * B * D * F_ / (2 * (B * D + D * F_ + B * F_)), rel=1e-12)
    assert intensity == pytest.approx(B / (1 + B / D + B / F_), rel=1e-12)
    assert intensity < B and (B - intensity) / B <= 2 * B / D      # the "≈ B" is this close
    assert round(intensity, 2) == {1: 1.00, 16: 15.94, 256: 240.94}[B]


def test_bound_and_roofline_time_on_h100():
    D = 8192
    peak, bw = peak_flops(H100, torch.bfloat16), H100.memory_bandwidth
    one = (arith.matmul_flops(1, D, D), arith.matmul_bytes(1, D, D))
    big = (arith.matmul_flops(4096, D, D), arith.matmul_bytes(4096, D, D))
    assert arith.bound(*one, peak, bw) == "memory"
    assert arith.bound(*big, peak, bw) == "compute"
    # B = 1: the 8192² bf16 weight (134 MB) read at 3.35 TB/s: about 40 µs
    assert arith.roofline_seconds(*one, peak, bw) == pytest.approx(134_250_496 / 3.35e12)
    assert arith.roofline_seconds(*one, peak, bw) == pytest.approx(40.07e-6, rel=1e-3)
    # B = 4096: 550 GFLOP at 989.4 TFLOP/s: about 556 µs
    assert arith.roofline_seconds(*big, peak, bw) == pytest.approx(2 * 4096 * D * D / 989.4e12)


# ---------------------------------------------------------------------------- days


def test_training_days_by_hand_and_llama_65b():
    # by hand: 6 · 1e9 · 1.44e12 = 8.64e21 FLOPs at 100 x 1e15 FLOP/s = 86,400 s = 1 day
    assert arith.training_days(1e9, 1.44e12, 100, 1e15, 1.0) == pytest.approx(1.0)
    assert arith.training_days(1e9, 1.44e12, 100, 1e15, 0.5) == pytest.approx(2.0)
    # LLaMA (Touvron et al. 2023, §2.4): 65.2B params, 1.4T tokens, 2048 A100-80GB at
    # 380 tokens/s/GPU: "approximately 21 days". That rate is an MFU of 6·N·380 / 312e12.
    achieved = arith.mfu(380, 6 * 65.2e9, peak_flops(A100, torch.bfloat16))
    assert achieved == pytest.approx(0.476, abs=1e-3)
    days = arith.training_days(65.2e9, 1.4e12, 2048, peak_flops(A100, torch.bfloat16), achieved)
    assert days == pytest.approx(21, abs=0.5)


@pytest.mark.parametrize("call, field", [
    (lambda: arith.matmul_flops(0, 4, 4), "m must be"),
    (lambda: arith.matmul_flops(4, 4.5, 4), "k must be"),
    (lambda: arith.matmul_bytes(4, 4, 4, bytes_per_value=0), "bytes_per_value"),
    (lambda: arith.training_flops(-1, 1e9), "n_params"),
    (lambda: arith.training_flops(1e9, 1e9, n_layer=96), "missing hidden, seq_len"),
    (lambda: arith.training_flops(1e9, 1e9, n_layer=96, hidden=0, seq_len=2048), "hidden"),
    (lambda: arith.mfu(0, 1e9, 1e15), "tokens_per_second"),
    (lambda: arith.arithmetic_intensity(1e9, 0), "bytes_moved"),
    (lambda: arith.critical_intensity(1e15, -1), "bandwidth"),
    (lambda: arith.roofline_seconds(1, 1, 0, 1), "peak_flops_per_second"),
    (lambda: arith.bound("1e9", 1, 1, 1), "flops"),
    (lambda: arith.training_days(1e9, 1e12, 2.5, 1e15, 0.4), "n_gpus"),
    (lambda: arith.training_days(1e9, 1e12, 8, 1e15, 40), "mfu"),
    (lambda: peak_flops(H100, torch.float64), "no peak figure for dtype torch.float64"),
    (lambda: peak_flops(H100, torch.int8), "no peak figure"),
    (lambda: peak_flops("H100", torch.bfloat16), "spec must be a GPUSpec"),
])
def test_impossible_inputs_name_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


@pytest.mark.parametrize("key", sorted(GPUS))
def test_peak_flops_reads_the_table(key):
    spec = GPUS[key]
    assert peak_flops(spec, torch.bfloat16) == spec.bf16_flops
    assert peak_flops(spec, torch.float16) == spec.fp16_flops
    assert peak_flops(spec, torch.float32) == spec.fp32_flops      # CUDA cores, not TF32
    assert peak_flops(spec, "tf32") == spec.tf32_flops
    assert peak_flops(spec, "bf16") == peak_flops(spec, "bfloat16") == spec.bf16_flops
    assert peak_flops(spec, torch.float32) < peak_flops(spec, "tf32") < peak_flops(spec, torch.bfloat16)


# ---------------------------------------------------------------------------- measurements


def test_matmul_throughput_is_self_consistent():
    r = measure.matmul_throughput(128, torch.float32, "cpu", repeats=3)
    assert (r.flops, r.bytes_moved) == (2 * 128**3, 3 * 128**2 * 4)
    assert r.seconds == r.timing.median > 0 and len(r.timing.samples) == 3
    assert r.flops_per_second == pytest.approx(r.flops / r.seconds)
    assert r.bytes_per_second == pytest.approx(r.bytes_moved / r.seconds)
    assert r.arithmetic_intensity == pytest.approx(128 / 6)         # 2n³ / (3n²·4)
    assert (r.device, r.dtype) == ("cpu", "float32")
    assert "TFLOP/s" in str(r)
    bf16 = measure.matmul_throughput(64, torch.bfloat16, "cpu", repeats=2)
    assert bf16.bytes_moved == 3 * 64**2 * 2 and bf16.dtype == "bfloat16"
    with pytest.raises(ValueError, match="floating-point"):
        measure.matmul_throughput(64, torch.int64, "cpu")


def test_elementwise_throughput_counts_read_plus_write():
    n = 2**20
    r = measure.elementwise_throughput(n, torch.float32, "cpu", repeats=3)
    assert (r.flops, r.bytes_moved) == (n, 2 * n * 4)
    assert r.bytes_per_second == pytest.approx(r.bytes_moved / r.seconds) and r.seconds > 0
    assert r.arithmetic_intensity == pytest.approx(1 / 8)
    half = measure.elementwise_throughput(n, torch.bfloat16, "cpu", repeats=2)
    assert half.bytes_moved == 2 * n * 2


def test_launch_overhead_dwarfs_the_per_element_cost():
    r = measure.launch_overhead(200, "cpu", repeats=3)
    assert r.seconds_per_op == pytest.approx(r.tiny.median / 200)
    assert r.seconds_per_element == pytest.approx(r.one.median / 200)
    assert 0 < r.seconds_per_element < r.seconds_per_op
    assert r.ratio > 1 and "tiny adds" in str(r)


def test_training_step_throughput_on_a_tiny_gpt():
    cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32)
    r = measure.training_step_throughput(cfg, 2, 16, torch.float32, "cpu", steps=2)
    model = GPT(cfg)
    matmul_params = model.num_params() - model.wte.weight.numel() - model.wpe.weight.numel()
    assert r["n_params"] == matmul_params == GPT.count_params(cfg) - (64 + 32) * 32
    assert r["flops_per_token"] == 6 * matmul_params + 12 * 2 * 32 * 16
    assert r["tokens_per_step"] == 32 and r["seconds_per_step"] > 0
    assert r["tokens_per_second"] == pytest.approx(32 / r["seconds_per_step"])
    assert r["achieved_flops_per_second"] == pytest.approx(
        r["flops_per_token"] * r["tokens_per_second"])
    assert len(r["timing"].samples) == 2
    with pytest.raises(ValueError, match="block_size"):
        measure.training_step_throughput(cfg, 2, 64, torch.float32, "cpu")


@pytest.mark.parametrize("backward", [False, True])
def test_attention_naive_vs_fused_agree_and_are_timed(backward):
    r = measure.attention_naive_vs_fused(2, 2, 64, 16, torch.float32, "cpu", backward=backward,
                                         repeats=3)
    assert r["naive_seconds"] > 0 and r["fused_seconds"] > 0
    assert r["speedup"] == pytest.approx(r["naive_seconds"] / r["fused_seconds"])
    assert r["max_abs_diff"] < 1e-4
    assert r["flops"] == 2 * 2 * 2 * (2 * 64 * 16 * 64)             # q·kᵀ and att·v
    assert r["scores_bytes"] == 2 * 2 * 64 * 64 * 4
    assert r["backward"] is backward


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_naive_attention_matches_pytorch_and_the_mask_matters(dtype, tol):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g).to(dtype) for _ in range(3))
    naive = measure.naive_attention(q, k, v)
    torch.testing.assert_close(naive, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=tol, rtol=tol)
    # the first query sees only the first key: its output is v's first row exactly
    torch.testing.assert_close(naive[:, :, 0], v[:, :, 0])
    # without the mask the answer is far off: the comparison would catch a missing mask
    unmasked = F.scaled_dot_product_attention(q, k, v)
    assert (naive.float() - unmasked.float()).abs().max() > 0.5


# ---------------------------------------------------------------------------- on a GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_measured_rates_stay_under_the_datasheet():
    spec = lookup(torch.cuda.get_device_name())
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in gpulab.device.hardware.GPUS")
    mm = measure.matmul_throughput(4096, torch.bfloat16, "cuda")
    assert 0.1 * spec.bf16_flops < mm.flops_per_second <= spec.bf16_flops
    copy = measure.elementwise_throughput(2**28, torch.float32, "cuda")
    assert 0.3 * spec.memory_bandwidth < copy.bytes_per_second <= spec.memory_bandwidth

