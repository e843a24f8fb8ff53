"""gpulab.pipeline (chapter 07): the step-time model, the synthetic datasets, the measured loop."""
import math
import multiprocessing

import pytest
import torch

from gpulab import pipeline


def test_serial_loop_adds_every_stage():
    assert pipeline.step_seconds(0.064, 0.040, workers=0, copy=0.003) == pytest.approx(0.107)


def test_workers_take_the_slowest_stage_not_the_sum():
    # 64 ms of loading over 4 workers = 16 ms; the 40 ms compute sets the pace.
    assert pipeline.step_seconds(0.064, 0.040, 4, copy=0.003, copy_overlapped=True) == 0.040
    # An un-overlapped copy sits in the compute stream: 43 ms.
    assert pipeline.step_seconds(0.064, 0.040, 4, copy=0.003) == pytest.approx(0.043)
    # Data-bound: 2 workers deliver a 120 ms batch every 60 ms.
    assert pipeline.step_seconds(0.120, 0.050, 2, copy=0.005) == pytest.approx(0.060)
    assert pipeline.bottleneck(0.120, 0.050, 2, copy=0.005) == "data"
    assert pipeline.bottleneck(0.064, 0.040, 4) == "compute"
    assert pipeline.bottleneck(0.010, 0.002, 4, copy=0.005, copy_overlapped=True) == "copy"
    assert pipeline.bottleneck(0.064, 0.040, 0) == "serial"


def test_idle_share_and_workers_needed():
    assert pipeline.device_idle_share(0.064, 0.040, 0, copy=0.003) == pytest.approx(67 / 107)
    assert pipeline.device_idle_share(0.064, 0.040, 4) == 0
    assert pipeline.workers_needed(0.320, 0.040) == 8          # exactly 8: no rounding up to 9
    assert pipeline.workers_needed(0.321, 0.040) == 9
    assert pipeline.step_seconds(0.320, 0.040, 8) == pytest.approx(0.040)
    with pytest.raises(ValueError):
        pipeline.workers_needed(0.1, 0.0)
    with pytest.raises(ValueError):
        pipeline.step_seconds(-1, 0.1, 0)


def test_loading_speedup_io_scales_past_cores_cpu_does_not():
    assert pipeline.loading_speedup(8, cores=2, io_bound=True) == 8
    assert pipeline.loading_speedup(8, cores=2, io_bound=False) == 2
    assert pipeline.loading_speedup(0, cores=2, io_bound=False) == 1
    assert pipeline.usable_cores() >= 1


def test_compile_break_even():
    assert pipeline.compile_break_even_steps(60, 0.3, 0.2) == pytest.approx(600)
    assert pipeline.compile_break_even_steps(60, 0.2, 0.2) == math.inf


def test_datasets_are_deterministic_and_cost_what_they_say():
    latency = pipeline.LatencyDataset(10, 0.0)
    assert torch.equal(latency[3], torch.full((64,), 3.0))
    assert [t[0].item() for t in latency.__getitems__([1, 2])] == [1.0, 2.0]
    decode = pipeline.DecodeDataset(4, rounds=10, shape=(2,))
    assert torch.equal(decode[2], torch.full((2,), 2.0))
    tokens = pipeline.TokenDataset(4, seq_len=8, vocab_size=50)
    x, y = tokens[1]
    assert x.shape == y.shape == (8,) and torch.equal(x[1:], y[:-1]) and torch.equal(tokens[1][0], x)
    assert pipeline.calibrate_rounds(0.001) > 0


def test_serial_loop_measures_the_sum_and_workers_overlap():
    """Sleep-based stages (20 ms of loading, 20 ms of compute), tolerances for a shared CPU: 0
    workers pay the sum, 40 ms; 2 workers the slower stage, 20 ms (model: half). Workers are gone
    afterwards."""
    serial = pipeline.measure_pipeline(0.005, 4, workers=0, compute=0.020, steps=4)
    assert serial.step_seconds >= 0.039 and serial.wait_share > 0.3
    overlapped = pipeline.measure_pipeline(0.005, 4, workers=2, compute=0.020, steps=4)
    assert overlapped.step_seconds < 0.75 * serial.step_seconds
    assert overlapped.wait_share < 0.3
    assert not multiprocessing.active_children()


def test_time_loop_shuts_down_workers_even_when_the_step_fails():
    loader = pipeline.make_loader(pipeline.LatencyDataset(20, 0.0), 2, workers=2)

    def failing(batch):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        pipeline.time_loop(loader, failing, steps=2)
    assert not multiprocessing.active_children()


def test_stand_in_compute_on_cpu_sleeps():
    import time
    compute = pipeline.StandInCompute(0.01)
    start = time.perf_counter()
    compute(None)
    assert time.perf_counter() - start >= 0.01 and compute.cycles == 0


def test_copy_overlap_says_nothing_on_a_cpu():
    assert pipeline.copy_compute_overlap(1024, 0.001, "cpu") is None


def test_a_rung_trains_and_counts_its_flops():
    from gpulab import arith
    from gpulab.models import GPT, GPTConfig

    config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)
    out = pipeline.run_rung(config, pipeline.Rung("tiny", batch_size=2, optimizer="adamw_fused"),
                            seq_len=16, device="cpu", steps=1)
    n = GPT.count_params(config) - (64 + 16) * 32
    assert out["flops_per_token"] == arith.training_flops(n, 1, n_layer=1, hidden=32, seq_len=16)
    assert out["tokens_per_second"] == pytest.approx(2 * 16 / out["step_seconds"])
    assert out["peak_bytes"] is None and not torch.backends.cuda.matmul.allow_tf32


def test_stand_in_compute_on_a_gpu_launches_one_calibrated_kernel(monkeypatch):
    """The CUDA branch, on a modelled torch.cuda: 10^7 cycles measured at 5 ms, so 0.5 s is
    10^9 cycles; a call launches one spinning kernel, then waits for it only when asked to."""
    from gpulab import measure
    from gpulab.pipeline import loop   # StandInCompute lives there and calls loop.measure.time_fn

    calls = []
    monkeypatch.setattr(loop.measure, "time_fn",
                        lambda fn, device, **kw: measure.Timing((0.005,), str(device)))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(("sleep", cycles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", str(device))))
    compute = pipeline.StandInCompute(0.5, "cuda")
    assert compute.cycles == 10**9
    compute(None)
    assert calls == [("sleep", 10**9), ("sync", "cuda")]
    calls.clear()
    pipeline.StandInCompute(0.5, "cuda", synchronize=False)(None)
    assert calls == [("sleep", 10**9)]
