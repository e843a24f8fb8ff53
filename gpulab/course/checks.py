"""Quiz checks: one readable line per autograded item, feedback that names the likely mistake.

A notebook's test cell is a single call::

    check("01-batch-bytes", batch_bytes)

The expected value is not in the notebook. It lives in the chapter's answer key, which is data
on the instructor's side (``autograder/keys/NN_topic.py``), computed by gpulab's own functions.
``check`` finds the key in this order:

1. the folder named by the environment variable ``GPULAB_ANSWER_KEYS`` (an instructor checking
   a notebook by hand against the real key);
2. ``selfcheck.dat`` beside the notebook: the self-study release's encoded copy of the key, so a
   learner gets an immediate verdict without the expected value being in plain sight;
3. ``autograder/keys`` in a folder above the notebook (an instructor working in the repository).

In a graded run (``make autograde``) ``check`` looks for no key at all: it records the answer,
and the grading process judges the record outside the learner's kernel
(``autograder/secure_grading.py``). Where no key is found, it records the answer too.

The verdict is a message that names the likely mistake, e.g. "8x too large: did you count bits
instead of bytes?"; answers of the wrong kind (a string, None, a tensor, NaN, ...) get a
plain-words message too. How it is delivered depends on who runs the cell:

- a learner in JupyterLab: the verdict is *shown* (✔ right / ✘ wrong with its diagnosis / not
  answered yet), never raised, so that Run All reaches the experiments at the end of a chapter;
- nbgrader's Validate button (NBGRADER_EXECUTION=validate), or GPULAB_STRICT_CHECKS=1 (the book
  build, where a wrong worked answer must fail): a wrong or unanswered item raises
  ``WrongAnswer`` (an AssertionError), so Validate lists it as a failing test. Without a key
  (the graded release) Validate can still tell an unanswered item or an answer of the wrong kind;
  whether a number is right only ``make autograde`` knows.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import importlib.util
import json
import math
import numbers
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.course.diagnosis import diagnose, percent, unit_kind  # noqa: F401 (re-exported)

KEYS_ENV = "GPULAB_ANSWER_KEYS"
STRICT_ENV = "GPULAB_STRICT_CHECKS"
SELFCHECK_FILE = "selfcheck.dat"
_SELFCHECK_HEADER = (
    "GPU Training Lab self-check data. It is encoded so that answers are not read by accident;\n"
    "decoding it only spoils the exercise. Graded releases do not include this file.\n"
)


# --------------------------------------------------------------------------------------------
# The answer key's vocabulary


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer and what to tell the learner who gives it."""

    value: float
    says: str


@dataclass(frozen=True)
class Item:
    """One autograded quiz item: the expected value, how close is right, and typical mistakes.

    ``rel_tol`` is relative (0.01 = 1%); ``abs_tol`` matters only for answers near zero.
    For a choice item give ``choices`` (lower-case strings) and a ``value`` among them.

    An answer that no single value captures (a training plan, which many plans satisfy) names
    its judge instead: ``judged_by`` is a gpulab function as "module:function", called with
    the item and the answer, that returns the verdict or raises ``WrongAnswer``; ``judge_args``
    is what it needs to know (chapter 12's budget name). ``value`` then only describes a right
    answer. The grader calls the same function outside the learner's kernel.
    """

    id: str
    value: float | str
    unit: str
    rel_tol: float = 1e-9
    abs_tol: float = 0.0
    mistakes: tuple[Mistake, ...] = ()
    choices: tuple[str, ...] = ()
    judged_by: str = ""
    judge_args: str = ""

    def __post_init__(self):
        if self.choices and self.value not in self.choices:
            raise ValueError(f"{self.id}: value {self.value!r} is not one of {self.choices}")
        if self.judged_by and not self.judged_by.startswith("gpulab."):
            raise ValueError(f"{self.id}: a judge must be a gpulab function, not {self.judged_by!r}")


def chapter_of(item_id: str) -> str:
    """'01-batch-bytes' -> '01': item ids start with their chapter's number."""
    return item_id.split("-", 1)[0]


# --------------------------------------------------------------------------------------------
# Finding and reading keys


def import_key(path: Path):
    """Import an instructor key file as a module (its list ``ITEMS``; for a chapter with
    per-student numbers also ``PARAMS``, ``QUESTIONS`` and ``items(values)``: gpulab.course.variants)."""
    spec = importlib.util.spec_from_file_location(f"gpulab_key_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def items_by_id(items, path: Path) -> dict[str, Item]:
    found = {item.id: item for item in items}
    if len(found) != len(items):
        raise ValueError(f"{path}: duplicate item ids")
    return found


def load_key_module(path: Path) -> dict[str, Item]:
    """Import an instructor key file (a Python module with a list ``ITEMS``)."""
    return items_by_id(import_key(path).ITEMS, path)


def _key_file_in(folder: Path, chapter: str) -> Path | None:
    matches = sorted(folder.glob(f"{chapter}_*.py"))
    return matches[0] if matches else None


# Fields written only when set, so that a key without judged items encodes as it always has.
_OMITTED_WHEN_EMPTY = ("judged_by", "judge_args")


def encode_selfcheck(items: dict[str, Item]) -> str:
    """The self-study release's copy of a key: JSON, compressed, base64 (deterministic)."""
    data = {k: {f: x for f, x in dataclasses.asdict(v).items()
                if f not in _OMITTED_WHEN_EMPTY or x}
            for k, v in sorted(items.items())}
    packed = zlib.compress(json.dumps(data, sort_keys=True).encode(), 9)
    text = base64.b64encode(packed).decode()
    lines = [text[i : i + 76] for i in range(0, len(text), 76)]
    return _SELFCHECK_HEADER + "\n".join(lines) + "\n"


def decode_selfcheck(text: str) -> dict[str, Item]:
    body = "".join(line for line in text.splitlines() if " " not in line)  # header lines have spaces
    data = json.loads(zlib.decompress(base64.b64decode(body)))
    items = {}
    for item_id, fields in data.items():
        fields["mistakes"] = tuple(Mistake(**m) for m in fields["mistakes"])
        fields["choices"] = tuple(fields["choices"])
        items[item_id] = Item(**fields)
    return items


def find_key(chapter: str, start: Path | None = None) -> dict[str, Item] | None:
    """The answer key for ``chapter``, looked up as the module docstring says; None if absent."""
    start = Path.cwd() if start is None else Path(start)
    if os.environ.get(KEYS_ENV):
        folder = Path(os.environ[KEYS_ENV])
        path = _key_file_in(folder, chapter)
        if path is None:
            raise FileNotFoundError(f"{KEYS_ENV}={folder} has no key for chapter {chapter}")
        return load_key_module(path)
    selfcheck = start / SELFCHECK_FILE
    if selfcheck.is_file():
        return decode_selfcheck(selfcheck.read_text())
    for folder in [start, *start.parents]:
        keys = folder / "autograder" / "keys"
        if keys.is_dir() and (path := _key_file_in(keys, chapter)):
            return load_key_module(path)
    return None


# --------------------------------------------------------------------------------------------
# Judging an answer


class WrongAnswer(AssertionError):
    """A failed check. Shown in Jupyter as its message alone, without a gpulab traceback."""

    def _render_traceback_(self):  # IPython's hook for custom exception display
        return [f"\x1b[31m✘ {self}\x1b[0m"]


def _as_number(answer, item: Item) -> float:
    """The answer as a finite float, or WrongAnswer saying in plain words what is off."""
    unit = f" in {item.unit}" if item.unit else ""
    if answer is Ellipsis:
        raise WrongAnswer(f"{item.id}: not answered yet. Replace the ... with your answer{unit}.")
    if answer is None:
        raise WrongAnswer(
            f"{item.id}: your answer is None. Did you forget to assign it, or does a function "
            f"you wrote forget to `return`? Give one number{unit}."
        )
    if isinstance(answer, bool):
        raise WrongAnswer(f"{item.id}: your answer is {answer}, a yes/no; give a number{unit}.")
    if isinstance(answer, str):
        try:
            float(answer.replace(",", "").replace("_", ""))
        except ValueError:
            raise WrongAnswer(f"{item.id}: your answer is the text {answer!r}; give a number{unit}.")
        raise WrongAnswer(
            f"{item.id}: your answer is the text {answer!r}. Write it as a number, without quotes."
        )
    if type(answer).__module__.startswith(("torch", "numpy")) and hasattr(answer, "shape"):
        if tuple(answer.shape) == ():
            if type(answer).__module__.startswith("numpy"):
                return _finite(float(answer), item)  # a numpy scalar is a fine number
            raise WrongAnswer(
                f"{item.id}: your answer is a 0-d tensor. Take the number out with `.item()`."
            )
        raise WrongAnswer(
            f"{item.id}: your answer is an array of shape {tuple(answer.shape)}; give one number"
            f"{unit}. (Reduce it first, e.g. `.sum().item()`, if that is what you meant.)"
        )
    if isinstance(answer, (list, tuple, set, dict)):
        raise WrongAnswer(
            f"{item.id}: your answer is a {type(answer).__name__}; give one number{unit}."
        )
    if isinstance(answer, complex):
        raise WrongAnswer(f"{item.id}: your answer {answer} is complex; give a real number.")
    if not isinstance(answer, numbers.Real):
        raise WrongAnswer(
            f"{item.id}: your answer is a {type(answer).__name__}, not a number; give one "
            f"number{unit}."
        )
    return _finite(float(answer), item)


def _finite(x: float, item: Item) -> float:
    if math.isnan(x):
        raise WrongAnswer(
            f"{item.id}: your answer is NaN (not a number): somewhere an operation had no "
            "meaningful result, such as 0/0 or inf - inf."
        )
    if math.isinf(x):
        raise WrongAnswer(f"{item.id}: your answer is infinite: a division by zero somewhere?")
    return x


def _close(a: float, b: float, item: Item) -> bool:
    return math.isclose(a, b, rel_tol=max(item.rel_tol, 1e-9), abs_tol=item.abs_tol)


def judge(item: Item, answer) -> str:
    """The verdict message for a right answer; raises WrongAnswer for a wrong one."""
    if item.judged_by:
        return _judge_by(item, answer)
    unit = f" {item.unit}" if item.unit else ""
    if item.choices:
        choices = ", ".join(map(repr, item.choices))
        if answer is Ellipsis:
            raise WrongAnswer(f"{item.id}: not answered yet. Replace the ... with one of {choices}.")
        given = answer.strip().lower() if isinstance(answer, str) else None
        if given not in item.choices:
            raise WrongAnswer(f"{item.id}: answer with one of {choices}.")
        if given != item.value:
            for mistake in item.mistakes:
                if str(mistake.value) == given:
                    raise WrongAnswer(f"{item.id}: {mistake.says}")
            raise WrongAnswer(f"{item.id}: not {given!r}. Reread the question and try again.")
        return f"✔ {item.id}: right ({given})."
    number = _as_number(answer, item)
    if not _close(number, float(item.value), item):
        raise WrongAnswer(f"{item.id}: {diagnose(number, item)}")
    tolerance = "" if item.rel_tol <= 1e-9 else f", within {percent(item.rel_tol)}"
    shown = f"{int(number):,}" if number.is_integer() and abs(number) < 1e15 else f"{number:,.6g}"
    return f"✔ {item.id}: right ({shown}{unit}{tolerance})."


def _judge_by(item: Item, answer) -> str:
    """The verdict of the item's own judge (``Item.judged_by``), a gpulab function."""
    module_name, _, function = item.judged_by.partition(":")
    if not module_name.startswith("gpulab.") or not function.isidentifier():
        raise ValueError(f"{item.id}: a judge must be a gpulab function, not {item.judged_by!r}")
    return getattr(importlib.import_module(module_name), function)(item, answer)


# --------------------------------------------------------------------------------------------
# Recording an answer for grading (the verdict is computed outside the learner's kernel)

RECORD_MIME = "application/vnd.gpulab.answer+json"


def answer_record(item_id: str, answer) -> dict:
    """What a graded run records for one answer: {"item", "value"} for a finite real number,
    {"item", "text"} for a string, else {"item", "error"} with the plain-words message. Only a
    plain float leaves the kernel, so an object that claims to equal everything records one
    number like any other answer."""
    if isinstance(answer, str):
        return {"item": item_id, "text": answer[:200]}
    try:
        value = _as_number(answer, Item(item_id, 0.0, ""))
    except WrongAnswer as wrong:
        return {"item": item_id, "error": str(wrong)}
    return {"item": item_id, "value": float(value)}


def _record(item_id: str, answer) -> None:
    record = answer_record(item_id, answer)
    # In plain Python only the text is printed: nothing records it there.
    display_bundle({RECORD_MIME: record, "text/plain": f"{item_id}: answer recorded for grading."})


def display_bundle(bundle: dict) -> None:
    """Display a MIME bundle in Jupyter; print its text/plain elsewhere (plain Python, a script)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(bundle["text/plain"])
        return
    display(bundle, raw=True)


# --------------------------------------------------------------------------------------------
# Showing a verdict to a learner

_STYLES = {   # (symbol, text colour, background, border): calm colours, not an error box
    "right": ("✔", "#1a6b2f", "#eef8f0", "#3f9d5a"),
    "wrong": ("✘", "#7a4a00", "#fff6e5", "#e0a030"),
    "unanswered": ("○", "#4a4f57", "#f3f4f6", "#9aa0a8"),
    "recorded": ("✎", "#24466b", "#eef3f9", "#6b8fb8"),
}


def show(state: str, message: str) -> None:
    """Display one verdict: as a styled box in Jupyter, as a plain line elsewhere."""
    symbol, colour, background, border = _STYLES[state]
    text = message if message.startswith(symbol) else f"{symbol} {message}"
    box = (f'<div class="gpulab-check gpulab-check-{state}" style="color:{colour};'
           f"background:{background};border-left:4px solid {border};padding:4px 10px;"
           f'font-family:var(--jp-code-font-family, monospace);white-space:pre-wrap">'
           f"{html.escape(text)}</div>")
    display_bundle({"text/html": box, "text/plain": text})


# --------------------------------------------------------------------------------------------
# Remembering what was shown, for the learner's tally at the end of a chapter


@dataclass(frozen=True)
class Verdict:
    """What a check showed: its state (right, wrong, unanswered, recorded) and the id of the
    notebook cell that showed it (None outside JupyterLab)."""

    state: str
    cell_id: str | None = None


# The last verdict each item showed in this kernel, by item id: what gpulab.course.progress's
# tally reads. (A saved notebook holds the same as each check cell's output: the box's class.)
shown: dict[str, Verdict] = {}


def _running_cell_id() -> str | None:
    """The id of the cell being run: JupyterLab sends it with each execute request."""
    try:
        from IPython import get_ipython

        return get_ipython().kernel.get_parent()["metadata"].get("cellId")
    except Exception:   # plain Python, a kernel without the request's metadata
        return None


def _show_verdict(item_id: str, state: str, message: str) -> None:
    shown[item_id] = Verdict(state, _running_cell_id())
    show(state, message)


def _strict() -> bool:
    """Raise on a wrong or unanswered item: nbgrader's Validate, or a build that must fail."""
    return os.environ.get("NBGRADER_EXECUTION") == "validate" or os.environ.get(STRICT_ENV) == "1"


def check(item_id: str, answer) -> None:
    """The test cell's one line: show ✔, or the likely mistake, or that it is not answered yet.

    A learner's kernel shows the verdict and goes on (Run All reaches the end of the chapter).
    nbgrader's Validate (and GPULAB_STRICT_CHECKS=1) raise WrongAnswer instead, so a wrong or
    unanswered item is a failing test there. In a graded run (nbgrader's autograde sets
    NBGRADER_EXECUTION=autograde) it only records the answer; ``make autograde`` judges the
    record against the instructor's key afterwards, outside this kernel
    (autograder/secure_grading.py)."""
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        _record(item_id, answer)
        return
    key = find_key(chapter_of(item_id))
    if key is None:   # a graded release: only an unanswered item or a non-number can be told
        record = answer_record(item_id, answer)
        if "error" in record:
            if _strict():
                raise WrongAnswer(record["error"])
            _show_verdict(item_id, "unanswered" if answer is Ellipsis else "wrong", record["error"])
            return
        _show_verdict(item_id, "recorded", f"{item_id}: answer recorded. This release has no "
                                           "self-checks: your instructor grades it.")
        return
    if item_id not in key:
        raise KeyError(f"{item_id} is not in chapter {chapter_of(item_id)}'s answer key")
    try:
        verdict = judge(key[item_id], answer)
    except WrongAnswer as wrong:
        if _strict():
            raise
        _show_verdict(item_id, "unanswered" if answer is Ellipsis else "wrong", str(wrong))
        return
    _show_verdict(item_id, "right", verdict)
