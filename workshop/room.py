"""A room of learners over HTTP, for tests/test_workshop.py and scripts/bench_workshop.py.

``start_hub`` starts the workshop's hub as `make workshop` does (workshop/run.py) on free ports
of 127.0.0.1, with its state and the learners' homes in a fresh folder; ``Browser`` is one
learner's browser: sign-in form, spawn, the server's REST and websocket APIs, saving a notebook
as JupyterLab does; ``stop_hub`` stops it all and deletes the accounts and the folder.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests
import websocket

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import accounts  # noqa: E402
import walls  # noqa: E402


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


# --------------------------------------------------------------------------------------------
# A learner's browser, over HTTP


class FromAddress(requests.adapters.HTTPAdapter):
    """Connections from one loopback address of 127.0.0.0/8 (Linux answers on them all): a
    learner elsewhere in the room, as the hub's proxy sees them."""

    def __init__(self, address: str):
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, source_address=(self.address, 0), **kwargs)


class Browser:
    def __init__(self, base: str, name: str, address: str | None = None):
        self.base, self.name = base, name
        self.http = requests.Session()
        if address:
            self.http.mount("http://", FromAddress(address))

    def sign_in(self, password: str, code: str = "", page: str = "login",
                headers: dict | None = None) -> requests.Response:
        """The sign-in form (or, with ``page="signup"``, the sign-up form and its code)."""
        self.http.get(f"{self.base}/hub/{page}", timeout=30, headers=headers)
        xsrf = self.http.cookies.get("_xsrf", path="/hub/")   # a server or service sets its own
        return self.http.post(f"{self.base}/hub/{page}", allow_redirects=False, timeout=60,
                              data={"username": self.name, "password": password, "otp": code,
                                    "_xsrf": xsrf}, headers=headers)

    def sign_up(self, password: str, code: str) -> requests.Response:
        return self.sign_in(password, code, page="signup")

    def use_token(self) -> None:
        """An API token of the signed-in learner's own (what JupyterLab's pages use, in short).
        The browser's cookies stay in ``self.signed_in`` (the hub knows this browser by them)."""
        xsrf = self.http.cookies.get("_xsrf", path="/hub/")   # a server or service sets its own
        reply = self.http.post(f"{self.base}/hub/api/users/{self.name}/tokens", json={},
                               headers={"X-XSRFToken": xsrf}, timeout=30)
        reply.raise_for_status()
        self.token = reply.json()["token"]
        self.signed_in = self.http
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {self.token}"

    def spawn(self) -> None:
        reply = self.http.post(f"{self.base}/hub/api/users/{self.name}/server", timeout=120)
        assert reply.status_code in (201, 202), reply.text

    def wait_ready(self, timeout: float = 150) -> None:
        """Follow the hub's spawn progress stream (what the spawn page shows) to its end;
        polling ten servers' status instead would keep the hub busy answering."""
        url = f"{self.base}/hub/api/users/{self.name}/server/progress"
        with self.http.get(url, stream=True, timeout=timeout) as events:
            for line in events.iter_lines():
                if line.startswith(b"data:"):
                    event = json.loads(line[5:])
                    if event.get("ready"):
                        return
                    if event.get("failed"):
                        raise RuntimeError(f"{self.name}'s server failed: {event}")
        raise RuntimeError(f"{self.name}'s progress stream ended before the server was ready")

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        return self.http.request(method, f"{self.base}/user/{self.name}/api/{path}", timeout=60, **kwargs)

    def start_kernel(self, path: str = "") -> str:
        reply = self.api("POST", "kernels", json={"name": "python3", "path": path})
        reply.raise_for_status()
        return reply.json()["id"]

    def execute(self, kernel_id: str, code: str, timeout: float = 60) -> dict:
        """Run ``code`` in the kernel over its websocket, as JupyterLab does: its stdout and the
        display messages it sent; "died" says why when the kernel dies (or the connection does)."""
        url = f"{self.base.replace('http', 'ws', 1)}/user/{self.name}/api/kernels/{kernel_id}/channels"
        ws = websocket.create_connection(url, header=[f"Authorization: token {self.token}"],
                                         timeout=timeout)
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": self.name,
                       "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        result = {"stdout": "", "displays": [], "died": False}
        try:
            while True:
                frame = ws.recv()
                if isinstance(frame, bytes):      # a message with binary buffers (a widget's)
                    continue
                msg = json.loads(frame)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    if msg.get("msg_type") == "status" and msg["content"].get("execution_state") in ("restarting", "dead"):
                        result["died"] = f"the kernel is {msg['content']['execution_state']}"
                        return result
                    continue
                kind = msg["msg_type"]
                if kind == "stream":
                    result["stdout"] += msg["content"]["text"]
                elif kind == "display_data":
                    result["displays"].append(msg["content"])
                elif kind == "error":
                    result["error"] = "\n".join(msg["content"]["traceback"])
                elif kind == "status" and msg["content"]["execution_state"] in ("restarting", "dead"):
                    result["died"] = f"the kernel is {msg['content']['execution_state']}"
                    return result
                elif kind == "status" and msg["content"]["execution_state"] == "idle":
                    return result
        except (websocket.WebSocketConnectionClosedException, ConnectionError) as error:
            result["died"] = f"the connection closed: {error!r}"
            return result
        except websocket.WebSocketTimeoutException:
            result["timed out"] = True
            return result
        finally:
            ws.close()

    def save_verdicts(self, chapter: str, displays: list[dict]) -> None:
        """Put each check's verdict under its test cell and save the notebook, as JupyterLab
        does after the learner runs the cell."""
        path = f"contents/course/{chapter}/{chapter}.ipynb"
        model = self.api("GET", path).json()
        for display in displays:
            item = re.search(r"(\d\d-[a-z0-9-]+)", display["data"]["text/plain"]).group(1)
            cell = next(c for c in model["content"]["cells"]
                        if c["cell_type"] == "code" and f'check("{item}"' in "".join(c["source"]))
            cell["outputs"] = [{"output_type": "display_data", "data": display["data"], "metadata": {}}]
        reply = self.api("PUT", path, json={"type": "notebook", "format": "json",
                                            "content": model["content"]})
        reply.raise_for_status()



def start_hub(settings: dict[str, str]) -> dict:
    """Start the hub with ``settings`` (WORKSHOP_* variables) added to this environment; wait
    until it answers. The dict it returns is what ``stop_hub`` needs, and the hub's address."""
    # Beside real homes: each learner's /tmp is their own tmpfs, which would hide a home under /tmp.
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-workshop-", dir="/home" if Path("/home").is_dir() else "/srv"))
    tmp.chmod(0o755)                       # learners must pass through to their homes
    (tmp / "homes").mkdir(mode=0o755)
    port, hub_port, api_port, progress_port = free_ports(4)
    env = {**os.environ, "WORKSHOP_STATE": str(tmp / "state"), "WORKSHOP_HOMES": str(tmp / "homes"),
           "WORKSHOP_IP": "127.0.0.1", "WORKSHOP_PORT": str(port),
           "WORKSHOP_HUB_PORT": str(hub_port), "WORKSHOP_PROXY_API_PORT": str(api_port),
           "WORKSHOP_PROGRESS_PORT": str(progress_port),
           "WORKSHOP_ADMIN_CODE": "admin-" + uuid.uuid4().hex, **settings}
    log = tmp / "hub.log"
    process = subprocess.Popen([sys.executable, str(HERE / "run.py")], env=env,
                               stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    room = {"process": process, "tmp": tmp, "log": log, "env": env,
            "base": f"http://127.0.0.1:{port}", "group": env["WORKSHOP_GROUP"]}
    start = time.monotonic()
    while True:
        try:
            if requests.get(f"{room['base']}/hub/api", timeout=5).ok:
                break
        except requests.ConnectionError:
            pass
        if process.poll() is not None or time.monotonic() - start > 90:
            said = log.read_text()[-3000:]
            stop_hub(room)
            raise RuntimeError("the hub did not start:\n" + said)
        time.sleep(0.2)
    room["hub_up_s"] = time.monotonic() - start
    return room


def log_excerpt(room: dict, lines: int = 60) -> str:
    """The hub log's errors, warnings and learner lines: what to read when a spawn fails."""
    text = room["log"].read_text() if room["log"].exists() else ""
    return "\n".join([line for line in text.splitlines()
                      if re.search(r"\[[EW] |Error|Traceback|learner", line)][-lines:])


def stop_hub(room: dict) -> None:
    """Stop the hub (its servers and services with it), delete the accounts and the folder."""
    if room.get("stopped"):
        return
    room["stopped"] = True
    hub = room["process"]
    if hub.poll() is None:
        os.kill(hub.pid, signal.SIGTERM)
        try:
            hub.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)
            hub.wait()
    # What the hub's walls left behind, then a safety net for a hub that died without cleaning up.
    applier, _ = walls.detect(room["group"])
    room["walls_left"] = [] if applier is None else leftover_cgroups(applier)
    if applier is not None:
        applier.finish()
    room["removed"] = accounts.remove_learners(room["group"], log=lambda _: None)
    shutil.rmtree(room["tmp"], ignore_errors=True)


def leftover_cgroups(applier) -> list[str]:
    """The cgroup folders of the workshop's group that still exist (none after a clean stop)."""
    if isinstance(applier, walls.CgroupV1):
        folders = [applier.folder(c) for c in applier.controllers] + [applier.hub_cpu]
        return [str(f) for f in folders if f.exists()]
    if isinstance(applier, walls.CgroupV2):
        return [str(applier.folder())] if applier.folder().exists() else []
    return []
