"""The host's view of the room: a JupyterHub service page listing each learner's progress.

For each learner it reads the notebooks in ~/course as last saved (JupyterLab saves every two
minutes and on Ctrl-S) and, for every quiz's one-line test cell ``check("01-batch-bytes", x)``,
the verdict the cell printed when it last ran: gpulab.course.checks shows it as a box of class
``gpulab-check-right``, ``-wrong`` or ``-unanswered``. The page shows, per learner, the chapter
they saved last, and per chapter the quizzes answered right out of those there are.

It reports what the notebooks say, which is fine for seeing who is stuck where, not for
grading: a learner can edit a saved output. Grades come from `make autograde`.

Run by the hub as a managed service (jupyterhub_config.py); only the admin may open it. It
reads learners' files as root, so it reads only what ``read_regular`` allows, each learner
within a time budget, several at once, and answers within PAGE_BUDGET_S whatever a folder holds
(``RoomReader``). ``learner_progress(home)`` is the pure part the tests call directly.
"""
from __future__ import annotations

import html
import json
import os
import pwd
import re
import signal
import stat
import time
from pathlib import Path

CHECK_CELL = re.compile(r"""^\s*check\(\s*["']([A-Za-z0-9_.-]+)["']""", re.MULTILINE)
VERDICT = re.compile(r"gpulab-check-(right|wrong|unanswered|recorded)")
# A learner's folder is read by root, so nothing in it may make the page wait or read elsewhere:
# only regular files the learner owns, inside ~/course/<chapter>/, opened without following a
# symlink and without blocking (a FIFO, a device), at most this many bytes each, this many
# entries, and this many seconds per learner (a chapter notebook with outputs is 1-3 MiB).
MAX_NOTEBOOK_BYTES = 16 * 2**20
MAX_ENTRIES = 200
LEARNER_BUDGET_S = 0.5
PAGE_BUDGET_S = 1.5          # the page answers by then with what it has read
NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_regular(name: str, dir_fd: int, uid: int | None, max_bytes: int = MAX_NOTEBOOK_BYTES):
    """(bytes, mtime) of ``name`` in the open folder ``dir_fd`` when it is a regular file of at
    most ``max_bytes`` owned by ``uid`` (any owner when None); None for anything else."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return None                      # not even opened: a FIFO, a device, a symlink
        fd = os.open(name, NO_FOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)                  # what was opened, in case it changed meanwhile
        if (not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes
                or (uid is not None and info.st_uid != uid)):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
        return (data, info.st_mtime) if len(data) <= max_bytes else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_folder(name: str, dir_fd: int | None) -> int | None:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=dir_fd)
    except OSError:
        return None


def _entries(fd: int) -> list[os.DirEntry]:
    """The first MAX_ENTRIES entries of an open folder, sorted by name."""
    found = []
    with os.scandir(fd) as listing:
        for entry in listing:
            found.append(entry)
            if len(found) >= MAX_ENTRIES:
                break
    return sorted(found, key=lambda e: e.name)


def notebook_verdicts(text: bytes) -> dict[str, str]:
    """{item id: "right" | "wrong" | "unanswered" | "recorded" | "not run"} for the check cells of
    one notebook's JSON; {} when it is not a notebook."""
    try:
        cells = json.loads(text)["cells"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return {}
    if not isinstance(cells, list):
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


def learner_progress(home: Path, uid: int | None = None,
                     budget_s: float = LEARNER_BUDGET_S) -> dict:
    """{"chapters": {chapter: {item: verdict}}, "current": the chapter saved last that has an
    answered quiz, or None, "complete": False when the time budget ran out first}, from the
    notebooks ``~/course/<chapter>/*.ipynb`` (module docstring: what is read, and what not)."""
    deadline = time.monotonic() + budget_s
    chapters, latest, complete = {}, (0.0, None), True
    course = _open_folder(str(Path(home) / "course"), None)
    if course is None:
        return {"chapters": {}, "current": None, "complete": True}
    try:
        for folder in _entries(course):
            if not folder.is_dir(follow_symlinks=False):
                continue
            chapter_fd = _open_folder(folder.name, course)
            if chapter_fd is None:
                continue
            try:
                for entry in _entries(chapter_fd):
                    if time.monotonic() > deadline:
                        complete = False
                        break
                    if not entry.name.endswith(".ipynb"):
                        continue
                    found = read_regular(entry.name, chapter_fd, uid)
                    if found is None:
                        continue
                    verdicts = notebook_verdicts(found[0])
                    chapters[folder.name] = verdicts
                    if any(v in ("right", "wrong") for v in verdicts.values()) and found[1] >= latest[0]:
                        latest = (found[1], folder.name)
            finally:
                os.close(chapter_fd)
            if not complete:
                break
    finally:
        os.close(course)
    return {"chapters": chapters, "current": latest[1], "complete": complete}


# --------------------------------------------------------------------------------------------
# The page

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222 }
nav { margin-bottom: 1em } nav a { margin-right: 1.5em }
table { border-collapse: collapse; table-layout: fixed; width: 100% }
td, th { border: 1px solid #ccc; padding: 3px 5px; vertical-align: top; overflow-wrap: anywhere;
         font-size: 0.85em } th { background: #f3f4f6; font-weight: 600 }
td div { font-size: 0.85em } .right { color: #1a6b2f } .wrong { color: #7a4a00 }
.idle { color: #888 } small { color: #555 }
"""


def render(rows: list[dict], chapters: list[str], hub: str = "/hub/") -> str:
    """The page: a row per learner, a column per chapter (right / quizzes, the right ones named),
    laid out to fit a laptop's 1280 px; links back to the hub at the top."""
    head = "".join(f"<th>{html.escape(c.replace('_', ' '))}</th>" for c in chapters)
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
        if row.get("note"):
            server += f"<br><small>{html.escape(row['note'])}</small>"
        current = html.escape(row["progress"]["current"] or "not started")
        body.append(f'<tr id="learner-{html.escape(row["name"])}"><td>{html.escape(row["name"])}'
                    f"<br><small>{server}</small></td><td>{current}</td>{''.join(cells)}</tr>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Workshop progress</title>"
            f"<meta name='viewport' content='width=device-width'>"
            f"<style>{STYLE}</style></head><body>"
            f"<nav><a id='back-to-admin' href='{hub}admin'>&larr; Admin page</a>"
            f"<a href='{hub}home'>Hub home</a></nav><h1>Workshop progress</h1>"
            f"<p><small>From each learner's saved notebooks: right answers / quizzes per chapter; "
            f"✔ right, ✘ wrong at the last run. Reload to refresh.</small></p>"
            f"<table><tr><th>learner</th><th>saved last</th>{head}</tr>{''.join(body)}</table>"
            f"</body></html>")


class RoomReader:
    """Reads the learners' folders for the page, a few at once in threads of its own, so that
    no folder holds the page: what is not read within PAGE_BUDGET_S shows as it was last read.
    A learner whose last read is still running is not read again meanwhile."""

    def __init__(self, workers: int = 4):
        from concurrent.futures import ThreadPoolExecutor
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="progress")
        self.running: dict[str, object] = {}         # learner -> Future
        self.last: dict[str, dict] = {}              # learner -> their last complete reading

    async def read(self, learners: list[tuple[str, Path, int]]) -> dict[str, tuple[dict, str]]:
        """{learner: (progress, note)} for (name, home, uid) triples, within PAGE_BUDGET_S."""
        import asyncio
        for name, home, uid in learners:
            if name not in self.running or self.running[name].done():
                self.running[name] = self.pool.submit(learner_progress, home, uid)
        futures = [asyncio.wrap_future(self.running[name]) for name, _, _ in learners]
        if futures:
            await asyncio.wait(futures, timeout=PAGE_BUDGET_S)
        found = {}
        for name, _, _ in learners:
            future = self.running[name]
            if future.done() and future.exception() is None:
                progress = future.result()
                if progress["complete"]:
                    self.last[name] = progress
                found[name] = (progress, "" if progress["complete"] else "read in part: too slow")
            else:
                found[name] = (self.last.get(name, {"chapters": {}, "current": None}),
                               "not read in time: shown as last read")
        return found


def main() -> None:
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import ioloop, web
    from tornado.httpclient import AsyncHTTPClient
    from urllib.parse import urlparse

    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    hub = url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "hub/")
    course = Path(os.environ["GPULAB_WORKSHOP_COURSE"])
    chapters = sorted(p.name for p in course.iterdir() if p.is_dir())
    reader = RoomReader()

    class ProgressPage(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        async def get(self):
            api = os.environ["JUPYTERHUB_API_URL"]
            reply = await AsyncHTTPClient().fetch(
                url_path_join(api, "users"),
                headers={"Authorization": f"token {os.environ['JUPYTERHUB_API_TOKEN']}"})
            users, learners = {}, []
            for user in sorted(json.loads(reply.body), key=lambda u: u["name"]):
                if user.get("admin"):
                    continue
                try:
                    account = pwd.getpwnam(user["name"])
                except KeyError:
                    continue
                users[user["name"]] = user
                learners.append((user["name"], Path(account.pw_dir), account.pw_uid))
            found = await reader.read(learners)
            rows = [{"name": name, "running": bool(users[name].get("servers")),
                     "progress": found[name][0], "note": found[name][1]} for name, _, _ in learners]
            self.set_header("Cache-Control", "no-store")
            self.finish(render(rows, chapters, hub))

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
