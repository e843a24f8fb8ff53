"""`make gpu-check` on a CPU: the report survives failing and hanging chapters, the footprint
sampler adds up the right processes (a fake NVML and process table), and without CUDA the
script refuses cleanly. Tiny fake notebooks, not the course's chapters, keep this fast."""
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from gpulab.device import footprint
from gpulab.device.footprint import Footprint, FootprintSampler, process_tree, tree_bytes

ROOT = Path(__file__).resolve().parent.parent
MiB, GiB = 2**20, 2**30


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


class FakeNVML:
    """The few pynvml functions the sampler and the report use, over a table the test sets."""

    class NVMLError(Exception):
        pass

    def __init__(self, processes=None, used=None):
        self.processes = processes if processes is not None else {0: []}  # device -> [(pid, bytes)]
        self.used = used if used is not None else {0: 0}                    # device -> used bytes
        self.broken = False
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.inits -= 1

    def nvmlDeviceGetCount(self):
        return len(self.processes)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self.broken:
            raise self.NVMLError("GPU is lost")
        listed = self.processes[handle]
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listed]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.used[handle], total=143_771_287_552)

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H200"

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12080

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (9, 0)


# ---------------------------------------------------------------- aggregation (pure functions)

def test_tree_bytes_adds_the_trees_processes_over_all_gpus_and_nothing_else():
    listed = [(0, 100, 500 * MiB),   # the kernel
              (0, 101, 700 * MiB),   # a rank on GPU 0 ...
              (1, 101, 300 * MiB),   # ... and on GPU 1: the same process, added
              (0, 7, 3 * GiB),       # another learner
              (0, 1, 1 * GiB),       # the checker itself (the tree's root, not counted)
              (1, 102, None)]        # listed, but the driver gives no byte count
    total, by_pid = tree_bytes(listed, {100, 101, 102})
    assert by_pid == {100: 500 * MiB, 101: 1000 * MiB, 102: None}
    assert total == 1500 * MiB


def test_process_tree_from_a_parent_table():
    parents = {1: 0, 50: 1, 60: 50, 61: 50, 70: 60, 80: 1}  # 80: a sibling, not a descendant
    assert footprint._tree_from_parents(50, parents) == {50, 60, 61, 70}
    assert footprint._tree_from_parents(999, parents) == set()


def test_parents_read_from_proc_survive_odd_process_names(tmp_path):
    for pid, stat in {"10": "10 (python) S 1 10 10", "11": "11 (a) b (c) R 10 10 10",
                      "12": "12 (ipykernel) S 11 10 10"}.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "stat").write_text(stat)
    (tmp_path / "self").mkdir()  # not a pid
    assert footprint._parents_from_proc(tmp_path) == {10: 1, 11: 10, 12: 11}


def test_process_tree_sees_this_process_and_a_child():
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert {os.getpid(), child.pid} <= process_tree(os.getpid())
        assert {os.getpid(), child.pid} <= footprint._tree_from_parents(
            os.getpid(), footprint._parents_from_proc())
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------- the sampler, fake NVML

def test_sampler_keeps_the_peak_of_the_tree_without_its_root():
    nvml = FakeNVML({0: [(1, 2 * GiB)], 1: []}, used={0: 2 * GiB, 1: 0})
    tree = {1, 10, 11}  # root 1 (the checker), its kernel 10 and a rank 11
    sampler = FootprintSampler(1, interval=60, nvml=nvml, tree=lambda root: set(tree)).start()
    nvml.processes = {0: [(1, 2 * GiB), (10, 600 * MiB), (99, 5 * GiB)], 1: []}
    nvml.used = {0: 7 * GiB + 600 * MiB, 1: 0}
    sampler.sample()
    nvml.processes = {0: [(1, 2 * GiB), (10, 900 * MiB)], 1: [(11, 700 * MiB)]}  # the peak
    nvml.used = {0: 2 * GiB + 900 * MiB, 1: 700 * MiB}
    sampler.sample()
    nvml.processes = {0: [(1, 2 * GiB), (10, 400 * MiB)], 1: []}  # the rank has ended
    fp = sampler.stop()
    assert fp.peak_bytes == 1600 * MiB
    assert fp.peak_by_pid == {10: 900 * MiB, 11: 700 * MiB}
    assert fp.pids_seen == {10, 11}
    assert fp.device_peak_above_start == 5 * GiB + 600 * MiB  # pid 99 is not ours: device-wide only
    assert fp.samples == 4 and fp.note == "" and nvml.inits == 0


def test_sampler_records_an_nvml_failure_instead_of_raising():
    nvml = FakeNVML({0: [(10, 100 * MiB)]}, used={0: 100 * MiB})
    sampler = FootprintSampler(1, interval=60, nvml=nvml, tree=lambda root: {1, 10}).start()
    nvml.broken = True
    sampler.sample()
    fp = sampler.stop()
    assert fp.peak_bytes == 100 * MiB and fp.samples == 1
    assert "GPU is lost" in fp.error and "sampling failed" in fp.note


def test_an_older_driver_is_read_through_the_v2_entry_point():
    class MismatchError(Exception):  # pynvml's NVMLLibraryMismatchError is no NVMLError
        pass

    nvml = FakeNVML()

    def v3(handle):
        raise MismatchError("Unversioned function called and the pyNVML version does not match")

    nvml.nvmlDeviceGetComputeRunningProcesses = v3
    nvml.nvmlDeviceGetComputeRunningProcesses_v2 = lambda handle: [
        SimpleNamespace(pid=10, usedGpuMemory=300 * MiB)]
    assert footprint.gpu_processes(nvml) == [(0, 10, 300 * MiB)]


def test_sampler_says_when_no_process_matched_but_the_device_filled():
    nvml = FakeNVML({0: []}, used={0: 0})
    sampler = FootprintSampler(1, interval=60, nvml=nvml, tree=lambda root: {1, 10}).start()
    nvml.processes, nvml.used = {0: [(4242, 1 * GiB)]}, {0: 1 * GiB}  # a host pid, say
    fp = sampler.stop()
    assert fp.peak_bytes == 0 and fp.device_peak_above_start == 1 * GiB
    assert "PID namespace" in fp.note


def test_sampler_thread_samples_on_its_own():
    nvml = FakeNVML({0: [(10, 100 * MiB)]}, used={0: 100 * MiB})
    with FootprintSampler(1, interval=0.01, nvml=nvml, tree=lambda root: {1, 10}) as sampler:
        import time
        deadline = time.monotonic() + 30          # until the thread has sampled, not a fixed sleep
        while sampler.footprint.samples <= 3 and time.monotonic() < deadline:
            time.sleep(0.005)
    assert sampler.footprint.samples > 3 and sampler.footprint.peak_bytes == 100 * MiB


def test_footprint_text_uses_gib():
    assert str(Footprint(peak_bytes=3 * GiB // 2, peak_by_pid={1: 3 * GiB // 2})).startswith(
        "1.500 GiB over 1 process(es)")


# ---------------------------------------------------------------- the report, real kernels

FACTS = {"date": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA Fake", "driver": "1.2",
         "torch": "2.13.0", "torch_cuda": "12.8", "python": "3.12"}


def make_notebook(folder: Path, sources: list[str]) -> Path:
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(s, metadata={"tags": ["experiment"]}) for s in sources]
    path = folder / f"{folder.name}.ipynb"
    nbformat.write(nb, path)
    return path


def test_report_survives_a_failing_and_a_hanging_chapter(tmp_path):
    gpu_check = load_gpu_check()
    # A process in a session of its own: killing the kernel's process group misses it.
    orphan = ("import subprocess, sys\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
              " start_new_session=True)")
    raises = make_notebook(tmp_path / "01_raises", [
        "print('before')", "raise ValueError('broken on purpose')", "print('after')", orphan,
        "print(child.pid)"])
    hangs = make_notebook(tmp_path / "02_hangs", ["import time\ntime.sleep(600)", "print('never')"])
    # The fake driver lists the checker (this process: not the learner's), a stranger, and every
    # process this test started (the kernels) at 100 MiB each.
    import psutil
    nvml = FakeNVML()
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda handle: [
        SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in
        [(os.getpid(), 3 * GiB), (1, 5 * GiB)]
        + [(p.pid, 100 * MiB) for p in psutil.Process().children(recursive=True)]]
    children_before = process_tree(os.getpid())
    report_md = gpu_check.run_check([raises, hangs], tmp_path / "out", FACTS, chapter_timeout=3,
                                    interval=0.05, nvml=nvml, gpu_tests=None)

    report = json.loads(report_md.with_suffix(".json").read_text())
    assert report["complete"] and report_md.name == "gpu-check-2026-12-01-nvidia-fake.md"
    first, second = report["chapters"]
    assert first["status"] == "errors"
    (error,) = first["errors"]
    assert (error["cell"], error["ename"]) == (1, "ValueError")
    assert "broken on purpose" in error["evalue"]
    assert [x["stdout"] for x in first["experiments"]][:3] == ["before\n", "", "after\n"]
    orphan_pid = int(first["experiments"][4]["stdout"])
    assert first["leftover_processes_killed"] == 1
    assert not psutil.pid_exists(orphan_pid) or psutil.Process(orphan_pid).status() == "zombie"
    assert second["status"] == "timed out"
    # The first chapter's unused seconds (its 3 less three prints and a raise) go on.
    assert first["limit_s"] == 3 and 3 < second["limit_s"] < 6
    assert (second["errors"][0]["cell"], second["errors"][0]["ename"]) == (0, "TimeoutError")
    assert [x["ran"] for x in second["experiments"]] == [True, False]
    for chapter in (first, second):  # the kernel counted, the checker and the stranger not
        assert chapter["footprint"]["peak_bytes"] >= 100 * MiB
        assert chapter["footprint"]["peak_bytes"] < 3 * GiB
    text = report_md.read_text()
    assert "| 01_raises | errors | " in text and "| 02_hangs | timed out | " in text
    assert "ValueError: broken on purpose" in text and "(not run)" in text
    # (Processes earlier tests left, e.g. multiprocessing's resource tracker, may stay.)
    assert process_tree(os.getpid()) <= children_before, "a kernel outlived its chapter"


def test_an_interrupted_run_leaves_its_report(tmp_path, monkeypatch):
    gpu_check = load_gpu_check()

    def interrupted(*args, **kwargs):  # what SIGTERM from an outer `timeout` turns into
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "run_chapter", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.run_check([tmp_path / "03_x" / "03_x.ipynb"], tmp_path, FACTS, 60, gpu_tests=None)
    (report_md,) = tmp_path.glob("*.md")
    assert "Incomplete: interrupted while 03_x ran" in report_md.read_text()
    assert not json.loads(report_md.with_suffix(".json").read_text())["complete"]


def test_facts_come_from_nvml_without_touching_cuda():
    facts = load_gpu_check().gpu_facts(FakeNVML())
    assert (facts["gpu"], facts["driver"], facts["driver_cuda"], facts["compute_capability"]) == (
        "NVIDIA H200", "570.124.06", "12.8", "9.0")


def test_refuses_cleanly_without_cuda(tmp_path, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        load_gpu_check().main(["--out", str(tmp_path / "out")])
    assert "needs a usable CUDA GPU" in str(exit_.value.code)  # a message: exit status 1
    assert not (tmp_path / "out").exists()


def test_main_runs_the_chosen_chapters_with_a_stand_in_gpu(tmp_path, monkeypatch):
    """The command line end to end, CUDA and the facts faked: the chapter filter, a float time
    limit from argparse, the report's place; on this machine NVML fails and the report says so."""
    import torch
    gpu_check = load_gpu_check()
    make_notebook(tmp_path / "solutions" / "01_fine", ["print(6 * 7)"])
    make_notebook(tmp_path / "solutions" / "02_skipped", ["raise SystemExit('not chosen')"])
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "gpu_facts", lambda: FACTS)
    monkeypatch.setattr(gpu_check, "run_gpu_tests", lambda: {"command": "pytest", "returncode": 0,
                                                             "tail": ["1 passed"]})

    def no_nvml(*args):
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu_check, "FootprintSampler", no_nvml)
    # main() points this process's kernels at the keys through the environment; monkeypatch
    # takes it back afterwards, or every later kernel of this pytest worker (the
    # browser test's JupyterLab) would look for keys in this test's empty folder.
    monkeypatch.setenv("GPULAB_ANSWER_KEYS", "")
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--chapter-timeout", "20", "01"]) == 0
    (report_json,) = (tmp_path / "out").glob("*.json")
    report = json.loads(report_json.read_text())
    (chapter,) = report["chapters"]
    assert (chapter["chapter"], chapter["status"], chapter["limit_s"]) == ("01_fine", "ok", 20)
    assert chapter["experiments"][0]["stdout"] == "42\n"
    assert chapter["footprint"]["peak_bytes"] is None and "NVML" in chapter["footprint"]["note"]
    assert report["complete"] and report["gpu_tests"]["tail"] == ["1 passed"]


def test_main_leaves_no_answer_keys_in_the_environment_of_its_caller():
    """The test above runs main() in this process: the keys' folder it set must not outlive it
    (found by a fresh clone's suite: the browser test's JupyterLab inherited an empty folder)."""
    assert "GPULAB_ANSWER_KEYS" not in os.environ
