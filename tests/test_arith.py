"""gpulab.arith: the formulas, cross-checked against the figures their sources publish."""
import pytest
import torch

from gpulab import arith
from gpulab.arith import GB, GiB, MiB


def test_tensor_bytes_matches_pytorch():
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int8):
        t = torch.empty(3, 5, 7, dtype=dtype)
        assert arith.tensor_bytes((3, 5, 7), dtype) == t.nbytes
    assert arith.tensor_bytes((64, 3, 224, 224), "float32") == 38_535_168
    with pytest.raises(ValueError, match="unknown dtype"):
        arith.bytes_per_element("float33")


def test_link_arithmetic():
    assert arith.transfer_seconds(25e9, 25e9) == 1.0
    assert arith.transfer_seconds(0, 25e9, latency=5e-6) == 5e-6
    assert arith.batches_per_second(38_535_168, 25 * GB) == pytest.approx(648.76, rel=1e-4)
    assert arith.resident_warps(132, 2048) == 8448


def test_model_state_recipes_match_their_sources():
    # Ultra-Scale Playbook: 1B parameters, mixed precision + Adam -> 16 GB.
    assert arith.model_state_bytes(1e9, "mixed_adam")["total"] == 16 * GB
    # ZeRO paper, Figure 1: Ψ = 7.5B, K = 12 -> (2 + 2 + 12)Ψ = 120 GB per GPU without sharding.
    state = arith.model_state_bytes(7.5e9, "mixed_adam")
    assert (state["params"], state["grads"], state["optimizer"]) == (15 * GB, 15 * GB, 90 * GB)
    per_param = {r: arith.model_state_bytes(1, r)["total"] for r in arith.RECIPES}
    assert per_param == {"fp32_adam": 16, "mixed_adam": 16, "mixed_adam_fp32_grads": 18,
                         "bf16_adam": 8, "fp32_sgd": 8, "fp32_sgd_momentum": 12}


def test_korthikanti_table_forms():
    s, b, h, a = 2048, 1, 12288, 96           # a GPT-3 175B layer (Brown et al. 2020, Table 2.1)
    sbh = s * b * h
    assert arith.activation_bytes_per_layer(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert arith.activation_bytes_per_layer(s, b, h, a, tp=8) == sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))
    assert arith.activation_bytes_per_layer(s, b, h, a, recompute="selective") == 34 * sbh
    assert arith.activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * sbh
    # Korthikanti et al. §4.2: for GPT-3, selective recomputation cuts activation memory by 70%.
    none = arith.activation_bytes_per_layer(s, b, h, a)
    selective = arith.activation_bytes_per_layer(s, b, h, a, recompute="selective")
    assert 1 - selective / none == pytest.approx(0.70, abs=0.01)


def test_fp32_without_dropout_matches_the_measured_small_gpt():
    # measuring-memory.md: vocab 1000, h 256, 4 heads, seq 128, batch 8, fp32, dropout 0:
    # sbh(64 + 4as/h) = 18.00 MiB per layer (18.03 measured; the rest is mask and LN statistics).
    per_layer = arith.activation_bytes_per_layer(128, 8, 256, 4, bytes_per_value=4, dropout=False)
    assert per_layer / MiB == pytest.approx(18.00)


@pytest.mark.parametrize("call, field", [
    (lambda: arith.activation_bytes_per_layer(128, 8, 256, 5), "heads=5 must divide hidden=256"),
    (lambda: arith.activation_bytes_per_layer(0, 8, 256, 4), "seq_len"),
    (lambda: arith.activation_bytes_per_layer(128, -1, 256, 4), "batch"),
    (lambda: arith.activation_bytes_per_layer(128, 8, 256, 4, tp=3), "tp=3"),
    (lambda: arith.activation_bytes_per_layer(128, 8, 256, 4, recompute="some"), "recompute"),
    (lambda: arith.model_state_bytes(1e9, "adam"), "recipe must be one of"),
    (lambda: arith.model_state_bytes(-5, "mixed_adam"), "n_params"),
    (lambda: arith.model_state_bytes("7B", "mixed_adam"), "n_params"),
])
def test_impossible_inputs_name_the_field(call, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        call()


def test_units_are_kept_apart():
    assert GiB / GB == pytest.approx(1.0737, abs=1e-4)


def test_the_course_gpts_layer_in_fp32_without_dropout_is_64sbh_plus_4as2b():
    """Chapter 02 writes Korthikanti's count out for the GPT its experiments measure (issue 29):
    4-byte values and no dropout masks or dropout output."""
    from gpulab.arith import activation_bytes_per_layer

    for s, b, h, a in ((128, 8, 256, 4), (2048, 1, 4096, 32)):
        assert activation_bytes_per_layer(s, b, h, a, 4, dropout=False) == 64 * s * b * h + 4 * a * s * s * b
        assert activation_bytes_per_layer(s, b, h, a) == s * b * h * (34 + 5 * a * s // h)
