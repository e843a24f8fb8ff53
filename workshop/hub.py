"""The workshop's JupyterHub parts: sign-up with a workshop code, one system account per
learner, and each learner's server started as that account with its share of a GPU.

- ``WorkshopAuthenticator``: a new learner signs up with the workshop code the host gives the
  room and a password of their own choosing; later they sign in with that password alone. A
  name, once claimed, is theirs (a shared password alone would let anyone sign in as anyone).
  The host signs in as the admin with the admin code. Each learner gets a system account in the
  group ``gpulab-learners``, home folder mode 0700.
- ``WorkshopSpawner``: LocalProcessSpawner that starts the server through start_learner.sh
  (the learner's identity, a private copy of the course, and the Python made reachable when it
  lives in root's home) with the learner's GPU, memory cap and thread count (workshop/plan.py).
Removing the accounts afterwards: workshop/accounts.py.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import socket
import stat
import subprocess
import sys
from pathlib import Path

from jupyterhub.auth import Authenticator, LocalAuthenticator
from jupyterhub.spawner import LocalProcessSpawner
from tornado import web
from traitlets import Unicode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import plan  # noqa: E402
from accounts import GROUP, is_learner_account, system_account_exists  # noqa: E402,F401

NAME_PATTERN = r"^[a-z][a-z0-9_-]{1,30}$"   # also a valid Linux account name
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


class WorkshopCodeAuthenticator(Authenticator):
    """Workshop code to sign up, own password afterwards; the admin signs in with the admin code.
    Without system accounts: Kubernetes (workshop/k8s/) gives each learner a pod instead."""

    workshop_code = Unicode(config=True, help="The code the host gives the room to sign up.")
    admin_code = Unicode(config=True, help="The admin's password.")
    passwords_file = Unicode(config=True, help="Learners' password hashes (JSON, mode 0600).")
    group = Unicode(GROUP, config=True, help="Every workshop account is in this group.")

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
        if system_account_exists(name) and not is_learner_account(name, self.group):
            raise web.HTTPError(403, f"The name {name!r} is taken on this server; choose another.")
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
        """A new account in the workshop's group, its home readable by its owner alone."""
        home = Path(self.home_root) / user.name
        subprocess.run(["groupadd", "--force", self.group], check=True)
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash",
                        "--user-group", "--groups", self.group,
                        "--comment", "GPU Training Lab workshop", user.name],
                       check=True, capture_output=True)
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
    """A learner's server: their account, their GPU and share of it, their CPU threads."""

    settings: plan.Settings = None          # set by jupyterhub_config.py
    devices_taken: dict[str, str] = {}      # learner -> device, for servers starting or running
    wrapper_env: dict[str, str] = {}        # start_learner.sh's variables (set by the config)

    def make_preexec_fn(self, name):
        return None   # start_learner.sh takes the learner's identity, after its mounts

    async def start(self):
        if self.port == 0:
            self.port = server_port()
        return await super().start()

    def get_env(self):
        env = super().get_env()
        device = plan.assign_device(self.settings.devices, self.devices_taken, self.user.name)
        if device is not None:
            self.devices_taken[self.user.name] = device
        env.update(plan.learner_env(self.settings, device))
        env.update(self.wrapper_env)
        self.log.info("workshop: %s gets %s", self.user.name,
                      f"{device}, memory cap {self.settings.memory_fraction:g}" if device else "no GPU")
        return env

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            self.devices_taken.pop(self.user.name, None)
