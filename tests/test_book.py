"""The book: it builds offline with warnings as errors, every chapter is a page, no grading
plumbing shows, collapsed blocks are closed dropdowns, internal links resolve, the formula sheet
agrees with gpulab, and in Chromium, opened from disk with the network blocked, every page
renders its formulas (the book ships its own MathJax), shows no raw TeX and no MathJax error, runs
nothing past its text column that does not scroll, logs no error, has one search field, and an
answer toggle opens.

One chapter's page is executed (EXECUTED, the cheapest): the path of `make book`, strict checks
and the device note included. Every solution runs whole where it is graded (tests/test_pipeline.py:
the solver submits the worked answers and is graded with the experiments); executing every page
here too would run each chapter twice."""
import functools
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest

import gpulab.batch_size.lr_scaling  # noqa: F401  the formula sheet's chapter 10 rows call
import gpulab.batch_size.noise_scale  # noqa: F401  batch_size.<module>.<name>
import gpulab.batch_size.planning  # noqa: F401
import gpulab.batch_size.tradeoff  # noqa: F401
from gpulab import arith, batch_size, precision

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "book" / "_build" / "html"
CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
EXECUTED = "08_monitoring"
MARKERS = ["BEGIN SOLUTION", "END SOLUTION", "YOUR CODE HERE", "YOUR ANSWER HERE", "HIDDEN TESTS"]
TEST_CELLS = ["check(&quot;", 'check("']  # a chapter's test cells (the intro may quote one)


@pytest.fixture(scope="module")
def site():
    result = subprocess.run([sys.executable, "scripts/build_book.py", "--execute", EXECUTED], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return HTML


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        for name in ("href", "src"):
            if attrs.get(name):
                self.links.append(attrs[name])


@functools.cache   # a page is read once, however many links point into it (pages are large)
def parse(page: Path) -> Links:
    links = Links()
    links.feed(page.read_text())
    return links


def pages(site: Path) -> list[Path]:
    return [p for p in site.rglob("*.html") if "_static" not in p.parts]


def test_every_chapter_is_a_page_and_the_executed_one_has_its_device_note(site):
    for chapter in CHAPTERS:
        page = site / "chapters" / f"{chapter}.html"
        text = page.read_text()
        # Only an executed page says where its outputs were produced; a page left unexecuted has none.
        assert ("Outputs on this page were produced on" in text) == (chapter == EXECUTED), chapter
        answers = sum(1 for c in nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", 4).cells
                      if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution"))
        assert text.count("Show answer") >= answers, f"{chapter}: a quiz without its answer toggle"
        assert "Show a model answer" in text
    for name in ("intro.html", "formulas.html", "search.html"):
        assert (site / name).exists(), name


def test_no_page_shows_grading_plumbing(site):
    for page in pages(site):
        text = page.read_text()
        for marker in MARKERS + (TEST_CELLS if page.parent.name == "chapters" else []):
            assert marker not in text, f"{page.relative_to(site)} shows {marker!r}"


def test_collapsed_blocks_become_closed_dropdowns():
    """A markdown cell that is one "Going deeper" or "Why" block, or the glossary's box, becomes a
    closed sphinx-design dropdown titled by its summary, its markdown intact (a fence inside is
    shorter than the dropdown's; a title may hold inline code, which a backtick fence's info string
    may not); anything else stays as it is."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from build_book import as_dropdown

    body = "Some *text* and $x$.\n\n$$ t = \\alpha $$\n\n```python\nprint(1)\n```\n\n::::{note}\nnested\n::::"
    cell = nbformat.v4.new_markdown_cell(
        f'<details class="going-deeper"><summary>Going deeper: `cudaMemcpy` and $\\alpha$</summary>\n\n{body}\n\n</details>\n')
    assert as_dropdown(cell) == (":::::{dropdown} Going deeper: `cudaMemcpy` and $\\alpha$\n"
                                 f":class-container: going-deeper\n\n{body}\n:::::")
    why = nbformat.v4.new_markdown_cell('<details class="why"><summary>Why (open it after you have checked your '
                                        'answer)</summary>\n\nBecause.\n\n</details>')
    assert as_dropdown(why) == ":::{dropdown} Why (open it after you have checked your answer)\n:class-container: why\n\nBecause.\n:::"
    box = nbformat.v4.new_markdown_cell("<details><summary>Words this chapter uses</summary>\n\n- **SM**: ...\n\n"
                                        "[the glossary](../../book/glossary.md).\n\n</details>")
    box.id = "words-this-chapter-uses"
    assert as_dropdown(box) == (":::{dropdown} Words this chapter uses\n:class-container: words-this-chapter-uses\n\n"
                                "- **SM**: ...\n\n[the glossary](../glossary.md).\n:::")
    for source in ('<details><summary>Anything</summary>\n\nx\n\n</details>',          # no class of ours
                   'Prose first.\n\n<details class="why"><summary>Why</summary>\n\nx\n\n</details>',
                   '<details class="why"><summary>Why</summary>\n\nx\n\n</details>\n\nProse after.',
                   '<details class="why"><summary>A</summary>\n\nx\n\n</details>\n'
                   '<details class="why"><summary>B</summary>\n\ny\n\n</details>'):
        assert as_dropdown(nbformat.v4.new_markdown_cell(source)) is None, source


def _collapsed_cells(chapter: str) -> list[tuple[str, str]]:
    """(class, title) of each cell of a chapter that the book turns into a dropdown."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from build_book import DETAILS_CELL, as_dropdown

    nb = nbformat.read(ROOT / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    found = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and as_dropdown(cell):
            kind = "words-this-chapter-uses" if cell.id == "words-this-chapter-uses" else DETAILS_CELL.match(cell.source)["kind"]
            found.append((kind, DETAILS_CELL.match(cell.source)["title"].strip()))
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_collapsed_block_is_a_closed_dropdown_on_its_page(site, chapter):
    html = (site / "chapters" / f"{chapter}.html").read_text()
    shown = re.findall(r'<details class="sd-sphinx-override sd-dropdown[^"]*? (going-deeper|why|words-this-chapter-uses)"([^>]*)>', html)
    expected = _collapsed_cells(chapter)
    assert [kind for kind, _ in shown] == [kind for kind, _ in expected]
    assert all("open" not in attributes for _, attributes in shown), "a dropdown open by default"


def test_internal_links_resolve(site):
    checked = 0
    for page in pages(site):
        for link in parse(page).links:
            url = urlparse(link)
            if url.scheme or link.startswith(("//", "mailto:")) or not (url.path or url.fragment):
                continue
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            assert target.exists(), f"{page.relative_to(site)} links to missing {link}"
            if url.fragment and target.suffix == ".html":
                assert url.fragment in parse(target).ids, f"{page.relative_to(site)}: no #{url.fragment} in {target.name}"
            checked += 1
    assert checked > 50


# --------------------------------------------------------------------------------------------
# The built book in a real browser, opened from disk with every non-local request blocked


@pytest.fixture(scope="module")
def chromium():
    sys.path.insert(0, str(ROOT / "scripts"))
    import browser

    with browser.chromium() as b:
        yield b, browser


def open_offline(chromium, page_file: Path):
    b, browser = chromium
    page = b.new_page(viewport=browser.VIEWPORT)
    console = browser.Console(page)
    browser.only_local(page, console)
    page.goto(page_file.as_uri())
    page.wait_for_load_state("load")
    return page, console


# What a reader would see go wrong, read from the page once MathJax has typeset it, with every
# dropdown opened (their content is laid out too):
# - raw TeX in the text (outside code and formulas): a backslash command, a TeX escape such as
#   `\_`, a `$`; or inside a formula, a backslash MathJax left as text (`\text{train\_batch\_size}`
#   without the textmacros package showed `train\_batch\_size`);
# - a formula MathJax could not parse (an merror node);
# - a table, code block, formula or image that runs past the text column without a container of
#   its own that scrolls sideways (headless Chromium draws no scrollbars, so "has a scrollbar"
#   is read as: an ancestor inside the column with overflow-x auto or scroll).
RENDER_PROBE = r"""async () => {
  if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
  document.querySelectorAll("details").forEach(d => d.open = true);
  const article = document.querySelector("article.bd-article");
  const skip = "pre, code, kbd, samp, script, style, textarea, mjx-container, .highlight, svg, math";
  const tex = /\\[A-Za-z]+|\\[\\_{}^%&#$,;!()\[\]]|\$/;
  const raw = [];
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode())
    if (!n.parentElement.closest(skip) && tex.test(n.textContent)) raw.push(n.textContent.trim().slice(0, 160));
  for (const t of article.querySelectorAll("mjx-assistive-mml mtext, mjx-assistive-mml mi"))
    if (t.textContent.includes("\\")) raw.push("in a formula: " + t.textContent);
  const errors = Array.from(article.querySelectorAll("mjx-container"))
    .filter(f => f.querySelector('mjx-merror, merror, [data-mml-node="merror"]'))
    .map(f => f.querySelector('mjx-merror, merror, [data-mml-node="merror"]').textContent.slice(0, 120));
  const right = article.getBoundingClientRect().right + 1;
  const wide = [];
  for (const el of article.querySelectorAll("table, pre, mjx-container[display=true], img")) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= right) continue;
    let scrolls = false;
    for (let a = el; a && a !== article && !scrolls; a = a.parentElement)
      scrolls = ["auto", "scroll"].includes(getComputedStyle(a).overflowX) && a.getBoundingClientRect().right <= right;
    if (!scrolls) wide.push(`${el.tagName.toLowerCase()} to ${Math.round(box.right)} px, column ends at ` +
                            `${Math.round(right)}: ${el.textContent.trim().slice(0, 60)}`);
  }
  return {raw, errors, wide};
}"""


@functools.cache     # each page is opened once for the tests that read it
def rendered(site: Path, chromium, name: str) -> dict:
    page, console = open_offline(chromium, site / f"{name}.html")
    formulas = page.locator(".math").count()        # what Sphinx marked as math
    if formulas:
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                               timeout=20_000)
        page.evaluate("() => MathJax.startup.promise.then(() => true)")   # first typesetting
    # One MathJax container per formula (an \underbrace nests an svg in the formula's svg).
    report = {"formulas": formulas, "typeset": page.locator(".math mjx-container").count(),
              "searches": sum(e.is_visible() for e in page.locator(
                  "input[type=search], .search-button-field, .search-button").all())}
    report |= page.evaluate(RENDER_PROBE)
    page.close()
    return report | {"console": console}


PAGES = ["intro", "teaching", "workshop", "formulas", "glossary", *(f"chapters/{c}" for c in CHAPTERS)]


@pytest.mark.parametrize("name", PAGES)
def test_pages_work_offline_with_math_rendered_and_one_search_field(site, chromium, name):
    report = rendered(site, chromium, name)
    assert report["typeset"] == report["formulas"], "raw LaTeX left"
    assert report["searches"] == 1, f"{report['searches']} search fields"
    assert not report["console"].blocked, f"the page asks the network for {report['console'].blocked}"
    assert not report["console"].errors, report["console"].errors


@pytest.mark.parametrize("name", PAGES)
def test_pages_show_no_raw_tex_and_no_math_error(site, chromium, name):
    report = rendered(site, chromium, name)
    assert not report["raw"], "raw TeX in view:\n" + "\n".join(report["raw"])
    assert not report["errors"], f"MathJax could not typeset: {report['errors']}"


@pytest.mark.parametrize("name", PAGES)
def test_nothing_runs_past_the_text_column_without_scrolling(site, chromium, name):
    report = rendered(site, chromium, name)
    assert not report["wide"], "\n".join(report["wide"])


def test_the_render_checks_catch_planted_faults(site, chromium):
    """The probe on a page with a raw `\\text{...}` and `$` in its text, a formula MathJax cannot
    parse, a table too wide and a wide table that scrolls (which is fine)."""
    page, _ = open_offline(chromium, site / "chapters" / f"{CHAPTERS[0]}.html")   # a page with MathJax
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
    page.evaluate(r"""async () => {
      await MathJax.startup.promise;
      const article = document.querySelector("article.bd-article");
      const p = document.createElement("p");
      p.textContent = "the knob \\text{train\\_batch\\_size} costs $b$";
      article.append(p, MathJax.tex2svg("\\frac{1}{", {display: true}));
      const wide = "<table><tr><td style='white-space: nowrap'>" + "too wide ".repeat(40) + "</td></tr></table>";
      article.insertAdjacentHTML("beforeend", wide + "<div style='overflow-x: auto'>" + wide.replace("too", "fine") + "</div>");
    }""")
    report = page.evaluate(RENDER_PROBE)
    page.close()
    assert report["raw"] == ["the knob \\text{train\\_batch\\_size} costs $b$"]
    assert len(report["errors"]) == 1
    assert len(report["wide"]) == 1 and "too wide" in report["wide"][0]


def test_some_chapter_shows_formulas(site):
    assert any('class="math' in (site / "chapters" / f"{c}.html").read_text() for c in CHAPTERS)


def test_an_answer_toggle_opens(site, chromium):
    page, console = open_offline(chromium, site / "chapters" / f"{CHAPTERS[0]}.html")
    details = page.locator("details.hide", has_text="Show answer").first
    answer = details.locator(".cell_input").first
    details.scroll_into_view_if_needed()
    assert not answer.is_visible()
    details.locator("summary").click()
    answer.wait_for(state="visible", timeout=5_000)
    page.close()
    assert not console.errors and not console.blocked, (console.errors, console.blocked)


def test_formula_sheet_examples_agree_with_gpulab():
    text = (ROOT / "book" / "formulas.md").read_text()
    table = text.split("<!-- checked examples start -->")[1].split("<!-- checked examples end -->")[0]
    rows = re.findall(r"^\| (.+?) \| `(.+?)` \| ([0-9.]+) \|$", table, flags=re.M)
    assert len(rows) >= 10
    for example, call, shown in rows:
        value = eval(call, {"arith": arith, "precision": precision, "batch_size": batch_size})  # the page's own gpulab call
        assert value == pytest.approx(float(shown), rel=5e-4), f"{example}: page says {shown}, gpulab {value}"
