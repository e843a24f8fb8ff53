"""The learner's and the instructor's path in a real browser (Debian's Chromium, Playwright),
against JupyterLab started exactly as `make lab` starts it (scripts/browser.py), in a scratch
copy of the course so that autosave and the Formgrader's gradebook stay out of the repository.

- Run All on an untouched release chapter reaches its last cell, no cell raises, and every quiz
  says "not answered yet" (JupyterLab drops the rest of the queue at the first cell that
  raises; tests/test_pipeline.py grades every chapter's untouched release whole in the sandbox,
  which proves the same for every chapter without a browser);
- a quiz answered wrong shows its diagnostic, answered right shows ✔;
- chapter 02's calculator responds to a slider and to an option;
- Nbgrader > Formgrader opens on the first try and lists the chapters;
- no page logs a console error or gets a 5xx.
The built book, opened from disk with the network blocked, is tested in tests/test_book.py.
"""
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

from gpulab.course.checks import load_key_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import browser  # noqa: E402

RUN_ALL_CHAPTER = "08_monitoring"   # the quickest chapter to run top to bottom on a CPU
QUIZ_CHAPTER = RUN_ALL_CHAPTER
CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def chromium():
    with browser.chromium() as b:
        yield b


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    course = browser.scratch_course(tmp_path_factory.mktemp("lab") / "course")
    with browser.jupyterlab(course, log=course / "lab.log") as running:
        yield running


@pytest.fixture
def page(chromium):
    """A fresh page; its console must stay free of errors through the test."""
    page = chromium.new_page(viewport=browser.VIEWPORT)
    console = browser.Console(page)
    yield page
    page.close()
    assert not console.errors, console.errors


def release(chapter: str) -> str:
    return f"notebooks/{chapter}/{chapter}.ipynb"


def outputs_text(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell.get("outputs", []))


@pytest.fixture(scope="module")
def ran_all(chromium, lab):
    """Chapter RUN_ALL_CHAPTER opened, Run All done; (page, console, saved notebook)."""
    page = chromium.new_page(viewport=browser.VIEWPORT)
    console = browser.Console(page)
    browser.open_notebook(lab, page, release(RUN_ALL_CHAPTER))
    saved = browser.run_all_and_wait(page, lab.course / release(RUN_ALL_CHAPTER), timeout_s=240)
    yield page, console, saved
    page.close()


def test_run_all_reaches_the_last_cell_and_every_quiz_says_not_answered(ran_all):
    page, console, saved = ran_all
    code = [c for c in saved["cells"] if c["cell_type"] == "code"]
    errors = [(c["id"], o["ename"]) for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, f"Run All stopped at a raising cell: {errors}"
    assert all(c["execution_count"] is not None for c in code), "Run All did not run every cell"
    tests = [c for c in code if c["source"].startswith("check(")]
    assert len(tests) >= 8
    for cell in tests:
        text = outputs_text(cell)
        assert "not answered yet" in text and "✘" not in text, (cell["id"], text)
    assert not console.errors, console.errors


def test_a_quiz_shows_its_diagnostic_when_wrong_and_a_tick_when_right(ran_all):
    page, console, saved = ran_all
    items = load_key_module(ROOT / "autograder" / "keys" / f"{QUIZ_CHAPTER}.py")
    test_cell = next(c for c in saved["cells"] if c["source"].startswith("check("))
    item_id, variable = test_cell["source"].removeprefix("check(").rstrip(")").split(", ")
    item = items[item_id.strip('"')]
    answer_cell = page.locator(".jp-CodeCell", has_text=f"{variable} = ...").first
    for answer, shown in [(item.mistakes[0].value, item.mistakes[0].says), (item.value, "✔")]:
        answer_cell.scroll_into_view_if_needed()
        answer_cell.locator(".cm-content").click()
        page.keyboard.press("Control+a")
        page.keyboard.type(f"{variable} = {answer!r}")
        page.keyboard.press("Shift+Enter")    # runs the answer, selects its test cell
        page.keyboard.press("Shift+Enter")    # runs the test cell
        verdict = page.locator(".jp-CodeCell", has_text=f"check({item_id}, {variable})")
        verdict.locator(".gpulab-check", has_text=shown[:60]).wait_for(timeout=30_000)
        answer_cell = page.locator(".jp-CodeCell", has_text=f"{variable} = {answer!r}").first
    assert not page.locator(".jp-OutputArea-output[data-mime-type*=error]").count()
    assert not console.errors, console.errors


def test_the_calculator_responds_to_a_slider_and_an_option(lab, page):
    browser.open_notebook(lab, page, release("02_vram_arithmetic"))
    cell = page.locator(".jp-CodeCell", has_text="memory_calculator(").first
    cell.scroll_into_view_if_needed()
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    calculator = cell.locator(".jp-OutputArea-output").first
    calculator.locator("img").first.wait_for(timeout=60_000)    # drawn: the layout has settled
    total = calculator.locator("b", has_text="Total per GPU")
    before = total.inner_text()

    slider = calculator.locator(".widget-slider", has_text="micro-batch").first
    slider.scroll_into_view_if_needed()
    box = slider.locator(".noUi-handle").first.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] / 2, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 40, y, steps=5)   # a small drag: 40 px
    page.mouse.up()
    expect(total).not_to_have_text(before, timeout=30_000)
    moved = int(slider.locator(".widget-readout").inner_text())
    assert 1 < moved <= 16, f"a 40 px drag moved micro-batch from 1 to {moved}"

    after_slider = total.inner_text()
    calculator.locator("button", has_text="full").first.click()      # recompute: full
    expect(total).not_to_have_text(after_slider, timeout=30_000)


def test_formgrader_opens_on_the_first_try_and_lists_the_chapters(lab, page):
    lab.open(page, "notebooks")                       # the file browser: no kernel needed
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").wait_for(timeout=60_000)
    browser.menu(page, "Nbgrader", "Formgrader")
    frame = page.frame_locator("iframe").last
    for chapter in CHAPTERS:
        frame.locator("td, a", has_text=chapter).first.wait_for(timeout=60_000)
    assert (lab.course / "autograder" / "gradebook.db").exists()
