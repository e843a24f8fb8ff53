"""The workshop's JupyterHub parts: sign-up with a workshop code, one system account per
learner, and each learner's server started as that account inside their walls.

- ``WorkshopAuthenticator``: a new learner signs up (/hub/signup, ``SignUpHandler``) with the
  workshop code the host gives the room and a password of their own choosing; later they sign
  in with that password alone. A name, once claimed, is theirs (a shared password alone would
  let anyone sign in as anyone); a name this machine already uses, as an account or a group, is
  refused before anything is saved. Sign-ups past the room's places wait until the host adds
  the name on the Admin page (``open_places``). Failed sign-ins from a browser the name has not
  signed in from lock the name and the client address for a growing while
  (``SignInLockout``); a browser the name signed in from before (a signed cookie, OWASP's
  "device cookie") has a lock of its own, so a classmate's guesses never lock the owner out.
  The client address is the one the hub's proxy saw (``client_address``). The host signs in as
  the admin with the admin code and lands on the Admin page. Each learner gets a system account
  in the group ``gpulab-learners``, home folder mode 0700, on a disk image of its own where the
  machine allows (workshop/homes.py).
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
import pwd
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
from jupyterhub.utils import maybe_future, url_path_join
from tornado import web
from traitlets import Integer, Unicode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import homes  # noqa: E402
import plan  # noqa: E402
import walls  # noqa: E402
from accounts import GROUP, is_learner_account, system_name_taken  # noqa: E402,F401

NAME_PATTERN = r"^[a-z][a-z0-9_-]{1,30}$"   # also a valid Linux account name
NAME_RULES = ("2 to 31 characters: lower-case letters, digits, - and _, starting with a letter")
MIN_PASSWORD = 6
WAITING_MAX = 10        # sign-ups held for the host at most: past it the page says to ask the host
KNOWN_BROWSER_DAYS = 30


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


def _proc_net_address(text: str) -> tuple[str, int]:
    """ "0100007F:1F90" (IPv4) or 32 hex digits and a port (IPv6), as /proc/net/tcp{,6} write
    them (each 32-bit word in the machine's byte order, little-endian here): (ip, port)."""
    hex_ip, hex_port = text.split(":")
    raw = bytes.fromhex(hex_ip)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)
    return ip.removeprefix("::ffff:"), int(hex_port, 16)


def socket_owner(peer: tuple, proc: Path = Path("/proc")) -> int | None:
    """The uid owning the client end of a TCP connection that came from ``peer`` (ip, port), when
    that end is on this machine (/proc/net/tcp and tcp6, column uid); None when it is not."""
    wanted = (peer[0].removeprefix("::ffff:"), int(peer[1]))
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if _proc_net_address(fields[1]) == wanted:
                return int(fields[7])
    return None


def client_address(request, proxies_in_front: int = 0, proc: Path = Path("/proc")) -> str:
    """The address a sign-in came from, as the hub's own proxy saw it. The proxy
    (configurable-http-proxy, run by root) appends the address of whoever connected to it to
    X-Forwarded-For, after whatever the client wrote there; each reverse proxy the host puts in
    front of it (``proxies_in_front``, e.g. an HTTPS nginx) appends one more. So the entry that
    many places from the end is the first one no client wrote. X-Real-Ip, which tornado's
    ``remote_ip`` prefers to them all, is the client's own word and is never read. A learner's
    process may also talk to the hub's port on 127.0.0.1 directly, writing its own
    X-Forwarded-For: a connection whose client end another account than root owns counts as
    that account, whatever its headers say."""
    peer = getattr(getattr(request.connection, "context", None), "address", None)
    if isinstance(peer, tuple) and len(peer) >= 2:
        owner = socket_owner(peer, proc)
        if owner not in (None, 0):
            return f"uid {owner} on this machine"
        if owner is None:                       # not the proxy, nor anyone on this machine
            return peer[0].removeprefix("::ffff:")
    hops = [hop.strip() for line in request.headers.get_list("X-Forwarded-For")
            for hop in line.split(",") if hop.strip()]
    address = hops[max(0, len(hops) - 1 - proxies_in_front)] if hops else request.remote_ip
    return address.removeprefix("::ffff:")          # an IPv4 client of a dual-stack listener


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
    open_places = Integer(30, config=True, help="How many learners may sign up with the code "
                          "alone; later sign-ups wait until the host adds them (Admin page).")
    proxies_in_front = Integer(0, config=True, help="Reverse proxies in front of the hub's own "
                               "(client_address).")
    # A browser the name has not signed in from: per name 3 free tries, then 1 s, 2 s, 4 s ...
    # (up to 300 s), cleared by the right password; per client address 20 in 10 minutes (a room
    # behind one NAT mistyping), never cleared by a success, or one learner's own account would
    # reset a guesser's count. A browser the name signed in from before: a lock of its own,
    # so that neither a classmate's guesses at the name nor a room sharing one address keep the
    # owner out (OWASP, "Slow Down Online Guessing Attacks with Device Cookies").
    name_lockout = SignInLockout(free=3)
    address_lockout = SignInLockout(free=20, window_s=600)
    browser_lockout = SignInLockout(free=3)

    def get_handlers(self, app):
        return super().get_handlers(app) + [("/signup", SignUpHandler)]

    def _read(self, suffix: str = "") -> dict[str, str]:
        path = Path(self.passwords_file + suffix)
        return json.loads(path.read_text()) if path.exists() else {}

    def _write(self, entries: dict[str, str], suffix: str = "") -> None:
        path = Path(self.passwords_file + suffix)
        fresh = path.with_name(path.name + ".tmp")
        fresh.write_text(json.dumps(entries, indent=1, sort_keys=True))
        fresh.chmod(0o600)
        fresh.replace(path)

    # Learners' password hashes by name ("": a place the host gave before they signed up), and
    # the sign-ups waiting for the host (passwords_file + ".waiting").
    def _passwords(self) -> dict[str, str]:
        return self._read()

    def _save(self, passwords: dict[str, str]) -> None:
        self._write(passwords)

    def _waiting(self) -> dict[str, str]:
        return self._read(".waiting")

    @staticmethod
    def _browser_cookie(name: str) -> str:
        return f"gpulab-known-{name}"

    def _known_browser(self, handler, name: str) -> str | None:
        """The id of this browser when ``name`` signed in from it before (its signed cookie)."""
        if handler is None:
            return None
        value = handler.get_signed_cookie(self._browser_cookie(name), max_age_days=KNOWN_BROWSER_DAYS)
        return value.decode() if value else None

    def _remember_browser(self, handler, name: str, known: str | None) -> None:
        if handler is not None and known is None:
            handler.set_signed_cookie(self._browser_cookie(name), secrets.token_hex(16),
                                      expires_days=KNOWN_BROWSER_DAYS, httponly=True,
                                      path=handler.hub.base_url)

    async def authenticate(self, handler, data):
        name = self.normalize_username(data.get("username", "").strip())
        known = self._known_browser(handler, name)
        if known:
            locks = [(self.browser_lockout, f"browser {name} {known}")]
        else:
            address = client_address(handler.request, self.proxies_in_front) if handler else ""
            locks = [(self.address_lockout, f"address {address}")]
            if name not in self.admin_users:   # the admin code (32+ characters) is not guessed
                locks.append((self.name_lockout, f"name {name}"))
        wait = max(lock.wait_s(key) for lock, key in locks)
        if wait > 0:
            raise web.HTTPError(429, f"Too many failed sign-ins: wait {math.ceil(wait)} s, then "
                                     "try again. Forgot your password? Ask the host.")
        signed_in = await self._check(name, data)
        for lock, key in locks:
            if signed_in is None:
                lock.failed(key)
            elif lock is not self.address_lockout:
                lock.succeeded(key)
        if signed_in is not None:
            self._remember_browser(handler, name, known)
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
        if waiting := self._waiting().get(name):
            if not await asyncio.to_thread(_matches, password, waiting):
                return None
            raise web.HTTPError(403, f"Your sign-up as {name!r} waits for the host: the room is "
                                     "full. Ask the host to add your name on the Admin page.")
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
        # From here to the save, nothing awaits: two sign-ups cannot both take the last place.
        passwords, waiting = self._passwords(), self._waiting()
        if passwords.get(name) or name in waiting:    # claimed while we were hashing
            return None
        if name not in passwords and len(passwords) >= self.open_places:
            if len(waiting) >= WAITING_MAX:
                raise web.HTTPError(403, f"The room is full ({len(passwords)} places) and "
                                         f"{len(waiting)} sign-ups already wait: ask the host.")
            waiting[name] = hashed
            self._write(waiting, ".waiting")
            self.log.warning("workshop: the room is full (%d places); %s waits for the host "
                             "(Admin page, Add Users)", len(passwords), name)
            raise web.HTTPError(403, f"The room is full ({len(passwords)} places): your sign-up "
                                     f"as {name!r} waits for the host. Ask the host to add your "
                                     "name on the Admin page, then sign in with your password.")
        passwords[name] = hashed
        self._save(passwords)
        self.log.info("workshop: %s signed up", name)
        return {"name": name, "admin": False}

    def add_user(self, user):
        """A user the host adds on the Admin page (or the REST API) gets a place: their waiting
        sign-up counts from now on, or the name may sign up with the code however full the
        room is. (Also called for every user at each start of the hub: nothing changes then.)"""
        if user.name not in self.admin_users:
            passwords, waiting = self._passwords(), self._waiting()
            if user.name in waiting:
                passwords[user.name] = waiting.pop(user.name)
                self._write(waiting, ".waiting")
                self._save(passwords)
                self.log.info("workshop: the host let %s in", user.name)
            elif user.name not in passwords:
                passwords[user.name] = ""
                self._save(passwords)
        return super().add_user(user)

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
    home_bytes = Integer(0, config=True, help="Each home's own disk (workshop/homes.py); 0: a "
                         "plain folder on the machine's disk.")

    async def add_system_user(self, user):
        """A new account in the workshop's group, its home readable by its owner alone, on a
        disk of its own of ``home_bytes``. If the system refuses it, the name is freed again:
        nothing is left claimed without an account. In a thread: useradd and mkfs take a
        second on a busy machine, and the hub answers everyone else meanwhile."""
        await asyncio.to_thread(self._make_account, user)

    def _make_account(self, user):
        home = Path(self.home_root) / user.name
        subprocess.run(["groupadd", "--force", self.group], check=True)
        made = subprocess.run(["useradd", "--home-dir", str(home), "--shell", "/bin/bash",
                               "--user-group", "--groups", self.group,
                               *(["--no-create-home"] if self.home_bytes else ["--create-home"]),
                               "--comment", "GPU Training Lab workshop", user.name],
                              capture_output=True, text=True)
        if made.returncode != 0:
            passwords = self._passwords()
            if passwords.pop(user.name, None) is not None:
                self._save(passwords)
            raise web.HTTPError(403, f"This server could not make an account named {user.name!r} "
                                     f"({made.stderr.strip()}): choose another name.")
        if self.home_bytes:
            account = pwd.getpwnam(user.name)
            homes.create(home, self.home_bytes, account.pw_uid, account.pw_gid)
        home.chmod(0o700)
        self.log.info("workshop: created account %s with home %s%s", user.name, home,
                      f" ({self.home_bytes // 2**20} MiB disk of its own)" if self.home_bytes else "")


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
    """(GPULAB_WORKSHOP_HIDE, GPULAB_WORKSHOP_REVEAL) for start_learner.sh: the folders learners
    may not enter that hold what they must reach (the Python installation, the venv, the
    course: e.g. root's home with pyenv's Python, a clone in a private folder), and those paths,
    colon-separated. Each such folder is covered in the learner's mount namespace by an empty
    one, into which the paths under it are bound back, read-only. (Folders never nest here:
    each is the outermost closed folder above its paths.)"""
    hidden = {p: h for p in paths if (h := hidden_ancestor(p))}
    for path, folder in hidden.items():
        if path == folder:
            raise SystemExit(f"workshop: learners cannot enter {path} (mode "
                             f"{path.stat().st_mode & 0o777:o}), which they need: even bound "
                             f"back it stays closed. Give others read and entry: chmod o+rx {path}")
    folders = sorted({str(h) for h in hidden.values()})
    return ":".join(folders), ":".join(str(p) for p in hidden)


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
        # A hub started again after a reboot finds the learners' disks unmounted.
        await asyncio.to_thread(homes.mount, Path(pwd.getpwnam(name).pw_dir))
        device = plan.assign_device(self.settings.devices, self.devices_taken, name)
        if device is not None:
            self.devices_taken[name] = device
        self._device = device
        prefix, self._walls_env = [], {}
        if self.walls is not None:
            limits = plan.learner_limits(self.settings, device)
            nodes = await asyncio.to_thread(walls.device_nodes, device, walls.nvml())
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

    async def run_post_stop_hook(self):
        """What the server left running (a daemon in a session of its own, a kernel's children)
        ends with its walls, however the server ended. JupyterHub calls ``stop`` only on a
        server that still runs (User.stop polls first): one that exited by itself (File > Shut
        Down, a crash, a learner's kill) is marked stopped without it. This hook runs after
        every stop, the idle culler's, the hub's shutdown's and a failed spawn's included."""
        self.devices_taken.pop(self.user.name, None)
        if self.walls is not None:
            await asyncio.to_thread(self.walls.stop, self.user.name)
        return await maybe_future(super().run_post_stop_hook())
