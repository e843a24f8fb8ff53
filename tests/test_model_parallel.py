"""Chapter 11, model parallelism: the formulas against their sources and an independent count,
the key against hand-worked figures, the trace replay on traces whose bubble is known, and on two
real gloo ranks (one launch) what the chapter says torch does: the splits equal the unsplit block,
the collectives are the counted ones, PyTorch's sequence-parallel plan keeps the gathered inputs,
and Schedule1F1B refuses fewer micro-batches than stages. The chapter's whole run (every
experiment, on 2 and 4 ranks) is the round trip's (tests/test_pipeline.py)."""
import doctest
import math
from pathlib import Path

import pytest
import torch

from gpulab.arith import GB, GiB
from gpulab.arith import model_parallel as mp
from gpulab.arith.training_memory import activation_bytes_per_layer
from gpulab.course.checks import load_key_module
from gpulab.model_parallel import pipeline_parallel

ROOT = Path(__file__).resolve().parent.parent
GPT3 = dict(seq_len=2048, batch=1, hidden=12288, heads=96)


def test_the_formulas_worked_examples_hold():
    assert doctest.testmod(mp).failed == 0


def test_tensor_parallel_traffic_and_time_by_hand():
    # Megatron's layout: 2 all-reduces forward (g), 2 backward (f), each of b·s·h.
    assert mp.tp_allreduce_elements(2, 1024, 4096, n_layers=3) == 3 * 4 * 2 * 1024 * 4096
    # GPT-3 175B on 8 GPUs of NVLink 4: 384 ring all-reduces of 2048·12288·2 bytes.
    one = 2 * 7 / 8 * 2048 * 12288 * 2 / 450e9
    assert mp.tp_comm_seconds(1, 2048, 12288, 8, 450e9, n_layers=96) == pytest.approx(384 * one)


@pytest.mark.parametrize("batch, seq", [(1, 2048), (8, 512), (3, 4096)])
def test_the_ratio_is_the_two_times_divided_and_the_batch_cancels(batch, seq):
    t, h, B, F = 8, 8192, 450e9, 400e12
    compute = mp.layer_training_flops(batch, seq, h) / (t * F)
    assert mp.tp_comm_to_compute(t, h, B, F) == pytest.approx(mp.tp_comm_seconds(batch, seq, h, t, B) / compute)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activations_per_rank_are_korthikantis(t):
    s, b, h, a = GPT3["seq_len"], GPT3["batch"], GPT3["hidden"], GPT3["heads"]
    sbh = s * b * h
    assert mp.activation_bytes_per_rank(s, b, h, a, t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert mp.activation_bytes_per_rank(s, b, h, a, t, sequence_parallel=True) == pytest.approx(
        sbh * (34 / t + 5 * a * s / (h * t)))
    assert mp.activation_bytes_per_rank(s, b, h, a, t, True, recompute="selective") == pytest.approx(34 * sbh / t)
    # t = 1: chapter 02's unsplit layer, either way
    whole = activation_bytes_per_layer(s, b, h, a)
    assert mp.activation_bytes_per_rank(s, b, h, a, 1, True) == mp.activation_bytes_per_rank(s, b, h, a, 1) == whole


def test_the_course_block_count_splits_as_the_chapter_says():
    s, b, h, a = 256, 2, 64, 4
    sbh = s * b * h
    for t in (1, 2, 4):
        tp = 4 * (4 * sbh + (12 * sbh + a * s * s * b) / t + 4 * b * s)
        assert mp.course_block_activation_bytes(s, b, h, a, t) == pytest.approx(tp)
        assert mp.course_block_activation_bytes(s, b, h, a, t, True) == pytest.approx(
            4 * (16 * sbh + a * s * s * b + 4 * b * s) / t)


def test_bubbles_and_micro_batches():
    for p in (2, 4, 16):
        for m in (1, 3, 8, 64):
            assert mp.interleaved_bubble_fraction(p, m, 1) == mp.pipeline_bubble_fraction(p, m)
            # interleaving by v is the same as v times the micro-batches, for the idle share
            assert mp.interleaved_bubble_fraction(p, m, 4) == pytest.approx(mp.pipeline_bubble_fraction(p, 4 * m))
    for p in (2, 4, 8, 16):
        for target in (0.05, 0.1, 0.2, 0.3):
            m = mp.microbatches_for_bubble(p, target)
            assert mp.pipeline_bubble_fraction(p, m) <= target + 1e-12
            assert m == 1 or mp.pipeline_bubble_fraction(p, m - 1) > target
    assert [mp.microbatches_in_flight("1F1B", 8, 32, i) for i in (0, 7)] == [8, 1]
    assert mp.microbatches_in_flight("1F1B", 8, 3, 0) == 3 and mp.microbatches_in_flight("GPipe", 8, 3) == 3
    assert mp.pipeline_send_elements(2, 64, 128, 8) == 2 * 8 * 2 * 64 * 128
    with pytest.raises(ValueError):
        mp.microbatches_in_flight("zero bubble", 4, 8)


def test_layouts_memory_and_links():
    gpt3 = mp.Transformer(175e9, 96, 12288, 96, 2048)
    # Megatron-LM's example: TP 8 x PP 16, no ZeRO: 16 bytes of 175e9/128 parameters; 6 layers
    # of 34·s·h/8 bytes (selective, SP), times 16 micro-batches in flight on the first stage.
    memory = mp.layout_memory_bytes(gpt3, mp.Layout(8, 16, 12, 1, 128, zero_stage=0))
    assert memory["model state"] == pytest.approx(16 * 175e9 / 128)
    assert memory["activations"] == pytest.approx(6 * 16 * 34 * 2048 * 12288 / 8)
    h100 = mp.Cluster(8, 450e9, 50e9, 80e9, 400e12)
    assert mp.layout_links(mp.Layout(8, 16, 128, 1, 16), h100) == {"tensor": 450e9, "pipeline": 50e9, "data": 50e9}
    assert mp.layout_links(mp.Layout(16, 1, 4, 1, 16), h100)["tensor"] == 400e9     # rails: 8 NICs
    assert mp.layout_links(mp.Layout(1, 1, 64, 1, 4), h100)["data"] == 400e9
    assert mp.layout_links(mp.Layout(2, 2, 2, 1, 4), h100) == {"tensor": 450e9, "pipeline": 450e9, "data": 450e9}
    # Narayanan et al. 2021's 1T-parameter row (TP 8 x PP 64 on 3,072 GPUs) keeps TP on NVLink.
    assert mp.layout_links(mp.Layout(8, 64, 6, 1, 64), h100)["tensor"] == 450e9


def test_the_key_against_hand_worked_figures():
    value = {k: i.value for k, i in load_key_module(ROOT / "autograder/keys/11_model_parallel.py").items()}
    assert value["11-tp-elements"] == 4 * 2048 * 12288
    assert value["11-tp-ms"] == pytest.approx(384 * 1.75 * 2048 * 12288 * 2 / 450e9 * 1e3)   # 75.16 ms
    assert value["11-tp-ratio"] == pytest.approx(7 * 2 * 400e12 / (9 * 8192 * 450e9))
    assert value["11-tp-nodes"] == pytest.approx(15 * 2 * 400e12 / (9 * 8192 * 50e9))
    assert value["11-sp-tp-gib"] == pytest.approx(2048 * 12288 * 23 / GiB)                   # 10 + 3 + 10
    assert value["11-sp-gib"] == pytest.approx(2048 * 12288 * 14.25 / GiB)                   # 34/8 + 10
    assert value["11-bubble-m"] == 135 and value["11-interleaved"] == pytest.approx(3 / 19)
    assert value["11-in-flight-gb"] == 24 and value["11-traffic-ratio"] == 12
    assert value["11-state-gb"] == pytest.approx((4 + 12 / 128) * 405e9 / 128 / GB)
    assert [value[k] for k in ("11-missing-f", "11-sp-traffic", "11-too-few-microbatches", "11-fastest-link")] == list("dbbb")


def _gpipe_trace(p, m, forward=1.0, backward=2.0):
    """A GPipe step with equal stages, as the ranks would trace it (start times shuffled: the
    replay orders by them only within a rank)."""
    traces = []
    for stage in range(p):
        order = [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
        traces.append([(kind, j, stage + 10 * i, stage + 10 * i + (forward if kind == "F" else backward), stage)
                       for i, (kind, j) in enumerate(order)])
    return traces


def _one_f_one_b_trace(p, m):
    traces = []
    for stage in range(p):
        warm = min(m, p - stage)
        order = [("F", j) for j in range(warm)]
        f = warm
        for j in range(m):
            order.append(("B", j))
            if f < m:
                order.append(("F", f))
                f += 1
        traces.append([(kind, j, 10 * i, 10 * i + (1.0 if kind == "F" else 2.0), stage) for i, (kind, j) in enumerate(order)])
    return traces


@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 8), (3, 5)])
def test_a_replayed_even_pipeline_idles_as_the_formula_says(p, m):
    bubble = mp.pipeline_bubble_fraction(p, m)
    assert pipeline_parallel.replayed_idle_fractions(_gpipe_trace(p, m), p) == pytest.approx([bubble] * p)
    if m >= p:
        assert pipeline_parallel.replayed_idle_fractions(_one_f_one_b_trace(p, m), p) == pytest.approx([bubble] * p)
        held = [pipeline_parallel.in_flight(trace) for trace in _one_f_one_b_trace(p, m)]
        assert held == [mp.microbatches_in_flight("1F1B", p, m, i) for i in range(p)]


def test_measured_idle_counts_every_gap():
    # two ranks, one computing 0-1 and 2-3, the other 1-2: a step of 3, idle 1/3 and 2/3
    traces = [[("F", 0, 0.0, 1.0, 0), ("B", 0, 2.0, 3.0, 0)], [("F", 0, 1.0, 2.0, 1)]]
    assert pipeline_parallel.idle_fractions(traces) == pytest.approx([1 / 3, 2 / 3])


# --------------------------------------------------------------------------------------------
# On two real ranks, once

def _saved_bytes(fn, module) -> int:
    """Bytes of the distinct storages autograd saves while fn runs, DTensors read through their
    local shard, the module's parameters and buffers (the causal mask) left out."""
    params = {p.to_local().untyped_storage().data_ptr() if hasattr(p, "to_local") else p.untyped_storage().data_ptr()
              for p in [*module.parameters(), *module.buffers()]}
    seen = {}

    def pack(t):
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def two_rank_facts(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from gpulab.model_parallel import sequence_parallel, tensor_parallel

    facts = {"compare": tensor_parallel.compare_with_unsplit(rank, world_size)}
    block = tensor_parallel.seeded_block()
    x, dy = tensor_parallel.seeded_input(tensor_parallel.CONFIG, 2, 64)
    mine = lambda t: t[:, rank * 32:(rank + 1) * 32].contiguous()          # noqa: E731
    by_hand = sequence_parallel.sequence_parallel_block(block, rank, world_size, torch.distributed.group.WORLD)
    plan = sequence_parallel.parallelize_module_block_sequence_parallel(block, init_device_mesh("cpu", (world_size,)))
    facts["saved"] = {name: _saved_bytes(lambda: split(mine(x).clone()).backward(mine(dy)), split)
                      for name, split in (("by hand", by_hand), ("parallelize_module", plan))}
    stage = PipelineStage(torch.nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
    try:
        Schedule1F1B(stage, n_microbatches=world_size - 1, loss_fn=lambda y, t: y.sum())
        facts["1F1B with m < p"] = "built"
    except ValueError as e:
        facts["1F1B with m < p"] = str(e)
    return facts


@pytest.fixture(scope="module")
def two_ranks():
    from gpulab.parallel.dist import launch

    return launch(two_rank_facts, 2, backend="gloo", timeout=180)


def test_tensor_parallel_splits_equal_the_whole_block_and_count_four_all_reduces(two_ranks):
    for facts in two_ranks:
        for name in ("by hand", "parallelize_module"):
            r = facts["compare"][name]
            assert max(r["output"], r["input grad"], *r["weight grads"].values()) < 1e-5
            assert r["collectives"] == {"all_reduce": (4, 4 * facts["compare"]["b·s·h"])}
        slip = facts["compare"]["by hand, f left out"]
        assert slip["output"] < 1e-5 and slip["input grad"] > 1e-3          # the slip Quiz 5 names
        assert max(slip["weight grads"]["mlp.c_fc"], slip["weight grads"]["mlp.c_proj"]) < 1e-5
        assert slip["weight grads"]["attn.c_attn"] > 1e-3
        assert slip["collectives"] == {"all_reduce": (2, 2 * facts["compare"]["b·s·h"])}


def test_pytorchs_sequence_parallel_plan_keeps_the_gathered_inputs(two_ranks):
    # The chapter's Going deeper block: each column-parallel linear saves the whole gathered
    # input (s·b·h values) where Megatron's keeps its s/t slice: 2·sbh·(1 − 1/t) values more.
    t, s, b, h = 2, 64, 2, 64
    for facts in two_ranks:
        saved = facts["saved"]
        assert saved["by hand"] == mp.course_block_activation_bytes(s, b, h, 4, t, sequence_parallel=True)
        assert saved["parallelize_module"] - saved["by hand"] == 2 * s * b * h * (1 - 1 / t) * 4


def test_schedule_1f1b_refuses_fewer_micro_batches_than_stages(two_ranks):
    # Quiz 12's answer, read from torch 2.13 and run
    assert all("must be greater than or equal to the number of stages" in f["1F1B with m < p"] for f in two_ranks)
