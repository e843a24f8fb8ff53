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

It also shows chapter 12's leaderboard (``board_rows``, ``render_board``): each learner's best
plan for the room's budget, read from the result file their runs write, ranked by a measurement
the board makes itself (``BoardMeasurer``), never by a number in the file. The host sees it
under the progress table; every learner may open it alone at ``board`` (the hub grants them
this service; the progress table itself checks that its visitor is the admin).
"""
from __future__ import annotations

import html
import json
import os
import pwd
import signal
import stat
import time
from pathlib import Path

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
    one notebook's JSON (read as the learner's own tally reads it: gpulab.course.progress); {}
    when it is not a notebook."""
    from gpulab.course.progress import saved_quizzes

    try:
        cells = json.loads(text)["cells"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return {}
    if not isinstance(cells, list):
        return {}
    return {quiz.item: quiz.state for quiz in saved_quizzes(cells)}


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


def render(rows: list[dict], chapters: list[str], hub: str = "/hub/", board: str = "") -> str:
    """The page: a row per learner, a column per chapter (right / quizzes, the right ones named),
    laid out to fit a laptop's 1280 px; links back to the hub at the top; ``board``, the
    leaderboard's HTML (``render_board``), under the table."""
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
            f"{board}</body></html>")


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

    async def runs(self, learners: list[tuple[str, Path, int]]) -> dict[str, tuple[list, int, bool]]:
        """{learner: ``learner_runs``} for the board, within PAGE_BUDGET_S; a learner not read
        in time shows without runs this time."""
        import asyncio
        futures = {name: self.pool.submit(learner_runs, home, uid) for name, home, uid in learners}
        if futures:
            await asyncio.wait([asyncio.wrap_future(f) for f in futures.values()], timeout=PAGE_BUDGET_S)
        return {name: f.result() if f.done() and f.exception() is None else ([], 0, False)
                for name, f in futures.items()}


# --------------------------------------------------------------------------------------------
# Chapter 12's leaderboard (issue 39)
#
# A learner's runs write ~/course/12_capstone/capstone-runs.jsonl (gpulab.capstone.results),
# and the learner can write anything there. So the board trusts the file for one thing only:
# which plan the learner puts forward. It reads the file as ``read_regular`` allows (a regular
# file the learner owns, at most results.MAX_FILE_BYTES) and each line as
# ``results.parse_line`` allows (a run's exact fields, a plan that parses, a known budget);
# the plan it puts forward is the one its runs for the room's budget claim fastest within the
# budget, else its latest. The board then measures that plan itself (``BoardMeasurer``: the
# course's code in a fresh process, as an unprivileged user) and ranks by that measurement, so
# a forged speed-up lifts no one, and a forged "within budget" is measured over it. What it
# shows of the file is the plan as the parser writes it back and the claimed speed-up as a
# number, escaped like everything on the page: no text of the file reaches it.

CAPSTONE = "12_capstone"
BOARD_STEPS = 2              # timed steps per measured run: a board, not a grade (that is 4)
MEASURE_USER = "nobody"      # who runs the board's measurements
MEASURE_TIMEOUT_S = 300


def learner_runs(home: Path, uid: int | None = None) -> tuple[list, int, bool]:
    """(runs, lines refused, whether a result file was read) of a learner's capstone folder."""
    from gpulab.capstone import results
    course = _open_folder(str(Path(home) / "course"), None)
    if course is None:
        return [], 0, False
    try:
        chapter = _open_folder(CAPSTONE, course)
        if chapter is None:
            return [], 0, False
        try:
            found = read_regular(results.RESULT_FILE, chapter, uid, results.MAX_FILE_BYTES)
        finally:
            os.close(chapter)
    finally:
        os.close(course)
    if found is None:
        return [], 0, False
    runs, refused = results.parse_runs(found[0])
    return runs, refused, True


def put_forward(runs: list, budget):
    """The run whose plan a learner's file puts forward for ``budget``: the one it claims
    fastest within the budget, else its latest; None when it has none for that budget."""
    mine = [r for r in runs if r.budget == budget.name]
    if not mine:
        return None
    claimed = [r for r in mine if r.in_budget and r.speedup is not None]
    best = max(claimed, key=lambda r: r.speedup) if claimed else mine[-1]
    return best


def board_rows(found: dict[str, tuple[list, int, bool]], measured, budget) -> list[dict]:
    """One row per learner, in the board's order: ranked by the board's own speed-up those
    whose measured plan is within the budget, then those being measured, then those over the
    budget or off its target, then those without a run. ``measured(plan_text, learner)`` is the
    board's measurement of a plan (``run.measure``'s dict, {"error": ...}, or None while it
    waits; ``BoardMeasurer``)."""
    from gpulab.capstone.plan import Plan, off_target
    rows = []
    for name, (runs, refused, read) in found.items():
        row = {"name": name, "refused": refused, "runs": len(runs), "status": "no run yet",
               "plan": None, "claimed": None, "speedup": None, "peak_mib": None}
        best = put_forward(runs, budget)
        if best is not None:
            plan = Plan.parse(best.plan)          # parse_line kept only plans that parse
            row.update(plan=plan.text(), claimed=best.speedup if best.in_budget else None)
            result = None if off_target(plan, budget) else measured(plan.text(), name)
            if off_target(plan, budget):
                row["status"] = "off target"
            elif result is None:
                row["status"] = "measuring"
            elif "error" in result:
                row["status"] = "not measured"
            else:
                row["peak_mib"] = result["peak_bytes"] / 2**20
                if result["in_budget"]:
                    row.update(status="in budget", speedup=result["speedup"])
                else:
                    row["status"] = "over budget"
        rows.append(row)
    order = {"in budget": 0, "measuring": 1, "over budget": 2, "off target": 3,
             "not measured": 4, "no run yet": 5}
    rows.sort(key=lambda r: (order[r["status"]], -(r["speedup"] or 0.0), r["name"]))
    rank = 0
    for row in rows:
        if row["status"] == "in budget":
            rank += 1
            row["rank"] = rank
    return rows


BOARD_STYLE = """
#board td.number { text-align: right } #board .board-over td, #board .board-off td { color: #7a4a00 }
#board code { font-size: 0.9em; overflow-wrap: anywhere }
"""


def render_board(rows: list[dict], budget, pending: int = 0, note: str = "") -> str:
    """The leaderboard as an HTML section; every value escaped (names are the hub's, plans the
    parser's own text, numbers formatted here)."""
    def number(x, fmt):
        return "-" if x is None else format(x, fmt)

    body = []
    for row in rows:
        status = {"in budget": "within both budgets" if (row["speedup"] or 0) >= budget.speedup
                  else "within memory, under the time budget"}.get(row["status"], row["status"])
        css = {"over budget": "board-over", "off target": "board-off"}.get(row["status"], "")
        refused = f"<br><small>{row['refused']} line(s) refused</small>" if row["refused"] else ""
        body.append(
            f'<tr id="board-{html.escape(row["name"])}" class="{css}">'
            f'<td class="number">{row.get("rank", "")}</td><td>{html.escape(row["name"])}</td>'
            f'<td class="number">{number(row["speedup"], ".2f")}{"x" if row["speedup"] else ""}</td>'
            f'<td class="number">{number(row["peak_mib"], ".1f")}</td>'
            f'<td>{html.escape(status)}{refused}</td>'
            f'<td><code>{html.escape(row["plan"] or "")}</code></td>'
            f'<td class="number">{number(row["claimed"], ".2f")}</td></tr>')
    note = (f" {pending} plan(s) waiting to be measured: reload in a minute." if pending else "") \
        + (f" {note}" if note else "")
    return (f"<section id='capstone-board'><style>{BOARD_STYLE}</style>"
            f"<h2>Chapter 12 leaderboard, budget {html.escape(budget.name)}</h2>"
            f"<p><small>Each learner's best plan from their result file, measured here by the "
            f"board on this machine, beside the naive run: the speed-up is the board's, never "
            f"the file's (the last column is what the file claims). Time budget "
            f"{budget.speedup}x, memory budget {budget.memory_mib} MiB.{html.escape(note)}"
            f"</small></p><table id='board'><tr><th style='width:4em'>rank</th><th>learner</th>"
            f"<th>speed-up</th><th>peak MiB</th><th>verdict</th><th>plan</th>"
            f"<th>claimed</th></tr>{''.join(body)}</table></section>")


def render_board_page(rows: list[dict], budget, hub: str = "/hub/", pending: int = 0,
                      note: str = "") -> str:
    """The board alone, the page learners may open."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Leaderboard</title>"
            f"<meta name='viewport' content='width=device-width'><style>{STYLE}</style></head>"
            f"<body><nav><a id='back-to-hub' href='{hub}home'>&larr; Hub home</a></nav>"
            f"{render_board(rows, budget, pending, note)}</body></html>")


class BoardMeasurer:
    """Measures the plans the board is asked about, one at a time, in a thread of its own at a
    low priority (its children inherit it): each in a fresh Python process
    (``gpulab.capstone.run.measure_in_fresh_process``) on the CPU, one thread, so that the board
    costs the room one core at most, and each plan is measured once. The process runs as
    ``MEASURE_USER`` where that user can run this Python; where it cannot (a Python under a
    private home, as pyenv installs it), as the service's own user, which ``note`` says. Either
    way it runs the course's code on a plan the strict parser wrote back, nothing of a learner's."""

    ENV = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "HOME": "/nonexistent", "LANG": "C.UTF-8"}

    def __init__(self, budget, user: str | None = MEASURE_USER, steps: int = BOARD_STEPS):
        import threading
        self.budget, self.steps, self.user, self.note = budget, steps, user, ""
        self.done: dict[str, dict] = {}
        self.queue: list[str] = []
        self.waiting: dict[str, str] = {}      # learner -> the one plan of theirs that waits
        self.lock = threading.Lock()
        self.wake = threading.Event()
        threading.Thread(target=self._work, name="board-measurer", daemon=True).start()

    def __call__(self, plan_text: str, learner: str = "") -> dict | None:
        """The measurement of a plan, or None while it waits. Asking queues it, once; a learner
        has one plan waiting at most: a newer one takes the place of theirs (a file rewritten
        again and again queues no more than one measurement at a time)."""
        with self.lock:
            if plan_text in self.done:
                return self.done[plan_text]
            earlier = self.waiting.get(learner)
            self.waiting[learner] = plan_text
            if earlier not in (None, plan_text) and earlier in self.queue[1:] \
                    and earlier not in self.waiting.values():
                self.queue.remove(earlier)     # no one waits for it now (the first may be running)
            if plan_text not in self.queue:
                self.queue.append(plan_text)
                self.wake.set()
            return None

    @property
    def pending(self) -> int:
        with self.lock:
            return len(self.queue)

    def _as_whom(self) -> dict:
        """subprocess.run's user, group and extra_groups for MEASURE_USER, if it can run this
        Python and import the course's code; {} (the service's own user) if not."""
        import subprocess
        import sys
        if not self.user:
            return {}
        try:
            account = pwd.getpwnam(self.user)
            who = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            subprocess.run([sys.executable, "-c", "import gpulab.capstone.run"], env=self.ENV,
                           cwd="/", capture_output=True, timeout=120, check=True, **who)
            return who
        except (KeyError, OSError, subprocess.SubprocessError):
            self.note = (f"Measured as the service's own user: {self.user} cannot run this "
                         "machine's Python.")
            return {}

    def _work(self) -> None:
        import threading
        from gpulab.capstone import run
        from gpulab.capstone.plan import Plan
        try:   # Linux: a thread's own nice value, which the processes it starts inherit
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        env, who = self.ENV, None
        while True:
            self.wake.wait()
            with self.lock:
                if not self.queue:
                    self.wake.clear()
                    continue
                text = self.queue[0]
            if who is None:
                who = self._as_whom()
            try:
                result = run.measure_in_fresh_process(Plan.parse(text), self.budget, self.steps,
                                                      timeout=MEASURE_TIMEOUT_S, env=env, cwd="/", **who)
            except Exception as error:       # noqa: BLE001 (any failure: shown as not measured)
                result = {"error": str(error)[:200]}
            with self.lock:
                self.done[text] = result
                self.queue.remove(text)


def main() -> None:
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import ioloop, web
    from tornado.httpclient import AsyncHTTPClient
    from urllib.parse import urlparse

    from gpulab.capstone import budget as budgets

    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    hub = url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "hub/")
    course = Path(os.environ["GPULAB_WORKSHOP_COURSE"])
    chapters = sorted(p.name for p in course.iterdir() if p.is_dir())
    reader = RoomReader()
    room_budget = budgets.CANONICAL          # a room's learners all have the chapter's own
    measurer = BoardMeasurer(room_budget)

    class RoomPage(HubOAuthenticated, web.RequestHandler):
        async def room(self) -> tuple[dict, list, bool]:
            """(learners' hub models, (name, home, uid) of each, whether the visitor is admin)."""
            api = os.environ["JUPYTERHUB_API_URL"]
            reply = await AsyncHTTPClient().fetch(
                url_path_join(api, "users"),
                headers={"Authorization": f"token {os.environ['JUPYTERHUB_API_TOKEN']}"})
            users, learners, admin = {}, [], False
            for user in sorted(json.loads(reply.body), key=lambda u: u["name"]):
                if user.get("admin"):
                    admin |= user["name"] == self.current_user["name"]
                    continue
                try:
                    account = pwd.getpwnam(user["name"])
                except KeyError:
                    continue
                users[user["name"]] = user
                learners.append((user["name"], Path(account.pw_dir), account.pw_uid))
            return users, learners, admin

        async def board(self, learners) -> list[dict]:
            return board_rows(await reader.runs(learners), measurer, room_budget)

    class ProgressPage(RoomPage):
        @web.authenticated
        async def get(self):
            users, learners, admin = await self.room()
            if not admin:                  # learners may reach this service for its board only
                raise web.HTTPError(403, "the progress page is the host's")
            found = await reader.read(learners)
            rows = [{"name": name, "running": bool(users[name].get("servers")),
                     "progress": found[name][0], "note": found[name][1]} for name, _, _ in learners]
            board = render_board(await self.board(learners), room_budget, measurer.pending,
                                 measurer.note)
            self.set_header("Cache-Control", "no-store")
            self.finish(render(rows, chapters, hub, board))

    class BoardPage(RoomPage):
        @web.authenticated
        async def get(self):
            _, learners, _ = await self.room()
            rows = await self.board(learners)
            self.set_header("Cache-Control", "no-store")
            self.finish(render_board_page(rows, room_budget, hub, measurer.pending, measurer.note))

    app = web.Application([
        (prefix, ProgressPage),
        (url_path_join(prefix, "board"), BoardPage),
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
