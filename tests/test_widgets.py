"""Tests of chapter 02's memory calculator (gpulab.course.widgets) and its plots.

The numbers are worked by hand from published examples (Ultra-Scale Playbook, ZeRO paper
Figure 1, Korthikanti et al. 2022), so a unit slip or a wrong sharding rule fails a test.
No GPU and no browser needed: the widget is built and driven by setting control values.
"""

import io
import re

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from gpulab.arith import gpt_param_count, zero_sharded  # noqa: E402
from gpulab.course import plots  # noqa: E402
from gpulab.course.widgets import CUSTOM, PRESETS, estimate_memory, memory_calculator  # noqa: E402
from gpulab.device import hardware

GPT2 = dict(n_layer=12, hidden=768, heads=12, seq_len=1024)  # GPT-2 small, context 1024
MODEL_STATE = ("params", "grads", "optimizer")


def state_gb(breakdown):
    return sum(breakdown[k] for k in MODEL_STATE) / 1e9


# ------------------------------------------------------------------------------------------
# Model state and ZeRO


def test_playbook_1b_params_mixed_adam_is_16_gb_of_model_state():
    # Ultra-Scale Playbook: 1B parameters x (2 + 2 + 12) bytes = 16 GB.
    m = estimate_memory(n_params=1e9, micro_batch=1, **GPT2)
    assert (m["params"], m["grads"], m["optimizer"]) == (2e9, 2e9, 12e9)
    assert state_gb(m) == pytest.approx(16.0)
    assert m["total"] == pytest.approx(sum(m[k] for k in (*MODEL_STATE, "activations")))


@pytest.mark.parametrize("stage, per_gpu_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, per_gpu_gb):
    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, K = 12, N_d = 64. By hand:
    # (2+2+12)Ψ = 120; 4Ψ + 12Ψ/64 = 31.41; 2Ψ + 14Ψ/64 = 16.64; 16Ψ/64 = 1.875 GB.
    m = estimate_memory(n_params=7.5e9, micro_batch=1, n_gpus=64, zero_stage=stage, **GPT2)
    assert state_gb(m) == pytest.approx(per_gpu_gb, abs=0.05)


def test_zero_stage_3_exact_and_nothing_saved_on_one_gpu():
    m = estimate_memory(n_params=7.5e9, micro_batch=1, n_gpus=64, zero_stage=3, **GPT2)
    assert state_gb(m) == pytest.approx(1.875)
    one = [estimate_memory(n_params=7.5e9, micro_batch=1, zero_stage=s, **GPT2) for s in range(4)]
    assert all(m == one[0] for m in one)  # ZeRO saves nothing at N_d = 1


def test_zero_does_not_shard_activations():
    a = [estimate_memory(n_params=1e9, micro_batch=4, n_gpus=8, zero_stage=s, **GPT2)
         for s in range(4)]
    assert len({m["activations"] for m in a}) == 1


def test_zero_sharded_on_its_own():
    state = {"params": 2.0, "grads": 2.0, "optimizer": 12.0, "total": 16.0}
    assert zero_sharded(state, 4, 2) == {"params": 2.0, "grads": 0.5, "optimizer": 3.0,
                                         "total": 5.5}


def test_recipe_changes_model_state():
    m = estimate_memory(n_params=1e9, micro_batch=1, recipe="mixed_adam_fp32_grads", **GPT2)
    assert state_gb(m) == pytest.approx(18.0)  # Megatron-LM: 2 + 4 + 12


# ------------------------------------------------------------------------------------------
# Parameter count and activations


def test_gpt_param_count_by_hand():
    # GPT-2 small: 12·12·768² + 50257·768 = 84,934,656 + 38,597,376
    assert gpt_param_count(12, 768, 50257) == 123_532_032
    # Llama-2-7B shape: 6.44B + 0.13B; the released (untied, SwiGLU) model is 6.74B
    assert gpt_param_count(32, 4096, 32000) == pytest.approx(6.57e9, rel=1e-3)


def test_vocab_instead_of_n_params():
    by_vocab = estimate_memory(vocab=50257, micro_batch=1, **GPT2)
    by_count = estimate_memory(n_params=123_532_032, micro_batch=1, **GPT2)
    assert by_vocab == by_count


@pytest.mark.parametrize("checkpointing, per_layer", [
    ("none", 6_291_456 * (34 + 80)),  # s·b·h·(34 + 5·a·s/h), 5·12·1024/768 = 80
    ("selective", 6_291_456 * 34),    # s·b·h·34
    ("full", 6_291_456 * 2),          # 2·s·b·h
])
def test_gpt2_activations_by_hand(checkpointing, per_layer):
    # Korthikanti et al. 2022 with s = 1024, b = 8, h = 768: s·b·h = 6,291,456
    m = estimate_memory(n_params=124e6, micro_batch=8, checkpointing=checkpointing, **GPT2)
    assert m["activations"] == 12 * per_layer  # 12 layers; none: 8.61 GB


def test_fp32_recipe_stores_fp32_activations():
    half = estimate_memory(n_params=1e9, micro_batch=2, checkpointing="full", **GPT2)
    full = estimate_memory(n_params=1e9, micro_batch=2, checkpointing="full", recipe="fp32_adam",
                           **GPT2)
    assert full["activations"] == 2 * half["activations"]


def test_micro_batch_scales_activations_only():
    one = estimate_memory(n_params=1e9, micro_batch=1, **GPT2)
    four = estimate_memory(n_params=1e9, micro_batch=4, **GPT2)
    assert four["activations"] == 4 * one["activations"]
    assert all(four[k] == one[k] for k in MODEL_STATE)


# ------------------------------------------------------------------------------------------
# Impossible inputs name the field

GOOD = dict(n_params=1e9, n_layer=12, hidden=768, heads=12, seq_len=1024, micro_batch=1)


@pytest.mark.parametrize("change, field", [
    ({"n_layer": 0}, "n_layer"),
    ({"n_layer": 2.5}, "n_layer"),
    ({"n_layer": True}, "n_layer"),
    ({"hidden": -768}, "hidden"),
    ({"heads": 0}, "heads"),
    ({"hidden": 256, "heads": 5}, "heads=5 must divide hidden=256"),
    ({"seq_len": 0}, "seq_len"),
    ({"micro_batch": -1}, "micro_batch"),
    ({"micro_batch": 1.5}, "micro_batch"),
    ({"n_params": 0}, "n_params"),
    ({"n_params": -1e9}, "n_params"),
    ({"n_params": None, "vocab": 0}, "vocab"),
    ({"n_params": None}, "n_params"),             # neither n_params nor vocab
    ({"vocab": 50257}, "n_params"),               # both
    ({"recipe": "adam9000"}, "recipe"),
    ({"checkpointing": "some"}, "checkpointing"),
    ({"zero_stage": 4}, "zero_stage"),
    ({"zero_stage": -1}, "zero_stage"),
    ({"n_gpus": 0}, "n_gpus"),
    ({"n_gpus": 2.0}, "n_gpus"),
])
def test_bad_input_raises_naming_the_field(change, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        estimate_memory(**{**GOOD, **change})


# ------------------------------------------------------------------------------------------
# Plots


def test_cards_match_the_hardware_table():
    gb = sorted(plots.CARDS_GB.values())
    assert gb == [24, 40, 80, 141]
    assert hardware.GPUS["H100-SXM5-80GB"].memory_bytes == 80 * 10**9
    assert hardware.GPUS["H200-SXM-141GB"].memory_bytes == 141 * 10**9


def test_stacked_memory_bar_heights_in_gb_and_card_lines():
    m = estimate_memory(n_params=1e9, micro_batch=1, **GPT2)  # 16 GB state + 1.08 GB activations
    ax = plots.stacked_memory_bar(m, title="t")
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == pytest.approx(m["total"] / 1e9)
    assert "10^9" in ax.get_ylabel()
    lines = sorted(line.get_ydata()[0] for line in ax.get_lines())
    assert lines == [24]  # the first card it fits on; 40 GB and up are off the axis
    plt.close(ax.figure)


def test_stacked_bars_stacks_each_group():
    ax = plots.stacked_bars(["b=1", "b=2"], {"predicted": {"a": [1, 2], "b": [3, 4]},
                                             "measured": {"a": [1, 1], "b": [1, 1]}}, "GB", "t")
    tops = sorted(round(p.get_y() + p.get_height(), 6) for p in ax.patches)
    assert tops == [1, 1, 1, 2, 2, 2, 4, 6]  # a: 1, 2 | 1, 1; a + b: 4, 6 | 2, 2
    plt.close(ax.figure)


# ------------------------------------------------------------------------------------------
# The widget


def total_gb(calc):
    found = re.search(r"Total per GPU: ([\d,.]+) GB \(([\d,.]+) GiB\)", calc.summary.value)
    assert found, calc.summary.value
    gb, gib = (float(x.replace(",", "")) for x in found.groups())
    assert gb / gib == pytest.approx(2**30 / 1e9, rel=0.01)  # both units, 7% apart
    return gb


def test_widget_builds_and_micro_batch_up_means_total_up():
    calc = memory_calculator()
    before, image = total_gb(calc), calc.plot.value
    assert bytes(image).startswith(b"\x89PNG")
    calc.controls["micro_batch"].value = 8
    assert total_gb(calc) > before
    assert calc.plot.value != image
    assert total_gb(calc) == pytest.approx(calc.breakdown["total"] / 1e9, abs=0.01)


def test_widget_zero_stage_and_gpus_lower_the_total():
    calc = memory_calculator("Llama-2-7B")
    assert calc.controls["seq_len"].value == 4096
    replicated = total_gb(calc)
    calc.controls["n_gpus"].value = 8
    calc.controls["zero_stage"].value = 3
    assert total_gb(calc) < replicated


def test_widget_preset_sets_the_architecture_and_a_hand_edit_makes_it_custom():
    calc = memory_calculator()
    calc.controls["preset"].value = "Llama-2-13B"
    assert calc.controls["n_layer"].value == PRESETS["Llama-2-13B"].n_layer == 40
    assert "13,015,864,320 parameters" in calc.summary.value
    calc.controls["n_layer"].value = 20
    assert calc.controls["preset"].value == CUSTOM
    assert f"{gpt_param_count(20, 5120, 32000):,} parameters" in calc.summary.value


def test_widget_shows_the_error_instead_of_a_traceback():
    calc = memory_calculator()
    calc.controls["hidden"].value = 256
    calc.controls["heads"].value = 5
    assert "heads=5 must divide hidden=256" in calc.summary.value
    assert calc.breakdown is None and calc.plot.layout.visibility == "hidden"
    calc.controls["heads"].value = 4  # fixed: the plot comes back
    assert calc.breakdown is not None and calc.plot.layout.visibility == "visible"
    calc.controls["n_layer"].value = 0
    assert "n_layer must be a positive integer" in calc.summary.value


def test_crowded_card_lines_share_one_label():
    """A total far above every card squeezes 24-141 GB into the bottom of the axis: their labels
    must not be drawn on top of each other."""
    m = estimate_memory(n_params=70e9, micro_batch=8, **GPT2)     # about 1.1 TB
    ax = plots.stacked_memory_bar(m, title="t")
    lines = sorted(line.get_ydata()[0] for line in ax.get_lines())
    assert lines == [24, 40, 80, 141]
    heights = sorted(text.get_position()[1] for text in ax.texts)
    gap = 0.07 * ax.get_ylim()[1]
    assert all(b - a >= gap for a, b in zip(heights, heights[1:])), heights
    assert any("24, 40" in text.get_text() for text in ax.texts)
    plt.close(ax.figure)


def test_widget_image_is_drawn_at_its_own_size_and_sliders_are_wide():
    from PIL import Image as PILImage   # matplotlib's own dependency

    calc = memory_calculator()
    width, height = PILImage.open(io.BytesIO(calc.plot.value)).size
    assert (f"{width}px", f"{height}px") == (calc.plot.layout.width, calc.plot.layout.height)
    slider = calc.controls["micro_batch"]
    track = int(slider.layout.width.removesuffix("px")) - int(
        slider.style.description_width.removesuffix("px"))
    assert track / (slider.max - slider.min) >= 4      # px per step of micro-batch
    assert calc.children[0].layout.align_items == "flex-start"


def test_by_size_ticks_every_size_and_keeps_the_legend_above_the_curves():
    sizes = [1, 4, 16, 64]
    ax = plots.by_size(sizes, {"pageable": [5, 9, 11, 12], "pinned": [8, 14, 20, 24]},
                       xlabel="MiB", ylabel="GB/s", title="t")
    ax.figure.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16", "64"]
    legend = ax.get_legend().get_window_extent()
    for line in ax.get_lines():
        points = ax.transData.transform(line.get_xydata())
        assert not any(legend.contains(x, y) for x, y in points), line.get_label()
    plt.close(ax.figure)


def test_bars_legend_covers_no_bar():
    one = plots.bars(["a", "b"], {"measured": [3.0, 5.0]}, ylabel="s", title="t")
    assert one.get_legend() is None
    two = plots.bars(["a", "b"], {"predicted": [3.0, 5.0], "measured": [3.2, 5.1]},
                     ylabel="s", title="t")
    two.figure.canvas.draw()
    legend = two.get_legend().get_window_extent()
    for bar in two.patches:
        assert not legend.overlaps(bar.get_window_extent()), bar
    plt.close("all")
