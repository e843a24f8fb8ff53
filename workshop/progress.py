"""The host's view of the room: a JupyterHub service page listing each learner's progress.

For each learner it reads the notebooks in ~/course as last saved (JupyterLab saves every two
minutes and on Ctrl-S) and, for every quiz's one-line test cell ``check("01-batch-bytes", x)``,
the verdict the cell printed when it last ran: gpulab.course.checks shows it as a box of class
``gpulab-check-right``, ``-wrong`` or ``-unanswered``. The page shows, per learner, the chapter
they saved last, and per chapter the quizzes answered right out of those there are.

It reports what the notebooks say, which is fine for seeing who is stuck where, not for
grading: a learner can edit a saved output. Grades come from `make autograde`.

Run by the hub as a managed service (jupyterhub_config.py); only the admin may open it.
``learner_progress(home)`` is the pure part the tests call directly.
"""
from __future__ import annotations

import html
import json
import os
import pwd
import re
import signal
from pathlib import Path

CHECK_CELL = re.compile(r"""^\s*check\(\s*["']([A-Za-z0-9_.-]+)["']""", re.MULTILINE)
VERDICT = re.compile(r"gpulab-check-(right|wrong|unanswered|recorded)")
MAX_NOTEBOOK_BYTES = 50 * 2**20   # a learner's file is read by root: bound what we load


def notebook_verdicts(path: Path) -> dict[str, str]:
    """{item id: "right" | "wrong" | "unanswered" | "recorded" | "not run"} for the check cells of one
    notebook; {} when it cannot be read as a notebook."""
    try:
        if path.is_symlink() or path.stat().st_size > MAX_NOTEBOOK_BYTES:
            return {}
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = nb["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    verdicts = {}
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        match = CHECK_CELL.search(source)
        if not match:
            continue
        verdict = "not run"
        for output in cell.get("outputs") or []:
            data = output.get("data", {}) if isinstance(output, dict) else {}
            found = VERDICT.search(str(data.get("text/html", "")))
            if found:
                verdict = found.group(1)
        verdicts[match.group(1)] = verdict
    return verdicts


def learner_progress(home: Path) -> dict:
    """{"chapters": {chapter: {item: verdict}}, "current": the chapter saved last that has an
    answered quiz, or None}."""
    chapters, latest = {}, (0.0, None)
    for path in sorted(Path(home).glob("course/*/*.ipynb")):
        chapter = path.parent.name
        verdicts = notebook_verdicts(path)
        chapters[chapter] = verdicts
        answered = any(v in ("right", "wrong") for v in verdicts.values())
        if answered and path.stat().st_mtime >= latest[0]:
            latest = (path.stat().st_mtime, chapter)
    return {"chapters": chapters, "current": latest[1]}


# --------------------------------------------------------------------------------------------
# The page

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222 }
table { border-collapse: collapse } td, th { border: 1px solid #ccc; padding: 4px 8px;
vertical-align: top } th { background: #f3f4f6 } .right { color: #1a6b2f } .wrong { color: #7a4a00 }
.idle { color: #888 } small { color: #555 }
"""


def render(rows: list[dict], chapters: list[str]) -> str:
    """The page: a row per learner, a column per chapter (right / quizzes, the right ones named)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in chapters)
    body = []
    for row in rows:
        cells = []
        for chapter in chapters:
            verdicts = row["progress"]["chapters"].get(chapter, {})
            right = [i for i, v in verdicts.items() if v == "right"]
            wrong = [i for i, v in verdicts.items() if v == "wrong"]
            items = "".join(f'<div class="right">✔ {html.escape(i)}</div>' for i in right)
            items += "".join(f'<div class="wrong">✘ {html.escape(i)}</div>' for i in wrong)
            cells.append(f"<td>{len(right)}/{len(verdicts)}{items}</td>")
        server = "running" if row["running"] else '<span class="idle">stopped</span>'
        current = html.escape(row["progress"]["current"] or "not started")
        body.append(f'<tr id="learner-{html.escape(row["name"])}"><td>{html.escape(row["name"])}'
                    f"<br><small>{server}</small></td><td>{current}</td>{''.join(cells)}</tr>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Workshop progress</title>"
            f"<style>{STYLE}</style></head><body><h1>Workshop progress</h1>"
            f"<p><small>From each learner's saved notebooks: right answers / quizzes per chapter; "
            f"✔ right, ✘ wrong at the last run. Reload to refresh.</small></p>"
            f"<table><tr><th>learner</th><th>saved last</th>{head}</tr>{''.join(body)}</table>"
            f"</body></html>")


def main() -> None:
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import ioloop, web
    from tornado.httpclient import AsyncHTTPClient
    from urllib.parse import urlparse

    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    course = Path(os.environ["GPULAB_WORKSHOP_COURSE"])
    chapters = sorted(p.name for p in course.iterdir() if p.is_dir())

    class ProgressPage(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        async def get(self):
            api = os.environ["JUPYTERHUB_API_URL"]
            reply = await AsyncHTTPClient().fetch(
                url_path_join(api, "users"),
                headers={"Authorization": f"token {os.environ['JUPYTERHUB_API_TOKEN']}"})
            rows = []
            for user in sorted(json.loads(reply.body), key=lambda u: u["name"]):
                if user.get("admin"):
                    continue
                try:
                    home = Path(pwd.getpwnam(user["name"]).pw_dir)
                except KeyError:
                    continue
                rows.append({"name": user["name"], "running": bool(user.get("servers")),
                             "progress": learner_progress(home)})
            self.set_header("Cache-Control", "no-store")
            self.finish(render(rows, chapters))

    app = web.Application([
        (prefix, ProgressPage),
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
    ], cookie_secret=os.urandom(32))
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app.listen(url.port, url.hostname)
    loop = ioloop.IOLoop.current()
    for sig in (signal.SIGINT, signal.SIGTERM):   # the hub stops its services with these
        signal.signal(sig, lambda *_: loop.add_callback_from_signal(loop.stop))
    loop.start()


if __name__ == "__main__":
    main()
