"""The book: it builds offline with warnings as errors, every chapter is a page, no grading
plumbing shows, internal links resolve, and the formula sheet agrees with gpulab."""
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat
import pytest

from gpulab import arith, precision

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "book" / "_build" / "html"
CHAPTERS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
MARKERS = ["BEGIN SOLUTION", "END SOLUTION", "YOUR CODE HERE", "YOUR ANSWER HERE", "HIDDEN TESTS"]
TEST_CELLS = ["check(&quot;", 'check("']  # a chapter's test cells (the intro may quote one)


@pytest.fixture(scope="module")
def site():
    result = subprocess.run([sys.executable, "scripts/build_book.py"], cwd=ROOT,
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


def parse(page: Path) -> Links:
    links = Links()
    links.feed(page.read_text())
    return links


def pages(site: Path) -> list[Path]:
    return [p for p in site.rglob("*.html") if "_static" not in p.parts]


def test_every_chapter_is_a_page_with_its_device_note(site):
    for chapter in CHAPTERS:
        page = site / "chapters" / f"{chapter}.html"
        text = page.read_text()
        assert "Outputs on this page were produced on" in text, chapter
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


def test_formula_sheet_examples_agree_with_gpulab():
    text = (ROOT / "book" / "formulas.md").read_text()
    table = text.split("<!-- checked examples start -->")[1].split("<!-- checked examples end -->")[0]
    rows = re.findall(r"^\| (.+?) \| `(.+?)` \| ([0-9.]+) \|$", table, flags=re.M)
    assert len(rows) >= 10
    for example, call, shown in rows:
        value = eval(call, {"arith": arith, "precision": precision})  # the page's own gpulab call
        assert value == pytest.approx(float(shown), rel=5e-4), f"{example}: page says {shown}, gpulab {value}"
