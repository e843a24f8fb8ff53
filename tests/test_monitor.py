"""gpulab.monitoring.monitor and the doctor's chapter-08 checks: the NVML path against a small fake pynvml
(this machine has no driver), the CPU fallback for real, energy from power and from the counter,
the health findings and the per-failure-class verdicts."""
import dataclasses
import time
import types

import pytest

from gpulab.device import DeviceFacts, NvmlGPU, TorchGPU, diagnose, render_report
from gpulab.device.health import GPUHealth, read_health
from gpulab.device.preflight import failure_classes
from gpulab.monitoring import monitor
from gpulab.monitoring.monitor import Monitor, Trace

GiB = 2**30


def fake_nvml(power_mw=300_000, events=0x4, ecc_uncorrected=0, fail_power=False, old_driver=False):
    """One H100 whose readings change each call: utilisation 10, 20, 30...; energy +30 J a call."""
    nvml = types.ModuleType("pynvml")
    calls = {"n": 0}

    def utilisation(handle):
        calls["n"] += 1
        return types.SimpleNamespace(gpu=10 * calls["n"], memory=5)

    def power(handle):
        if fail_power:
            raise RuntimeError("Not Supported")
        return power_mw

    nvml.NVML_CLOCK_SM, nvml.NVML_TEMPERATURE_GPU = 1, 0
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nvml.nvmlDeviceGetUtilizationRates = utilisation
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 * GiB, total=80 * GiB)
    nvml.nvmlDeviceGetPowerUsage = power
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 71
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: 1755
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1_000_000 + 30_000 * calls["n"]   # mJ
    if old_driver:                   # before driver 535 only the "throttle" name exists
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: events
    else:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: events
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: 500_000
    nvml.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: 700_000
    nvml.nvmlDeviceGetTemperatureThreshold = lambda h, kind: 87
    nvml.nvmlDeviceGetEccMode = lambda h: [1, 1]
    nvml.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: ecc_uncorrected if kind == 1 else 7
    nvml.nvmlDeviceGetRemappedRows = lambda h: (0, 0, False, False)
    return nvml


def test_gpu_samples_every_series_through_nvml():
    values = monitor.read_gpu_sample(fake_nvml(), 0)
    assert values == {"util_percent": 10.0, "memory_used_bytes": 3.0 * GiB, "power_watts": 300.0,
                      "temperature_c": 71.0, "sm_clock_mhz": 1755.0, "clock_events": 4.0,
                      "energy_mj": 1_030_000.0}


def test_an_unsupported_query_is_left_out_and_an_old_driver_still_gives_clock_events():
    values = monitor.read_gpu_sample(fake_nvml(fail_power=True, old_driver=True, events=0x24), 0)
    assert "power_watts" not in values and values["clock_events"] == 0x24


def wait_for_samples(watch, n, seconds=30.0):
    """The work lasts until the sampling thread has taken ``n`` samples (not a fixed sleep, which
    a loaded machine can leave without a single wake-up of the thread)."""
    deadline = time.monotonic() + seconds
    while watch.trace.samples < n and time.monotonic() < deadline:
        time.sleep(0.005)


def test_monitor_on_a_fake_gpu_samples_in_the_background_and_marks_phases():
    with Monitor(interval=0.01, nvml=fake_nvml()) as watch:
        with watch.phase("compute"):
            wait_for_samples(watch, 4)        # one at the start, three from the thread
    trace = watch.trace
    assert trace.on_gpu and "H100" in trace.source and trace.note == ""
    assert trace.samples >= 5 and trace.times == sorted(trace.times)      # and one at the end
    assert trace.series["util_percent"][:3] == [10.0, 20.0, 30.0]
    assert [p for p, _, _ in trace.phases] == ["compute"] and trace.in_phase("compute", "power_watts")


def test_energy_prefers_the_counter_and_falls_back_to_power_times_time():
    counter = Trace(times=[0.0, 1.0, 2.0], series={"energy_mj": [0.0, 250e3, 700e3],
                                                   "power_watts": [100.0, 100.0, 100.0]})
    assert counter.energy_joules() == pytest.approx(700.0)
    power = Trace(times=[0.0, 1.0, 3.0], series={"power_watts": [100.0, 300.0, 300.0]})
    assert power.energy_joules() == pytest.approx(200 + 600)          # trapezoids
    assert power.energy_joules(1.0, 3.0) == pytest.approx(600)
    assert Trace(times=[0.0, 1.0], series={"cpu_percent": [1.0, 2.0]}).energy_joules() is None


def test_energy_and_token_formulas():
    assert monitor.energy_per_step(650, 0.42) == pytest.approx(273)
    assert monitor.tokens_per_kwh(16_384, 273) == pytest.approx(16_384 * 3.6e6 / 273)


def test_without_a_driver_the_monitor_watches_this_process_and_says_so():
    class NoDriver:
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    with Monitor(interval=0.01, nvml=NoDriver()) as watch:
        with watch.phase("busy"):
            end = time.process_time() + 0.2            # 0.2 s of this process's CPU, however long
            while time.process_time() < end:
                pass
    trace = watch.trace
    assert not trace.on_gpu and "not a GPU" in trace.source and "NVML" in trace.note
    assert set(trace.series) == {"cpu_percent", "rss_bytes"} and min(trace.series["rss_bytes"]) > 0
    # A spinning thread shows as busy: each sample is the CPU time since the one before over the
    # time between them, so the samples add up to the CPU the loop used (0.2 s; psutil counts in
    # 10 ms ticks), on a quiet machine or a loaded one.
    cpu = sum(percent / 100 * (t1 - t0) for t0, t1, percent in
              zip(trace.times, trace.times[1:], trace.series["cpu_percent"][1:]))
    assert 0.1 < cpu < 1.0


def test_plot_draws_one_panel_per_series():
    trace = Trace(source="test", times=[0.0, 0.1, 0.2],
                  series={"cpu_percent": [0.0, 90.0, 95.0], "rss_bytes": [1e8, 1e8, 2e8]},
                  phases=[("compute", 0.05, 0.2)])
    fig = monitor.plot(trace)
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "process RSS (GiB)"


def test_health_reads_clocks_power_cap_and_ecc():
    health = read_health(fake_nvml(ecc_uncorrected=2), 0)
    assert (health.sm_clock_mhz, health.max_sm_clock_mhz, health.clock_events) == (1755, 1980, 4)
    assert (health.power_limit_watts, health.default_power_limit_watts) == (500, 700)
    assert (health.ecc_enabled, health.ecc_uncorrected_volatile, health.ecc_corrected_volatile) == (True, 2, 7)
    assert health.row_remap_pending is False and health.persistence_mode is None  # not offered


def gpu_machine(health: GPUHealth | None, arch=("sm_80", "sm_90")) -> DeviceFacts:
    return DeviceFacts(
        torch_version="2.13.0+cu126", torch_cuda="12.6", cuda_available=True,
        cuda_visible_devices=None, nvml_status="ok", driver_version="560.35.03", driver_cuda="12.6",
        torch_gpus=[TorchGPU(0, "NVIDIA H100 80GB HBM3", (9, 0), 80 * GiB, 70 * GiB, True, "u")],
        nvml_gpus=[NvmlGPU(0, "NVIDIA H100 80GB HBM3", 80 * GiB, 10 * GiB, [], "u", health)],
        pid=1, torch_arch_list=list(arch), shm_bytes=64 * 10**6)


def test_doctor_flags_memory_errors_power_cap_and_slowdown_before_a_run():
    sick = read_health(fake_nvml(ecc_uncorrected=2, events=0x44), 0)
    findings = diagnose(gpu_machine(sick))
    levels = {f.level for f in findings}
    assert levels == {"ok", "warn", "error"}
    text = render_report(gpu_machine(sick), findings)
    assert "uncorrectable memory errors" in text and "SwPowerCap, HwThermalSlowdown" in text
    assert "power cap is 500 W, below its default 700 W" in text
    assert text.splitlines()[-2].startswith("Verdict: BROKEN")


def test_a_healthy_gpu_gets_no_health_finding():
    healthy = GPUHealth(clock_events=0x1, ecc_enabled=True, ecc_uncorrected_volatile=0,
                        power_limit_watts=700, default_power_limit_watts=700)
    assert [f.level for f in diagnose(gpu_machine(healthy))] == ["ok"]


def test_doctor_finds_no_kernel_image_for_a_newer_gpu():
    facts = gpu_machine(None, arch=("sm_80", "sm_86"))
    facts = dataclasses.replace(facts, torch_gpus=[dataclasses.replace(facts.torch_gpus[0],
                                                                       capability=(12, 0))])
    assert diagnose(facts)[0].level == "error" and "sm_120" in diagnose(facts)[0].message


def test_an_older_driver_of_the_same_cuda_major_runs_the_build():
    """CUDA's minor-version compatibility: torch built for CUDA 12.8 runs on driver 535 (CUDA
    12.2), with a limited feature set: a warning, not an error. CUDA 13 on it cannot."""
    def driver_row(driver, driver_cuda, torch_cuda):
        facts = dataclasses.replace(gpu_machine(GPUHealth(clock_events=0x0)), driver_version=driver,
                                    driver_cuda=driver_cuda, torch_cuda=torch_cuda)
        return next(row for row in failure_classes(facts) if row[0] == "driver older than torch's CUDA")

    level, why = driver_row("535.104.05", "12.2", "12.8")[1:]
    assert level == "warn" and "minor-version compatibility" in why and ">= 525" in why
    assert driver_row("535.104.05", "12.2", "13.0")[1] == "error"
    assert driver_row("470.82.01", "11.4", "12.1")[1] == "error"
    assert driver_row("580.65.06", "13.0", "12.8")[1] == "ok"
    assert driver_row(None, None, "12.8")[1] == "n/a"


def test_failure_classes_give_a_plain_verdict_each():
    rows = {name: level for name, level, _ in failure_classes(gpu_machine(GPUHealth(clock_events=0x4)))}
    assert rows == {"out of memory": "ok", "no kernel image": "ok",
                    "driver older than torch's CUDA": "ok", "slowdown (power, heat)": "warn",
                    "memory errors (ECC)": "ok", "DataLoader shared memory": "warn",
                    "hung collective": "n/a"}
