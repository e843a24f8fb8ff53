"""gpulab.pipeline.trace and gpulab.pipeline.utilisation (chapter 07): a profile's idle share, its top ops, launch
overhead; NVML sampling with a stand-in NVML; the CPU analogue."""
import gzip
import json
import types

import pytest

from gpulab.pipeline import trace, utilisation


def X(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


GPU_TRACE = [
    X("user_annotation", "ProfilerStep#1", 0, 100), X("user_annotation", "ProfilerStep#2", 100, 100),
    # kernels: 20-50 and 40-60 overlap (busy 20-60 = 40 µs); 150-180 (30 µs): 70 of 200 busy
    X("kernel", "gemm", 20, 30), X("kernel", "gemm", 40, 20), X("kernel", "softmax", 150, 30),
    X("cuda_runtime", "cudaLaunchKernel", 15, 8), X("cuda_runtime", "cudaLaunchKernel", 35, 8),
    X("cuda_runtime", "cudaLaunchKernel", 140, 8), X("cuda_runtime", "cudaMemcpyAsync", 5, 3),
    X("user_annotation", "compute", 10, 60),
]


def test_idle_share_counts_overlapping_kernels_once():
    idle = trace.idle_share(GPU_TRACE)
    assert (idle.busy_us, idle.step_us, idle.steps) == (70, 200, 2)
    assert idle.share == pytest.approx(0.65) and idle.busy_from == "GPU kernels"


def test_idle_share_on_a_cpu_reads_the_compute_ranges():
    events = [X("user_annotation", "ProfilerStep#1", 0, 100), X("user_annotation", "data", 0, 60),
              X("user_annotation", "compute", 60, 40), X("cpu_op", "aten::mm", 60, 30)]
    idle = trace.idle_share(events)
    assert idle.share == pytest.approx(0.6) and "no GPU" in idle.busy_from


def test_idle_share_needs_step_markers():
    with pytest.raises(ValueError, match="schedule"):
        trace.idle_share([X("kernel", "gemm", 0, 10)])


def test_intervals_outside_the_steps_do_not_count():
    assert trace.covered([(-50, 10), (90, 200)], (0, 100)) == 20
    assert trace.merged([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]


def test_top_ops_and_launch_overhead():
    assert trace.top_ops(GPU_TRACE, 1) == [("gemm", 50.0, 2)]
    launches = trace.launch_overhead(GPU_TRACE)
    assert (launches.launches, launches.kernels) == (3, 3)
    assert launches.us_per_launch == 8 and launches.us_per_kernel == pytest.approx(80 / 3)
    assert not launches.launch_bound
    tiny = [X("cuda_runtime", "cudaLaunchKernel", 0, 6), X("kernel", "add", 6, 2)]
    assert trace.launch_overhead(tiny).launch_bound
    assert "no GPU" in str(trace.launch_overhead([]))


def test_load_events_reads_plain_and_gzipped_traces(tmp_path):
    data = {"traceEvents": GPU_TRACE + [{"ph": "M", "name": "process_name"}]}
    (tmp_path / "t.json").write_text(json.dumps(data))
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump(data, f)
    assert trace.load_events(tmp_path / "t.json") == trace.load_events(tmp_path / "t.json.gz") == GPU_TRACE


def test_a_real_cpu_profile_round_trip(tmp_path):
    """torch.profiler on this machine: export (checked), read back, and the idle share is what the
    trace's own ranges say: busy = the "compute" ranges inside the steps. (No clock ratio: a loaded
    machine stretches the sleeps, and the share with them.)"""
    import time

    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    path = trace.new_trace_path()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: trace.export(p, path)) as prof:
        for _ in range(4):
            with record_function("data"):
                time.sleep(0.006)
            with record_function("compute"):
                time.sleep(0.002)
            prof.step()
    events = trace.load_events(path)
    idle = trace.idle_share(events)
    steps = trace.step_windows(events)
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "compute"]
    assert idle.steps == 3 and idle.busy_us == pytest.approx(sum(trace.covered(compute, w) for w in steps))
    assert idle.busy_us >= 3 * 2000 and idle.step_us >= 3 * 8000        # sleeps never end early
    assert idle.share == pytest.approx(1 - idle.busy_us / idle.step_us)
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"           # this user's folder only


def test_a_trace_that_was_not_written_is_an_error(tmp_path):
    """Kineto, the profiler's exporter, reports a failed write only on stderr; export raises. And
    it never writes over a file that is already there (a stale or someone else's)."""
    class Profile:
        def __init__(self, text):
            self.text = text

        def export_chrome_trace(self, path):
            if self.text is not None:
                open(path, "w").write(self.text)

    with pytest.raises(RuntimeError, match="wrote no trace"):
        trace.export(Profile(None), tmp_path / "t.json")
    with pytest.raises(RuntimeError, match="wrote no trace"):
        trace.export(Profile(""), tmp_path / "empty.json")
    assert trace.export(Profile("{}"), tmp_path / "ok.json") == tmp_path / "ok.json"
    with pytest.raises(FileExistsError):
        trace.export(Profile("{}"), tmp_path / "ok.json")
    assert trace.new_trace_path() != trace.new_trace_path()


class FakeNvml:
    NVML_CLOCK_SM = 1

    def __init__(self, count=1):
        self.count, self.calls = count, 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetUtilizationRates(self, h):
        self.calls += 1
        return types.SimpleNamespace(gpu=100 if self.calls > 1 else 0, memory=3)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        return 150_000                                      # milliwatts

    def nvmlDeviceGetClockInfo(self, h, which):
        assert which == self.NVML_CLOCK_SM
        return 1980


def test_sampler_reads_utilisation_power_and_clock():
    sampler = utilisation.UtilisationSampler(nvml=FakeNvml(), skip=1, interval=60)  # samples by hand
    sampler.start()
    for _ in range(4):                                      # the first is skipped
        sampler.sample()
    result = sampler.stop()
    assert result.gpu_percent[:3] == [100.0] * 3 and result.power_watts[0] == 150.0
    assert result.sm_clock_mhz[0] == 1980 and result.used_bytes[0] == 2**30
    assert "100%" in str(result)


def test_sampler_without_a_gpu_says_so():
    class NoDriver(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    for nvml in (NoDriver(), FakeNvml(count=0)):
        with utilisation.UtilisationSampler(nvml=nvml) as sampler:
            pass
        assert sampler.result.samples == 0 and "no NVIDIA GPU" in sampler.result.note
        assert "no utilisation samples" in str(sampler.result)


def test_cpu_busy_counts_a_busy_loop_and_not_a_sleep():
    """CPU seconds, not a ratio to wall time (which a loaded machine changes): the loop runs until
    it has used 50 ms of this process's CPU, the sleep uses next to none however long it lasts."""
    import time

    def spin():
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass

    busy, _ = utilisation.cpu_busy(spin)
    idle, _ = utilisation.cpu_busy(lambda: time.sleep(0.05))
    assert busy.cpu_seconds >= 0.05
    assert idle.cpu_seconds < 0.02 and idle.wall_seconds >= 0.05
