"""The CUDA branches of gpulab.measure, run on a CPU against a fake torch.cuda: what is waited
for, on which stream the events go, which allocator figure is read, how many warm-up steps."""
import pytest
import torch

from gpulab import measure
from gpulab.measure import training_steps

MiB = 2**20


def test_time_fn_waits_for_the_warmup_and_times_on_the_devices_stream(monkeypatch):
    calls = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing, "an event without timing cannot give elapsed_time"

        def record(self, stream=None):
            calls.append(("record", stream))

        def synchronize(self):
            calls.append(("wait for end",))

        def elapsed_time(self, end):
            return 2.5  # milliseconds, as CUDA reports it

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    monkeypatch.setattr(torch.cuda, "synchronize",
                        lambda device=None: calls.append(("sync", str(device))))

    timing = measure.time_fn(lambda: calls.append(("fn",)), "cuda:1", warmup=2, repeats=2)

    one_run = [("record", "stream of cuda:1"), ("fn",), ("record", "stream of cuda:1"),
               ("wait for end",)]
    # The warm-up's work has finished before the first start event; each run's end is waited for
    # before the next starts; both events on cuda:1's stream, not the current device's.
    assert calls == [("fn",), ("fn",), ("sync", "cuda:1")] + one_run * 2
    assert timing.samples == (0.0025, 0.0025) and timing.device == "cuda:1"


def test_allocated_bytes_on_cuda_reads_the_block_not_the_request(monkeypatch):
    stats = {}  # empty before the allocator's first allocation, as on a fresh GPU

    def make_tensor():  # a 73.5 MiB float64 batch that gets a whole 74 MiB segment
        stats.update({"allocated_bytes.all.current": 74 * MiB,
                      "requested_bytes.all.current": 77_070_336})
        return object()

    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: dict(stats))
    assert measure.allocated_bytes(make_tensor, "cuda") == 74 * MiB


def test_allocated_bytes_on_a_cpu_is_the_storage_size():
    assert measure.allocated_bytes(lambda: torch.empty(1000), "cpu") == 4000


@pytest.mark.parametrize("device, warmup", [("cuda", 2), ("cpu", 1)])
def test_training_steps_warm_up_twice_on_a_gpu(monkeypatch, device, warmup):
    seen = {}
    # Patched where training_step_timing looks them up: in the module that holds it.
    monkeypatch.setattr(training_steps, "GPT", lambda config, **kwargs: None)
    monkeypatch.setattr(training_steps, "make_optimizer", lambda model, name: None)
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: None)
    monkeypatch.setattr(training_steps, "time_fn", lambda fn, dev, warmup, repeats: seen.update(
        device=str(dev), warmup=warmup, repeats=repeats))
    measure.training_step_timing(device=device, steps=3)
    assert seen == {"device": device, "warmup": warmup, "repeats": 3}
