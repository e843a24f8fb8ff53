"""Tests of gpulab.device: the preflight report.

diagnose() is pure, so most tests describe a made-up machine as DeviceFacts and check the finding
a learner would read. The rest run collect_facts() and `python -m gpulab doctor` on this machine,
and feed collect_facts() a fake pynvml to cover drivers that are missing, broken or partial.
No GPU needed.
"""

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from gpulab import device
from gpulab.__main__ import main
from gpulab.device import choosing  # holds count_gpus_in_this_process and its torch
from gpulab.device import (
    GiB, LEARNER_BUDGET_BYTES, NVML_INIT_FAILED, NVML_NO_LIBRARY, NVML_NOT_INSTALLED, NVML_OK,
    DeviceFacts, Finding, GPUProcess, NvmlGPU, TorchGPU, collect_facts, diagnose, is_usable,
    physical_gpu, render_report,
)

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20
A100 = "NVIDIA A100-SXM4-80GB"
UUID = "5b6c1d2e-0000-1111-2222-333344445555"  # torch's spelling; NVML adds "GPU-"


def torch_gpu(free=70 * GiB, total=80 * GiB, name=A100) -> TorchGPU:
    return TorchGPU(0, name, (8, 0), total, free, bf16=True, uuid=UUID)


def nvml_gpu(index=0, used=10 * GiB, total=80 * GiB, processes=None) -> NvmlGPU:
    return NvmlGPU(index, A100, total, used, processes=processes, uuid=UUID if index == 0 else None)


def machine(**changes) -> DeviceFacts:
    """A healthy machine: CUDA 12.6 build of torch, driver for CUDA 12.6, one A100 with room.
    Each test changes only what it is about."""
    healthy = DeviceFacts(
        torch_version="2.13.0+cu126", torch_cuda="12.6", cuda_available=True,
        cuda_visible_devices=None, torch_gpus=[torch_gpu()], nvml_status=NVML_OK,
        driver_version="560.35.03", driver_cuda="12.6", nvml_gpus=[nvml_gpu()], pid=1000,
    )
    return dataclasses.replace(healthy, **changes)


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


CPU_BUILD = dict(torch_version="2.13.0+cpu", torch_cuda=None, cuda_available=False, torch_gpus=[])
NO_DRIVER = dict(nvml_status=NVML_NO_LIBRARY, nvml_error="NVML Shared Library Not Found",
                 driver_version=None, driver_cuda=None, nvml_gpus=[])
TORCH_SEES_NO_GPU = dict(cuda_available=False, torch_gpus=[])


# ------------------------------------------------------------------ diagnose, scenario by scenario

@pytest.mark.parametrize("facts", [
    machine(**CPU_BUILD, **NO_DRIVER),
    machine(**TORCH_SEES_NO_GPU, **NO_DRIVER),  # the default pip torch on Linux is a CUDA build
    machine(**CPU_BUILD, nvml_status=NVML_NOT_INSTALLED, nvml_gpus=[]),
], ids=["cpu-build", "cuda-build", "no-pynvml"])
def test_a_no_gpu_is_ok_and_says_experiments_shrink(facts):
    finding = only(diagnose(facts))
    assert finding.level == "ok"
    assert finding.message.startswith("No GPU: experiments run on CPU at reduced size")
    assert is_usable([finding])


def test_b_gpu_present_but_torch_is_cpu_only_build():
    facts = machine(**CPU_BUILD, driver_cuda="12.4")
    finding = only(diagnose(facts))
    assert finding.level == "error"
    assert "CPU-only" in finding.message and A100 in finding.message
    assert "make lab TORCH=" in finding.next_step and "12.4" in finding.next_step
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu" in finding.next_step
    assert not is_usable([finding])


def test_c_driver_older_than_torch_cuda_runtime():
    facts = machine(**TORCH_SEES_NO_GPU, driver_version="550.54.15", driver_cuda="12.4",
                    torch_cuda_error="The NVIDIA driver on your system is too old")
    finding = only(diagnose(facts))
    assert finding.level == "error"
    assert "driver too old" in finding.message
    for version in ("12.4", "12.6", "550.54.15"):
        assert version in finding.message
    assert "make lab TORCH=" in finding.next_step


def test_c_versions_compare_as_numbers_not_text():
    # "12.10" > "12.9" as versions, though not as strings: no "too old" here
    facts = machine(**TORCH_SEES_NO_GPU, torch_cuda="12.9", driver_cuda="12.10",
                    torch_cuda_error="some other reason")
    finding = only(diagnose(facts))
    assert finding.level == "error"
    assert "too old" not in finding.message and "some other reason" in finding.message


def test_d_cuda_build_but_driver_not_loaded():
    facts = machine(**TORCH_SEES_NO_GPU, nvml_status=NVML_INIT_FAILED,
                    nvml_error="Driver Not Loaded", driver_version=None, driver_cuda=None,
                    nvml_gpus=[])
    finding = only(diagnose(facts))
    assert finding.level == "error"
    assert "driver" in finding.message and "Driver Not Loaded" in finding.message
    assert "nvidia-smi" in finding.next_step


def test_e_nearly_full_gpu_names_the_other_processes():
    us = GPUProcess(1000, "python", GiB // 2)  # machine() says pid 1000 collected the facts
    processes = [GPUProcess(4242, "python3", 70 * GiB), us]
    facts = machine(torch_gpus=[torch_gpu(free=2 * GiB)],
                    nvml_gpus=[nvml_gpu(used=78 * GiB, processes=processes)])
    finding = only(diagnose(facts))
    assert finding.level == "warn"
    assert "2.0 GiB free of 80.0 GiB" in finding.message
    assert "other processes hold 70.0 GiB: pid 4242 python3" in finding.message
    assert "pid 1000" not in finding.message
    assert "CUDA_VISIBLE_DEVICES" in finding.next_step
    assert "before CUDA initialises" in finding.next_step
    assert is_usable([finding])


@pytest.mark.parametrize("free, total, warns", [
    (LEARNER_BUDGET_BYTES - 1, 16 * GiB, True),  # under the 4 GiB budget
    (LEARNER_BUDGET_BYTES, 16 * GiB, False),
    (6 * GiB, 80 * GiB, True),  # 7.5% free: over budget, but the GPU is taken
    (9 * GiB, 80 * GiB, False),
])
def test_e_memory_thresholds(free, total, warns):
    facts = machine(torch_gpus=[torch_gpu(free=free, total=total)],
                    nvml_gpus=[nvml_gpu(processes=None)])
    finding = only(diagnose(facts))
    assert finding.level == ("warn" if warns else "ok")
    if warns:  # no process list from the driver: still says how much is taken
        assert "in use" in finding.message


@pytest.mark.parametrize("value", ["", "-1", "2", "NoDevFiles", "GPU-00000000-dead", "GPU-0,1"])
def test_f_cuda_visible_devices_hides_every_gpu(value):
    facts = machine(**TORCH_SEES_NO_GPU, cuda_visible_devices=value,
                    nvml_gpus=[nvml_gpu(0), nvml_gpu(1)])
    finding = only(diagnose(facts))
    assert finding.level == "warn"
    assert f"CUDA_VISIBLE_DEVICES={value!r} hides all 2 GPU(s)" in finding.message
    assert is_usable([finding])


@pytest.mark.parametrize("value", [f"GPU-{UUID}", f"GPU-{UUID[:8]}", f"GPU-{UUID.upper()},GPU-0dead",
                                   "MIG-anything"])
def test_f_a_uuid_that_names_a_gpu_hides_nothing(value):
    facts = machine(cuda_visible_devices=value, nvml_gpus=[nvml_gpu(0), nvml_gpu(1)])
    assert not [f for f in diagnose(facts) if "hides all" in f.message]


def test_f_a_valid_cuda_visible_devices_is_not_blamed():
    facts = machine(**TORCH_SEES_NO_GPU, cuda_visible_devices="1", torch_cuda_error="boom",
                    nvml_gpus=[nvml_gpu(0), nvml_gpu(1)])
    finding = only(diagnose(facts))
    assert finding.level == "error" and "boom" in finding.message


def test_g_ready_names_the_gpu():
    finding = only(diagnose(machine()))
    assert finding.level == "ok"
    assert finding.message.startswith(f"Ready: experiments run on {A100}")


# ------------------------------------------------------------------ the report

def test_report_states_units_and_ends_with_verdict_and_next_step():
    facts = machine(**CPU_BUILD, driver_cuda="12.4")
    report = render_report(facts, diagnose(facts))
    assert "GiB (2^30 bytes)" in report
    verdict, next_step = report.splitlines()[-2:]
    assert verdict.startswith("Verdict: BROKEN")
    assert next_step.startswith("Next step: reinstall torch")


def test_report_of_a_ready_machine_has_no_next_step():
    report = render_report(machine(), diagnose(machine()))
    assert report.splitlines()[-1] == f"Verdict: READY on {A100}."


# ------------------------------------------------------------------ this machine, for real

def test_best_device_follows_torch(monkeypatch):
    assert device.best_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.best_device() == torch.device("cpu")


@pytest.mark.parametrize("visible, torch_index, physical", [
    (None, 1, 1),  # unset: nothing renumbered
    ("2,3", 0, 2),
    ("2,3", 1, 3),
    ("3, 1", 1, 1),  # the listed order, not sorted
    ("2,-1,3", 0, 2),  # CUDA stops at the first invalid entry
])
def test_physical_gpu_follows_cuda_visible_devices(visible, torch_index, physical):
    assert physical_gpu(visible, torch_index) == physical


@pytest.mark.parametrize("visible, torch_index", [("2,3", 2), ("", 0), ("2,-1,3", 1)])
def test_physical_gpu_rejects_a_hidden_index(visible, torch_index):
    with pytest.raises(IndexError, match="does not exist"):
        physical_gpu(visible, torch_index)


# CUDA_VISIBLE_DEVICES in every form CUDA accepts, on a modelled driver (tests/modelled_nvml):
# GPU 0 and GPU 2 share their UUIDs' first 8 digits; GPU 1 is in MIG mode with two instances.
H200 = 141 * 10**9
MACHINE = [
    {"uuid": "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "minor": 0, "total": H200},
    {"uuid": "GPU-5b6c1d2e-0000-1111-2222-333344445555", "minor": 1, "total": H200, "migs": [
        {"uuid": "MIG-1c2d3e4f-aaaa-5bbb-8ccc-000000000001", "gi": 7, "ci": 0, "total": 17 * GiB},
        {"uuid": "MIG-1c2d3e4f-aaaa-5bbb-8ccc-000000000002", "gi": 8, "ci": 0, "total": 17 * GiB}]},
    {"uuid": "GPU-8932f937-ffff-4106-c12f-00000000aaaa", "minor": 2, "total": H200},
]


def modelled_pynvml(gpus=MACHINE):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "modelled_pynvml", REPO / "tests" / "modelled_nvml" / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.modelled(gpus)


@pytest.mark.parametrize("visible, physical", [
    ("2,1", [2, 1]),                                               # indices: no driver asked
    ("0,2,-1,1", [0, 2]),                                          # cut at the first invalid
    ("1gpu2,0", [1, 0]),                                           # an index is read like strtoul
    ("GPU-5b6c1d2e-0000-1111-2222-333344445555", [1]),              # a full UUID
    ("GPU-5b6c1d2e", [1]),                                         # abbreviated: unique prefix
    ("gpu-5b6c1d2e,0", []),                                        # the prefix is GPU-, not gpu-
    ("GPU-8932F937-D72C", [0]),                                    # hex digits in any case
    ("GPU-8932f937,1", []),                                        # ambiguous: GPUs 0 and 2
    ("GPU-8932f937-f,GPU-8932f937-d,1", [2, 0, 1]),                # mixed UUIDs and an index
    ("0, GPU-5b6c1d2e ,GPU-00000000,2", [0, 1]),                   # cut at a UUID matching none
    ("MIG-1c2d3e4f-aaaa-5bbb-8ccc-000000000002", [1]),             # a MIG instance: its GPU
    ("MIG-1c2d3e4f-aaaa-5bbb-8ccc-000000000001,0", [1]),           # one MIG instance at most
    ("MIG-GPU-5b6c1d2e-0000-1111-2222-333344445555/7/0", [1]),     # the R450/R460 form
    ("MIG-1c2d3e4f-aaaa-5bbb-8ccc", []),                           # ambiguous between the two
    ("GPU-5b6c1d2e,3,0", [1]),                                     # 3 is past the last GPU
    ("", []), ("-1", []),
])
def test_visible_gpus_reads_every_form_cuda_accepts(visible, physical):
    listed = choosing.visible_gpus(visible, nvml=modelled_pynvml())
    assert [g.nvml_index for g in listed] == physical
    for torch_index, gpu in enumerate(physical):
        assert physical_gpu(visible, torch_index, nvml=modelled_pynvml()) == gpu


def test_visible_gpus_names_the_devices_it_found():
    gpu, = choosing.visible_gpus("GPU-5b6c1d2e", nvml=modelled_pynvml())
    assert gpu.uuid == MACHINE[1]["uuid"] and gpu.mig_uuid is None
    mig, = choosing.visible_gpus(MACHINE[1]["migs"][1]["uuid"], nvml=modelled_pynvml())
    assert (mig.nvml_index, mig.uuid, mig.mig_uuid) == (1, MACHINE[1]["uuid"], MACHINE[1]["migs"][1]["uuid"])


def test_a_uuid_without_a_driver_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)            # `import pynvml` fails
    with pytest.raises(LookupError, match="NVML"):
        physical_gpu("GPU-5b6c1d2e", 0)
    assert physical_gpu("2,3", 1) == 3                         # indices need no driver


def test_the_samplers_watch_the_gpu_behind_cuda0_in_every_form(monkeypatch):
    from gpulab.monitoring.monitor import Monitor
    from gpulab.pipeline.utilisation import UtilisationSampler
    for visible, expected in [("GPU-5b6c1d2e", 1), ("MIG-1c2d3e4f-aaaa-5bbb-8ccc-000000000002", 1),
                              ("2,0", 2)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        sampler, watch = UtilisationSampler(nvml=modelled_pynvml()), Monitor(nvml=modelled_pynvml())
        assert sampler._open() and watch._open_gpu() is None
        assert sampler.index == watch.index == expected, visible
    assert UtilisationSampler(3, nvml=modelled_pynvml()).index == 3     # an index given stays


def test_a_footprint_counts_processes_on_mig_instances():
    from gpulab.device import footprint
    gpus = json.loads(json.dumps(MACHINE))
    gpus[0]["processes"] = [{"pid": 10, "used": 300 * MiB}]
    gpus[1]["migs"][1]["processes"] = [{"pid": 11, "used": 500 * MiB}]
    assert footprint.gpu_processes(modelled_pynvml(gpus)) == [(0, 10, 300 * MiB), (1, 11, 500 * MiB)]


# The chapters' first cells on a GPU server whose workshop hands out a UUID: torch is modelled
# with one visible GPU (the real build here has no CUDA), NVML with MACHINE, and the learner's
# GPU is the second one, so that code reading the variable as an index or ignoring it fails.
FIRST_CELLS = """
import json, os, sys, types
import torch
props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=141 * 10**9,
                              multi_processor_count=132, uuid="5b6c1d2e-0000-1111-2222-333344445555")
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_name = lambda device=None: props.name
torch.cuda.get_device_properties = lambda device=None: props
torch.cuda.get_device_capability = lambda device=None: (props.major, props.minor)
seen = {}
for path in sys.argv[1:]:
    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    namespace = {"__name__": "__main__"}
    exec(compile("".join(cells[0]["source"]), path, "exec"), namespace)
    seen[os.path.basename(path)] = {k: namespace[k] for k in ("GPU_INDEX",) if k in namespace}
print(json.dumps(seen))
"""


def test_every_chapters_first_cells_run_with_a_gpu_uuid_assigned(tmp_path):
    notebooks = sorted(REPO.glob("notebooks/[0-9][0-9]_*/[0-9][0-9]_*.ipynb"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-5b6c1d2e-0000-1111-2222-333344445555",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "modelled_nvml"), str(REPO)]),
           "MODELLED_NVML": json.dumps(MACHINE),
           "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", FIRST_CELLS, *map(str, notebooks)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(seen) == len(notebooks) >= 8
    assert seen["08_monitoring.ipynb"]["GPU_INDEX"] == 1      # the learner's GPU, through NVML


def test_learner_budget_is_4_gib():
    assert LEARNER_BUDGET_BYTES == 4 * 2**30


def test_collect_facts_on_this_machine():
    facts = collect_facts()
    assert facts.torch_version == torch.__version__
    assert facts.cuda_build == (torch.version.cuda is not None)  # False on the CPU build
    assert facts.cuda_available == torch.cuda.is_available()
    assert len(facts.torch_gpus) == (torch.cuda.device_count() if facts.cuda_available else 0)
    assert facts.nvml_status in (NVML_OK, NVML_NOT_INSTALLED, NVML_NO_LIBRARY, NVML_INIT_FAILED)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only report")
def test_report_on_this_cpu_machine_says_cpu_and_reduced_size():
    facts = collect_facts()
    report = render_report(facts, diagnose(facts))
    assert "No GPU: experiments run on CPU at reduced size" in report
    assert report.splitlines()[-1].startswith("Verdict: READY on CPU")


def test_python_m_gpulab_doctor_exits_0_here():
    done = subprocess.run([sys.executable, "-m", "gpulab", "doctor"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Verdict: " in done.stdout


def test_python_m_gpulab_without_command_prints_usage(capsys):
    assert main([]) == 2
    assert "usage: python -m gpulab" in capsys.readouterr().out


# ------------------------------------------------------------------ NVML, with a fake pynvml

class FakeNVMLError(Exception):
    def __init__(self, value: int, text: str):
        super().__init__(text)
        self.value = value


def fake_pynvml(init_error: Exception | None = None, broken_gpu: int | None = None):
    """Two A100s; GPU 1 will not list its processes; ``broken_gpu`` fails its memory query."""
    nvml = types.ModuleType("pynvml")
    nvml.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    nvml.shut_down = False

    def init():
        if init_error:
            raise init_error

    def memory(handle):
        if handle == broken_gpu:
            raise FakeNVMLError(15, "GPU is lost")
        return types.SimpleNamespace(total=80 * GiB, used=GiB, free=79 * GiB)

    def processes(handle):
        if handle == 1:
            raise FakeNVMLError(3, "Not Supported")
        return [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=GiB)]

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: setattr(nvml, "shut_down", True)
    nvml.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # older pynvml returns bytes
    nvml.nvmlSystemGetCudaDriverVersion = lambda: 12040
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda handle: A100
    nvml.nvmlDeviceGetUUID = lambda handle: f"GPU-{handle}0000000-AAAA"
    nvml.nvmlDeviceGetMemoryInfo = memory
    nvml.nvmlDeviceGetComputeRunningProcesses = processes
    return nvml


@pytest.mark.parametrize("error, status", [
    (FakeNVMLError(9, "Driver Not Loaded"), NVML_INIT_FAILED),
    (FakeNVMLError(12, "NVML Shared Library Not Found"), NVML_NO_LIBRARY),
    (RuntimeError("anything else"), NVML_INIT_FAILED),
])
def test_nvml_init_failure_is_recorded_not_raised(monkeypatch, error, status):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=error))
    facts = collect_facts()
    assert facts.nvml_status == status and facts.nvml_error == str(error)
    assert facts.nvml_gpus == []
    assert str(error) in render_report(facts, diagnose(facts))


def test_missing_pynvml_is_recorded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert collect_facts().nvml_status == NVML_NOT_INSTALLED


def test_nvml_facts_from_a_working_driver(monkeypatch):
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    facts = collect_facts()
    assert (facts.nvml_status, facts.nvml_error) == (NVML_OK, None)
    assert (facts.driver_version, facts.driver_cuda) == ("550.54.15", "12.4")
    first, second = facts.nvml_gpus
    assert (first.name, first.total_bytes, first.used_bytes) == (A100, 80 * GiB, GiB)
    assert first.uuid == "00000000-aaaa"
    our_name = Path("/proc/self/comm").read_text().strip()
    assert first.processes == [GPUProcess(os.getpid(), our_name, GiB)]
    assert second.processes is None  # the driver would not say: unknown, not "none"
    assert nvml.shut_down


def test_nvml_query_failing_midway_keeps_what_was_gathered(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(broken_gpu=1))
    facts = collect_facts()
    assert len(facts.nvml_gpus) == 1
    assert "GPU is lost" in facts.nvml_error


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs the CPU-only build of torch")
def test_doctor_exits_1_when_gpus_exist_but_torch_is_cpu_only(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "CPU-only build" in out and "Verdict: BROKEN" in out and "12.4" in out


class FakeCuda:
    """torch.cuda on a made-up 8-GPU machine, as torch 2.13 behaves (issue 13, finding 5): before
    CUDA is initialised, device_count() asks NVML and honours CUDA_VISIBLE_DEVICES as it is now;
    init() reads the variable once, and from then on the count is fixed."""

    GPUS = 8

    def __init__(self):
        self.fixed = None  # the count CUDA saw when it initialised

    def _count_now(self) -> int:
        value = os.environ.get("CUDA_VISIBLE_DEVICES")
        return self.GPUS if value is None else len(
            [e for e in value.split(",") if e.strip().isdigit()][:self.GPUS])

    def is_available(self) -> bool:
        return True

    def init(self) -> None:
        self.fixed = self._count_now()

    def device_count(self) -> int:
        return self._count_now() if self.fixed is None else self.fixed


@pytest.mark.parametrize("value, late, expected", [
    (None, False, 8), ("", False, 0), ("0", False, 1), ("2,3", False, 2),
    ("", True, 8), ("0", True, 8),          # set after CUDA started: ignored
])
def test_the_probe_initialises_cuda_before_setting_the_variable_late(monkeypatch, value, late,
                                                                     expected):
    # A probe that only called device_count() before the change would see "" -> 0 here: the
    # opposite of the lesson. Initialising CUDA first is what makes the late change too late.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")     # so that monkeypatch restores ours after
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(choosing.torch, "cuda", FakeCuda())
    assert device.count_gpus_in_this_process(value, set_after_init=late) == expected


def test_without_a_gpu_the_late_probe_does_not_try_to_start_cuda(monkeypatch):
    # torch.cuda.init() raises on a machine without a GPU; the probe must not call it there.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    fake = FakeCuda()
    fake.is_available = lambda: False
    fake.init = lambda: pytest.fail("init() called without a GPU")
    monkeypatch.setattr(choosing.torch, "cuda", fake)
    assert device.count_gpus_in_this_process("", set_after_init=True) == 0


def test_visible_gpu_counts_runs_each_setting_in_its_own_process(monkeypatch):
    # On this CPU-only machine every count is 0; the point is that the probes run, parse and
    # honour the variable in child processes without touching ours. One call: each costs one
    # import of torch.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    from gpulab.device import visible_gpu_counts
    counts = visible_gpu_counts({"hide": ("", False), "late": ("", True), "unset": (None, False),
                                 "late unset": (None, True)})
    gpus = torch.cuda.device_count()
    assert counts == {"hide": 0, "late": gpus, "unset": gpus, "late unset": gpus}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"


def test_visible_gpu_count_is_one_probe(monkeypatch):
    from gpulab.device import choosing
    monkeypatch.setattr(choosing, "visible_gpu_counts",
                        lambda settings: {label: len(repr(s)) for label, s in settings.items()})
    assert choosing.visible_gpu_count("", set_after_init=True) == len(repr(("", True)))


# ------------------------------------------------------------------------------------------
# Chapter 01, Experiment 4 (issue 13, finding 4), run against a simulated asynchronous GPU

class SimulatedGPU:
    """A GPU that runs queued kernels one after another, KERNEL seconds each, while the host
    only pays a few microseconds per launch and its clock moves on."""

    KERNEL, LAUNCH = 1.0, 1e-5

    def __init__(self):
        self.host = self.busy_until = 0.0

    def perf_counter(self) -> float:
        return self.host

    def launch(self) -> None:
        self.busy_until = max(self.busy_until, self.host) + self.KERNEL
        self.host += self.LAUNCH

    def synchronize(self, device=None) -> None:
        self.host = max(self.host, self.busy_until)


def test_chapter_01_times_the_synchronised_matmul_from_an_empty_queue():
    import nbformat

    nb = nbformat.read(REPO / "solutions/01_device_basics/01_device_basics.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if c.id == "ch01-code-37")
    gpu = SimulatedGPU()

    class Matrix:
        def __matmul__(self, other):
            gpu.launch()
            return self

    def time_fn(fn, device, warmup=2, repeats=10):   # CUDA events: the kernel's own time
        for _ in range(warmup + repeats):
            fn()
        gpu.synchronize()
        return types.SimpleNamespace(median=gpu.KERNEL)

    from gpulab.course import predict
    namespace = dict(
        torch=types.SimpleNamespace(randn=lambda *shape, device=None: Matrix()),
        time=types.SimpleNamespace(perf_counter=gpu.perf_counter),
        measure=types.SimpleNamespace(time_fn=time_fn, synchronize=gpu.synchronize),
        predict=predict, device="cuda", ON_GPU=True, queued_sync_ratio=...)
    exec(cell, namespace)
    assert namespace["naive"] < 0.01                                    # queueing only
    assert namespace["too_early"] == pytest.approx(2 * gpu.KERNEL, rel=0.01)  # Quiz 12's 2x
    assert namespace["synchronized"] == pytest.approx(gpu.KERNEL, rel=0.01)   # the real time
