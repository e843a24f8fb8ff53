"""The course glossary (scripts/glossary.py): the yml files validate, every term is used, its
first use in course order defines it, its home section defines it, and the generated boxes and
book/glossary.md are in sync. Static: markdown is parsed, no kernel runs.

The checker itself is tested on small planted courses (tmp_path), so that each rule is seen to
fail: a term used before its definition, a definition in the wrong section, a stale box."""
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import glossary  # noqa: E402

COURSE = glossary.Course(ROOT)     # parsed once for the module's tests
CHAPTERS = glossary.chapter_folders(ROOT)


def test_the_glossary_files_validate():
    assert not COURSE.errors, "\n".join(COURSE.errors)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_lists_its_terms(chapter):
    path = ROOT / "book" / "glossary" / f"{chapter}.yml"
    assert path.exists(), f"{path.relative_to(ROOT)} is missing"
    assert any(t.chapter == chapter for t in COURSE.terms), f"{path.relative_to(ROOT)} lists no term"


def test_every_term_is_used():
    assert not COURSE.unused(), "\n".join(COURSE.unused())


def test_every_term_is_defined_where_it_is_first_used():
    assert not COURSE.used_before_defined(), "\n".join(COURSE.used_before_defined())


def test_every_term_is_defined_in_its_home_section():
    assert not COURSE.undefined_in_home_section(), "\n".join(COURSE.undefined_in_home_section())


def test_the_boxes_and_the_glossary_page_are_in_sync():
    assert not COURSE.stale(), "\n".join(COURSE.stale()) + "\nrun: python scripts/glossary.py --write"


# --------------------------------------------------------------------------------------------
# The checker on planted courses

TITLE = "# Chapter {n} — {name}"


def plant(root: Path, chapters: dict[str, list[str]], glossary_files: dict[str, str]) -> glossary.Course:
    """A course of markdown cells (`chapters`: folder -> cell sources) and yml files."""
    for folder, cells in chapters.items():
        nb = nbformat.v4.new_notebook()
        for i, source in enumerate(cells):
            cell = nbformat.v4.new_markdown_cell(source)
            cell.id = f"{folder[:2]}-md-{i}"
            nb.cells.append(cell)
        nb.cells.insert(1, nbformat.v4.new_code_cell("import torch"))
        path = root / "solutions" / folder / f"{folder}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
    (root / "book" / "glossary").mkdir(parents=True, exist_ok=True)
    for folder, text in glossary_files.items():
        (root / "book" / "glossary" / f"{folder}.yml").write_text(textwrap.dedent(text))
    return glossary.Course(root)


SM = """\
- term: streaming multiprocessor
  forms: [SM]
  section: "1. Inside the GPU"
  means: >-
    One of the GPU's many processors.
"""
KERNEL = """\
- term: kernel
  section: "2. Kernels"
  means: A function the GPU runs on many threads at once.
"""
GOOD = {
    "01_alpha": [
        "# Chapter 01 — Alpha",
        "## 1. Inside the GPU\n\nA GPU has many processors. Each is a *streaming multiprocessor*.\n"
        "The SMs run threads.\n\n```python\n# a kernel in a comment, a fence: not read\n```\n\n"
        "$$ \\text{kernel} = 1 $$",
        "## 2. Kernels\n\n"
        "Work the GPU runs is a ***kernel***. Many kernels run on each SM.",
    ],
    "02_beta": [
        "# Chapter 02 — Beta",
        "## 1. Again\n\nA kernel per layer. The per-SM view (one word with its hyphen) and "
        "`get_kernel()` (an identifier) are not uses.",
    ],
}


def test_a_course_that_keeps_the_rules_passes_them(tmp_path):
    course = plant(tmp_path, GOOD, {"01_alpha": SM + KERNEL})
    assert course.problems() == []
    first = course.first_use(course.terms[0])
    assert first.cell == "01-md-1" and "streaming multiprocessor" in first.text


def test_a_term_used_before_its_definition_fails(tmp_path):
    chapters = {**GOOD, "01_alpha": [
        GOOD["01_alpha"][0],
        "## 0. Before\n\nThe SM is where a kernel runs.",       # SM and kernel, both too early
        *GOOD["01_alpha"][1:]]}
    course = plant(tmp_path, chapters, {"01_alpha": SM + KERNEL})
    problems = course.used_before_defined()
    assert len(problems) == 2 and all("01-md-1" in p for p in problems), problems


def test_a_use_in_an_earlier_chapter_must_define_it_there(tmp_path):
    chapters = {"00_zero": ["# Chapter 00", "## Intro\n\nEvery kernel is timed."], **GOOD}
    course = plant(tmp_path, chapters, {"01_alpha": SM + KERNEL})
    assert [p.split(":")[0] for p in course.used_before_defined()] == ["'kernel' (book/glossary/01_alpha.yml)"]
    # Defined in passing there, in italics, or with a link to the glossary: both pass.
    for intro in ("Every *kernel* (a function the GPU runs) is timed.",
                  "Every [kernel](../../book/glossary.md) is timed."):
        course = plant(tmp_path, {**chapters, "00_zero": ["# Chapter 00", f"## Intro\n\n{intro}"]},
                       {"01_alpha": SM + KERNEL})
        assert course.used_before_defined() == [], intro


def test_bold_is_not_a_definition_and_the_italic_must_be_the_form(tmp_path):
    for wrong in ("Work the GPU runs is a **kernel**.", "Work the GPU runs is *a kernel*."):
        chapters = {**GOOD, "01_alpha": [*GOOD["01_alpha"][:2], f"## 2. Kernels\n\n{wrong}"]}
        course = plant(tmp_path, chapters, {"01_alpha": KERNEL})
        assert len(course.used_before_defined()) == 1, wrong
        assert len(course.undefined_in_home_section()) == 1, wrong
    # Italic code and underscores do define; a definition holds for its own sentence only.
    for right in ("It is a *`kernel`*.", "It is a _kernel_."):
        chapters = {**GOOD, "01_alpha": [*GOOD["01_alpha"][:2], f"## 2. Kernels\n\n{right}"]}
        assert plant(tmp_path, chapters, {"01_alpha": KERNEL}).problems() == [], right


def test_a_definition_in_the_wrong_section_fails(tmp_path):
    misplaced = SM.replace("1. Inside the GPU", "2. Kernels")
    course = plant(tmp_path, GOOD, {"01_alpha": misplaced})
    assert course.used_before_defined() == []
    assert len(course.undefined_in_home_section()) == 1, course.undefined_in_home_section()
    # A subsection belongs to its section; the next heading of the same level ends it.
    chapters = {**GOOD, "01_alpha": [GOOD["01_alpha"][0],
                                     "## 1. Inside the GPU\n\n### Quiz 1\n\nEach is a *streaming multiprocessor*.",
                                     "## 1b. Next\n\nOne SM."]}
    assert plant(tmp_path, chapters, {"01_alpha": SM}).problems() == []


def test_text_in_details_counts_and_headings_math_and_code_do_not(tmp_path):
    chapters = {"01_alpha": [
        "# Chapter 01 — Alpha: the kernel",                           # a heading: not a use
        "## 1. Inside the GPU\n\n$\\mathrm{kernel}$ and\n\n```\nkernel\n```\n\n"
        "<details class=\"going-deeper\"><summary>Going deeper: more</summary>\n\n"
        "The kernel inside a block is read.\n\n</details>",
        "## 2. Kernels\n\nIt is a *kernel*.",
    ]}
    course = plant(tmp_path, chapters, {"01_alpha": KERNEL})
    (problem,) = course.used_before_defined()
    assert "inside a block" in problem


def test_case_and_plurals(tmp_path):
    chapters = {"01_alpha": ["# Chapter 01", "## 1. Inside the GPU\n\nA *streaming multiprocessor*. "
                                             "Small sms are not SMs? Streaming Multiprocessors are."]}
    course = plant(tmp_path, chapters, {"01_alpha": SM})
    texts = [s.text for s in course.uses["streaming multiprocessor"]]
    assert texts == ["A streaming multiprocessor.", "Small sms are not SMs?", "Streaming Multiprocessors are."]
    assert glossary.form_pattern("batch").fullmatch("batches") and glossary.form_pattern("GPU").fullmatch("GPUs")
    assert not glossary.form_pattern("GPU").search("gpu") and glossary.form_pattern("gpu").search("GPU")


def test_the_longest_form_wins_where_forms_overlap(tmp_path):
    scaling = """\
- term: loss scaling
  section: "1. Scaling"
  means: Multiplying the loss so that small gradients survive in fp16.
- term: dynamic loss scaling
  section: "2. Dynamic"
  means: Loss scaling whose factor changes during training.
"""
    chapters = {"01_alpha": ["# Chapter 01", "## 1. Scaling\n\nThis is *loss scaling*.",
                             "## 2. Dynamic\n\n*Dynamic loss scaling* adapts. Dynamic loss scaling again."]}
    course = plant(tmp_path, chapters, {"01_alpha": scaling})
    assert course.problems() == []
    assert len(course.uses["loss scaling"]) == 1 and len(course.uses["dynamic loss scaling"]) == 2
    # Before "loss scaling" is defined, a use of the longer term alone is no use of it.
    chapters["01_alpha"] = [chapters["01_alpha"][0], *reversed(chapters["01_alpha"][1:])]
    assert plant(tmp_path, chapters, {"01_alpha": scaling}).used_before_defined() == []


def test_broken_files_are_named(tmp_path):
    chapters = {"01_alpha": GOOD["01_alpha"]}
    files = {
        "01_alpha": SM + KERNEL + """\
- term: multiprocessor
  forms: [SMs]
  section: "1. Inside the GPU"
  means: Same word as SM.
- term: warp
  section: "9. Nowhere"
  means: A group of 32 threads.
- term: stream
  form: [streams]
  means: ""
""",
        "07_ghost": "- term: ghost\n  section: x\n  means: y\n",
    }
    errors = plant(tmp_path, chapters, files).errors
    assert any("'SM'" in e and "'SMs'" in e and "one term only" in e for e in errors), errors
    assert any("'warp'" in e and "no heading '9. Nowhere'" in e for e in errors), errors
    assert any("'stream'" in e and "section, means" in e for e in errors), errors
    assert any("unknown key form" in e for e in errors), errors
    assert any("07_ghost.yml: no chapter" in e for e in errors), errors


def test_an_unused_term_fails(tmp_path):
    extra = "- term: warp\n  section: \"2. Kernels\"\n  means: A group of 32 threads.\n"
    course = plant(tmp_path, GOOD, {"01_alpha": SM + KERNEL + extra})
    assert [p.split(" ")[0] for p in course.unused()] == ["'warp'"]


def test_write_makes_the_boxes_and_the_page_and_check_finds_them_stale(tmp_path, capsys):
    plant(tmp_path, GOOD, {"01_alpha": SM + KERNEL})
    with pytest.raises(SystemExit) as stopped:
        glossary.main(["--check"], root=tmp_path)
    assert stopped.value.code == 1
    glossary.main(["--write"], root=tmp_path)
    with pytest.raises(SystemExit) as stopped:
        glossary.main(["--check"], root=tmp_path)
    assert stopped.value.code == 0

    alpha = nbformat.read(tmp_path / "solutions/01_alpha/01_alpha.ipynb", as_version=4)
    box = alpha.cells[1]
    assert box.id == glossary.BOX_ID and box.cell_type == "markdown"
    assert box.source.startswith("<details><summary>Words this chapter uses</summary>")
    assert "- **kernel**: A function the GPU runs" in box.source and "From earlier" not in box.source
    beta = nbformat.read(tmp_path / "solutions/02_beta/02_beta.ipynb", as_version=4).cells[1].source
    assert "- **kernel**, from chapter 01: A function" in beta and "streaming" not in beta
    page = (tmp_path / "book" / "glossary.md").read_text()
    assert page.index("**kernel**") < page.index("**streaming multiprocessor** (SM)")
    assert "[chapter 01, 1. Inside the GPU](chapters/01_alpha.ipynb#1-inside-the-gpu)" in page
    # The box is not read as the chapter's text: writing it changes no rule's outcome.
    assert glossary.Course(tmp_path).problems() == []

    # A changed definition makes the page and both boxes stale; a hand-edited box too.
    yml = tmp_path / "book/glossary/01_alpha.yml"
    yml.write_text(yml.read_text().replace("many threads", "many, many threads"))
    stale = glossary.Course(tmp_path).stale()
    assert len(stale) == 3 and "book/glossary.md is stale" in stale, stale
    glossary.main(["--write"], root=tmp_path)
    alpha = nbformat.read(tmp_path / "solutions/01_alpha/01_alpha.ipynb", as_version=4)
    alpha.cells[1].source += "\nA line of my own."
    nbformat.write(alpha, tmp_path / "solutions/01_alpha/01_alpha.ipynb")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        glossary.main(["--check"], root=tmp_path)
    assert stopped.value.code == 1 and "01_alpha.ipynb is stale" in capsys.readouterr().out


def test_a_later_chapters_term_defined_in_passing_is_new_where_it_is_met(tmp_path):
    chapters = {"00_zero": ["# Chapter 00", "## Intro\n\nEach *kernel* (a GPU function) is timed."],
                "01_alpha": ["# Chapter 01", "## 1. Timing\n\nA kernel again."],
                "02_beta": ["# Chapter 02", "## 2. Kernels\n\nIt is a *kernel*, in full."]}
    course = plant(tmp_path, chapters, {"02_beta": KERNEL})
    assert course.problems() == []
    assert "- **kernel**: A function the GPU runs on many threads at once. (Chapter 02 covers it in full.)" \
        in course.box("00_zero")
    assert "- **kernel**, from chapter 00 (chapter 02 covers it in full): A function" in course.box("01_alpha")
    assert "New in this chapter:\n\n- **kernel**: A function" in course.box("02_beta")


def test_heading_anchors_are_myst_slugs(tmp_path):
    chapters = {"01_alpha": ["# Chapter 01 — Alpha", "## 3. Inside `the` GPU's $x$ core",
                             "## 3. Inside `the` GPU's $x$ core"]}
    plant(tmp_path, chapters, {})
    slugs = [slug for _, slug in glossary.chapter_headings(tmp_path / "solutions/01_alpha/01_alpha.ipynb")]
    assert slugs == ["chapter-01--alpha", "3-inside-the-gpus--core", "3-inside-the-gpus--core-1"]
