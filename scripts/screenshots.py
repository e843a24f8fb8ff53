"""`make screenshots`: a PNG of each chapter's key views, taken in JupyterLab by the same browser
driver as the browser tests (scripts/browser.py), into book/screenshots/.

For each chapter's release notebook (in a scratch copy of the course): Run All, then
- <NN>-quiz.png: the first quiz answered with its first typical mistake, showing the diagnosis;
- <NN>-plot.png: the chapter's main plot (the first cell that calls the plot named below);
- 02-calculator.png: chapter 02's memory calculator.
The README and the book's landing page show some of them. About 1-2 minutes per chapter on a
2-core CPU:  python scripts/screenshots.py [NN_topic ...]
"""
from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

import browser
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "book" / "screenshots"
sys.path.insert(0, str(ROOT))
from gpulab.course.checks import load_key_module  # noqa: E402

MAIN_PLOT = {   # the call that draws each chapter's main plot
    "01_device_basics": "plots.by_size(",
    "02_vram_arithmetic": "plots.stacked_bars(",
    "03_throughput": "plots.roofline(",
    "04_mixed_precision": "plots.by_size(",
    "05_checkpointing_accumulation": "plots.bars(",
    "06_data_parallel": "plots.bars(",
}


def save_png(png: bytes, path: Path) -> None:
    """Write a screenshot as a small palette PNG (a few dozen KB), readable in any viewer."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KB)")


def region(page, *locators, pad: int = 6) -> bytes:
    """One screenshot spanning several elements (e.g. an answer cell and its check)."""
    boxes = [loc.bounding_box() for loc in locators]
    x0, y0 = min(b["x"] for b in boxes) - pad, min(b["y"] for b in boxes) - pad
    x1 = max(b["x"] + b["width"] for b in boxes) + pad
    y1 = max(b["y"] + b["height"] for b in boxes) + pad
    return page.screenshot(clip={"x": max(x0, 0), "y": max(y0, 0), "width": x1 - x0, "height": y1 - y0})


def quiz_view(page, chapter: str, saved: dict) -> bytes:
    items = load_key_module(ROOT / "autograder" / "keys" / f"{chapter}.py")
    test = next(c for c in saved["cells"] if c["source"].startswith("check("))
    item_id, variable = test["source"].removeprefix("check(").rstrip(")").split(", ")
    mistake = items[item_id.strip('"')].mistakes[0]
    answer_cell = page.locator(".jp-CodeCell", has_text=f"{variable} = ...").first
    answer_cell.scroll_into_view_if_needed()
    answer_cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    page.keyboard.type(f"{variable} = {mistake.value!r}")
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    check_cell = page.locator(".jp-CodeCell", has_text=f"check({item_id}, {variable})").first
    check_cell.locator(".gpulab-check-wrong").wait_for(timeout=30_000)
    answer_cell = page.locator(".jp-CodeCell", has_text=f"{variable} = {mistake.value!r}").first
    question = answer_cell.locator("xpath=preceding-sibling::div[contains(@class, 'jp-MarkdownCell')][1]")
    parts = ([question] if question.count() else []) + [answer_cell, check_cell]
    parts[0].scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    return region(page, *parts)


def plot_view(page, marker: str | None) -> bytes:
    """The output image of the first cell calling ``marker`` (None: the notebook's first plot)."""
    cells = page.locator(".jp-CodeCell", has_text=marker) if marker else page.locator(".jp-CodeCell")
    image = cells.locator(".jp-OutputArea-output img").first
    image.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    return image.screenshot()


def calculator_view(page) -> bytes:
    cell = page.locator(".jp-CodeCell", has_text="memory_calculator(").first
    output = cell.locator(".jp-OutputArea-output").first
    output.locator(".widget-slider").first.wait_for(timeout=30_000)
    output.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    return output.screenshot()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("chapters", nargs="*",
                        default=sorted(p.name for p in (ROOT / "notebooks").iterdir() if p.is_dir()))
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        course = browser.scratch_course(Path(tmp) / "course")
        with browser.chromium() as chromium, browser.jupyterlab(course) as lab:
            for chapter in args.chapters:
                page = chromium.new_page(viewport={"width": 1280, "height": 1000})
                path = f"notebooks/{chapter}/{chapter}.ipynb"
                browser.open_notebook(lab, page, path)
                page.keyboard.press("Control+b")     # hide the file browser: more room
                saved = browser.run_all_and_wait(page, course / path, timeout_s=600)
                number = chapter[:2]
                save_png(plot_view(page, MAIN_PLOT.get(chapter)), OUT / f"{number}-plot.png")
                if chapter == "02_vram_arithmetic":
                    save_png(calculator_view(page), OUT / f"{number}-calculator.png")
                save_png(quiz_view(page, chapter, saved), OUT / f"{number}-quiz.png")
                page.close()
                lab.close_sessions()


if __name__ == "__main__":
    main()
