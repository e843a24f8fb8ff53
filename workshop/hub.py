"""The workshop's JupyterHub parts: sign-up with a workshop code, one system account per
learner, and each learner's server started as that account inside their walls.

- ``WorkshopAuthenticator``: a new learner signs up (/hub/signup, ``SignUpHandler``) with the
  workshop code the host gives the room and a password of their own choosing; later they sign
  in with that password alone. A name, once claimed, is theirs (a shared password alone would
  let anyone sign in as anyone); a name this machine already uses, as an account or a group, is
  refused before anything is saved. Failed sign-ins lock the name, then the client address, for
  a growing while (``SignInLockout``). The host signs in as the admin with the admin code and
  lands on the Admin page. Each learner gets a system account in the group
  ``gpulab-learners``, home folder mode 0700.
- ``WorkshopSpawner``: LocalProcessSpawner that starts the server through start_learner.sh
  (cgroups joined, private scratch, the learner's identity, a private copy of the course) with
  the learner's walls (workshop/walls.py), GPU, memory cap and threads (workshop/plan.py).
Removing the accounts afterwards: workshop/accounts.py.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import secrets
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from jupyterhub.auth import Authenticator, LocalAuthenticator
from jupyterhub.handlers.login import LoginHandler
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import url_path_join
from tornado import web
from traitlets import Unicode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import plan  # noqa: E402
import walls  # noqa: E402
from accounts import GROUP, is_learner_account, system_name_taken  # noqa: E402,F401

NAME_PATTERN = r"^[a-z][a-z0-9_-]{1,30}$"   # also a valid Linux account name
NAME_RULES = ("2 to 31 characters: lower-case letters, digits, - and _, starting with a letter")
MIN_PASSWORD = 6


# --------------------------------------------------------------------------------------------
# Accounts


def _hash(password: str, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1)
    return f"scrypt${salt.hex()}${digest.hex()}"


def _matches(password: str, stored: str) -> bool:
    salt = bytes.fromhex(stored.split("$")[1])
    return secrets.compare_digest(_hash(password, salt), stored)


class SignInLockout:
    """Failed sign-ins per key (a name, a client address) within the last ``window_s``: the
    first ``free`` cost nothing; each one after locks the key twice as long as the one before,
    1 s, 2 s, 4 s, ... up to ``longest_s``. In memory: a restarted hub starts afresh."""

    def __init__(self, free: int, window_s: float = 3600, longest_s: float = 300,
                 clock=time.monotonic):
        self.free, self.window_s, self.longest_s, self.clock = free, window_s, longest_s, clock
        self.times: dict[str, list[float]] = {}
        self.locked_until: dict[str, float] = {}

    def wait_s(self, key: str) -> float:
        return max(0.0, self.locked_until.get(key, 0.0) - self.clock())

    def failed(self, key: str) -> None:
        now = self.clock()
        times = [t for t in self.times.get(key, []) if t > now - self.window_s] + [now]
        self.times[key] = times
        if (over := len(times) - self.free) > 0:
            self.locked_until[key] = now + min(2.0 ** (over - 1), self.longest_s)

    def succeeded(self, key: str) -> None:
        self.times.pop(key, None)
        self.locked_until.pop(key, None)


class SignUpHandler(LoginHandler):
    """/hub/signup: the sign-in form's handling (WorkshopCodeAuthenticator.authenticate) on a
    page that says it is the sign-up, with the name rules and the workshop code."""

    def render_template(self, name, **ns):
        ns.setdefault("name_rules", NAME_RULES)
        ns.setdefault("min_password", MIN_PASSWORD)
        return super().render_template("signup.html" if name == "login.html" else name, **ns)


def landing_url(handler) -> str:
    """Where a signed-in person lands (JupyterHub.default_url): the host on the Admin page,
    with no server of their own until they start one; a learner on their server (\"\")."""
    user = handler.current_user
    return url_path_join(handler.hub.base_url, "admin") if user is not None and user.admin else ""


class WorkshopCodeAuthenticator(Authenticator):
    """Workshop code to sign up, own password afterwards; the admin signs in with the admin code.
    Without system accounts: Kubernetes (workshop/k8s/) gives each learner a pod instead."""

    workshop_code = Unicode(config=True, help="The code the host gives the room to sign up.")
    admin_code = Unicode(config=True, help="The admin's password.")
    passwords_file = Unicode(config=True, help="Learners' password hashes (JSON, mode 0600).")
    group = Unicode(GROUP, config=True, help="Every workshop account is in this group.")
    # Per name: 3 free tries, then 1 s, 2 s, 4 s ..., cleared by the right password. Per client
    # address: 20 in 10 minutes, a room behind one NAT mistyping; never cleared by a success,
    # or one learner's own account would reset a guesser's count.
    name_lockout = SignInLockout(free=3)
    address_lockout = SignInLockout(free=20, window_s=600)

    def get_handlers(self, app):
        return super().get_handlers(app) + [("/signup", SignUpHandler)]

    def _passwords(self) -> dict[str, str]:
        path = Path(self.passwords_file)
        return json.loads(path.read_text()) if path.exists() else {}

    def _save(self, passwords: dict[str, str]) -> None:
        path = Path(self.passwords_file)
        fresh = path.with_suffix(".tmp")
        fresh.write_text(json.dumps(passwords, indent=1, sort_keys=True))
        fresh.chmod(0o600)
        fresh.replace(path)

    async def authenticate(self, handler, data):
        name = self.normalize_username(data.get("username", "").strip())
        address = handler.request.remote_ip if handler is not None else ""
        wait = max(self.name_lockout.wait_s(f"name {name}"),
                   self.address_lockout.wait_s(f"address {address}"))
        if wait > 0:
            raise web.HTTPError(429, f"Too many failed sign-ins: wait {math.ceil(wait)} s, then "
                                     "try again. Forgot your password? Ask the host.")
        signed_in = await self._check(name, data)
        if signed_in is None:
            self.name_lockout.failed(f"name {name}")
            self.address_lockout.failed(f"address {address}")
        else:
            self.name_lockout.succeeded(f"name {name}")
        return signed_in

    async def _check(self, name: str, data: dict):
        password = data.get("password", "")
        if not self.validate_username(name) or not password:
            return None
        if name in self.admin_users:
            if self.admin_code and secrets.compare_digest(password, self.admin_code):
                return {"name": name, "admin": True}
            return None
        known = self._passwords().get(name)
        if known:
            ok = await asyncio.to_thread(_matches, password, known)
            return {"name": name, "admin": False} if ok else None
        # A new name: the workshop code lets a learner claim it with a password of their own.
        if not secrets.compare_digest(data.get("otp", "").strip(), self.workshop_code):
            return None
        if len(password) < MIN_PASSWORD:
            raise web.HTTPError(403, f"Choose a password of at least {MIN_PASSWORD} characters: "
                                     "you will sign in with it from now on.")
        if system_name_taken(name) and not is_learner_account(name, self.group):
            raise web.HTTPError(403, f"The name {name!r} is already used on this server (an "
                                     "account or a group of its system): choose another.")
        hashed = await asyncio.to_thread(_hash, password)
        passwords = self._passwords()
        if name in passwords:    # claimed by someone else while we were hashing
            return None
        passwords[name] = hashed
        self._save(passwords)
        self.log.info("workshop: %s signed up", name)
        return {"name": name, "admin": False}

    def delete_user(self, user):
        """Deleting a learner in the admin page frees their name (a forgotten password): they
        sign up again with the workshop code and find their account and files as they left them."""
        passwords = self._passwords()
        if passwords.pop(user.name, None) is not None:
            self._save(passwords)
        super().delete_user(user)


class WorkshopAuthenticator(WorkshopCodeAuthenticator, LocalAuthenticator):
    """The same sign-up, and a system account per learner (make workshop)."""

    home_root = Unicode("/home", config=True, help="Learners' home folders go here.")

    def add_system_user(self, user):
        """A new account in the workshop's group, its home readable by its owner alone. If the
        system refuses it, the name is freed again: nothing is left claimed without an account."""
        home = Path(self.home_root) / user.name
        subprocess.run(["groupadd", "--force", self.group], check=True)
        made = subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell",
                               "/bin/bash", "--user-group", "--groups", self.group,
                               "--comment", "GPU Training Lab workshop", user.name],
                              capture_output=True, text=True)
        if made.returncode != 0:
            passwords = self._passwords()
            if passwords.pop(user.name, None) is not None:
                self._save(passwords)
            raise web.HTTPError(403, f"This server could not make an account named {user.name!r} "
                                     f"({made.stderr.strip()}): choose another name.")
        home.chmod(0o700)
        self.log.info("workshop: created account %s with home %s", user.name, home)


# --------------------------------------------------------------------------------------------
# Learners' servers


def hidden_ancestor(path: Path) -> Path | None:
    """The outermost folder above or at ``path`` that other users may not enter (mode without
    o+x, e.g. /root), or None when every folder on the way lets them through."""
    for folder in [*reversed(path.parents), path]:
        if folder.is_dir() and not folder.stat().st_mode & stat.S_IXOTH:
            return folder
    return None


def reveal_plan(paths: list[Path]) -> tuple[str, str]:
    """(GPULAB_WORKSHOP_HIDE, GPULAB_WORKSHOP_REVEAL) for start_learner.sh: what learners must
    reach (the Python installation, the venv, the course) but cannot, behind which folder."""
    hidden = {p: h for p in paths if (h := hidden_ancestor(p))}
    if not hidden:
        return "", ""
    folders = set(hidden.values())
    if len(folders) > 1:
        raise SystemExit("workshop: learners cannot reach " + ", ".join(map(str, hidden)) +
                         f": they lie behind several closed folders ({', '.join(map(str, folders))})."
                         " Install the course and its Python where every user may read them.")
    return str(folders.pop()), ":".join(str(p) for p in hidden)


def server_port(low: int = 20000, high: int = 32000) -> int:
    """A free port for a learner's server below Linux's ephemeral range (32768 and up), where
    every kernel picks its five ports: a port that a kernel took between the hub's choice and the
    server's start would leave the hub waiting for a server that exited at once."""
    for _ in range(200):
        port = secrets.randbelow(high - low) + low
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between {low} and {high}")


class WorkshopSpawner(LocalProcessSpawner):
    """A learner's server: their account, their walls, their GPU and share of it, their threads."""

    settings: plan.Settings = None          # set by jupyterhub_config.py
    walls = None                            # walls.Systemd, CgroupV1 or CgroupV2; None: off
    learner_cmd: list[str] = []             # start_learner.sh and the server (the config)
    devices_taken: dict[str, str] = {}      # learner -> device, for servers starting or running
    wrapper_env: dict[str, str] = {}        # start_learner.sh's variables (set by the config)

    def make_preexec_fn(self, name):
        return None   # start_learner.sh takes the learner's identity, after its walls and mounts

    async def start(self):
        if self.port == 0:
            self.port = server_port()
        name = self.user.name
        device = plan.assign_device(self.settings.devices, self.devices_taken, name)
        if device is not None:
            self.devices_taken[name] = device
        self._device = device
        prefix, self._walls_env = [], {}
        if self.walls is not None:
            limits = plan.learner_limits(self.settings, device)
            nodes = await asyncio.to_thread(walls.device_nodes, device, _nvml())
            prefix, self._walls_env = await asyncio.to_thread(self.walls.start, name, limits, nodes)
            self.log.info("workshop: %s's walls (%s): %d MiB, %d tasks, CPU weight %d, devices %s",
                          name, self.walls.name, limits.memory_bytes // 2**20, limits.tasks,
                          limits.cpu_weight, ", ".join(n.path for n in nodes) or "none")
        self.cmd = prefix + list(self.learner_cmd)
        return await super().start()

    def get_env(self):
        env = super().get_env()
        device = getattr(self, "_device", None)
        env.update(plan.learner_env(self.settings, device))
        env.update(self.wrapper_env)
        env.update(getattr(self, "_walls_env", {}))
        env["GPULAB_WORKSHOP_WALLS"] = self.walls.name if self.walls is not None else "off"
        env["GPULAB_WORKSHOP_OOM_SCORE_ADJ"] = str(walls.LEARNER_OOM_SCORE_ADJ)
        self.log.info("workshop: %s gets %s", self.user.name,
                      f"{device}, memory cap {self.settings.memory_fraction:g}" if device else "no GPU")
        return env

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            self.devices_taken.pop(self.user.name, None)
            if self.walls is not None:     # what the server left running ends with its walls
                await asyncio.to_thread(self.walls.stop, self.user.name)


def _nvml():
    """The driver's NVML (nvidia-ml-py), or None on a machine without it."""
    try:
        import pynvml
        return pynvml
    except ImportError:
        return None
