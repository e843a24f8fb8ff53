"""`make book`: the course as a static site with Jupyter Book 1.x, built offline.

1. Each solution notebook becomes a page in book/chapters/ (generated, not committed):
   - a worked answer cell keeps only its solution, hidden behind a "Show answer" toggle;
   - test cells (grading plumbing) are removed from the page (they still run, so a wrong
     worked answer would show up as an error in the build);
   - a written answer becomes a collapsed "model answer" dropdown;
   - a markdown cell that is one `<details class="going-deeper">` or `<details class="why">`
     block, and the generated "Words this chapter uses" box (scripts/glossary.py), become closed
     sphinx-design dropdowns titled by their summary (markdown, math and code inside intact);
   - nbgrader's metadata and markers are dropped;
   - a first cell prints which device, torch version and date produced the page's outputs.
2. MathJax is copied from the sphinx-mathjax-offline package into book/_build/offline_static, so
   the pages render formulas with no network (book/_config.yml points Sphinx at it).
3. `jupyter-book build book -W` executes the pages (cached in book/_build/.jupyter_cache, so an
   unchanged chapter is not run again) and writes book/_build/html; any warning fails the build.
   Quiz checks run strict (GPULAB_STRICT_CHECKS=1): a wrong worked answer stops the build.
   `--execute 08_monitoring ...` executes only those chapters (the others are pages without
   outputs, and without the device note, which only an executed page can give): tests/test_book.py
   builds so, because `make test` already runs every solution whole where it is graded.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
CHAPTERS = BOOK / "chapters"

DEVICE_NOTE = r'''
import datetime, platform, torch
from gpulab.device import best_device
where = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
         else f"the CPU ({platform.processor() or platform.machine()}), no GPU: experiments at reduced size")
print(f"Outputs on this page were produced on {where};\n"
      f"torch {torch.__version__}, {datetime.date.today().isoformat()}.")'''


def worked_answer(source: str) -> str:
    """An answer cell's worked solution, without the `name = ...` stub and the markers."""
    inside = source.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
    return inside.strip("\n")


# A markdown cell that is exactly one collapsed block (the course's prose conventions, issues 35-36).
DETAILS_CELL = re.compile(r'\A\s*<details(?:\s+class="(?P<kind>[\w-]+)")?\s*>\s*<summary>(?P<title>.*?)</summary>'
                          r'(?P<body>.*)</details>\s*\Z', re.S)
DROPDOWN_KINDS = ("going-deeper", "why")
WORDS_BOX_ID = "words-this-chapter-uses"      # scripts/glossary.py's box
GLOSSARY_FROM_NOTEBOOK, GLOSSARY_FROM_PAGE = "../../book/glossary.md", "../glossary.md"


def dropdown(title: str, body: str, css_class: str) -> str:
    """A closed sphinx-design dropdown in a colon fence (a backtick fence's info string may not
    hold the backticks of a title's inline code), longer than any colon fence inside."""
    longest = max((len(m) for m in re.findall(r"^\s*(:{3,})", body, flags=re.M)), default=0)
    fence = ":" * max(3, longest + 1)
    return f"{fence}{{dropdown}} {title.strip()}\n:class-container: {css_class}\n\n{body.strip()}\n{fence}"


def as_dropdown(cell) -> str | None:
    """The dropdown a markdown cell becomes, or None when it is not one collapsed block."""
    match = DETAILS_CELL.match(cell.source)
    if not match or "<details" in match["body"]:
        return None
    if cell.get("id") == WORDS_BOX_ID:
        body = match["body"].replace(f"]({GLOSSARY_FROM_NOTEBOOK})", f"]({GLOSSARY_FROM_PAGE})")
        return dropdown(match["title"], body, "words-this-chapter-uses")
    if match["kind"] in DROPDOWN_KINDS:
        return dropdown(match["title"], match["body"], match["kind"])
    return None


def page_from(solution: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(solution, as_version=4)
    cells = []
    for cell in nb.cells:
        meta = cell.metadata.pop("nbgrader", {})
        tags = cell.metadata.setdefault("tags", [])
        if meta.get("solution") and cell.cell_type == "code":
            cell.source = worked_answer(cell.source)
            tags.append("hide-input")
        elif meta.get("grade") and cell.cell_type == "code":
            tags.append("remove-cell")
        elif meta.get("solution") and cell.cell_type == "markdown":
            cell.source = f"````{{dropdown}} Show a model answer\n{cell.source.strip()}\n````"
        elif cell.cell_type == "markdown" and (collapsed := as_dropdown(cell)) is not None:
            cell.source = collapsed
        if "memory_calculator(" in cell.source:
            # An interactive widget needs a live kernel; the static page says so instead.
            tags.append("remove-output")
            cells.append(cell)
            cells.append(nbformat.v4.new_markdown_cell(
                "*(The calculator is interactive in JupyterLab: run this notebook to use it.)*"))
            continue
        cells.append(cell)
    note = nbformat.v4.new_code_cell(DEVICE_NOTE, metadata={"tags": ["remove-input"]})
    nb.cells = cells[:1] + [note] + cells[1:]   # right under the chapter's title
    for i, cell in enumerate(nb.cells):
        cell.id = f"page-{i:03d}"
    nb.metadata.pop("title", None)
    return nb


def copy_mathjax(dest: Path) -> None:
    """MathJax 3's TeX-to-SVG bundle and the pieces it loads on demand (TeX extensions, the
    menu), from the sphinx-mathjax-offline package: about 3.5 MB of its 24."""
    package = importlib.metadata.distribution("sphinx-mathjax-offline")
    source = Path(package.locate_file("sphinx-mathjax-offline/static/mathjax"))
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "input" / "tex").mkdir(parents=True)
    shutil.copy(source / "tex-svg.js", dest)
    for folder in ("ui", "a11y", "input/tex/extensions"):
        shutil.copytree(source / folder, dest / folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--execute", nargs="+", metavar="CHAPTER",
                        help="execute only these chapters' pages (default: all)")
    args = parser.parse_args()
    CHAPTERS.mkdir(exist_ok=True)
    for old in CHAPTERS.glob("*.ipynb"):
        old.unlink()
    for solution in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        page = page_from(solution)
        if args.execute is not None and solution.stem not in args.execute:
            page.metadata["mystnb"] = {"execution_mode": "off"}    # myst-nb's per-page setting
        nbformat.write(page, CHAPTERS / solution.name)
    copy_mathjax(BOOK / "_build" / "offline_static" / "mathjax")
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    subprocess.run([str(jupyter_book), "build", str(BOOK), "-W", "--keep-going"], check=True,
                   env={**os.environ, "GPULAB_STRICT_CHECKS": "1"})
    print(f"book: {BOOK / '_build' / 'html' / 'index.html'}")


if __name__ == "__main__":
    main()
