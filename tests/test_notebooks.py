"""Static checks of the committed notebooks: nbgrader metadata, no outputs, nothing leaked, no
answer in view before its check cell."""
import ast
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.nbgraderformat import MetadataValidator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "autograder"))
from scratch_course import worked_answer  # noqa: E402

SOURCES = sorted((ROOT / "solutions").glob("*/*.ipynb"))
RELEASES = sorted((ROOT / "notebooks").glob("*/*.ipynb"))


def test_every_chapter_is_released():
    assert SOURCES and [p.relative_to(ROOT / "solutions") for p in SOURCES] == [
        p.relative_to(ROOT / "notebooks") for p in RELEASES]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name)
def test_every_chapter_ends_with_the_learners_tally(path):
    """The self-study learner's progress (issue 37): the chapter's last cell shows their own tally
    of this chapter (scripts/add_progress_cell.py adds it; gpulab.course.progress.tally)."""
    last = nbformat.read(path, as_version=4).cells[-1]
    assert last.id == "progress-tally" and last.cell_type == "code"
    assert f'tally("{path.parent.name}")' in last.source


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name)
def test_source_metadata_validates(path):
    nb = nbformat.read(path, as_version=4)
    MetadataValidator().validate_nb(nb)  # raises on malformed nbgrader metadata
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    manual = [c for c in graded if c.metadata["nbgrader"].get("solution")]
    assert len(graded) - len(manual) >= 8 and manual, "8+ autograded items and a written answer"


@pytest.mark.parametrize("path", SOURCES + RELEASES, ids=lambda p: f"{p.parts[-3]}/{p.parent.name}")
def test_committed_notebooks_carry_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.id


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.parent.name)
def test_release_leaks_no_solution(path):
    text = path.read_text()
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    source = nbformat.read(ROOT / "solutions" / path.parent.name / path.name, as_version=4)
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            worked = worked_answer(cell.source)
            assert worked.strip() not in text, f"{meta['grade_id']}: worked answer shipped"
    assert not list(path.parent.glob("*.py")), "no answer key (or any code) in the release folder"


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell assigns, names it reads), from its syntax tree."""
    assigned, read = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (assigned if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            assigned.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            assigned.update((a.asname or a.name).split(".")[0] for a in node.names)
    return assigned, read


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.parent.name)
def test_only_its_answer_cell_sets_an_answer(path):
    """The untouched release scores zero only if no other cell computes an answer variable, and
    runs top to bottom only if an experiment reads one only after checking it was answered
    (`if name is ...:`, as chapter 02's budget experiment does). (The pipeline grades the untouched
    release end to end for the first chapter; this covers every chapter)."""
    nb = nbformat.read(path, as_version=4)
    roles = {c.id: c.metadata.get("nbgrader", {}) for c in nb.cells}
    answers = {c.id: c.source.split("=")[0].strip() for c in nb.cells
               if c.cell_type == "code" and roles[c.id].get("solution")}
    assert all(re.fullmatch(r"[A-Za-z_]\w* = \.\.\.\n# YOUR CODE HERE", c.source)
               for c in nb.cells if c.id in answers), "an answer cell is not `name = ...` + stub"
    for c in nb.cells:
        if c.cell_type != "code" or c.id in answers or roles[c.id].get("grade"):
            continue
        assigned, read = _names(c.source)
        assert not assigned & set(answers.values()), f"{c.id} sets {assigned & set(answers.values())}"
        unguarded = {name for name in read & set(answers.values()) if f"{name} is ..." not in c.source}
        assert not unguarded, f"{c.id} reads {unguarded} without checking `is ...` first"


@pytest.mark.parametrize("path", RELEASES, ids=lambda p: p.parent.name)
def test_no_later_cell_needs_what_only_a_worked_answer_defines(path):
    """A worked answer may name its steps (`per_param = 2 + 2 + 12`); the release's answer cell
    is only `name = ...`, so a later cell that read such a step would raise NameError in the
    untouched release (and for a learner who answered differently). Every name a later cell
    reads is defined by a cell the release has, before it (or is a builtin)."""
    import builtins
    source = nbformat.read(ROOT / "solutions" / path.parent.name / path.name, as_version=4)
    only_worked = set()
    for cell in source.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            stub_name = cell.source.split("=")[0].strip()
            only_worked |= _names(worked_answer(cell.source))[0] - {stub_name}
    release = nbformat.read(path, as_version=4)
    defined = set(dir(builtins)) | {"get_ipython", "display", "In", "Out"}
    for cell in release.cells:
        if cell.cell_type != "code":
            continue
        assigned, read = _names(cell.source)
        assert not (read & only_worked) - defined - assigned, (
            f"{cell.id} reads {sorted((read & only_worked) - defined - assigned)}, which only a worked answer defines")
        defined |= assigned


# --------------------------------------------------------------------------------------------
# No answer in view (issue 36, item 19): nothing visible before a graded item's check cell has
# run explains or states its answer. What a learner sees at once is every cell outside a closed
# `<details class="why">` block, so the rules are about the prose around each check cell:
#
# A. After the check cell: a markdown cell between it and the next heading (or the next graded
#    cell) that explains the answer is one `<details class="why">` block. It explains the answer
#    when it states the expected number (see `states_number`), names a choice item's answer
#    ("(c)", "line C", `` `both` ``), begins with "Why" or "Answer", or names its own quiz
#    ("Quiz 15"). A cell that begins with a heading ends the stretch (so does a heading inside a
#    cell: only the text above it is read).
# B. Before it: the hints between the question and the check cell state neither the expected
#    number nor the choice; the lead-in (the quiz's section, from its `#`/`##` heading down to the
#    quiz's heading) does not state a distinctive expected number (three significant digits or
#    more, or hexadecimal), unless the question itself gives that number.
# The question cell itself is not read for numbers: its givens may equal the answer by chance
# (chapter 10's Quiz 4 gives a batch of 1,024 and asks for a B_crit of 1,024).

from gpulab.course.checks import load_key_module  # noqa: E402

WHY_BLOCK = re.compile(r'\A\s*<details class="why">\s*<summary>.*?</summary>.*</details>\s*\Z', re.S)
HEADING_LINE = re.compile(r"^ {0,3}(#{1,6})\s", re.M)
_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
_WRITTEN_NUMBER = re.compile(
    r"(?<![\w.])(?P<hex>0x[0-9A-Fa-f]+)\b"
    r"|(?<![\w.])(?P<whole>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d+))?"
    r"(?:(?P<e>[eE][+-]?\d+)"
    r"|\s*(?:×|\\times|\\cdot|·)\s*10(?:\^\{?(?P<power>[+\-−]?\d+)\}?|(?P<sup>[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)))?"
    r"(?P<suffix>\s?%|[kKMBGT]\b|\s(?:thousand|million|billion|trillion)\b)?")
_MULTIPLIER = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12,
               "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}


def written_numbers(text: str):
    """(as written, value, half its last digit, distinctive) for each number in a text: plain,
    with thousands commas, 1.2e-9, 1.21 × 10⁻⁹ or 1.21 \\times 10^{-9}, 3.2M or 7 billion, 41%,
    0x4C. Distinctive: three significant digits or more, or hexadecimal."""
    for m in _WRITTEN_NUMBER.finditer(text):
        if m["hex"]:
            yield m[0], int(m["hex"], 16), 0.5, True
            continue
        digits = m["whole"].replace(",", "") + (m["frac"] or "")
        if m["e"]:
            exponent = int(m["e"][1:])
        elif m["sup"]:
            exponent = int(m["sup"].translate(_SUPERSCRIPT))
        else:
            exponent = int((m["power"] or "0").replace("−", "-"))
        scale = 10.0 ** exponent
        suffix = (m["suffix"] or "").strip()
        scale *= 0.01 if suffix == "%" else _MULTIPLIER.get(suffix, 1)
        value = float(m["whole"].replace(",", "") + (f".{m['frac']}" if m["frac"] else "")) * scale
        yield m[0], value, 0.5 * 10.0 ** -len(m["frac"] or "") * scale, len(digits.lstrip("0")) >= 3


def states_number(text: str, item, distinctive_only: bool = False) -> list[str]:
    """The numbers in `text` that state the item's expected value: the value rounded to the
    digits written, and within the item's tolerance or 2% of it (so "54 ms" and "54.4 ms" state
    54.44 ms; "50 ms" does not). A zero answer is not looked for (every text has a 0)."""
    if isinstance(item.value, str) or item.value == 0:
        return []
    return [shown for shown, value, half, distinctive in written_numbers(text)
            if (distinctive or not distinctive_only)
            and abs(value - item.value) <= half * (1 + 1e-9)
            and abs(value - item.value) <= max(item.rel_tol, 0.02) * abs(item.value)]


def states_choice(text: str, item) -> list[str]:
    """Where `text` names a choice item's answer: "(c)" or "line c" for a letter, the choice in
    backticks or quotes for a word."""
    if not isinstance(item.value, str):
        return []
    choice = re.escape(item.value)
    if len(item.value) == 1:
        return re.findall(rf"\({choice}\)|\bline\s+{choice}\b", text, flags=re.I)
    return re.findall(rf"[`'\"]{choice}[`'\"]", text)


def _above_heading(source: str) -> str:
    heading = HEADING_LINE.search(source)
    return source[:heading.start()] if heading else source


def _graded(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("grade") or meta.get("solution"))


def answers_in_view(cells, items: dict) -> list[str]:
    """What breaks rules A and B in a notebook's cells, one line per cell and item."""
    found = []
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("grade"):
            continue
        for item_id in re.findall(r'check\("([^"]+)"', cell.source):
            item = items[item_id]
            quiz = max(k for k in range(i) if cells[k].cell_type == "markdown" and HEADING_LINE.search(cells[k].source))
            question = cells[quiz].source
            quiz_heading = list(HEADING_LINE.finditer(question))[-1]
            number = re.search(r"Quiz (\d+)", question[quiz_heading.start():])

            # A. the stretch after the check cell
            for later in cells[i + 1:]:
                if _graded(later) or (later.cell_type == "markdown" and HEADING_LINE.match(later.source)):
                    break
                if later.cell_type != "markdown" or WHY_BLOCK.match(later.source):
                    continue
                text = _above_heading(later.source)
                plain = re.sub(r"[*_#>\s]+", " ", text).strip()
                says = (states_number(text, item) + states_choice(text, item)
                        + re.findall(r"^(?:Why|Answer|The answer)\b", plain)
                        + (re.findall(rf"\bQuiz {number[1]}\b", text) if number else []))
                if says:
                    found.append(f"{later.id} (after the check of {item_id}, answer {item.value!r}): "
                                 f"{says} in view; make it a <details class=\"why\"> block")
                if HEADING_LINE.search(later.source):
                    break

            # B. the hints between the question and the check cell, and the section's lead-in
            for hint in cells[quiz + 1:i]:
                if hint.cell_type == "markdown" and not WHY_BLOCK.match(hint.source):
                    says = states_number(hint.source, item) + states_choice(hint.source, item)
                    if says:
                        found.append(f"{hint.id} (between the question and the check of {item_id}, "
                                     f"answer {item.value!r}): {says}")
            given = {round(v, 12) for _, v, _, _ in written_numbers(question[quiz_heading.start():])}
            section = re.compile(r"^ {0,3}#{1,2}\s", re.M)
            start = max((k for k in range(quiz + 1)
                         if cells[k].cell_type == "markdown" and section.search(cells[k].source)), default=0)
            for k in range(start, quiz + 1):
                source = cells[k].source
                if cells[k].cell_type != "markdown" or WHY_BLOCK.match(source):
                    continue
                if k == start and section.search(source):
                    source = source[list(section.finditer(source))[-1].start():]
                if k == quiz:
                    source = source[:len(source) - len(question) + quiz_heading.start()]
                says = [shown for shown in states_number(source, item, distinctive_only=True)
                        if round(next(written_numbers(shown))[1], 12) not in given]
                if says:
                    found.append(f"{cells[k].id} (the lead-in to {item_id}, answer {item.value!r}): "
                                 f"states {says} before the question")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name)
def test_no_answer_is_in_view_before_its_check(path):
    items = load_key_module(ROOT / "autograder" / "keys" / f"{path.parent.name}.py")
    found = answers_in_view(nbformat.read(path, as_version=4).cells, items)
    assert not found, "\n".join(found)


def _planted(*cells):
    """Markdown strings and ("check", item_id) pairs as a notebook's cells."""
    made = []
    for n, cell in enumerate(cells):
        if isinstance(cell, tuple):
            code = nbformat.v4.new_code_cell(f'check("{cell[1]}", answer)')
            code.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                         "grade_id": f"test-{cell[1]}", "points": 1, "schema_version": 3}
            made.append(code)
        else:
            made.append(nbformat.v4.new_markdown_cell(cell))
        made[-1].id = f"cell-{n}"
    return made


def test_the_answer_in_view_rules_catch_planted_answers():
    from gpulab.course.checks import Item
    ms = Item("99-ms", 54.444, "ms", rel_tol=0.01)
    choice = Item("99-line", "c", "", choices=("a", "b", "c", "d"))
    word = Item("99-fix", "both", "", choices=("power", "both"))
    mask = Item("99-mask", 76, "")
    items = {i.id: i for i in (ms, choice, word, mask)}
    why = '<details class="why"><summary>Why (open it after you have checked your answer)</summary>\n\n{}\n\n</details>'

    def flagged(*cells):
        return [line.split(" ")[0] for line in answers_in_view(_planted(*cells), items)]

    quiz = "### Quiz 3: how long?\n\nHow many ms does it take at 450 GB/s?"
    question = "## 1. A section\n\n" + quiz
    assert flagged(question, ("check", "99-ms"), "### Quiz 4\n\nNext.") == []
    for after in ("It takes 54.4 ms.", "About 54 ms: $2 \\cdot 7/8 \\cdot 14/450 = 54.4$.", "Why: the ring.",
                  "**Answer.** Twice.", "Quiz 3 counts one direction.", "It is 5.44 \\times 10^{1} ms"):
        assert flagged(question, ("check", "99-ms"), after) == ["cell-2"], after
        assert flagged(question, ("check", "99-ms"), why.format(after)) == [], after
    # Other numbers, another quiz, a heading first: not an answer; the stretch ends at a heading.
    assert flagged(question, ("check", "99-ms"), "At 50 ms or 60 ms, like Quiz 2, ...") == []
    assert flagged(question, ("check", "99-ms"), "### Experiment 1\n\nIt takes 54.4 ms.") == []
    assert flagged(question, ("check", "99-ms"), "Text.\n\n### Experiment\n\n54.4 ms", "54.4 ms") == []

    lines = "### Quiz 5: which line?\n\n(a) ... (b) ... (c) ... (d) ..."
    assert flagged(lines, ("check", "99-line"), "(c): nothing calls `set_epoch`.") == ["cell-2"]
    assert flagged(lines, ("check", "99-line"), "So line C divides twice.") == ["cell-2"]
    assert flagged(lines, "Hint: look at (c).", ("check", "99-line")) == ["cell-1"]
    words = "### Quiz 6\n\nAnswer 'power' or 'both'."
    assert flagged(words, ("check", "99-fix"), "It is `both`: the cap and the heat.") == ["cell-2"]
    assert flagged(words, ("check", "99-fix"), "Both of these matter.") == []

    # The lead-in: a distinctive expected number is a give-away; a given of the question is not.
    lead = "## 3. Bits\n\nThe cap and the thermal limit read 0x4 | 0x40 | 0x8 = {}."
    ask = "### Quiz 4: build a mask\n\nWhich mask means a power cap and heat?"
    assert flagged(lead.format("0x4C"), ask, ("check", "99-mask")) == ["cell-0"]
    assert flagged(lead.format("0x4C"), "## 4. Next\n\n" + ask, ("check", "99-mask")) == []
    assert flagged(lead.format("0x4C"), ask + " (0x4C is not it)", ("check", "99-mask")) == []
    assert flagged(lead.format("a mask"), ask, ("check", "99-mask")) == []
    assert flagged("## 1.\n\nA 54.4 ms step.\n\n" + quiz, ("check", "99-ms")) == ["cell-0"]
    assert flagged("## 1.\n\nA 54.4 ms step.", quiz, ("check", "99-ms")) == ["cell-0"]
    assert flagged("## 1.\n\nAbout 54 ms.\n\n" + quiz, ("check", "99-ms")) == []   # two digits: not distinctive


def test_written_numbers_read_the_ways_the_course_writes_them():
    read = {shown: value for shown, value, _, _ in written_numbers(
        "1,536 and 8.088e22, 1.21 × 10⁻⁹, 8.1 \\times 10^{22}, 3.2M, 7 billion, 41%, 0x4C, 2.5")}
    assert read == pytest.approx({"1,536": 1536, "8.088e22": 8.088e22, "1.21 × 10⁻⁹": 1.21e-9,
                                  "8.1 \\times 10^{22}": 8.1e22, "3.2M": 3.2e6, "7 billion": 7e9,
                                  "41%": 0.41, "0x4C": 76, "2.5": 2.5})
