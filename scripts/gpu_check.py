"""`make gpu-check`: run every solution notebook on a CUDA GPU and write a report of the figures.

The report (reports/gpu-check-<date>-<gpu>.md) records the date, GPU, driver, torch and CUDA
versions, each chapter's execution time and peak GPU memory (the course keeps it under 4 GiB per
learner), the printed output of every experiment cell (cells tagged `experiment`), and the
result of the GPU-only tests (chapter 02: the allocator's peak vs the prediction). Commit it:
it is the only place the course's GPU figures come from.

    python scripts/gpu_check.py [--out DIR]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
PEAK_PROBE = "import json, torch; print(json.dumps({'peak': torch.cuda.max_memory_allocated()}))"


def run_chapter(path: Path) -> tuple[float, int, list[str]]:
    """Execute one notebook; return seconds, peak GPU bytes, and the experiment cells' text."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PEAK_PROBE))
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    peak = json.loads(nb.cells[-1].outputs[0]["text"])["peak"]
    texts = []
    for cell in nb.cells:
        if "experiment" in cell.metadata.get("tags", []):
            printed = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
            texts.append(f"```python\n{cell.source}\n```\n\n```text\n{printed.rstrip()}\n```")
    return seconds, peak, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "reports")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu-check needs a usable CUDA GPU (see `python -m gpulab doctor`); "
                 "GPU figures are never written without one.")
    os.environ["GPULAB_ANSWER_KEYS"] = str(ROOT / "autograder" / "keys")
    from gpulab import device

    facts = device.collect_facts()
    name = torch.cuda.get_device_name(0)
    today = datetime.date.today().isoformat()
    lines = [f"# GPU check, {today}", "",
             f"- GPU: {name} (compute capability {torch.cuda.get_device_capability(0)})",
             f"- driver: {facts.driver_version}; torch {torch.__version__}, CUDA {torch.version.cuda}",
             "- produced by `make gpu-check` (scripts/gpu_check.py); figures below are measured", ""]
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        seconds, peak, texts = run_chapter(path)
        lines += [f"## {path.parent.name}", "",
                  f"executed in {seconds:.1f} s; peak GPU memory allocated by PyTorch "
                  f"{peak / 2**30:.3f} GiB (budget 4 GiB)", "", *texts, ""]
        print(f"{path.parent.name}: {seconds:.1f} s, peak {peak / 2**30:.3f} GiB")
    # The GPU-only tests: the allocator's peak against the tracker and the prediction.
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_memory.py", "-k", "cuda"],
                           cwd=ROOT, capture_output=True, text=True)
    lines += ["## GPU tests (`pytest tests/test_memory.py -k cuda`)", "", "```text",
              *tests.stdout.strip().splitlines()[-15:], "```", ""]
    print(tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else tests.stderr[-500:])
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()
    report = args.out / f"gpu-check-{today}-{slug}.md"
    report.write_text("\n".join(lines))
    print(f"report: {report}")


if __name__ == "__main__":
    main()
