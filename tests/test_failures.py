"""gpulab.monitoring.failures: clock-event bits against pynvml's constants, the checkpoint interval against
Young's and Daly's published formulas and a simulation, the out-of-memory message round trip,
the CUDA error texts, kernel-image compatibility, NaN steps, /dev/shm, a hung collective and DDP's
join() on uneven inputs."""
import math
import os

import pynvml
import pytest

from gpulab.device import health
from gpulab.monitoring import failures

GiB = 2**30


def test_clock_event_bits_are_pynvmls():
    assert health.decode_clock_events(pynvml.nvmlClocksEventReasonSwPowerCap
                                        | pynvml.nvmlClocksEventReasonHwThermalSlowdown) == [
        "SwPowerCap", "HwThermalSlowdown"]
    assert health.decode_clock_events(0x44) == ["SwPowerCap", "HwThermalSlowdown"]
    assert health.decode_clock_events(0) == []
    assert health.decode_clock_events(0x1 | 0x1000) == ["GpuIdle", "unknown(0x1000)"]
    assert health.slowdowns(0x1 | 0x2 | 0x20) == ["SwThermalSlowdown"]   # idle is no slowdown
    assert "power limit" in health.explain_clock_events(0x4)


def test_a_hardware_slowdown_reports_hw_slowdown_too():
    """nvidia-smi: HW Slowdown (0x8) "is active if either HW Thermal Slowdown or HW Power Brake are
    active", so the power cap and the hardware thermal slowdown read 0x4C on a GPU, not 0x44."""
    assert health.reported_clock_events(0x4 | 0x40) == 0x4C
    assert health.reported_clock_events(0x80 | 0x4) == 0x8C
    assert health.reported_clock_events(0x80 | 0x40) == 0xC8
    assert health.reported_clock_events(0x80 | 0x20) == 0xA8
    assert health.reported_clock_events(0x4 | 0x20) == 0x24     # the driver's own: no 0x8
    assert health.reported_clock_events(0x4 | 0x2) == 0x6
    assert health.decode_clock_events(0x4C) == ["SwPowerCap", "HwSlowdown", "HwThermalSlowdown"]


def test_checkpoint_intervals_against_the_papers():
    # Young: sqrt(2 * 3 min * 1440 min) = 92.95 min.
    assert failures.young_interval(3, 1440) == pytest.approx(math.sqrt(8640))
    # Daly tends to Young minus delta when delta << M, and returns M when delta >= 2M.
    assert failures.daly_interval(3, 1440) == pytest.approx(
        math.sqrt(8640) * (1 + math.sqrt(3 / 2880) / 3 + 3 / 2880 / 9) - 3)
    assert failures.daly_interval(100, 40) == 40
    # Young's interval minimises the first-order waste, and there the two costs are equal.
    best = failures.young_interval(5, 480)
    assert failures.waste_fraction(best, 5, 480) < failures.waste_fraction(0.8 * best, 5, 480)
    assert failures.waste_fraction(best, 5, 480) < failures.waste_fraction(1.25 * best, 5, 480)
    assert 5 / best == pytest.approx(best / (2 * 480))
    assert failures.cluster_mtbf(50_000, 1024) == pytest.approx(48.828, rel=1e-4)
    assert failures.max_interval_for_loss(1440, 0.01) == pytest.approx(28.8)


def test_simulation_agrees_with_the_first_order_waste_when_failures_are_rare():
    # M = 100 h, checkpoint 1 min every 60 min: waste = 1/60 + 60/12000 = 2.17%.
    simulated = failures.simulate_waste(24 * 60 * 10, 60, 1, 6000, runs=60, seed=1)
    assert simulated == pytest.approx(failures.waste_fraction(60, 1, 6000), rel=0.15)
    assert failures.simulate_waste(600, 60, 1, 1e12, runs=3) == pytest.approx(9 / 609)


def test_oom_message_round_trips_and_names_the_fix():
    text = failures.cuda_oom_message(4 * GiB, int(79.19 * GiB), int(1.06 * GiB), int(74.10 * GiB),
                                     int(77.05 * GiB), process_bytes=int(78.13 * GiB))
    assert text.startswith("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total "
                           "capacity of 79.19 GiB of which 1.06 GiB is free. Including non-PyTorch")
    assert "2.95 GiB is reserved by PyTorch but unallocated" in text
    report = failures.parse_oom(text)
    assert report.outside_pytorch / GiB == pytest.approx(1.08, abs=0.01)
    assert report.process / GiB == pytest.approx(78.13, abs=0.01)
    assert failures.oom_fix(report) == "smaller_batch"
    fragmented = failures.parse_oom(failures.cuda_oom_message(
        int(1.5 * GiB), 80 * GiB, int(0.9 * GiB), 61 * GiB, 76 * GiB))
    assert failures.oom_fix(fragmented) == "expandable_segments"
    assert failures.oom_fix(failures.parse_oom(failures.cuda_oom_message(
        100 * GiB, 80 * GiB, 70 * GiB, GiB, GiB))) == "too_large"
    assert failures.oom_fix(failures.parse_oom(failures.cuda_oom_message(
        4 * GiB, 80 * GiB, GiB, 10 * GiB, 10 * GiB))) == "other_process"
    with pytest.raises(ValueError):
        failures.parse_oom("RuntimeError: something else")


def test_a_real_message_of_pytorch_parses():
    # As printed by PyTorch 2.x (quoted in many bug reports), wrapped over lines.
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
            "total capacity of 8.00 GiB of which 0 bytes is free. Of the allocated memory\n"
            "14.51 GiB is allocated by PyTorch, and 15.90 MiB is reserved by PyTorch but unallocated.")
    report = failures.parse_oom(text)
    assert (report.requested, report.free, report.unallocated) == (20 * 2**20, 0, round(15.9 * 2**20))


def test_format_size_follows_c10():
    assert [failures.format_size(n) for n in (1024, 1025, 2**20 + 1, 3 * GiB)] == [
        "1024 bytes", "1.00 KiB", "1.00 MiB", "3.00 GiB"]


def test_cpu_oom_is_read_from_a_real_allocation_failure():
    import torch
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**40, 2**10)         # 4 PiB: more than any address space
    assert failures.parse_cpu_oom(str(info.value)) == 2**52


def test_cuda_error_texts():
    text = failures.cuda_error_message("cudaErrorAssert")
    assert text.splitlines()[0] == "CUDA error: device-side assert triggered"
    assert "CUDA_LAUNCH_BLOCKING=1" in text
    assert "CUDA_LAUNCH_BLOCKING" not in failures.cuda_error_message("cudaErrorAssert",
                                                                     launch_blocking=True)
    assert "asynchronously" not in failures.cuda_error_message("cudaErrorNoKernelImageForDevice")


@pytest.mark.parametrize("arch, capability, ok", [
    (["sm_80", "sm_90"], (9, 0), True),
    (["sm_80"], (8, 9), True),            # same major, newer minor: binary compatible
    (["sm_86"], (8, 0), False),           # never backwards
    (["sm_80", "sm_90"], (12, 0), False),  # a newer major needs PTX or a new build
    (["sm_80", "compute_90"], (12, 0), True),
    (["sm_90a"], (9, 0), True), (["sm_90a"], (10, 0), False),
    ([], (9, 0), False),
])
def test_kernel_image_available(arch, capability, ok):
    assert health.kernel_image_available(arch, capability)[0] is ok


def test_nan_steps_and_fp16_overflow():
    assert failures.first_nonfinite([1.0, 2.0, float("inf"), float("nan")]) == 2
    assert failures.first_nonfinite([1.0, 2.0]) is None
    assert failures.steps_to_overflow(1.0, 2.25) == 14      # 2.25^13 = 37,877; 2.25^14 = 85,223
    assert failures.steps_to_overflow(1.0, 2.0) == 16       # 2^16 = 65,536 > 65,504


def test_shm_needed():
    assert failures.shm_bytes_needed(8, 2, 256 * 3 * 224 * 224 * 4) == 2_466_250_752


def test_a_missing_rank_times_out_and_its_stack_names_the_collective():
    """The wait ends at the group's timeout, not before (the upper bound only says it ended: a
    loaded machine may take seconds to wake the waiting thread). And what faulthandler (or
    py-spy) shows of the hung rank, dumped a quarter into the wait: its innermost frame waits at
    the all_reduce."""
    import faulthandler
    import tempfile

    with tempfile.TemporaryFile("w+") as stacks:
        waited, message = failures.missing_rank(
            timeout_seconds=1.0, while_waiting=lambda: faulthandler.dump_traceback(stacks, all_threads=True))
        stacks.seek(0)
        dump = stacks.read()
    assert 0.8 < waited < 60 and "Timed out" in message
    waiting = next(thread for thread in dump.split("\n\n") if "missing_rank" in thread)
    line = int(waiting.split("missing_rank")[0].rsplit("line ", 1)[1].split()[0])
    assert "allreduce" in open(failures.__file__).read().splitlines()[line - 1]


def test_monitored_barrier_names_the_rank_that_never_came():
    """Section 6.2, for real: rank 0 of two gloo ranks waits at monitored_barrier for rank 1, and
    the error (and gloo's own log, captured from stderr) names rank 1."""
    waited, message, log = failures.missing_rank_at_barrier(timeout_seconds=0.5)
    assert 0.4 < waited < 5 and "Ranks 1 failed to pass monitoredBarrier" in message
    assert "monitoredBarrier" in log


def test_join_lets_uneven_ranks_finish_and_without_it_the_longer_rank_waits_in_backward():
    """Section 6.4, for real on two gloo processes with 3 and 4 batches. With join(), both ranks
    end with the weights of this hand-made run: rank 0 sits out rank 1's fourth step with a zero
    gradient, still divided by the starting world size of 2 (join's default,
    divide_by_initial_world_size), and DDP copies the last rank's weights to the others at the
    end. Without it, rank 1 is in its fourth backward when rank 0's barrier gives up on it."""
    import torch

    joined = failures.uneven_inputs((3, 4), use_join=True)
    assert joined["steps"] == [3, 4] and joined["weight_gap"] == 0.0
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    shards = [torch.Generator().manual_seed(rank) for rank in range(2)]     # as each rank draws
    loaders = [[torch.randn(4, 8, generator=shards[rank]) for _ in range(n)]
               for rank, n in enumerate((3, 4))]
    for step in range(4):
        grads = []
        for loader in loaders:
            model.zero_grad()
            if step < len(loader):
                model(loader[step]).square().mean().backward()
                grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= 0.1 * sum(g[i] for g in grads) / 2
    expected = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.allclose(torch.tensor(joined["weights"][0]), expected, atol=1e-6)

    hung = failures.uneven_inputs((3, 4), use_join=False, barrier_seconds=1.0)
    assert "Ranks 1 failed to pass monitoredBarrier" in hung["errors"][0]
    assert hung["waiting_in"] == {0: "dist.monitored_barrier(timeout=patience, wait_all_ranks=True)",
                                  1: "loss.backward()"}


def test_record_writes_the_error_torchrun_prints(monkeypatch):
    """Section 6.3: @record writes the exception to TORCHELASTIC_ERROR_FILE, and the helper puts
    the environment back as it found it."""
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", "/nonexistent/kept.json")
    written = failures.recorded_error(FloatingPointError("loss is NaN at step 14"))
    assert written["message"]["message"] == "FloatingPointError: loss is NaN at step 14"
    assert "in main" in written["message"]["extraInfo"]["py_callstack"]
    assert os.environ["TORCHELASTIC_ERROR_FILE"] == "/nonexistent/kept.json"
