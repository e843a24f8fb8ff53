"""The learner's and the instructor's path in a real browser (Debian's Chromium, Playwright),
against JupyterLab started exactly as `make lab` (the learner's lab) and `make formgrader` (the
instructor's) start it (scripts/browser.py), both in one scratch copy of the course so that
autosave and the Formgrader's gradebook stay out of the repository.

- Run All on an untouched release chapter reaches its last cell, no cell raises, and every quiz
  says "not answered yet" (JupyterLab drops the rest of the queue at the first cell that
  raises; tests/test_pipeline.py grades every chapter's untouched release whole in the sandbox,
  which proves the same for every chapter without a browser);
- a quiz answered wrong shows its diagnostic, answered right shows ✔;
- the tally at the end of the chapter counts the quizzes answered and right, and its links lead
  to the check cells of the quizzes still open;
- chapter 02's calculator responds to a slider and to an option;
- the learner's lab shows no instructor tool (no Nbgrader menu, no Create Assignment sidebar, no
  Validate button, no Formgrader page) and writes nothing into autograder/;
- a markdown table wider than the notebook (chapter 09's "One table, five spellings") scrolls
  sideways within its cell (lab/custom/custom.css);
- the instructor's lab has nbgrader's tools, and Nbgrader > Formgrader opens on the first try and
  lists the chapters; neither the instructor's workspace nor one in ~/.jupyter is restored into
  the learner's lab;
- no page logs a console error or gets a 5xx.
The built book, opened from disk with the network blocked, is tested in tests/test_book.py.
"""
import json
import re
import sys
import urllib.error
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import expect

from gpulab.course.checks import load_key_module

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import add_progress_cell  # noqa: E402
import browser  # noqa: E402

RUN_ALL_CHAPTER = "08_monitoring"   # the quickest chapter to run top to bottom on a CPU
QUIZ_CHAPTER = RUN_ALL_CHAPTER
CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def chromium():
    with browser.chromium() as b:
        yield b


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The learner's lab (`make lab`); ``autograder_files``: what autograder/ held when it started."""
    course = browser.scratch_course(tmp_path_factory.mktemp("lab") / "course")
    # The chapters' last cell, the learner's tally, as scripts/add_progress_cell.py adds it.
    add_progress_cell.add_progress_cell(course / release(RUN_ALL_CHAPTER))
    with browser.jupyterlab(course, log=course / "lab.log") as running:
        running.autograder_files = files_under(course / "autograder")
        yield running


@pytest.fixture(scope="module")
def instructor_lab(lab):
    """The instructor's lab (`make formgrader`) in the same course, started only for the test
    that needs it."""
    with browser.jupyterlab(lab.course, log=lab.course / "instructor-lab.log", target="formgrader") as running:
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


def test_the_tally_counts_the_answers_and_links_to_the_quizzes_still_open(ran_all):
    page, console, saved = ran_all     # after Run All, one quiz answered wrong, then right
    quizzes = sum(c["source"].startswith("check(") for c in saved["cells"])
    assert f"0 of {quizzes} quizzes answered, 0 right" in outputs_text(saved["cells"][-1])
    tally = page.locator(".jp-CodeCell", has_text=f'tally("{RUN_ALL_CHAPTER}")')
    tally.scroll_into_view_if_needed()
    tally.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    box = tally.locator(".gpulab-progress")
    expect(box).to_contain_text(f"1 of {quizzes} quizzes answered, 1 right", timeout=30_000)
    link = box.locator("a[href*='#cell-id=']").first     # the first quiz not answered yet
    item = link.inner_text()
    link.click()
    expect(page.locator(".jp-CodeCell", has_text=f'check("{item}"')).to_be_in_viewport(timeout=10_000)
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


INSTRUCTOR_TOOLS = {"menu": "Nbgrader", "toolbar": "Validate", "sidebar": "Nbgrader Create Assignment"}


def instructor_tools_in_view(page) -> set[str]:
    """Which of nbgrader's tools an open notebook's JupyterLab shows."""
    shown = {
        "menu": page.locator(".lm-MenuBar-itemLabel").all_inner_texts(),
        "toolbar": page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Toolbar").first.inner_text().split(),
        "sidebar": page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab").evaluate_all(
            "tabs => tabs.map(tab => tab.title || tab.innerText)"),
    }
    return {tool for tool, label in INSTRUCTOR_TOOLS.items() if label in shown[tool]}


def test_the_learners_lab_shows_no_instructor_tool_and_writes_nothing_into_autograder(ran_all, lab):
    page, console, _ = ran_all     # chapter 08, Run All done, two quizzes answered
    assert instructor_tools_in_view(page) == set()
    with pytest.raises(urllib.error.HTTPError) as formgrader:
        lab.api("/formgrader")
    assert formgrader.value.code == 404
    assert files_under(lab.course / "autograder") == lab.autograder_files
    assert not console.errors, console.errors


def test_a_table_wider_than_the_notebook_scrolls_sideways(lab, page):
    # Chapter 09's markdown cells that hold a table, in a notebook of their own beside it (the
    # whole chapter would take its long scroll to render: JupyterLab renders a cell in view).
    chapter = nbformat.read(lab.course / release("09_frameworks"), as_version=4)
    with_tables = [c for c in chapter.cells if c.cell_type == "markdown" and re.search(r"^\|[ :|-]+\|$", c.source, re.M)]
    nb = nbformat.v4.new_notebook(cells=with_tables, metadata=chapter.metadata)
    nbformat.write(nb, lab.course / "notebooks" / "09_frameworks" / "tables.ipynb")
    lab.open(page, "notebooks/09_frameworks/tables.ipynb")
    page.locator(".jp-RenderedMarkdown table").first.wait_for(timeout=90_000)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer").evaluate("""async scroller => {
        while (scroller.scrollTop + scroller.clientHeight < scroller.scrollHeight - 1) {
            scroller.scrollTop += scroller.clientHeight;
            await new Promise(r => setTimeout(r, 200));
        }
    }""")
    blocks = sum(len(re.findall(r"^\|[ :|-]+\|$", c.source, re.M)) for c in with_tables)
    expect(page.locator(".jp-RenderedMarkdown table")).to_have_count(blocks, timeout=30_000)
    # Each table in view (off-screen cells are not laid out), then: how far past its cell it
    # runs, whether its content is wider than its box, and whether it scrolls.
    tables = page.locator(".jp-RenderedMarkdown table").evaluate_all("""async tables => {
        const found = [];
        for (const t of tables) {
            t.scrollIntoView();
            await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
            const cell = t.closest('.jp-Cell-inputWrapper, .jp-OutputArea-output');
            const past = t.getBoundingClientRect().right - cell.getBoundingClientRect().right;
            const wide = t.scrollWidth > t.clientWidth + 1;
            t.scrollLeft = 200;
            found.push({past, wide, scrolls: t.scrollLeft > 0, text: t.innerText.slice(0, 60)});
        }
        return found;
    }""")
    assert len(tables) == blocks >= 2
    for table in tables:
        assert table["past"] <= 1, f"a table runs {table['past']:.0f} px past its cell: {table['text']!r}"
        assert table["scrolls"] == table["wide"], table
    assert any(t["wide"] for t in tables), "no table of chapter 09 is wider than the notebook any more"
    page.goto("about:blank")        # the notebook closed before its kernel goes
    lab.close_sessions()


def plant_workspace(folder: Path, opens: str) -> None:
    """A default workspace that reopens the file ``opens`` in an editor tab."""
    from jupyterlab_server.workspaces_handler import WorkspacesManager

    tab = f"editor:{opens}"
    WorkspacesManager(str(folder)).save("default", json.dumps({"metadata": {"id": "default"}, "data": {
        "layout-restorer:data": {"main": {"dock": {"type": "tab-area", "currentIndex": 0, "widgets": [tab]},
                                          "current": tab}},
        tab: {"data": {"path": opens, "factory": "Editor"}}}}))


def tab_titles(page) -> list[str]:
    """The main area's tabs, once JupyterLab has restored its workspace (the status bar comes
    after the restore: a tab it reopens is there a moment later)."""
    page.locator(".jp-StatusBar-Item").first.wait_for(state="attached", timeout=60_000)
    page.wait_for_timeout(3000)
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel").all_inner_texts()


# Last in the module: the Formgrader writes autograder/gradebook.db into the course both labs share.
def test_the_instructors_lab_has_nbgraders_tools_and_the_formgrader_lists_the_chapters(instructor_lab, lab, page):
    # Workspaces the learner's lab must not restore: the instructor's, and one in ~/.jupyter (the
    # default place, where every lab that keeps no workspace of its own saves).
    plant_workspace(lab.course / ".lab-workspaces" / "instructor", "autograder/release.py")
    plant_workspace(lab.course / ".jupyter" / "lab" / "workspaces", "autograder/grade.py")
    page.goto(f"{instructor_lab.url}/lab?token={instructor_lab.token}")
    assert "release.py" in tab_titles(page), "the planted workspace was not restored where it belongs"
    for own in (lab.course / ".lab-workspaces" / "learner").iterdir():
        own.unlink()                # the learner's own, with the chapters opened above
    page.goto(f"{lab.url}/lab?token={lab.token}")
    assert not {"release.py", "grade.py"} & set(tab_titles(page)), "another lab's workspace reopened"

    browser.open_notebook(instructor_lab, page, release(QUIZ_CHAPTER))
    assert instructor_tools_in_view(page) == set(INSTRUCTOR_TOOLS)
    browser.menu(page, "Nbgrader", "Formgrader")
    frame = page.frame_locator("iframe").last
    for chapter in CHAPTERS:
        frame.locator("td, a", has_text=chapter).first.wait_for(timeout=60_000)
    assert (lab.course / "autograder" / "gradebook.db").exists()
