"""gpulab.pipeline (chapter 07): the step-time model, the synthetic datasets, the measured loop."""
import math
import multiprocessing
import time

import pytest
import torch
from torch.utils.data import Dataset

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


def test_cpu_bound_workers_load_on_the_free_cores_only():
    # 80 ms of loading per batch, 4 workers, a 5 ms step: waiting loads 4 batches at once (20 ms
    # per batch), computing loads only 2 at once on 2 free cores (40 ms), 4 on 8 (20 ms).
    assert pipeline.step_seconds(0.080, 0.005, 4) == pytest.approx(0.020)
    assert pipeline.step_seconds(0.080, 0.005, 4, cores=2) == pytest.approx(0.040)
    assert pipeline.step_seconds(0.080, 0.005, 4, cores=8) == pytest.approx(0.020)
    assert pipeline.step_seconds(0.080, 0.005, 0, cores=2) == pytest.approx(0.085)   # serial: no cores
    assert pipeline.step_seconds(0.080, 0.005, 4, cores=2) == pytest.approx(
        0.080 / pipeline.loading_speedup(4, 2, io_bound=False))                       # Experiment 2's rule
    with pytest.raises(ValueError):
        pipeline.step_seconds(0.08, 0.005, 4, cores=0)


def test_the_hand_over_of_each_batch_is_the_main_processes_work():
    # The main process takes each batch from a worker (3 ms here) before its 5 ms step: 8 ms,
    # slower than 4 workers' 20 ms / 4 = 5 ms of loading; with no workers there is no hand-over.
    assert pipeline.step_seconds(0.020, 0.005, 4, handover=0.003) == pytest.approx(0.008)
    assert pipeline.step_seconds(0.080, 0.005, 4, handover=0.003) == pytest.approx(0.020)
    assert pipeline.step_seconds(0.020, 0.005, 0, handover=0.003) == pytest.approx(0.025)
    assert pipeline.step_seconds(0.020, 0.004, 4, copy=0.005, copy_overlapped=True,
                                 handover=0.001) == pytest.approx(0.006)


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
    read = tokens.__getitems__([1, 3])                      # a batch read at once: the same samples
    assert all(torch.equal(a, b) for got, i in zip(read, (1, 3)) for a, b in zip(got, tokens[i]))
    assert pipeline.calibrate_rounds(0.001) > 0


class Loading(Dataset):
    """10 ms of waiting per sample, and a counter, shared with the workers, of samples being
    loaded right now."""

    def __init__(self, n: int = 64):
        self.n, self.busy = n, multiprocessing.Value("i", 0)

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        with self.busy.get_lock():
            self.busy.value += 1
        time.sleep(0.010)
        with self.busy.get_lock():
            self.busy.value -= 1
        return torch.tensor(float(index))


def test_serial_loop_waits_for_every_load_and_workers_load_during_the_steps():
    """No clock ratios: a loaded machine stretches sleeps but never shortens them. With no workers
    each timed step waits for its whole 10 ms load and then computes 10 ms, so each is at least
    their sum; with 2 workers a sample is being loaded while the step computes (the step looks,
    for up to 10 s). Workers are gone afterwards."""
    serial_data = Loading()
    serial = pipeline.time_loop(pipeline.make_loader(serial_data, 1, 0), lambda batch: time.sleep(0.010),
                                steps=4)
    assert serial.wait_seconds >= 4 * 0.010 and serial.step_seconds >= 0.020
    data, loading_during_step = Loading(), []

    def step(batch):
        deadline = time.monotonic() + 10
        while data.busy.value == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        loading_during_step.append(data.busy.value > 0)
        time.sleep(0.010)

    pipeline.time_loop(pipeline.make_loader(data, 1, 2), step, steps=4)
    assert len(loading_during_step) == 6 + 4 and all(loading_during_step)   # warm-up (2 + 1) x 2
    assert not multiprocessing.active_children()


def test_the_hand_over_is_measured_from_a_worker():
    assert 0 < pipeline.handover_seconds(pipeline.LatencyDataset(16, 0.0), 2, batches=3, settle=0.005)
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
    precision = torch.backends.cuda.matmul.fp32_precision
    out = pipeline.run_rung(config, pipeline.Rung("tiny", batch_size=2, optimizer="adamw_fused"),
                            seq_len=16, device="cpu", steps=1)
    n = GPT.count_params(config) - (64 + 16) * 32
    assert out["flops_per_token"] == arith.training_flops(n, 1, n_layer=1, hidden=32, seq_len=16)
    assert out["tokens_per_second"] == pytest.approx(2 * 16 / out["step_seconds"])
    assert out["peak_bytes"] is None and out["steps"] == 1
    assert torch.backends.cuda.matmul.fp32_precision == precision     # set back as it was


def test_the_course_ladder_keeps_every_rung_after_the_workers_compute_bound():
    """The ladder's plan, for a GPU and a CPU (no GPU needed to read it): one change per rung,
    every rung after the first loads with workers, and the data stage (LOAD_SHARE of the naive
    compute over W workers) is 1/16 of the naive compute on a GPU, whose later rungs are expected
    to be up to about 10x faster (bf16 tensor cores, fused kernels), and 1/4 on a CPU, whose are
    at most about 2x. TF32 and compile appear on the GPU ladder only; the GPU's micro-batch
    fits the 2.5 GiB the course plans for."""
    from gpulab import arith

    for on_gpu, fastest in ((True, 10), (False, 2)):
        config, seq, rungs = pipeline.course_ladder(on_gpu)
        assert rungs[0].workers == 0 and all(r.workers == rungs[1].workers > 0 for r in rungs[1:])
        data_stage = pipeline.LOAD_SHARE / rungs[1].workers          # of the naive compute
        assert data_stage * fastest < 1
        assert len({r.name for r in rungs}) == len(rungs)
        assert any(r.tf32 or r.compile or r.autocast for r in rungs) is on_gpu
    config, seq, rungs = pipeline.course_ladder(True)
    assert arith.predict_training_memory(config, rungs[-1].batch_size, seq)["peak"] <= 2.5 * 2**30
    assert [r.name for r in rungs][2:5] == ["+ fused AdamW", "+ TF32", "+ bf16 autocast"]


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


def test_a_stream_is_read_whole_by_every_worker_unless_sharded():
    """Quiz 13 and section 8.1, for real with 2 workers: the plain stream comes twice (the key's
    count), the sharded one once, and the chapter shows the module's own lines."""
    import inspect
    import json
    from pathlib import Path

    from torch.utils.data import DataLoader

    plain = list(DataLoader(pipeline.Stream(9), batch_size=4, num_workers=2))
    sharded = list(DataLoader(pipeline.ShardedStream(9), batch_size=4, num_workers=2))
    assert len(plain) == pipeline.unsharded_batches(9, 4, 2) == 6
    assert sorted(torch.cat(plain).tolist()) == sorted(2 * list(range(9)))
    assert sorted(torch.cat(sharded).tolist()) == list(range(9))
    assert pipeline.unsharded_batches(1000, 10, 0) == 100 and not multiprocessing.active_children()
    chapter = Path(__file__).resolve().parents[1] / "solutions/07_input_pipeline/07_input_pipeline.ipynb"
    shown = "".join(next(c["source"] for c in json.loads(chapter.read_text())["cells"]
                         if c["id"] == "ch07-md-script-shard"))
    source = inspect.getsource(pipeline.ShardedStream)
    docstring = pipeline.ShardedStream.__doc__
    for line in source.replace(f'"""{docstring}"""', "").splitlines():
        code = line.split("#")[0].rstrip()
        if code:
            assert code in shown, code


def test_free_cores_is_the_rate_of_all_cores_over_one(monkeypatch):
    """Erratum 16's inputs: the cores computing workers get (the rate of `cores` workers over one
    worker's, each with as many batches per worker) and one worker's seconds per batch. The
    arithmetic, with loading_rate stood in for: the notebook's Experiment 1 and make bench time
    them for real, where a loaded machine cannot fail a test."""
    calls = []

    def rate(dataset, batch_size, workers, batches):
        calls.append((workers, batches))
        return {1: 10.0, 2: 17.0}[workers]              # batches per second

    monkeypatch.setattr(pipeline.loop, "loading_rate", rate)
    assert pipeline.free_cores("data", 4, cores=2, batches=4) == pytest.approx(1.7)
    assert calls == [(1, 4), (2, 8)]
    assert pipeline.worker_load_seconds("data", 4, batches=4) == pytest.approx(0.1)


def test_a_sharded_stream_keeps_the_rank_it_was_made_with(monkeypatch):
    """Erratum 14: a worker started with spawn or forkserver has no process group, so the rank is
    read when the dataset is made and travels with it (pickled, as spawn sends it)."""
    import pickle

    monkeypatch.setattr(pipeline.datasets.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(pipeline.datasets.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(pipeline.datasets.dist, "get_world_size", lambda: 2)
    dataset = pipeline.ShardedStream(9)
    monkeypatch.setattr(pipeline.datasets.dist, "is_initialized", lambda: False)   # as in the worker
    in_worker = pickle.loads(pickle.dumps(dataset))
    assert [int(x) for x in in_worker] == [1, 3, 5, 7]


def test_seeded_workers_draw_the_same_again():
    from torch.utils.data import DataLoader

    def draws(seed):
        loader = DataLoader(pipeline.RandomAugment(4), batch_size=2, num_workers=2,
                            generator=torch.Generator().manual_seed(seed))
        return torch.cat(list(loader)).tolist()

    first = draws(0)
    assert first == draws(0) != draws(1) and len(set(first)) == 4     # workers differ, runs repeat
