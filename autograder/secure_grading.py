"""Grading that holds: verdicts outside the learner's kernel, each submission in a sandbox.

nbgrader's own autograde runs each notebook and scores a test cell by whether it raised. Code in
an answer cell runs in the same kernel as the tests, so it can patch the checker, return an
object that equals everything, or read the answer key from disk. Here the roles are split:

1. ``NormalizeCells`` (before nbgrader's sanitising) makes the submitted notebook's graded cells
   match the instructor's: deleted ones come back, duplicates and cells claiming unknown ids lose
   their grading metadata, retyped ones get their type back, and every change is flagged.
2. ``ExecuteSandboxed`` runs the notebook in a kernel inside bubblewrap: the course folder (keys,
   solutions, gradebook, other students' work) is hidden, everything but the submission's own
   folder and a private /tmp is read-only, and the kernel's processes live in their own PID
   namespace, so none outlives it. A cell over its time limit, a kernel death (``os._exit``,
   a segfault, an OOM kill) or the notebook's total time limit stops the run with a message;
   grading goes on with what ran.
3. In the kernel, ``gpulab.checks.check`` only *records* each answer (a plain number or text).
   ``GradeRecordedAnswers`` then judges the records against the instructor's key, here in the
   grading process, and rewrites each test cell's output to the verdict: a diagnostic error
   (zero) or a pass. It also caps every output's size.

What this cannot stop: a learner who knows the right number can type it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbgrader.api import Gradebook
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Integer, List, Unicode

import gpulab
from gpulab.checks import RECORD_MIME, Item, WrongAnswer, judge, load_key_module

INTEGRITY_LOG = "integrity.jsonl"  # one line per finding, beside the gradebook


# ------------------------------------------------------------------------------------------
# The sandbox

class SandboxUnavailable(RuntimeError):
    pass


def sandbox_command(workdir: str, hidden: list[str], readable: tuple[str, ...] = ()) -> list[str]:
    """bubblewrap arguments that run a command with ``workdir`` as its only writable folder
    (plus a private /tmp), the ``hidden`` folders replaced by empty ones (the Python environment
    and the gpulab package are put back, read-only), and its own PID namespace."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "grading needs bubblewrap to isolate each submission: `apt-get install bubblewrap` "
            "(Debian/Ubuntu; `make test` and `make autograde` do it when run as root).")
    package = Path(gpulab.__file__).resolve().parent
    hidden = sorted({str(Path(h).resolve()) for h in [*hidden, package.parent]})
    args = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for folder in hidden:
        args += ["--tmpfs", folder]
    for keep in (sys.prefix, str(package), *readable):      # what the kernel needs to run
        args += ["--ro-bind", keep, keep]
    workdir = str(Path(workdir).resolve())
    args += ["--bind", workdir, workdir, "--chdir", workdir,
             "--setenv", "HOME", "/tmp", "--setenv", "IPYTHONDIR", "/tmp/ipython",
             "--setenv", "MPLCONFIGDIR", "/tmp/matplotlib",
             # ipykernel exits when its parent's pid is not its ppid, which a PID namespace
             # changes; --die-with-parent ends the sandbox with its parent instead.
             "--unsetenv", "JPY_PARENT_PID",
             "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--die-with-parent", "--"]
    return args


class SandboxedKernelManager(AsyncKernelManager):
    """Starts the kernel inside ``sandbox_command``, in the folder nbgrader runs it in."""

    hidden_paths = List(Unicode(), help="Folders the kernel must not see.").tag(config=True)

    async def _async_pre_start_kernel(self, **kw):
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        workdir = kw.get("cwd") or os.getcwd()
        # The kernel reads its ports and key from the connection file (often in /tmp).
        return sandbox_command(workdir, list(self.hidden_paths), (self.connection_file,)) + cmd, kw


# ------------------------------------------------------------------------------------------
# 1. Graded cells as the instructor made them

def _flag(resources, message: str) -> None:
    resources.setdefault("gpulab_flags", []).append(message)


# nbgrader runs two passes (sanitise, then execute and grade) with fresh resources; the
# findings of the first travel to the second in the notebook's metadata, under this name.
CARRY = "gpulab_grading"


class NormalizeCells(NbGraderPreprocessor):
    """Graded and answer cells back to the instructor's layout, every change flagged."""

    def preprocess(self, nb, resources):
        nb.metadata.pop(CARRY, None)  # only this step writes it
        nb, resources = self._normalize(nb, resources)
        nb.metadata[CARRY] = {"flags": resources.get("gpulab_flags", [])}
        return nb, resources

    def _normalize(self, nb, resources):
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            source = gb.find_notebook(info["notebook"], info["assignment"])
            cells = {c.name: (c.cell_type, c.source, c.locked) for c in source.source_cells}
            points = {c.name: c.max_score for c in source.grade_cells}
            solutions = {c.name for c in source.solution_cells}
            order = [c.name for c in source.source_cells]

        def metadata(grade_id: str) -> dict:
            """The cell's nbgrader metadata as the instructor's source has it."""
            meta = {"grade": grade_id in points, "solution": grade_id in solutions,
                    "locked": cells[grade_id][2], "grade_id": grade_id, "schema_version": 3}
            if grade_id in points:
                meta["points"] = points[grade_id]
            return meta

        seen = set()
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if meta is None:
                continue
            grade_id = meta.get("grade_id")
            if grade_id not in cells or grade_id in seen:
                why = "a second copy of" if grade_id in seen else "an unknown"
                _flag(resources, f"removed grading metadata from {why} cell {grade_id!r}")
                del cell.metadata["nbgrader"]
                cell.metadata.pop("deletable", None)
                cell.metadata.pop("editable", None)
                continue
            seen.add(grade_id)
            cell_type, text, locked = cells[grade_id]
            expected = metadata(grade_id)
            changed = [k for k, v in expected.items() if k != "schema_version" and meta.get(k) != v]
            if changed or set(meta) - set(expected) - {"checksum", "cell_type"}:
                _flag(resources, f"restored the grading metadata of {grade_id!r} ({', '.join(changed) or 'extra keys'})")
            cell.metadata["nbgrader"] = expected
            if cell.cell_type != cell_type:
                _flag(resources, f"restored {grade_id!r} as a {cell_type} cell (it was {cell.cell_type})")
                _retype(cell, cell_type)
            if locked and cell.source != text:
                _flag(resources, f"restored the text of locked cell {grade_id!r}")
                cell.source = text
        for position, grade_id in enumerate(order):
            if grade_id in seen or grade_id not in points and grade_id not in solutions:
                continue
            _flag(resources, f"put back deleted cell {grade_id!r}")
            cell_type, text, _ = cells[grade_id]
            cell = _new_cell(cell_type, text)
            cell.metadata["nbgrader"] = metadata(grade_id)
            nb.cells.insert(_insert_at(nb, order[:position]), cell)
            seen.add(grade_id)
        return nb, resources


def _retype(cell, cell_type: str) -> None:
    fresh = _new_cell(cell_type, cell.source)
    fresh.metadata = cell.metadata
    fresh.id = cell.get("id", fresh.id)
    cell.clear()
    cell.update(fresh)


def _new_cell(cell_type: str, text: str):
    return nbformat.v4.new_code_cell(text) if cell_type == "code" else nbformat.v4.new_markdown_cell(text)


def _insert_at(nb, earlier_ids: list[str]) -> int:
    """After the last cell whose grade_id comes before the missing one in the source."""
    position = 0
    for index, cell in enumerate(nb.cells):
        if cell.metadata.get("nbgrader", {}).get("grade_id") in earlier_ids:
            position = index + 1
    return position


# ------------------------------------------------------------------------------------------
# 2. Running the notebook in the sandbox, with limits

class _StopRun(Exception):
    pass


class ExecuteSandboxed(Execute):
    """nbgrader's Execute in a sandboxed kernel; a cell or notebook time limit or a kernel
    death stops the run with a message instead of failing the whole submission."""

    notebook_timeout = Integer(900, help="Seconds for the whole notebook.").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def preprocess(self, nb, resources=None, km=None):
        resources["gpulab_flags"] = list(nb.metadata.pop(CARRY, {}).get("flags", []))
        self._deadline = time.monotonic() + self.notebook_timeout
        try:
            return super().preprocess(nb, resources, km)
        except (DeadKernelError, CellTimeoutError, _StopRun) as stop:
            why = str(stop) if isinstance(stop, _StopRun) else (
                "the kernel died (the process exited, crashed or ran out of memory)"
                if isinstance(stop, DeadKernelError) else "a cell ran past its time limit")
            resources.setdefault("gpulab", {})["stopped"] = why
            _flag(resources, f"execution stopped: {why}")
            return nb, resources

    def _get_timeout(self, cell):
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _StopRun(f"the notebook ran past its limit of {self.notebook_timeout} s")
        timeout = super()._get_timeout(cell)
        return remaining if timeout is None else min(timeout, remaining)

    async def _async_handle_timeout(self, timeout, cell=None):
        # A kernel that swallows the interrupt would stall every later cell: stop here.
        raise _StopRun(f"a cell ran longer than {timeout:.0f} s")


# ------------------------------------------------------------------------------------------
# 3. Verdicts from the records, outside the kernel

class GradeRecordedAnswers(NbGraderPreprocessor):
    """Judge each test cell's recorded answer against the instructor's key; cap outputs."""

    keys_dir = Unicode(help="Folder of the instructor's answer keys (NN_topic.py).").tag(config=True)
    max_output_chars = Integer(100_000, help="Largest output kept, in characters.").tag(config=True)

    def preprocess(self, nb, resources):
        assignment = resources["nbgrader"]["assignment"]
        key_file = next(Path(self.keys_dir).glob(f"{assignment[:2]}_*.py"), None)
        key = load_key_module(key_file) if key_file else {}
        stopped = resources.get("gpulab", {}).get("stopped")
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = [self._capped(o) for o in cell.outputs]
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            item_id = meta["grade_id"].removeprefix("test-")
            passed, message = _verdict(item_id, cell, key, stopped)
            cell.outputs = [_pass(message) if passed else _fail(message)]
        flags = resources.get("gpulab_flags", [])
        if flags:
            note = "**Grading notes** (for you and your instructor):\n\n" + "\n".join(f"- {f}" for f in flags)
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(note))
            _log(resources, flags)
        return nb, resources

    def _capped(self, output):
        size = len(json.dumps(output, default=str))
        if size <= self.max_output_chars:
            return output
        return nbformat.v4.new_output("stream", name="stdout",
                                      text=f"[output of {size:,} characters removed: over the "
                                           f"{self.max_output_chars:,} limit]\n")


def _verdict(item_id: str, cell, key: dict[str, Item], stopped: str | None) -> tuple[bool, str]:
    if item_id not in key:
        return False, f"{item_id}: not in the instructor's answer key (tell your instructor)."
    records = [o["data"][RECORD_MIME] for o in cell.get("outputs", [])
               if o.get("output_type") in ("display_data", "execute_result") and RECORD_MIME in o.get("data", {})]
    if not records:
        if stopped:
            return False, f"{item_id}: not graded, because {stopped} before this cell ran."
        return False, f"{item_id}: no answer was recorded (did this cell run `check(...)`?)."
    if len(records) > 1:
        return False, f"{item_id}: more than one answer was recorded; only one counts, so none does."
    record = records[0]
    if not isinstance(record, dict) or record.get("item") != item_id or len(record) != 2:
        return False, f"{item_id}: the recorded answer is malformed."
    kind, value = next((k, v) for k, v in record.items() if k != "item")
    if kind == "error" and isinstance(value, str):
        return False, value[:500]
    if kind == "text" and isinstance(value, str):
        answer = value
    elif kind == "value" and type(value) in (int, float) and math.isfinite(value):
        answer = float(value)
    else:
        return False, f"{item_id}: the recorded answer is malformed."
    try:
        return True, judge(key[item_id], answer)
    except WrongAnswer as wrong:
        return False, str(wrong)


def _pass(message: str):
    return nbformat.v4.new_output("stream", name="stdout", text=message + "\n")


def _fail(message: str):
    return nbformat.v4.new_output("error", ename="WrongAnswer", evalue=message,
                                  traceback=[f"\x1b[31m✘ {message}\x1b[0m"])


def _log(resources, flags: list[str]) -> None:
    info = resources["nbgrader"]
    db_path = info["db_url"].removeprefix("sqlite:///")
    with open(Path(db_path).parent / INTEGRITY_LOG, "a") as log:
        for flag in flags:
            log.write(json.dumps({"student": info.get("student"), "assignment": info["assignment"],
                                  "notebook": info["notebook"], "finding": flag}) + "\n")
