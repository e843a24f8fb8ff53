"""Grading that holds: verdicts outside the learner's kernel, each submission in a sandbox.

nbgrader's own autograde runs each notebook and scores a test cell by whether it raised. Code in
an answer cell runs in the same kernel as the tests, so it can patch the checker, return an
object that equals everything, or read the answer key from disk. Here the roles are split:

1. ``NormalizeCells`` (before nbgrader's sanitising) makes the submitted notebook's graded cells
   match the instructor's: deleted ones come back, duplicates and cells claiming unknown ids lose
   their grading metadata, retyped ones get their type back, and every change is flagged.
2. ``ExecuteSandboxed`` runs the notebook in a kernel inside bubblewrap (autograder/sandbox.py:
   an allow-list file system without the course folder or the home folder, no network, a
   watchdog on memory, processes and CPU time). A cell over its time limit, a kernel death
   (``os._exit``, a segfault), a limit reached, or the notebook's total time limit stops the run
   with a message; grading goes on with what ran. Outputs are capped as they arrive, per cell
   and per notebook, so the grading process never holds a flood.
3. In the kernel, ``gpulab.course.checks.check`` only *records* each answer (a plain number or text).
   ``GradeRecordedAnswers`` then judges the records against the instructor's key, here in the
   grading process, and rewrites each test cell's output to the verdict: a diagnostic error
   (zero) or a pass. It also caps every output's size, and writes the findings (what intake.py
   refused, what graded_html.py removed, what NormalizeCells restored) at the top, escaped.

What this cannot stop: a learner who knows the right number can type it. With a course seed
(``GradeRecordedAnswers.course_seed``) each student's quizzes have numbers of their own
(gpulab.course.variants), so a classmate's number, or the solutions', is not the right one.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbgrader.api import Gradebook
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Integer, Unicode

import intake
from graded_html import markdown_text
from gpulab.course import variants
from gpulab.course.checks import RECORD_MIME, Item, WrongAnswer, import_key, items_by_id, judge
from sandbox import SandboxedKernelManager, sandbox_warnings  # noqa: F401 (grade.py, tests)

INTEGRITY_LOG = "integrity.jsonl"  # one line per finding, beside the gradebook
PROGRESS_LOG = "progress.jsonl"    # one line per notebook graded, beside the gradebook

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
        info = resources["nbgrader"]
        # What the submission's folder held that grading refused (intake.py) comes first.
        refused = intake.recorded(info.get("student") or "", info["assignment"])
        resources["gpulab_flags"] = refused + resources.get("gpulab_flags", [])
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
    death stops the run with a message instead of failing the whole submission. Outputs are
    capped as they arrive, per cell and per notebook: the grader never holds more of them."""

    notebook_timeout = Integer(300, help="Seconds for the whole notebook.").tag(config=True)
    submission_timeout = Integer(420, help="Seconds for all of one submission's grading, the run "
                                 "included: `make autograde` stops nbgrader at a submission that "
                                 "takes longer (it scores zero, with a finding), and its feedback "
                                 "page gets as long (FeedbackDeadline).").tag(config=True)
    max_cell_output_chars = Integer(1_000_000, help="Outputs kept per cell, in characters "
                                    "(text, or data as JSON).").tag(config=True)
    max_notebook_output_chars = Integer(10_000_000, help="Outputs kept per notebook, in "
                                        "characters.").tag(config=True)

    # Widget state would be kept whole in memory, and an Output widget's outputs bypass the caps;
    # a graded copy shows no live widget anyway.
    store_widget_state = Bool(False, help="Keep widgets' state (off: see above).").tag(config=True)
    # Outputs that stop reaching the grader (ZeroMQ drops a message over the sandbox's
    # max_message_bytes, and the channel with it) stop the run instead of stalling each cell.
    raise_on_iopub_timeout = Bool(True, help="Stop when outputs stop coming.").tag(config=True)
    iopub_timeout = Integer(15, help="Seconds to wait for a cell's last outputs after its "
                            "reply.").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    def create_kernel_manager(self):
        self.sandbox = super().create_kernel_manager()     # nbclient drops its km when done
        return self.sandbox

    def preprocess(self, nb, resources=None, km=None):
        self.sandbox = None
        self.comm_open_handlers = {}
        self._cell_chars, self._notebook_chars, self._cut = {}, 0, {}
        resources["gpulab_flags"] = list(nb.metadata.pop(CARRY, {}).get("flags", []))
        self._deadline = time.monotonic() + self.notebook_timeout
        try:
            return super().preprocess(nb, resources, km)
        except (DeadKernelError, CellTimeoutError, _StopRun, RuntimeError) as stop:
            over_limit = getattr(self.sandbox, "stopped_because", None)
            if over_limit:
                why = f"the submission {over_limit} (a limit per submission)"
            elif isinstance(stop, _StopRun):
                why = str(stop)
            elif isinstance(stop, CellTimeoutError):
                why = (f"its outputs stopped reaching the grader (a flood the grader cannot take as fast, or one message over "
                       f"{self.sandbox.max_message_bytes // 2**20} MiB is dropped, and the channel with it)")
            elif isinstance(stop, DeadKernelError) or "kernel died" in str(stop).lower():
                why = "the kernel died (the process exited, crashed or hit a limit)"
            else:
                raise
            resources.setdefault("gpulab", {})["stopped"] = why
            _flag(resources, f"execution stopped: {why}")
            return nb, resources
        finally:
            if self._cut:
                dropped = sum(self._cut.values())
                _flag(resources, f"outputs over the limits ({self.max_cell_output_chars:,} characters "
                                 f"per cell, {self.max_notebook_output_chars:,} per notebook) were left "
                                 f"out: {dropped:,} characters from {len(self._cut)} cell(s)")

    def _get_timeout(self, cell):
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _StopRun(self._notebook_over)
        timeout = super()._get_timeout(cell)
        return remaining if timeout is None else min(timeout, remaining)

    @property
    def _notebook_over(self) -> str:
        return f"the notebook ran past its time limit of {self.notebook_timeout} s"

    async def _async_handle_timeout(self, timeout, cell=None):
        # A kernel that swallows the interrupt would stall every later cell: stop here.
        if time.monotonic() >= self._deadline - 1:
            raise _StopRun(self._notebook_over)
        raise _StopRun(f"a cell ran longer than {timeout:.0f} s")

    def output(self, outs, msg, display_id, cell_index):
        """nbclient's output, kept only while the cell and the notebook are within their caps."""
        if self.clear_before_next_output:              # a clear_output(wait=True) takes effect
            self._forget(cell_index)
        size = _message_chars(msg)
        kept = self._cell_chars.get(cell_index, 0)
        if cell_index in self._cut or kept + size > self.max_cell_output_chars or \
                self._notebook_chars + size > self.max_notebook_output_chars:
            if cell_index not in self._cut:
                outs.append(nbformat.v4.new_output("stream", name="stderr", text=(
                    "[the grader left out this cell's outputs from here on: over the limits of "
                    f"{self.max_cell_output_chars:,} characters per cell and "
                    f"{self.max_notebook_output_chars:,} per notebook]\n")))
            self._cut[cell_index] = self._cut.get(cell_index, 0) + size
            return None
        self._cell_chars[cell_index] = kept + size
        self._notebook_chars += size
        return super().output(outs, msg, display_id, cell_index)

    def clear_output(self, outs, msg, cell_index):
        super().clear_output(outs, msg, cell_index)
        if not outs:
            self._forget(cell_index)

    def _forget(self, cell_index):
        self._notebook_chars -= self._cell_chars.pop(cell_index, 0)

    def _update_display_id(self, display_id, msg):
        """An update replaces an earlier output: it counts against the notebook's cap too."""
        if display_id not in self._display_id_map:     # a first display: output() counts it
            return
        size = _message_chars(msg)
        if self._notebook_chars + size > self.max_notebook_output_chars:
            self._cut[-1] = self._cut.get(-1, 0) + size    # -1: updates, whichever cell they show in
            return
        self._notebook_chars += size
        super()._update_display_id(display_id, msg)


def _message_chars(msg) -> int:
    """The size of an output message's content, in characters, without copying it."""
    content = msg.get("content", {})
    size = len(content.get("text", "")) + len(content.get("evalue", ""))
    size += sum(len(line) for line in content.get("traceback", []) if isinstance(line, str))
    for value in (content.get("data") or {}).values():
        size += len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
    return size


class FeedbackDeadline:
    """A time limit per submission for ``nbgrader generate_feedback``, as its pre- and
    post-convert hooks: a page that takes longer to render stops with a TimeoutError, which
    nbgrader reports for that student alone (`make autograde` then writes a plain page for it).
    ``seconds`` is called when a page starts (the config file is read by then). Only in a
    command's own process: never in a server's event loop (the Formgrader's), where an alarm
    left by a page that failed would fire into whatever the server does next."""

    def __init__(self, seconds):
        self.seconds = seconds

    def start(self, **_):
        try:
            asyncio.get_running_loop()
            return
        except RuntimeError:
            pass
        signal.signal(signal.SIGALRM, self._over)      # ValueError outside the main thread
        signal.setitimer(signal.ITIMER_REAL, self.seconds())

    def stop(self, **_):
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _over(self, *_):
        raise TimeoutError(f"its feedback took longer than {self.seconds():g} s (the limit per submission)")


# ------------------------------------------------------------------------------------------
# 3. Verdicts from the records, outside the kernel

class GradeRecordedAnswers(NbGraderPreprocessor):
    """Judge each test cell's recorded answer against the instructor's key; cap outputs."""

    keys_dir = Unicode(help="Folder of the instructor's answer keys (NN_topic.py).").tag(config=True)
    course_seed = Unicode("", help="Per-student numbers (gpulab.course.variants): the course's seed; "
                          "empty, everyone has the chapter's own numbers.").tag(config=True)
    max_output_chars = Integer(100_000, help="Largest output kept, in characters.").tag(config=True)

    def preprocess(self, nb, resources):
        assignment = resources["nbgrader"]["assignment"]
        key_file = next(Path(self.keys_dir).glob(f"{assignment[:2]}_*.py"), None)
        # Each student is judged against the key for their own numbers (drawn from the id of
        # their submission folder, never from the notebook), and sees their own quiz texts.
        student = resources["nbgrader"].get("student") or ""
        items, questions = (variants.student_key(import_key(key_file), self.course_seed, student,
                                                 key_file.stem) if key_file else ([], {}))
        key = items_by_id(items, key_file)
        stopped = resources.get("gpulab", {}).get("stopped")
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = [self._capped(o) for o in cell.outputs]
                if (shown := variants.question_of(cell)) in questions:
                    cell.outputs = [variants.question_output(questions[shown])]
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            item_id = meta["grade_id"].removeprefix("test-")
            passed, message = _verdict(item_id, cell, key, stopped)
            cell.outputs = [_pass(message) if passed else _fail(message)]
        flags = resources.get("gpulab_flags", [])
        if flags:
            # A flag quotes what the student wrote (ids, file names): escaped, it shows as text.
            note = "**Grading notes** (for you and your instructor):\n\n" + "\n".join(
                f"- {markdown_text(flag)}" for flag in flags)
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(note))
            _log(resources, INTEGRITY_LOG, [{"finding": flag} for flag in flags])
        _log(resources, PROGRESS_LOG, [{"findings": len(flags)}])
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
        return False, printable(value[:500])
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


def printable(text: str) -> str:
    """``text`` without control characters (a record's message could carry terminal escapes)."""
    return "".join(c if c.isprintable() or c == "\n" else "\ufffd" for c in text)


def _pass(message: str):
    return nbformat.v4.new_output("stream", name="stdout", text=message + "\n")


def _fail(message: str):
    return nbformat.v4.new_output("error", ename="WrongAnswer", evalue=message,
                                  traceback=[f"\x1b[31m✘ {message}\x1b[0m"])


def _log(resources, name: str, entries: list[dict]) -> None:
    """Append one line per entry to the log ``name`` beside the gradebook (make autograde
    prints them as they come)."""
    info = resources["nbgrader"]
    db_path = info["db_url"].removeprefix("sqlite:///")
    with open(Path(db_path).parent / name, "a") as log:
        for entry in entries:
            log.write(json.dumps({"student": info.get("student"), "assignment": info["assignment"],
                                  "notebook": info["notebook"], **entry}) + "\n")
