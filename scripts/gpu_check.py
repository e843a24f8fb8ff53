"""`make gpu-check`: run every solution notebook on a CUDA GPU; write a report of what it measured.

The report, reports/gpu-check-<date>-<gpu>.md and a .json twin with the same content, records
the date, GPU, driver, CUDA and torch versions; for each chapter its status (ok, errors, timed
out, kernel died, failed), each error with the cell it came from, the execution time, the slowest cells,
the GPU footprint and the printed output of every experiment cell (cells tagged `experiment`);
then the GPU-only tests. It is the only place the course's GPU figures come from: commit it.

The report is rewritten after every chapter, so a run cut short still leaves one. A failing cell
does not stop its chapter (later cells run and their errors are recorded too) and a chapter that
fails does not stop the run. Each chapter's cells get `--chapter-timeout` seconds in all, plus
what the chapters before it left unused (a kernel's start, limited to 60 s, is not counted);
when they are spent the kernel is killed and the chapter is reported as timed out.

The footprint is what the learner holds on a shared GPU: the used memory the driver (NVML)
reports for the chapter's kernel and all its child processes (chapter 06's ranks), sampled every
`--interval` seconds over the whole chapter (gpulab.device.footprint), against the course's budget of
4 GiB per learner. It includes each process's CUDA context and PyTorch's cache, which
`torch.cuda.max_memory_allocated` leaves out; the checker itself never initialises CUDA.

    python scripts/gpu_check.py [--out DIR] [--chapter-timeout S] [CHAPTER ...]

CHAPTER: a prefix of a chapter folder (`01`, `06_data`); all chapters when none is given.
On a bare GPU machine without the venv, see reports/README.md for the one-line command.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # gpulab, when run as a script from anywhere

from gpulab.device.footprint import FootprintSampler, process_tree  # noqa: E402

BUDGET_BYTES = 4 * 2**30          # the course's GPU memory budget per learner (GiB = 2^30 bytes)
CHAPTER_TIMEOUT_S = 70            # six chapters, their kernel starts and the GPU tests: ~8 min
GPU_TESTS_TIMEOUT_S = 45
KERNEL_START_TIMEOUT_S = 60
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class ChapterResult:
    """What one notebook's run produced; ``to_dict`` is its entry in the JSON report."""

    chapter: str
    notebook: str
    status: str = "not run"       # ok | errors | timed out | kernel died | failed
    limit_s: float = 0.0          # seconds its cells were allowed
    cells_seconds: float = 0.0    # seconds its cells took
    seconds: float = 0.0          # seconds it took, the kernel's start and end included
    errors: list[dict] = field(default_factory=list)
    slowest_cells: list[dict] = field(default_factory=list)
    experiments: list[dict] = field(default_factory=list)
    footprint: dict | None = None
    leftover_processes_killed: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _cell_label(cell, index: int) -> dict:
    first_line = next((line for line in cell.source.splitlines() if line.strip()), "")
    return {"cell": index, "cell_id": cell.get("id"),
            "grade_id": cell.metadata.get("nbgrader", {}).get("grade_id"),
            "first_line": first_line[:120]}


def _stream(cell, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == name)


def _error_outputs(nb) -> list[dict]:
    """Each error a cell printed, with the cell it came from (cells tagged raises-exception are
    meant to fail and are left out)."""
    errors = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in cell.metadata.get("tags", []):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                traceback = ANSI.sub("", "\n".join(output.get("traceback", [])))
                errors.append({**_cell_label(cell, index), "ename": output.get("ename"),
                               "evalue": ANSI.sub("", str(output.get("evalue")))[:2000],
                               "traceback_tail": traceback.splitlines()[-25:]})
    return errors


def _snapshot(pids: set[int]) -> list:
    """psutil handles of ``pids``: they outlive a pid's reuse (psutil checks the start time)."""
    try:
        import psutil
    except ImportError:
        return []
    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return processes


def _kill_leftovers(processes: list) -> int:
    """Kill the processes of a chapter's tree that outlived its kernel, orphans included (a rank
    the kernel's shutdown missed would hold GPU memory through the next chapter)."""
    import psutil

    killed = 0
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                process.kill()  # a zombie holds nothing: it only waits to be reaped
                killed += 1
        except psutil.Error:
            pass
    return killed


def run_chapter(path: Path, timeout: float, nvml=None, interval: float = 0.1) -> ChapterResult:
    """Execute one notebook with a time limit for all its cells, sampling its GPU footprint
    (``nvml`` None: ``pynvml``; False: no sampling). Never raises for what the notebook does."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    result = ChapterResult(path.parent.name, f"{path.parent.name}/{path.name}", limit_s=timeout)
    sampler = None
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=max(1, math.ceil(timeout)), allow_errors=True,
                            shutdown_kernel="immediate", startup_timeout=KERNEL_START_TIMEOUT_S,
                            record_timing=True,
                            resources={"metadata": {"path": str(path.parent)}})
    cell_seconds: list[tuple[float, int]] = []
    start = time.monotonic()
    leftovers: list = []
    try:
        with client.setup_kernel():
            # The learner's processes: the kernel and all it starts, never this checker.
            kernel = getattr(client.km.provisioner, "pid", None)
            root, include_root = (kernel, True) if kernel else (os.getpid(), False)
            if nvml is not False:
                try:
                    sampler = FootprintSampler(root, include_root, interval, nvml).start()
                except Exception as error:  # noqa: BLE001 (no NVML: the chapter still runs)
                    result.footprint = {"peak_bytes": None, "note": f"NVML: {error!r}"}
            deadline = time.monotonic() + timeout  # the limit is for the cells, not the start
            result.status = "ok"
            try:
                for index, cell in enumerate(nb.cells):
                    remaining = deadline - time.monotonic()
                    cell_start = time.monotonic()
                    try:
                        if remaining <= 0:
                            raise CellTimeoutError("no time left")
                        client.timeout = max(1, math.ceil(remaining))
                        client.execute_cell(cell, index)
                    except CellTimeoutError:
                        result.status = "timed out"
                        result.errors.append({
                            **_cell_label(cell, index), "ename": "TimeoutError",
                            "evalue": f"the chapter's {timeout:.0f} s ran out during this cell; "
                                      f"the kernel was killed"})
                        break
                    finally:
                        cell_seconds.append((time.monotonic() - cell_start, index))
            finally:  # before the kernel goes: what it started, to kill any that outlive it
                leftovers = _snapshot(process_tree(root) - {os.getpid()})
    except DeadKernelError as error:
        result.status = "kernel died"
        result.errors.append({"cell": cell_seconds[-1][1] if cell_seconds else None,
                              "ename": "DeadKernelError", "evalue": str(error)})
    except Exception as error:  # noqa: BLE001 (kernel failed to start, nbclient broke, ...)
        result.status = "failed"
        result.errors.append({"cell": None, "ename": type(error).__name__,
                              "evalue": ANSI.sub("", str(error))[:2000]})
    result.seconds = time.monotonic() - start
    result.cells_seconds = sum(s for s, _ in cell_seconds)
    result.leftover_processes_killed = _kill_leftovers(leftovers)
    if sampler is not None:
        result.footprint = sampler.stop().to_dict()
    output_errors = _error_outputs(nb)
    if output_errors and result.status == "ok":
        result.status = "errors"
    result.errors = output_errors + result.errors
    result.slowest_cells = [{**_cell_label(nb.cells[i], i), "seconds": round(s, 2)}
                            for s, i in sorted(cell_seconds, reverse=True)[:3]]
    result.experiments = [{**_cell_label(cell, i), "source": cell.source,
                           "ran": cell.get("execution_count") is not None,
                           "stdout": _stream(cell, "stdout"), "stderr": _stream(cell, "stderr")}
                          for i, cell in enumerate(nb.cells)
                          if "experiment" in cell.metadata.get("tags", [])]
    return result


def gpu_facts(nvml=None) -> dict:
    """Date, GPU, driver and versions, read from NVML so that this process never creates a CUDA
    context (it would hold GPU memory all run long); torch for its own versions."""
    import torch

    facts = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "python": platform.python_version(), "host": platform.node()}
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(0)
            cuda = nvml.nvmlSystemGetCudaDriverVersion()
            facts.update(gpu=nvml.nvmlDeviceGetName(handle), gpus=nvml.nvmlDeviceGetCount(),
                         driver=nvml.nvmlSystemGetDriverVersion(),
                         driver_cuda=f"{cuda // 1000}.{cuda % 1000 // 10}",
                         compute_capability="{}.{}".format(
                             *nvml.nvmlDeviceGetCudaComputeCapability(handle)),
                         memory_bytes=nvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            nvml.nvmlShutdown()
    except Exception as error:  # noqa: BLE001
        facts.update(gpu=torch.cuda.get_device_name(0), driver=f"unknown (NVML: {error!r})")
    return facts


def run_gpu_tests(timeout: float = GPU_TESTS_TIMEOUT_S) -> dict:
    """The GPU-only tests: chapter 02's allocator peak against the tracker and the prediction."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/test_memory.py", "-k", "cuda"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        tail = (done.stdout.strip() or done.stderr.strip()).splitlines()[-15:]
        return {"command": " ".join(command[2:]), "returncode": done.returncode, "tail": tail}
    except subprocess.TimeoutExpired:
        return {"command": " ".join(command[2:]), "returncode": None,
                "tail": [f"timed out after {timeout:g} s"]}


def _gib(n: int | None) -> str:
    return "not measured" if n is None else f"{n / 2**30:.3f} GiB"


def markdown(report: dict) -> str:
    """The report as Markdown: the facts, a table of chapters, then each chapter in detail."""
    f = report["facts"]
    lines = [f"# GPU check, {f['date'][:10]}", "",
             f"- GPU: {f.get('gpu')} (compute capability {f.get('compute_capability', '?')}, "
             f"{_gib(f.get('memory_bytes'))}; {f.get('gpus', '?')} GPU(s) on the host)",
             f"- driver {f.get('driver')} (CUDA {f.get('driver_cuda', '?')}); torch {f['torch']} "
             f"built for CUDA {f['torch_cuda']}; Python {f['python']}",
             f"- run at {f['date']} by `{report['command']}`; time limit per chapter "
             f"{report['chapter_timeout_s']:g} s, plus what earlier chapters left unused",
             f"- footprint: the peak over the run of the GPU memory the driver (NVML) reports for "
             f"the chapter's kernel and all its child processes, sampled every "
             f"{report['interval_s']:g} s (CUDA contexts, PyTorch's cache and rank processes "
             f"included; a shorter peak can be missed); the budget is 4 GiB (2^30 bytes) per "
             f"learner", ""]
    if not report["complete"]:
        why = report.get("interrupted") or "the run stopped before every chapter was reported"
        lines += [f"**Incomplete: {why}.**", ""]
    lines += ["| chapter | status | seconds (limit) | footprint | within 4 GiB | processes |",
              "| --- | --- | ---: | ---: | --- | ---: |"]
    for c in report["chapters"]:
        fp = c["footprint"] or {}
        peak = fp.get("peak_bytes")
        within = "?" if peak is None else ("yes" if peak <= BUDGET_BYTES else "**no**")
        processes = "?" if peak is None else len(fp.get("peak_by_pid") or {})
        lines.append(f"| {c['chapter']} | {c['status']} | {c['seconds']:.1f} "
                     f"({c['limit_s']:.0f}) | {_gib(peak)} | {within} | {processes} |")
    lines.append("")
    for c in report["chapters"]:
        lines += [f"## {c['chapter']}", "", f"{c['status']}, {c['seconds']:.1f} s "
                  f"(`{c['notebook']}`)", ""]
        fp = c["footprint"] or {}
        per_pid = ", ".join(f"pid {pid} {_gib(b)}"
                            for pid, b in (fp.get("peak_by_pid") or {}).items())
        if fp.get("peak_bytes") is None:
            lines.append(f"- footprint not measured: {fp.get('note', 'no sampling')}")
        else:
            lines.append(f"- footprint: {_gib(fp['peak_bytes'])} at its peak "
                         f"({per_pid or 'no process listed'}); device-wide "
                         f"{_gib(fp['device_peak_above_start_bytes'])} above the start; "
                         f"{fp['samples']} samples" + (f"; {fp['note']}" if fp["note"] else ""))
        if c["leftover_processes_killed"]:
            lines.append(f"- {c['leftover_processes_killed']} process(es) outlived the kernel "
                         f"and were killed")
        lines.append("- slowest cells: " + ", ".join(
            f"{s['cell']} ({s['seconds']:.1f} s)" for s in c["slowest_cells"]))
        lines.append("")
        for e in c["errors"]:
            where = "" if e.get("cell") is None else (
                f"cell {e['cell']} (`{e.get('first_line', '')}`"
                + (f", {e['grade_id']}" if e.get("grade_id") else "") + "): ")
            lines += [f"**Error** {where}{e['ename']}: {e['evalue']}", ""]
            if e.get("traceback_tail"):
                lines += ["```text", *e["traceback_tail"], "```", ""]
        for x in c["experiments"]:
            printed = x["stdout"].rstrip() or ("(printed nothing)" if x["ran"] else "(not run)")
            lines += [f"Experiment, cell {x['cell']}:", "", "```python", x["source"], "```", "",
                      "```text", printed, "```", ""]
            if x["stderr"].strip():
                lines += ["stderr:", "", "```text", x["stderr"].rstrip()[-3000:], "```", ""]
    if report.get("gpu_tests"):
        t = report["gpu_tests"]
        lines += [f"## GPU tests (`{t['command']}`, exit status {t['returncode']})", "",
                  "```text", *t["tail"], "```", ""]
    return "\n".join(lines)


def write_report(report: dict, out: Path) -> Path:
    """Write the Markdown and the JSON report; return the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    slug = "".join(ch if ch.isalnum() else "-" for ch in str(report["facts"].get("gpu"))).strip("-")
    stem = out / f"gpu-check-{report['facts']['date'][:10]}-{slug.lower() or 'gpu'}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    path = stem.with_suffix(".md")
    path.write_text(markdown(report))
    return path


def run_check(notebooks: list[Path], out: Path, facts: dict, chapter_timeout: float,
              interval: float = 0.1, nvml=None, gpu_tests=None,
              command: str = "scripts/gpu_check.py") -> Path:
    """Run each notebook, rewriting the report after each; then ``gpu_tests()`` (a function
    returning its report entry; None: none). Return the Markdown report's path."""
    report = {"facts": facts, "command": command, "chapter_timeout_s": chapter_timeout,
              "interval_s": interval, "budget_bytes": BUDGET_BYTES, "complete": False,
              "chapters": [], "gpu_tests": None}
    path = write_report(report, out)
    notebook, unused = None, 0.0
    try:
        for notebook in notebooks:
            limit = chapter_timeout + unused
            result = run_chapter(notebook, limit, nvml=nvml, interval=interval)
            unused = max(0.0, limit - result.cells_seconds)
            report["chapters"].append(result.to_dict())
            peak = (result.footprint or {}).get("peak_bytes")
            print(f"{result.chapter}: {result.status}, {result.seconds:.1f} s, footprint "
                  f"{_gib(peak)}" + "".join(f"\n  cell {e.get('cell')}: {e['ename']}: "
                                            f"{e['evalue'][:200]}" for e in result.errors),
                  flush=True)
            path = write_report(report, out)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from an outer `timeout` (see main)
        report["interrupted"] = f"interrupted while {notebook.parent.name} ran"
        write_report(report, out)
        raise
    if gpu_tests is not None:
        report["gpu_tests"] = gpu_tests()
        print(f"GPU tests: {report['gpu_tests']['tail'][-1:]}", flush=True)
    report["complete"] = True
    return write_report(report, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("chapters", nargs="*", help="chapter folder prefixes (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    parser.add_argument("--chapter-timeout", type=float, default=CHAPTER_TIMEOUT_S,
                        help=f"seconds for one chapter's cells, plus what earlier chapters "
                             f"left unused (default {CHAPTER_TIMEOUT_S})")
    parser.add_argument("--interval", type=float, default=0.1,
                        help="seconds between two footprint samples (default 0.1)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu-check needs a usable CUDA GPU (see `python -m gpulab doctor`); "
                 "GPU figures are never written without one.")
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
    except ImportError as error:
        sys.exit(f"gpu-check needs nbclient and ipykernel ({error}); on a bare GPU machine "
                 f"install them from wheels as reports/README.md says.")
    notebooks = [p for p in sorted((ROOT / "solutions").glob("*/*.ipynb"))
                 if not args.chapters or any(p.parent.name.startswith(c) for c in args.chapters)]
    if not notebooks:
        sys.exit(f"no chapter matches {args.chapters}")
    os.environ["GPULAB_ANSWER_KEYS"] = str(ROOT / "autograder" / "keys")
    previous = signal.signal(signal.SIGTERM, _interrupt)  # an outer `timeout` leaves a report
    try:
        path = run_check(notebooks, args.out, gpu_facts(), args.chapter_timeout, args.interval,
                         gpu_tests=run_gpu_tests,
                         command=" ".join(["scripts/gpu_check.py", *(argv or sys.argv[1:])]))
    except KeyboardInterrupt:
        print(f"interrupted; the report in {args.out} holds the chapters that finished",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"report: {path} (and {path.with_suffix('.json').name})")
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
