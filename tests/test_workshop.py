"""Workshop mode (issues 20, 30 and 34): a real JupyterHub on localhost with ten learners, walled in.

One hub for the whole file (the `room` fixture), started by workshop/run.py as `make workshop`
starts it, on free ports, with three made-up GPUs (a modelled NVML on the hub's PYTHONPATH,
tests/modelled_nvml, gives them UUIDs and device minor numbers) and small walls: 1 GiB, 128
tasks, 64 MiB of scratch and a 64 MiB home disk per learner, 11 places. The fixture plays the room once, all learners at the
same time where a room would be. First they sign up over HTTP, their servers spawn, each runs
code in a kernel through its server's REST and websocket API and saves its quizzes' verdicts;
one learner's kernel dies first. Then some attack the walls as a hostile learner would while
their classmates work: a memory hog, a process storm, /dev/shm filled, other GPUs' device
nodes opened (mknod stand-ins with NVIDIA's major number: a denial is EPERM, a node the learner
may open but whose driver is absent ENXIO), scratch files and a planted torch.compile cache in
/tmp, the course's solutions and keys, a FIFO, a symlink and a 2 GB sparse file for the
progress page; a home filled past its disk; someone guesses a password; someone signs up as a
system group. Then the host looks. Then, with every place taken, a learner signs up three more
names (the host lets one in, whose server the plan has no room for); a machine elsewhere in the
room sends sign-ins with a made-up X-Real-Ip; a classmate guesses a learner's password six times
while that learner signs in from their own browser; a learner leaves a daemon behind and their
server ends by itself. The tests check what happened (one in Chromium: the learner's and the
host's first minutes), and the last one stops the hub and checks nothing is left. Creating the
learners' system accounts, cgroups and disks needs root, as a workshop does: those tests are
marked needs_root (tests/conftest.py).
"""
from __future__ import annotations

import errno
import json
import os
import pwd
import re
import socket
import stat
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
WORKSHOP = ROOT / "workshop"
sys.path.insert(0, str(WORKSHOP))
import accounts  # noqa: E402
import hub  # noqa: E402
import plan  # noqa: E402
import progress  # noqa: E402
import walls  # noqa: E402
from room import Browser, log_excerpt, start_hub, stop_hub  # noqa: E402

from gpulab import gpu_share  # noqa: E402
from gpulab.course.checks import load_key_module  # noqa: E402

N_LEARNERS = 10
DEVICES = tuple(f"GPU-{i}a1b2c3d-0000-4000-8000-00000000000{i}" for i in range(3))
MACHINE = [{"uuid": uuid_, "minor": i, "name": "NVIDIA H200"} for i, uuid_ in enumerate(DEVICES)]
MEMORY, TASKS, SCRATCH = 2**30, 128, 64 * 2**20
KERNEL_IDLE_S = 20          # long enough for the attacks to use the kernels of the first round
CHAPTER = "01_device_basics"
KEY = load_key_module(ROOT / "autograder" / "keys" / f"{CHAPTER}.py")
ITEM_A, ITEM_B = "01-batch-bytes", "01-batch-mib"
# This run's own group and account names: never a real workshop's, nor another run's beside it.
RUN = uuid.uuid4().hex[:6]
GROUP = f"gpulab-test-{RUN}"
HOST, GUESSED, NEWCOMER = f"w{RUN}host", f"w{RUN}guessed", f"w{RUN}newcomer"
EXTRA = [f"w{RUN}extra{i}" for i in range(3)]    # sign-ups past the room's places
DISK = 64 * 2**20                                # each learner's home
ELSEWHERE, SPOOFER = "127.0.0.2", "127.0.0.3"    # two more machines in the room (loopback)


def learner(i: int) -> str:
    return f"w{RUN}l{i:02d}"


def answers(i: int) -> dict[str, str]:
    """What learner i answers: item A right for even i (else 8x too large), item B right for
    i divisible by 3 (else left unanswered)."""
    a = KEY[ITEM_A].value if i % 2 == 0 else KEY[ITEM_A].value * 8
    b = repr(KEY[ITEM_B].value) if i % 3 == 0 else "..."
    return {ITEM_A: repr(a), ITEM_B: b}


PROBE = """
import json, os, pwd
from gpulab.course.checks import check
from gpulab.gpu_share import memory_fraction
check({item_a!r}, {answer_a})
check({item_b!r}, {answer_b})
seen = {{"user": pwd.getpwuid(os.getuid()).pw_name, "home": os.path.expanduser("~"),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "fraction_env": os.environ.get("GPULAB_GPU_MEMORY_FRACTION"),
        "fraction_read": memory_fraction(), "omp": os.environ.get("OMP_NUM_THREADS")}}
own = os.path.expanduser("~/course/{chapter}/{chapter}.ipynb")
seen["own_notebook_bytes"] = len(open(own).read())
for what, path in [("other_notebook", {other_notebook!r}), ("other_home", {other_home!r})]:
    try:
        open(path).read() if what == "other_notebook" else os.listdir(path)
        seen[what] = "read"
    except PermissionError:
        seen[what] = "denied"
if {with_torch}:
    import gpulab, torch
    seen["cuda_initialised"] = torch.cuda.is_initialized()
    seen["cap_queued"] = any(call.__qualname__ == "cap.<locals>.apply"
                             for call, _ in torch.cuda._queued_calls)
    seen["applied_fraction"] = gpulab.gpu_share.applied_fraction
for folder in ("/tmp", "/var/tmp", "/dev/shm"):          # scratch files of one's own
    open(f"{{folder}}/marker-{{seen['user']}}", "w").write("mine")
if {plant!r}:     # a planted torch.compile cache for a classmate, world-writable as in issue 30
    os.makedirs({plant!r}, exist_ok=True)
    os.chmod({plant!r}, 0o777)
    open(os.path.join({plant!r}, "planted.py"), "w").write("print('a classmate ran this')")
print(json.dumps(seen))
"""

# --------------------------------------------------------------------------------------------
# What hostile learners try while their classmates work (phase 2 of the room)

HOG = """
held = []
while len(held) < 4 * %d // (32 * 2**20):      # four times the limit: a wall that failed
    held.append(bytearray(32 * 2**20))         # zero-filled, so every page is touched
print("the hog got", len(held) * 32, "MiB")
""" % MEMORY
STORM = """
import errno, json, os, time
children, failed = [], None
try:
    while len(children) < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError as error:
    failed = errno.errorcode.get(error.errno)
time.sleep(6)                        # held at the limit while a classmate starts a kernel
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(json.dumps({"started": len(children), "failed": failed}))
"""
FILL_SHM = """
import json, os
def usage():
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return int(open(f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes").read())
        if controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            return int(open(f"/sys/fs/cgroup{path}/memory.current").read())
before, written, failed = usage(), 0, None
try:
    with open("/dev/shm/filling", "wb", buffering=0) as f:
        for _ in range(100):
            written += f.write(b"x" * 2**20)
except OSError as error:
    failed = error.errno
grew = usage() - before
os.remove("/dev/shm/filling")
print(json.dumps({"written": written, "failed": failed, "grew": grew}))
"""
OPEN_NODES = """
import json, os
opened = {}
for path in %r:
    try:
        os.close(os.open(path, os.O_RDWR))
        opened[path] = "opened"
    except OSError as error:
        opened[path] = error.errno
print(json.dumps(opened))
"""
LOOK_AROUND = """
import json, os
seen = {folder: sorted(os.listdir(folder)) for folder in ("/tmp", "/var/tmp", "/dev/shm")}
for path in %r:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path).read(1)
        seen[path] = "read"
    except PermissionError:
        seen[path] = "denied"
    except FileNotFoundError:   # a checkout behind a closed folder: only what learners need shows
        seen[path] = "absent"
print(json.dumps(seen))
"""
INDUCTOR_CACHE = """
import json, os
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
cache = default_cache_dir()
print(json.dumps({"cache": cache, "planted": os.path.exists(os.path.join(cache, "planted.py"))}))
"""
TRAPS = """
import os
course = os.path.expanduser("~/course")
def replace(chapter, make):
    path = f"{course}/{chapter}/{chapter}.ipynb"
    os.remove(path)
    make(path)
replace("02_vram_arithmetic", lambda p: os.symlink(%r, p))   # a notebook only root may read
replace("03_throughput", os.mkfifo)                              # reading it would wait forever
replace("04_mixed_precision", lambda p: os.truncate(open(p, "w").name, 2 * 10**9))  # 2 GB sparse
replace("05_checkpointing_accumulation", lambda p: os.symlink("/etc/shadow", p))
print("set")
"""
FILL_HOME = """
import errno, json, os
home = os.path.expanduser("~")
disk = os.statvfs(home)
written, failed = 0, None
try:
    with open(os.path.join(home, "filling"), "wb", buffering=0) as f:
        for _ in range(%d):                    # twice the disk
            written += f.write(b"x" * 2**20)
except OSError as error:
    failed = errno.errorcode.get(error.errno)
os.remove(os.path.join(home, "filling"))
print(json.dumps({"written": written, "failed": failed, "size": disk.f_blocks * disk.f_frsize,
                  "course": os.path.isdir(os.path.join(home, "course"))}))
""" % (2 * DISK // 2**20)
PAST_THE_PROXY = """
import json, requests
hub = "http://127.0.0.1:%%d/hub/login"
codes = []
for n in range(26):
    claim = {"X-Forwarded-For": f"10.8.{n}.1"}      # the same on both: the hub's XSRF reads it
    s = requests.Session()
    s.get(hub, headers=claim, timeout=30)
    reply = s.post(hub, headers=claim, allow_redirects=False, timeout=30, data={
        "username": f"w%sdirect{n}", "password": "wrong", "_xsrf": s.cookies.get("_xsrf")})
    codes.append(reply.status_code)
    if reply.status_code == 429:
        break
print(json.dumps(codes))
""" % RUN
DAEMON = """
import subprocess
subprocess.run(["setsid", "--fork", "sleep", "600"], check=True, stdin=subprocess.DEVNULL,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("started")
"""
SECRET_ITEM = "99-secret-item"


# --------------------------------------------------------------------------------------------
# The room, played once


@pytest.fixture(scope="module")
def room():
    if not (WORKSHOP / "node_modules" / ".bin" / "configurable-http-proxy").exists():
        pytest.fail("the workshop's proxy is not installed: make test installs it (npm ci --prefix workshop)")
    room = start_hub({"WORKSHOP_GROUP": GROUP, "WORKSHOP_DEVICES": ",".join(DEVICES),
                      "WORKSHOP_LEARNERS": str(N_LEARNERS), "WORKSHOP_KERNEL_IDLE_S": str(KERNEL_IDLE_S),
                      "WORKSHOP_CODE": "room-code-42", "WORKSHOP_ADMIN": HOST,
                      "WORKSHOP_SIGNUPS": str(N_LEARNERS + 1), "WORKSHOP_DISK": str(DISK),
                      "WORKSHOP_MEMORY": str(MEMORY), "WORKSHOP_TASKS": str(TASKS),
                      "WORKSHOP_SCRATCH": str(SCRATCH), "MODELLED_NVML": json.dumps(MACHINE),
                      "PYTHONPATH": str(ROOT / "tests" / "modelled_nvml")})
    room["timings"] = {"hub up": room["hub_up_s"]}
    try:
        play(room)
        yield room
    finally:
        stop_hub(room)


def stand_in_nodes(folder: Path) -> dict[str, Path]:
    """mknod stand-ins for each modelled GPU's node and nvidiactl: NVIDIA's numbers, no driver."""
    folder.mkdir(mode=0o755)
    nodes = {d["uuid"]: folder / f"nvidia{d['minor']}" for d in MACHINE}
    nodes["ctl"] = folder / "nvidiactl"
    for name, path in nodes.items():
        minor = 255 if name == "ctl" else int(path.name.removeprefix("nvidia"))
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(walls.NVIDIA_MAJOR, minor))
        path.chmod(0o666)
    return nodes


def play(room: dict) -> None:
    base, env, timings = room["base"], room["env"], room["timings"]
    start = time.monotonic()

    # Everyone signs up at once, and their servers spawn.
    browsers = [Browser(base, learner(i)) for i in range(N_LEARNERS)]

    def sign_up_and_spawn(b: Browser):
        reply = b.sign_up(password=f"pw-{b.name}", code=env["WORKSHOP_CODE"])
        assert reply.status_code == 302, (b.name, reply.status_code, reply.text[:500])
        b.use_token()
        b.spawn()
        b.wait_ready()

    t = time.monotonic()
    try:
        with ThreadPoolExecutor(N_LEARNERS) as pool:
            list(pool.map(sign_up_and_spawn, browsers))
    except Exception as error:   # say what the hub and the servers said about it
        raise RuntimeError(f"{error}\nhub log (errors, warnings, learners):\n{log_excerpt(room)}") from error
    timings["10 sign-ups and spawns"] = time.monotonic() - t
    room["browsers"] = browsers

    # Two who may not get in: a wrong code, and someone else claiming a taken name.
    room["wrong_code"] = Browser(base, NEWCOMER).sign_up("pw-newcomer", code="wrong-code").status_code
    room["taken_name"] = Browser(base, learner(1)).sign_up("pw-impostor", code=env["WORKSHOP_CODE"]).status_code

    # Learner 0's kernel dies; their server starts it again (their probe runs in it, below).
    dying = browsers[0].start_kernel(path=f"course/{CHAPTER}")
    room["death"] = browsers[0].execute(dying, "import os; os._exit(1)")

    # Then everyone runs their probe (learner 2 imports torch too) and saves the verdicts;
    # learner 1 plants a torch.compile cache for learner 2.
    homes = {b.name: pwd.getpwnam(b.name).pw_dir for b in browsers}

    def probe(i: int) -> dict:
        b, other = browsers[i], browsers[(i + 1) % N_LEARNERS].name
        kernel = dying if i == 0 else b.start_kernel(path=f"course/{CHAPTER}")
        a = answers(i)
        code = PROBE.format(item_a=ITEM_A, answer_a=a[ITEM_A], item_b=ITEM_B, answer_b=a[ITEM_B],
                            chapter=CHAPTER, with_torch=i == 2, other_home=homes[other],
                            other_notebook=f"{homes[other]}/course/{CHAPTER}/{CHAPTER}.ipynb",
                            plant=f"/tmp/torchinductor_{learner(2)}" if i == 1 else "")
        result = b.execute(kernel, code)
        assert "error" not in result and not result["died"], (b.name, result)
        b.save_verdicts(CHAPTER, result["displays"])
        return json.loads(result["stdout"].strip().splitlines()[-1]), kernel

    t = time.monotonic()
    with ThreadPoolExecutor(N_LEARNERS) as pool:
        probed = list(pool.map(probe, range(N_LEARNERS)))
    room["seen"] = {b.name: seen for b, (seen, _) in zip(browsers, probed)}
    kernels = {b.name: kernel for b, (_, kernel) in zip(browsers, probed)}
    room["idle_kernel"] = kernels[learner(1)]      # learner 1 leaves their kernel idle from now on
    timings["10 kernels probed"] = time.monotonic() - t
    room["servers_after"] = {b.name: b.api("GET", "status").status_code for b in browsers}

    # Phase 2: the walls attacked, each attack beside a classmate who keeps working.
    t = time.monotonic()
    nodes = stand_in_nodes(room["tmp"] / "dev")
    secret = room["tmp"] / "secret.ipynb"           # root's: a learner's symlink must not reach it
    secret.write_text(json.dumps({"cells": [{"cell_type": "code", "source": f'check("{SECRET_ITEM}", 1)',
                                             "metadata": {}, "outputs": [{"output_type": "display_data",
                                             "metadata": {}, "data": {"text/html": '<div class="gpulab-check-right">'}}]}]}))
    secret.chmod(0o600)
    private = [str(ROOT / "solutions"), str(ROOT / "autograder" / "keys"),
               str(ROOT / "autograder" / "keys" / f"{CHAPTER}.py")]
    hub_answers = []

    def keep_asking_the_hub(stop: threading.Event):
        while not stop.is_set():
            try:
                hub_answers.append(requests.get(f"{base}/hub/api", timeout=10).status_code)
            except requests.RequestException as error:
                hub_answers.append(repr(error))
            stop.wait(0.25)

    def attack(name: str):
        if name == "guesser":
            return guess_passwords(base, env["WORKSHOP_CODE"])
        b = browsers[int(name[-1])]
        if name == "hog 3":                # in a kernel of its own
            return b.execute(b.start_kernel(), HOG, timeout=120)
        if name == "working 4":            # a classmate's kernel, started before the hog, computing
            return b.execute(kernels[b.name], "print(sum(i * i for i in range(3 * 10**6)))")
        if name == "storm 5":
            return b.execute(kernels[b.name], STORM, timeout=120)
        if name == "new kernel 6":         # a classmate starting a kernel during the storm
            time.sleep(1)
            return b.execute(b.start_kernel(), "print(6 * 7)")
        if name == "shm 7":
            found = b.execute(kernels[b.name], FILL_SHM)
            found["home"] = b.execute(kernels[b.name], FILL_HOME)
            return found
        if name == "nodes 8":
            found = b.execute(kernels[b.name], OPEN_NODES % [str(p) for p in nodes.values()])
            found["traps"] = b.execute(kernels[b.name], TRAPS % str(secret))
            return found
        if name == "look 9":
            return b.execute(kernels[b.name], LOOK_AROUND % private)
        assert name == "inductor 2"
        return b.execute(kernels[b.name], INDUCTOR_CACHE)

    attacks = ["hog 3", "storm 5", "shm 7", "nodes 8", "look 9", "inductor 2", "working 4",
               "new kernel 6", "guesser"]
    stop = threading.Event()
    asker = threading.Thread(target=keep_asking_the_hub, args=(stop,))
    asker.start()
    try:
        with ThreadPoolExecutor(len(attacks)) as pool:
            room["attacks"] = dict(zip(attacks, pool.map(attack, attacks)))
    finally:
        stop.set()
        asker.join()
    room["hub_answers"], room["nodes"], room["private"] = hub_answers, nodes, private
    room["after_hog"] = browsers[3].execute(browsers[3].start_kernel(), "from gpulab import gpu_share\n"
                                            "print('\\n'.join(gpu_share.share_lines(None)))")
    room["classmate_after_hog"] = browsers[4].execute(kernels[learner(4)], "print('still here')")
    applier = walls.detect(GROUP)[0]
    events = (applier.folder("memory", learner(3)) / "memory.oom_control"
              if isinstance(applier, walls.CgroupV1) else applier.folder(learner(3)) / "memory.events")
    room["hog_oom_kills"] = int(re.search(r"oom_kill (\d+)", events.read_text()).group(1))
    timings["attacks"] = time.monotonic() - t

    # The host signs in (landing on the Admin page) and opens the progress page.
    host = Browser(base, env["WORKSHOP_ADMIN"])
    room["host_sign_in"] = host.sign_in(env["WORKSHOP_ADMIN_CODE"])
    room["host_servers"] = host.http.get(f"{base}/hub/api/user", timeout=30).json().get("servers")
    t = time.monotonic()
    page = host.http.get(f"{base}/services/progress/", timeout=60)
    room["progress_s"] = time.monotonic() - t
    room["progress"] = (page.status_code, page.text)
    room["learner_progress_blocked"] = browsers[3].http.get(
        f"{base}/services/progress/", timeout=60, allow_redirects=False).status_code
    room["home_7"] = pwd.getpwnam(learner(7)).pw_dir

    # Phase 3, one after the other: sign-ups past the room's places (the host lets one in, whose
    # server the plan has no room for); then, side by side, sign-ins with a made-up X-Real-Ip and a
    # classmate's guesses at a name, and a learner's daemon that must not outlive their server.
    t = time.monotonic()
    host.use_token()
    room["past_the_places"] = sign_up_past_the_places(base, host, env["WORKSHOP_CODE"])
    with ThreadPoolExecutor(2) as pool:
        sign_ins = pool.submit(spoof_and_lock_out, base, browsers, int(env["WORKSHOP_HUB_PORT"]))
        room["after_stop"] = stop_and_look(room, browsers[6])
        room["sign_ins"] = sign_ins.result()
    timings["sign-ups, sign-ins, a stop"] = time.monotonic() - t

    # Learner 1's idle kernel goes within the culler's timeout and interval.
    t = time.monotonic()
    while time.monotonic() - t < 4 * KERNEL_IDLE_S:
        kernels_now = [k["id"] for k in browsers[1].api("GET", "kernels").json()]
        if room["idle_kernel"] not in kernels_now:
            break
        time.sleep(0.5)
    room["idle_kernel_left"] = room["idle_kernel"] in kernels_now
    timings["all"] = time.monotonic() - start + timings["hub up"]
    print("workshop timings (s):", {k: round(v, 1) for k, v in timings.items()})


def sign_up_past_the_places(base: str, host: Browser, code: str) -> dict:
    """With every place taken (ten learners and the guessed one), one learner signs up three
    more names at once; one of them tries to sign in; the host adds it; it tries to spawn."""
    extra = [Browser(base, name) for name in EXTRA]
    with ThreadPoolExecutor(len(extra)) as pool:
        replies = list(pool.map(lambda b: b.sign_up(f"pw-{b.name}", code), extra))
    seen = {"sign_ups": [(r.status_code, r.text) for r in replies]}
    early = extra[0].sign_in(f"pw-{EXTRA[0]}")
    seen["early sign-in"] = (early.status_code, early.text)
    seen["accounts"] = [accounts.system_account_exists(name) for name in EXTRA]
    seen["hub users"] = [host.http.get(f"{base}/hub/api/users/{name}", timeout=30).status_code
                         for name in EXTRA]
    seen["host adds"] = host.http.post(f"{base}/hub/api/users/{EXTRA[0]}", timeout=60).status_code
    let_in = Browser(base, EXTRA[0])
    seen["let in"] = let_in.sign_in(f"pw-{EXTRA[0]}").status_code
    let_in.use_token()
    spawn = let_in.http.post(f"{base}/hub/api/users/{EXTRA[0]}/server", timeout=60)
    seen["spawn"] = (spawn.status_code, spawn.text)
    return seen


def spoof_and_lock_out(base: str, browsers: list[Browser], hub_port: int) -> dict:
    """Three attacks on the sign-in lock. A machine at SPOOFER sends wrong sign-ins that claim
    (X-Real-Ip) to come from ELSEWHERE, where a learner then signs in; then more, each claiming
    an address of its own. Learner 9's kernel sends wrong sign-ins to the hub's own port, past
    the proxy, each with an X-Forwarded-For of its own. A classmate (same address as everyone)
    guesses learner 4's password six times, waiting out each lock; learner 4 then signs in from
    their own browser."""
    seen = {}
    b9 = browsers[9]
    seen["past the proxy"] = json.loads(b9.execute(b9.start_kernel(), PAST_THE_PROXY % hub_port,
                                                   timeout=120)["stdout"].strip().splitlines()[-1])
    spoofer = lambda n: Browser(base, f"w{RUN}nobody{n}", address=SPOOFER)  # noqa: E731
    seen["claiming elsewhere"] = [spoofer(n).sign_in("wrong", headers={"X-Real-Ip": ELSEWHERE})
                                  .status_code for n in range(21)]
    seen["elsewhere"] = Browser(base, learner(7), address=ELSEWHERE).sign_in(f"pw-{learner(7)}").status_code
    seen["fresh claims"] = []
    for n in range(21, 26):                            # each claims an address never seen before
        status = spoofer(n).sign_in("wrong", headers={"X-Real-Ip": f"10.9.{n}.1"}).status_code
        seen["fresh claims"].append(status)
        if status == 429:
            break
    classmate, failures, seen["guesses"] = Browser(base, learner(4)), 0, []
    while failures < 6:                                # 3 free, then locks of 1, 2 and 4 s
        reply = classmate.sign_in(f"guess-{failures}")
        seen["guesses"].append(reply.status_code)
        if reply.status_code == 429:
            time.sleep(float(re.search(r"wait (\d+) s", reply.text).group(1)))
        else:
            failures += 1
    owner = Browser(base, learner(4))                  # the browser they signed up in, signed out
    for cookie in browsers[4].signed_in.cookies:
        if cookie.name.startswith("gpulab-known-"):
            owner.http.cookies.set_cookie(cookie)
    seen["owner"] = owner.sign_in(f"pw-{learner(4)}").status_code
    seen["classmate, right password"] = classmate.sign_in(f"pw-{learner(4)}").status_code
    return seen


def stop_and_look(room: dict, b: Browser) -> dict:
    """A learner starts a daemon in a session of its own, then their server ends by itself (as
    File > Shut Down ends it) and they press Stop My Server: what is left of them?"""
    base, uid = room["base"], pwd.getpwnam(b.name).pw_uid
    seen = {"daemon": b.execute(b.start_kernel(), DAEMON)}
    seen["running before"] = len(processes_of(uid))
    seen["shutdown"] = b.api("POST", "shutdown").status_code
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if b.api("GET", "status").status_code != 200:
                break
        except requests.RequestException:
            break
        time.sleep(0.5)
    seen["stop"] = b.http.delete(f"{base}/hub/api/users/{b.name}/server", timeout=120).status_code
    while time.monotonic() < deadline and b.http.get(f"{base}/hub/api/users/{b.name}",
                                                     timeout=30).json()["servers"]:
        time.sleep(0.5)
    time.sleep(0.5)
    seen["left"] = processes_of(uid)
    applier = walls.detect(GROUP)[0]
    seen["cgroups left"] = [str(applier.folder(c, b.name)) for c in applier.controllers
                            if applier.folder(c, b.name).exists()]
    return seen


def processes_of(uid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and accounts._owner(p) == uid]


def guess_passwords(base: str, code: str) -> dict:
    """Someone signs up, then someone else guesses their password; a name the system uses."""
    seen = {"sign_up": Browser(base, GUESSED).sign_up("right-password", code).status_code}
    guesser = Browser(base, GUESSED)
    seen["guesses"] = [guesser.sign_in(f"guess-{n}").status_code for n in range(4)]  # 3 free
    locked = guesser.sign_in("right-password")            # locked, even with the right one
    seen["locked"] = (locked.status_code, locked.text)
    time.sleep(1.2)
    seen["one more guess"] = guesser.sign_in("guess-5").status_code
    locked = guesser.sign_in("right-password")
    seen["locked again"] = (locked.status_code, locked.text)   # longer this time
    time.sleep(2.2)
    seen["right after"] = guesser.sign_in("right-password").status_code
    for name in ("adm", "daemon"):                          # a system group; a system account
        reply = Browser(base, name).sign_up("pw-system", code)
        seen[name] = (reply.status_code, reply.text)
    return seen


# --------------------------------------------------------------------------------------------
# What happened


@pytest.mark.needs_root
def test_learners_sign_up_with_the_code_and_their_servers_spawn(room):
    assert len(room["browsers"]) == N_LEARNERS
    assert all(status == 200 for status in room["servers_after"].values()), room["servers_after"]
    assert room["wrong_code"] == 403, "a wrong workshop code must not sign anyone up"
    assert room["taken_name"] == 403, "a claimed name must need its owner's password"


@pytest.mark.needs_root
def test_each_learner_gets_the_planned_gpu_memory_cap_and_threads(room):
    seen = room["seen"]
    per_device = {d: sum(s["CUDA_VISIBLE_DEVICES"] == d for s in seen.values()) for d in DEVICES}
    assert sorted(per_device.values()) == [3, 3, 4], per_device     # 10 learners, 3 devices
    fraction = (1 - 0.15) / 4                                        # 4 share the fullest device
    for name, s in seen.items():
        assert s["fraction_env"] == f"{int(fraction * 1000) / 1000:g}", (name, s)
        assert s["fraction_read"] == pytest.approx(0.212), (name, s)
        assert s["omp"] == str(max(1, os.cpu_count() // N_LEARNERS)), (name, s)


@pytest.mark.needs_root
def test_learners_run_as_their_own_account_and_cannot_read_each_other(room):
    for name, s in room["seen"].items():
        assert s["user"] == name and s["home"] == pwd.getpwnam(name).pw_dir
        assert s["own_notebook_bytes"] > 10_000, "each learner has their own copy of the course"
        assert s["other_notebook"] == "denied" and s["other_home"] == "denied", (name, s)
        assert os.stat(s["home"]).st_mode & 0o777 == 0o700


@pytest.mark.needs_root
def test_gpulab_queues_the_cap_without_starting_cuda(room):
    s = room["seen"][learner(2)]
    assert s["cap_queued"] and s["applied_fraction"] == pytest.approx(0.212)
    assert s["cuda_initialised"] is False


@pytest.mark.needs_root
def test_a_dead_kernel_leaves_the_other_learners_working(room):
    assert room["death"]["died"], room["death"]
    # Everyone's probe ran after learner 0's kernel died, learner 0's in the restarted kernel.
    assert set(room["seen"]) == {learner(i) for i in range(N_LEARNERS)}


@pytest.mark.needs_root
def test_an_idle_kernel_is_culled(room):
    assert not room["idle_kernel_left"], f"kernel still there after {4 * KERNEL_IDLE_S} s"


@pytest.mark.needs_root
def test_the_progress_page_shows_each_learners_answered_quizzes(room):
    status, page = room["progress"]
    assert status == 200, page[:500]
    assert room["learner_progress_blocked"] in (302, 403), "only the host sees the room"
    for i in range(N_LEARNERS):
        row = re.search(rf'<tr id="learner-{learner(i)}">(.*?)</tr>', page, re.S).group(1)
        right = set(re.findall(r'class="right">✔ ([\w-]+)', row))
        wrong = set(re.findall(r'class="wrong">✘ ([\w-]+)', row))
        expect_right = {ITEM_A} if i % 2 == 0 else set()
        expect_right |= {ITEM_B} if i % 3 == 0 else set()
        assert right == expect_right and wrong == ({ITEM_A} if i % 2 else set()), (i, row)
        assert CHAPTER in row


def output(result: dict) -> dict:
    """The JSON a hostile snippet printed last, or the whole result when it printed none."""
    assert "error" not in result and not result["died"], result
    return json.loads(result["stdout"].strip().splitlines()[-1])


@pytest.mark.needs_root
def test_a_memory_hog_is_stopped_while_a_classmate_keeps_working_and_the_hub_answers(room):
    hog = room["attacks"]["hog 3"]
    assert hog["died"] or "MemoryError" in hog.get("error", ""), hog
    assert room["hog_oom_kills"] >= 1, "the kernel's own memory cgroup stopped it"
    assert room["attacks"]["working 4"]["stdout"].strip() == str(sum(i * i for i in range(3 * 10**6)))
    assert room["classmate_after_hog"]["stdout"].strip() == "still here"
    assert room["hub_answers"] and set(room["hub_answers"]) == {200}, room["hub_answers"]
    # The learner can read the limit that stopped them (the doctor shows these lines).
    assert re.search(rf"workshop memory +{MEMORY / 2**30:.2f} GiB for all your processes",
                     room["after_hog"]["stdout"]), room["after_hog"]


@pytest.mark.needs_root
def test_a_process_storm_stops_at_the_tasks_limit_while_a_classmate_starts_a_kernel(room):
    storm = output(room["attacks"]["storm 5"])
    assert storm["failed"] == "EAGAIN" and 0 < storm["started"] < TASKS, storm
    assert room["attacks"]["new kernel 6"]["stdout"].strip() == "42"


@pytest.mark.needs_root
def test_scratch_is_private_capped_and_counted_in_the_learners_memory(room):
    look = output(room["attacks"]["look 9"])
    me = learner(9)
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        markers = [n for n in look[folder] if n.startswith("marker-")]
        assert markers == [f"marker-{me}"], (folder, look[folder])
    assert not any(n.startswith("torchinductor_") for n in look["/tmp"])
    shm = output(room["attacks"]["shm 7"])
    assert shm["failed"] == errno.ENOSPC and SCRATCH - 2**20 <= shm["written"] <= SCRATCH, shm
    assert shm["grew"] >= shm["written"] * 0.9, "tmpfs pages count in the learner's memory"


@pytest.mark.needs_root
def test_a_planted_torch_compile_cache_has_no_effect(room):
    found = output(room["attacks"]["inductor 2"])
    assert found["cache"] == f"/tmp/torchinductor_{learner(2)}" and found["planted"] is False


@pytest.mark.needs_root
def test_a_learner_can_open_their_own_gpu_only(room):
    opened = output(room["attacks"]["nodes 8"])
    own = room["nodes"][room["seen"][learner(8)]["CUDA_VISIBLE_DEVICES"]]
    for name, node in room["nodes"].items():
        # ENXIO: the node may be opened, but no driver answers; EPERM: the devices cgroup refused
        expected = errno.ENXIO if node in (own, room["nodes"]["ctl"]) else errno.EPERM
        assert opened[str(node)] == expected, (name, opened)


@pytest.mark.needs_root
def test_learners_cannot_read_the_solutions_or_the_keys(room):
    look = output(room["attacks"]["look 9"])
    assert {look[p] for p in room["private"]} <= {"denied", "absent"}, look
    import check
    lines, walled = check.walls_lines(plan.settings_from_env({"WORKSHOP_DEVICES": "none"}), GROUP)
    assert walled and "walls                 cgroup v1" in lines[0], lines
    assert any("instructor folders    closed to learner accounts" in line for line in lines), lines
    assert any(re.match(r"  disk per learner +[\d.]+ GiB home, a disk of its own", line)
               for line in lines), lines


@pytest.mark.needs_root
def test_failed_sign_ins_lock_the_name_for_a_growing_while(room):
    seen = room["attacks"]["guesser"]
    assert seen["sign_up"] == 302 and seen["guesses"] == [403] * 4, seen
    assert seen["locked"][0] == 429 and "wait 1 s" in seen["locked"][1], seen["locked"][0]
    assert seen["one more guess"] == 403
    assert seen["locked again"][0] == 429 and "wait 2 s" in seen["locked again"][1]
    assert seen["right after"] == 302, "the right password works again after the lock"


@pytest.mark.needs_root
def test_a_made_up_x_real_ip_neither_locks_others_out_nor_escapes_the_limit(room):
    """The lock counts the address the hub's proxy saw: 21 failures claiming to come from
    ELSEWHERE lock SPOOFER, not ELSEWHERE; a fresh claim each time escapes nothing, nor does a
    learner's X-Forwarded-For sent to the hub's own port past the proxy."""
    seen = room["sign_ins"]
    assert seen["past the proxy"] == [403] * 21 + [429], seen["past the proxy"]
    proxy_errors = [line for line in room["log"].read_text().splitlines() if "ConfigProxy" in line
                    and "/hub/login" in line]
    assert seen["claiming elsewhere"] == [403] * 21, (seen, proxy_errors)
    assert seen["elsewhere"] == 302, "a learner at the claimed address was locked out"
    assert seen["fresh claims"][-1] == 429 and len(seen["fresh claims"]) <= 2, seen


@pytest.mark.needs_root
def test_a_classmate_cannot_lock_a_learner_out(room):
    """Six guesses at learner 4's name, from the room's one address, lock the name for every
    browser it has not signed in from; its owner's own browser signs in at once."""
    seen = room["sign_ins"]
    assert seen["guesses"].count(403) == 6 and 429 in seen["guesses"], seen
    assert seen["owner"] == 302, "the owner's right password was refused"
    assert seen["classmate, right password"] == 429, "the name stays locked to the guesser"


@pytest.mark.needs_root
def test_sign_ups_past_the_rooms_places_wait_for_the_host(room):
    seen = room["past_the_places"]
    for status, text in seen["sign_ups"]:
        assert status == 403 and "The room is full (11 places)" in text, (status, text[:300])
    assert seen["early sign-in"][0] == 403 and "waits for the host" in seen["early sign-in"][1]
    assert seen["accounts"] == [False] * 3 and seen["hub users"] == [404] * 3, seen
    saved = json.loads((room["tmp"] / "state" / "learners.json").read_text())
    assert len(saved) == 12 and EXTRA[0] in saved and not set(EXTRA[1:]) & set(saved)
    assert seen["host adds"] == 201 and seen["let in"] == 302, seen
    # The plan's ten servers run: an eleventh waits (JupyterHub's active_server_limit).
    assert seen["spawn"][0] == 429 and "limit" in seen["spawn"][1].lower(), seen["spawn"]


@pytest.mark.needs_root
def test_a_stopped_learner_leaves_nothing_running(room):
    seen = room["after_stop"]
    assert seen["daemon"]["stdout"].strip() == "started" and seen["running before"] >= 3, seen
    assert seen["shutdown"] in (200, 202, 204) and seen["stop"] in (202, 204), seen
    assert seen["left"] == [], f"{learner(6)}'s processes outlived their server: {seen['left']}"
    assert seen["cgroups left"] == [], seen


@pytest.mark.needs_root
def test_a_learners_home_is_a_disk_of_its_own(room):
    """Writing twice the disk's size stops at it (ENOSPC) in the learner's own home; on a machine
    that cannot give homes a disk (no loop devices), the banner says so instead."""
    import homes
    filled = output(room["attacks"]["shm 7"]["home"])
    if homes.why_not(room["tmp"] / "homes") is not None:       # the stated fallback
        assert "disk       NO CAP (" in room["log"].read_text() and filled["failed"] is None
        return
    assert filled["failed"] == "ENOSPC" and DISK // 2 < filled["written"] <= DISK, filled
    assert filled["size"] <= DISK and filled["course"], filled
    home = Path(room["home_7"])
    assert os.path.ismount(home) and homes.size_bytes(home) == DISK


@pytest.mark.needs_root
def test_a_system_name_is_refused_before_anything_is_saved(room):
    seen = room["attacks"]["guesser"]
    saved = json.loads((room["tmp"] / "state" / "learners.json").read_text())
    for name in ("adm", "daemon"):
        status, text = seen[name]
        assert status == 403 and "already used on this server" in text, (name, status)
        assert name not in saved and not accounts.is_learner_account(name, GROUP)


@pytest.mark.needs_root
def test_the_host_lands_on_the_admin_page_without_a_server(room):
    reply = room["host_sign_in"]
    assert reply.status_code == 302 and reply.headers["Location"].endswith("/hub/admin")
    assert room["host_servers"] == {}


@pytest.mark.needs_root
def test_the_progress_page_answers_through_fifos_symlinks_and_huge_files(room):
    assert room["attacks"]["nodes 8"]["traps"]["stdout"].strip() == "set"
    status, page = room["progress"]
    assert status == 200 and SECRET_ITEM not in page and "root:" not in page
    row = re.search(rf'<tr id="learner-{learner(8)}">(.*?)</tr>', page, re.S).group(1)
    assert CHAPTER in row                                   # the rest of their folder was read
    print(f"progress page with the traps set: {room['progress_s']:.2f} s")
    assert room["progress_s"] < 10, "a learner's folder held the page"


@pytest.mark.needs_root
def test_the_first_minutes_in_chromium(room):
    """A learner signs in and lands on "start here" without a news prompt or an empty menu, and
    runs the doctor in a terminal; the host lands on the Admin page, and the progress page links
    back and fits 1280 px. (The sign-up page is checked here too; the room signed up over HTTP.)"""
    sys.path.insert(0, str(ROOT / "scripts"))
    import browser
    base, b0 = room["base"], room["browsers"][0]
    with browser.chromium() as chromium:
        page = chromium.new_page(viewport=browser.VIEWPORT)
        missing, errors = [], []
        page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{base}/hub/login")
        page.click("#signup-link a")
        page.wait_for_url("**/hub/signup")
        assert page.locator("h1").inner_text().strip() == "Sign up"
        assert hub.NAME_RULES in page.locator("#name-rules").inner_text()
        assert page.locator("input[name=otp]").count() == 1
        page.goto(f"{base}/hub/login")
        assert page.locator("input[name=otp]").count() == 0     # signing in needs no code
        page.fill("#username_input", b0.name)
        page.fill("#password_input", f"pw-{b0.name}")
        page.click("#login_submit")
        page.wait_for_selector(".jp-RenderedMarkdown h1", timeout=90_000)
        assert "Start here" in page.locator(".jp-RenderedMarkdown h1").first.inner_text()
        page.wait_for_timeout(3000)           # JupyterLab asks about news within its first seconds
        assert page.locator(".jp-toast-button", has_text="No").count() == 0
        menus = page.locator(".lm-MenuBar-itemLabel").all_inner_texts()
        assert "File" in menus and not any("grader" in m.lower() for m in menus), menus
        browser.menu(page, "File", "New", "Terminal")
        page.wait_for_selector(".jp-Terminal", timeout=30_000)
        page.locator(".jp-Terminal").first.click()
        page.keyboard.type("python -m gpulab doctor > ~/doctor.txt 2>&1; mv ~/doctor.txt ~/doctor.done\n")
        deadline, report = time.monotonic() + 120, None
        while report is None and time.monotonic() < deadline:
            reply = b0.api("GET", "contents/doctor.done")
            report = reply.json()["content"] if reply.ok else None
            time.sleep(1)
        assert report and "Verdict: " in report and "workshop memory" in report, report
        assert not [url for url in missing if "/user/" in url], missing     # lsp/status was one
        assert not [e for e in errors if "lsp" in e.lower() or "plugin" in e.lower()], errors

        host = chromium.new_page(viewport=browser.VIEWPORT)
        host.goto(f"{base}/hub/login")
        host.fill("#username_input", room["env"]["WORKSHOP_ADMIN"])
        host.fill("#password_input", room["env"]["WORKSHOP_ADMIN_CODE"])
        host.click("#login_submit")
        host.wait_for_url("**/hub/admin", timeout=30_000)
        host.goto(f"{base}/services/progress/")
        host.wait_for_selector("#back-to-admin")
        assert host.locator("#back-to-admin").get_attribute("href").endswith("/hub/admin")
        width = host.evaluate("document.documentElement.scrollWidth")
        assert width <= browser.VIEWPORT["width"], f"the progress page is {width} px wide"


@pytest.mark.needs_root
def test_the_banner_gives_the_room_an_address_it_can_reach(room):
    banner = re.search(r"open\s+http://([^:/]+):(\d+)/(.*)", room["log"].read_text())
    assert banner and banner.group(1) == "127.0.0.1" and "only this machine" in banner.group(3)
    import run
    address = run.room_address("0.0.0.0")           # what a hub listening everywhere prints
    with socket.create_server(("0.0.0.0", 0)) as listening:
        with socket.create_connection((address, listening.getsockname()[1]), timeout=5):
            pass                                     # this machine answers at that address
    assert not socket.gethostbyname(address).startswith("127."), address


# --------------------------------------------------------------------------------------------
# Chapter 12's leaderboard in the room (issue 39): three learners run their plans in their own
# kernels, a fourth forges a result file, and the board ranks them by its own measurement.
# (In the room fixture's hub; placed before the test that stops it.)

CAPSTONE = "12_capstone"
# Learners whose servers and sign-ins the rest of the room leaves alone (6's server is stopped,
# 4's name is locked by a guesser, 9 probes the hub's port).
FAST, SLOW, OVER, FORGER = learner(2), learner(5), learner(8), learner(0)
BOARD_LEARNERS = {FAST: "micro_batch=6 accumulation=4 workers=3",          # hides the loading
                  SLOW: "micro_batch=6 accumulation=4",                    # waits for every batch
                  OVER: "micro_batch=24 accumulation=1"}                   # the naive run: over
CAPSTONE_RUN = """
import json, os
from gpulab.capstone import budget, plan, results, run
measured = run.measure_in_fresh_process(plan.Plan.parse(%r), budget.CANONICAL, steps=2)
done = results.record(measured, os.path.expanduser("~/course/12_capstone"))
print(json.dumps({"in_budget": done.in_budget, "speedup": done.speedup}))
"""
FORGERY = """
import json, os
line = json.loads(%r)
lines = [dict(line, speedup=99.0),                                     # a slow plan, "99x"
         dict(line, speedup=50.0, device="<script>document.title='pwned'</script>"
              "<img src=x onerror=\\"document.title='pwned'\\">"),
         dict(line, plan="<img src=x onerror=alert(1)>", speedup=98.0)]     # no plan: refused
with open(os.path.expanduser("~/course/12_capstone/capstone-runs.jsonl"), "w") as f:
    f.write("\\n".join(json.dumps(l) for l in lines) + "\\n")
print("forged")
"""


def forged_line(plan_text: str) -> str:
    """A result line as a run writes it, for the forger to edit."""
    from gpulab.capstone import results
    return json.dumps(results.run_of({
        "plan": plan_text, "budget": "A", "device": "cpu", "peak_bytes": 22 * 2**20,
        "naive_peak_bytes": 54 * 2**20, "step_s": 1.0, "naive_step_s": 1.0, "tokens_per_s": 1536.0,
        "naive_tokens_per_s": 1536.0, "speedup": 1.0, "in_budget": True, "why": ""}).__dict__)


def board_order(page) -> list[tuple[str, str, str]]:
    """(learner, rank, verdict) of each row of the board a page shows, top to bottom."""
    return [tuple(row.locator("td").nth(i).inner_text().strip() for i in (1, 0, 4))
            for row in page.locator("#board tr[id^=board-]").all()]


@pytest.mark.needs_root
def test_the_room_board_ranks_runs_by_its_own_measurement_in_chromium(room):
    """Three learners run in their kernels (walls and all); a fourth forges a result file (a
    slow plan claimed 99x, a script in a field, a plan that is markup). In Chromium the host's
    page ranks the one who hid the loading first, lists the naive run as over budget, ranks the
    forger at the slow plan's measured speed, shows none of the forged text and runs none of
    its script; a learner reaches the board, but not the host's table."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import browser
    base, env = room["base"], room["env"]
    browsers = {b.name: b for b in room["browsers"]}

    def capstone_run(name: str) -> dict:
        b = browsers[name]
        return output(b.execute(b.start_kernel(path=f"course/{CAPSTONE}"),
                                CAPSTONE_RUN % BOARD_LEARNERS[name], timeout=600))

    t = time.monotonic()
    with ThreadPoolExecutor(len(BOARD_LEARNERS)) as pool:
        ran = dict(zip(BOARD_LEARNERS, pool.map(capstone_run, BOARD_LEARNERS)))
    forger = browsers[FORGER]
    forged = forger.execute(forger.start_kernel(), FORGERY % forged_line(BOARD_LEARNERS[SLOW]))
    assert forged["stdout"].strip() == "forged", forged
    print(f"capstone runs in three kernels: {time.monotonic() - t:.0f} s", ran)
    assert ran[FAST]["in_budget"] and ran[SLOW]["in_budget"]
    assert not ran[OVER]["in_budget"] and ran[OVER]["speedup"] is None

    with browser.chromium() as chromium:
        host = chromium.new_page(viewport=browser.VIEWPORT)
        dialogs = []
        host.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        host.goto(f"{base}/hub/login")
        host.fill("#username_input", env["WORKSHOP_ADMIN"])
        host.fill("#password_input", env["WORKSHOP_ADMIN_CODE"])
        host.click("#login_submit")
        host.wait_for_url("**/hub/admin", timeout=30_000)
        deadline = time.monotonic() + 420                   # the board measures two plans
        while True:
            host.goto(f"{base}/services/progress/")
            host.wait_for_selector("#board")
            order = board_order(host)
            if not any(verdict == "measuring" for _, _, verdict in order) or time.monotonic() > deadline:
                break
            host.wait_for_timeout(5000)
        print(f"board measured in {time.monotonic() - t:.0f} s since the runs began:", order)
        names = [name for name, _, _ in order]
        verdicts = dict((name, verdict) for name, _, verdict in order)
        assert names[0] == FAST and verdicts[FAST] == "within both budgets", order
        assert dict((n, r) for n, r, _ in order)[FAST] == "1"
        assert verdicts[OVER] == "over budget", order
        assert names.index(OVER) > names.index(FORGER) > 0, order            # not lifted
        forger_row = host.locator(f"#board-{FORGER}")
        slow_row = host.locator(f"#board-{SLOW}")
        assert forger_row.locator("td").nth(2).inner_text() == slow_row.locator("td").nth(2).inner_text()
        assert "99.00" in forger_row.inner_text() and "refused" in forger_row.inner_text()
        page_html = host.content()
        assert "pwned" not in page_html and "onerror" not in page_html and "<img" not in page_html
        assert host.title() == "Workshop progress" and dialogs == []
        assert host.evaluate("document.documentElement.scrollWidth") <= browser.VIEWPORT["width"]

        me = chromium.new_page(viewport=browser.VIEWPORT)
        me.goto(f"{base}/hub/login?next=/services/progress/board")
        me.fill("#username_input", FAST)
        me.fill("#password_input", f"pw-{FAST}")
        me.click("#login_submit")
        me.wait_for_selector("#board", timeout=60_000)
        assert [name for name, _, _ in board_order(me)] == names
        assert me.goto(f"{base}/services/progress/").status == 403    # the host's table is not theirs


def test_the_board_trusts_a_result_file_for_a_plan_only(tmp_path):
    """The pure parts, without a hub: what each learner's folder holds, read as root would."""
    from gpulab.capstone import budget, results
    good, slow = BOARD_LEARNERS[FAST], BOARD_LEARNERS[SLOW]

    def home(name: str, lines: list[str] | None = None) -> Path:
        folder = tmp_path / name / "course" / CAPSTONE
        folder.mkdir(parents=True)
        if lines is not None:
            (folder / results.RESULT_FILE).write_text("\n".join(lines) + "\n")
        return tmp_path / name

    homes = {"ada": home("ada", [forged_line(good).replace('"speedup": 1.0', '"speedup": 2.0')]),
             "bob": home("bob", [forged_line(slow)]),
             "cy": home("cy", [forged_line("micro_batch=24 accumulation=1")]),
             "dee": home("dee", [forged_line(slow).replace('"speedup": 1.0', '"speedup": 99.0'),
                                 forged_line(slow).replace('"cpu"', '"<script>alert(1)</script>"'),
                                 "{not json", forged_line("micro_batch=8 accumulation=1")]),
             "eve": home("eve"), "fay": home("fay"), "gus": home("gus"), "hal": tmp_path / "hal"}
    (homes["eve"] / "course" / CAPSTONE / results.RESULT_FILE).symlink_to(
        homes["ada"] / "course" / CAPSTONE / results.RESULT_FILE)
    os.mkfifo(homes["fay"] / "course" / CAPSTONE / results.RESULT_FILE)
    with open(homes["gus"] / "course" / CAPSTONE / results.RESULT_FILE, "w") as f:
        f.truncate(2 * 10**9)
    found = {name: progress.learner_runs(path) for name, path in homes.items()}
    assert found["dee"][1] == 1 and len(found["dee"][0]) == 3        # "{not json" refused
    assert [found[n][2] for n in ("eve", "fay", "gus", "hal")] == [False] * 4
    assert progress.learner_runs(homes["ada"], uid=65534) == ([], 0, False)   # not theirs

    measured_here = {plan_text(good): {"in_budget": True, "speedup": 2.5, "peak_bytes": 22 * 2**20},
                     plan_text(slow): {"in_budget": True, "speedup": 1.1, "peak_bytes": 22 * 2**20},
                     plan_text("micro_batch=24 accumulation=1"):
                         {"in_budget": False, "speedup": None, "peak_bytes": 54 * 2**20}}
    rows = progress.board_rows(found, lambda text, who: measured_here.get(text), budget.CANONICAL)
    order = [(r["name"], r.get("rank"), r["status"]) for r in rows]
    assert order[:4] == [("ada", 1, "in budget"), ("bob", 2, "in budget"), ("dee", 3, "in budget"),
                         ("cy", None, "over budget")], order
    dee = next(r for r in rows if r["name"] == "dee")
    assert dee["claimed"] == 99.0 and dee["speedup"] == 1.1 and dee["refused"] == 1
    assert {r["status"] for r in rows[4:]} == {"no run yet"}
    pending = progress.board_rows({"ada": found["ada"]}, lambda text, who: None, budget.CANONICAL)
    assert pending[0]["status"] == "measuring" and "rank" not in pending[0]
    page = progress.render_board_page(rows, budget.CANONICAL)
    assert "<script" not in page and "alert" not in page and "99.00" in page
    assert page.index('id="board-ada"') < page.index('id="board-dee"') < page.index('id="board-cy"')


def test_the_board_queues_one_plan_per_learner_at_a_time():
    """A learner who rewrites their file again and again has one plan waiting, not one per
    rewrite; a plan another learner waits for stays; a measured plan is not measured again."""
    from gpulab.capstone import budget

    class Idle(progress.BoardMeasurer):
        def _work(self):                    # no measuring thread: the queue alone
            pass

    board = Idle(budget.CANONICAL)
    assert board("p1", "ada") is None and board("p2", "ada") is None and board("p2", "bob") is None
    for plan in ("p3", "p4", "p5"):
        board(plan, "ada")
    assert board.queue == ["p1", "p2", "p5"] and board.pending == 3
    board.done["p1"] = {"in_budget": True}
    assert board("p1", "cy") == {"in_budget": True}


def plan_text(text: str) -> str:
    from gpulab.capstone.plan import Plan
    return Plan.parse(text).text()


@pytest.mark.needs_root
def test_stopping_removes_every_process_account_and_file(room):
    names = [learner(i) for i in range(N_LEARNERS)]
    uids = {pwd.getpwnam(n).pw_uid for n in names}
    stop_hub(room)
    assert set(room["removed"]) == set(names) | {HOST, GUESSED, EXTRA[0]}
    assert room["walls_left"] == [], "the hub removes the learners' cgroups when it stops"
    for n in names:
        with pytest.raises(KeyError):
            pwd.getpwnam(n)
    left = [p for p in os.listdir("/proc") if p.isdigit() and accounts._owner(p) in uids]
    assert not left, f"processes left behind: {left}"
    assert not room["tmp"].exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{room['base']}/hub/api", timeout=5)


# --------------------------------------------------------------------------------------------
# The pure parts


def test_devices_are_spread_evenly_and_kept_per_learner():
    devices = ("GPU-a", "GPU-b", "MIG-c")
    taken = {}
    for i in range(7):
        taken[f"l{i}"] = plan.assign_device(devices, taken, f"l{i}")
    assert [taken[f"l{i}"] for i in range(7)] == ["GPU-a", "GPU-b", "MIG-c"] * 2 + ["GPU-a"]
    assert plan.assign_device(devices, taken, "l4") == "GPU-b"    # a learner keeps theirs
    del taken["l1"], taken["l4"]                                   # two servers stopped
    assert plan.assign_device(devices, taken, "new") == "GPU-b"
    assert plan.assign_device((), {}, "cpu") is None


def test_memory_fraction_and_threads_per_learner():
    assert plan.memory_fraction(30, 1) == 0.028          # 30 on one H200: 3.9 GiB of 139.8
    assert plan.memory_fraction(7, 7) == 0.85            # one learner per MIG slice
    assert plan.memory_fraction(10, 3) == 0.212
    assert plan.threads_per_learner(30, 16) == 1 and plan.threads_per_learner(4, 16) == 4
    assert plan.learners_that_fit(int(139.8 * 2**30)) == 34
    with pytest.raises(ValueError, match="UUID"):
        plan.parse_devices("0,1")
    env = {"WORKSHOP_DEVICES": "GPU-x,GPU-y", "WORKSHOP_LEARNERS": "9"}
    s = plan.settings_from_env(env, cores=16)
    assert (s.devices, s.memory_fraction, s.threads) == (("GPU-x", "GPU-y"), 0.17, 1)
    assert plan.learner_env(s, None)["CUDA_VISIBLE_DEVICES"] == ""


def test_make_workshop_refuses_devices_this_machine_cannot_map(tmp_path):
    """Before anything is created, not a bare 500 at every spawn: a UUID the driver does not
    know (the modelled NVML), and a GPU named on a machine without NVML (this one's own)."""
    import subprocess
    base = {**os.environ, "WORKSHOP_STATE": str(tmp_path), "WORKSHOP_GROUP": GROUP,
            "WORKSHOP_PORT": "1", "WORKSHOP_LEARNERS": "2", "WORKSHOP_MEMORY": "1G",
            "WORKSHOP_DISK": "1G"}
    runs = {"unknown UUID": {"WORKSHOP_DEVICES": f"{DEVICES[0]},GPU-0000dead-beef",
                             "MODELLED_NVML": json.dumps(MACHINE),
                             "PYTHONPATH": str(ROOT / "tests" / "modelled_nvml")},
            "no NVML": {"WORKSHOP_DEVICES": DEVICES[0]}}
    for why, settings in runs.items():
        done = subprocess.run([sys.executable, str(WORKSHOP / "run.py")], env={**base, **settings},
                              capture_output=True, text=True, timeout=60)
        said = done.stdout + done.stderr
        assert done.returncode != 0 and "cannot map" in said, (why, said[-2000:])
        refused = DEVICES[0] if why == "no NVML" else "GPU-0000dead-beef"
        assert f"  {refused} (" in said and "WORKSHOP_DEVICES=none" in said, (why, said[-2000:])
        assert "GPU Training Lab workshop, planned" not in said and not list(tmp_path.iterdir())
        if why == "unknown UUID":                      # the one the driver knows passes
            assert f"  {DEVICES[0]} (" not in said, said[-2000:]


def test_gpu_share_reads_the_cap_and_tells_the_doctor():
    assert gpu_share.memory_fraction({}) is None
    assert gpu_share.memory_fraction({"GPULAB_GPU_MEMORY_FRACTION": "0.25"}) == 0.25
    with pytest.warns(UserWarning, match="not a fraction"):
        assert gpu_share.memory_fraction({"GPULAB_GPU_MEMORY_FRACTION": "4GiB"}) is None
    line, = gpu_share.share_lines(80 * 2**30, {"GPULAB_GPU_MEMORY_FRACTION": "0.25"})
    assert "0.25 of cuda:0's memory = 20.0 GiB" in line
    assert gpu_share.share_lines(80 * 2**30, {}) == []


def test_progress_reads_verdicts_from_saved_outputs(tmp_path):
    def cell(source, state=None):
        outputs = [] if state is None else [{"output_type": "display_data", "metadata": {}, "data": {
            "text/html": f'<div class="gpulab-check gpulab-check-{state}">x</div>', "text/plain": "x"}}]
        return {"cell_type": "code", "source": source, "outputs": outputs, "metadata": {}}
    nb = {"cells": [cell('check("01-a", a)', "right"), cell('check("01-b", b)', "wrong"),
                    cell(['check("01-c",', " c)"]), cell("x = 1", "right")]}
    folder = tmp_path / "course" / CHAPTER
    folder.mkdir(parents=True)
    (folder / f"{CHAPTER}.ipynb").write_text(json.dumps(nb))
    (tmp_path / "course" / "02_x").mkdir()
    (tmp_path / "course" / "02_x" / "02_x.ipynb").write_text("not json")
    got = progress.learner_progress(tmp_path)
    assert got == {"chapters": {CHAPTER: {"01-a": "right", "01-b": "wrong", "01-c": "not run"},
                                "02_x": {}}, "current": CHAPTER, "complete": True}


def test_workshop_check_counts_the_learners_that_fit(tmp_path):
    import check
    sys.path.insert(0, str(ROOT / "tests"))
    h200 = plan.Device("GPU-h200", "NVIDIA H200", int(139.8 * 2**30), int(130 * 2**30))
    other = plan.Device("GPU-other", "NVIDIA H200", int(139.8 * 2**30), int(139 * 2**30))
    room_of = lambda n: plan.settings_from_env(  # noqa: E731
        {"WORKSHOP_DEVICES": "GPU-h200,MIG-gone", "WORKSHOP_LEARNERS": str(n)}, cores=16)
    lines, fits = check.fit_lines([h200, other], room_of(40).devices, room_of(40), 4 * 2**30)
    assert fits == 32                                  # 130 GiB free // 4 GiB; the other is not used
    assert "only" not in "\n".join(lines) and "below" not in "\n".join(lines)  # 20 per device
    lines, fits = check.fit_lines([h200, other], room_of(80).devices, room_of(80), 4 * 2**30)
    text = "\n".join(lines)
    assert "the plan puts 40 learners here; only 32 fit" in text
    assert "0.021 x 139.8 GiB = 2.9 GiB, is below a learner's 4.0 GiB" in text
    assert "MIG-gone: listed in WORKSHOP_DEVICES but not found" in text
    # With no report the figure is the course's 4 GiB budget; a report's largest footprint wins.
    assert check.measured_footprint(tmp_path)[0] == 4 * 2**30
    (tmp_path / "gpu-check-2026-01-01-h200.json").write_text(json.dumps(
        {"chapters": [{"footprint": {"peak_bytes": 3 * 2**30}}, {"footprint": None},
                      {"footprint": {"peak_bytes": 5 * 2**30}}]}))
    assert check.measured_footprint(tmp_path) == (5 * 2**30, "the largest chapter footprint "
                                                  "measured in gpu-check-2026-01-01-h200.json")
    from test_device import modelled_pynvml
    nvml = modelled_pynvml(MACHINE + [{"uuid": "GPU-mig", "minor": 3, "migs": [{"uuid": "MIG-x", "gi": 1, "ci": 0}]}])
    first, gone = check.node_lines((DEVICES[2], "MIG-x"), nvml)
    assert first.endswith("/dev/nvidia2") and "/dev/nvidiactl" in first
    assert "MIG-x: its device nodes cannot be found" in gone and "could not start" in gone


def test_workshop_check_warns_when_a_chapter_needs_more_than_the_plan_gives(tmp_path):
    import check
    needs = tmp_path / "needs.json"
    needs.write_text(json.dumps({"date": "2026-12-03", "machine": "2 cores", "chapters": {
        "01_a": {"peak_memory_bytes": 400 * 2**20, "peak_tasks": 20},
        "07_b": {"peak_memory_bytes": 600 * 2**20, "peak_tasks": 300}}}))
    tight = plan.settings_from_env({"WORKSHOP_DEVICES": "none", "WORKSHOP_MEMORY": "723M",
                                    "WORKSHOP_DISK": "1G"})
    text = "\n".join(check.needs_lines(tight, needs))
    assert "largest 0.6 GiB (07_b" in text and "the peak of 07_b: past it" in text, text
    assert "512 is below 2 x the peak of 07_b" in text and "01_a" not in text.split("largest")[1].split("\n", 1)[1]
    roomy = plan.settings_from_env({"WORKSHOP_DEVICES": "none", "WORKSHOP_MEMORY": "2G",
                                    "WORKSHOP_TASKS": "1024", "WORKSHOP_DISK": "1G"})
    assert "hold every chapter" in "\n".join(check.needs_lines(roomy, needs))
    # The committed figures (make bench) are read as they are.
    assert check.needs_lines(roomy)[0].startswith("  chapter needs         largest ")


def test_each_learners_limits_follow_the_machine_and_the_host(monkeypatch):
    s = plan.settings_from_env({"WORKSHOP_DEVICES": "none", "WORKSHOP_LEARNERS": "30"},
                               cores=16, ram=512 * 2**30)
    assert s.memory_bytes == int(512 * 0.9 * 2**30 / 30) // 2**20 * 2**20       # 15.4 GiB each
    assert (s.tasks, s.scratch_bytes, s.walls) == (512, s.memory_bytes // 2, True)
    s = plan.settings_from_env({"WORKSHOP_DEVICES": "none", "WORKSHOP_MEMORY": "768M",
                                "WORKSHOP_TASKS": "64", "WORKSHOP_SCRATCH": "1.5G",
                                "WORKSHOP_WALLS": "off"}, ram=24 * 2**30)
    assert (s.memory_bytes, s.tasks, s.scratch_bytes, s.walls) == (768 * 2**20, 64, 3 * 2**29, False)
    assert plan.learner_limits(s, "MIG-x") == plan.Limits(768 * 2**20, 100, 64, 3 * 2**29, "MIG-x")
    assert plan.memory_per_learner(24 * 2**30, 30) == 737 * 2**20      # 2.4 GiB kept for the hub
    s = plan.settings_from_env({"WORKSHOP_DEVICES": "none", "WORKSHOP_LEARNERS": "30"},
                               ram=24 * 2**30, disk_free=70 * 2**30)
    assert (s.disk_bytes, s.signups) == (2150 * 2**20, 30)          # 2.1 GiB each, 30 places
    s = plan.settings_from_env({"WORKSHOP_DEVICES": "none", "WORKSHOP_DISK": "10G",
                                "WORKSHOP_SIGNUPS": "0"}, ram=24 * 2**30)
    assert (s.disk_bytes, s.signups) == (10 * 2**30, 0)              # every sign-up waits
    with pytest.raises(ValueError, match="of disk per learner is too little"):
        plan.settings_from_env({"WORKSHOP_DEVICES": "none"}, ram=24 * 2**30, disk_free=2**30)
    with pytest.raises(ValueError, match="too little"):
        plan.settings_from_env({"WORKSHOP_DEVICES": "none", "WORKSHOP_LEARNERS": "100"}, ram=16 * 2**30)
    with pytest.raises(ValueError, match="size such as"):
        plan.parse_size("WORKSHOP_MEMORY", "lots")


LIMITS = plan.Limits(2**30, 100, 512, 2**29, DEVICES[1])
PROC_DEVICES = """Character devices:
  1 mem
  5 /dev/tty
136 pts
195 nvidia-frontend
234 nvidia-caps
510 nvidia-uvm

Block devices:
  8 sd
"""


@pytest.fixture
def machine(tmp_path):
    """A stand-in /proc and /dev of a GPU server: devices, MIG capability minors, two GPUs' nodes."""
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    (proc / "devices").write_text(PROC_DEVICES)
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text(
        "config 1\nmonitor 2\ngpu1/gi7/access 66\ngpu1/gi7/ci0/access 67\ngpu1/gi8/access 75\n")
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-caps/nvidia-cap66", "nvidia-caps/nvidia-cap75"):
        (dev / name).touch()
    gpus = [dict(MACHINE[0]), {**MACHINE[1], "migs": [{"uuid": "MIG-aaaa", "gi": 7, "ci": 0}]}]
    sys.path.insert(0, str(ROOT / "tests"))
    from test_device import modelled_pynvml
    return proc, dev, modelled_pynvml(gpus)


def test_device_nodes_are_the_learners_gpu_or_mig_instance_and_no_other(machine):
    proc, dev, nvml = machine
    common = [walls.Node(f"{dev}/nvidiactl", 195, 255), walls.Node(f"{dev}/nvidia-uvm", 510, 0),
              walls.Node(f"{dev}/nvidia-uvm-tools", 510, 1)]
    assert walls.device_nodes(DEVICES[0], nvml, proc, dev) == common + [walls.Node(f"{dev}/nvidia0", 195, 0)]
    mig = walls.device_nodes("MIG-aaaa", nvml, proc, dev)
    assert mig == common + [walls.Node(f"{dev}/nvidia1", 195, 1),        # MIG User Guide's caps:
                            walls.Node(f"{dev}/nvidia-caps/nvidia-cap66", 234, 66, "r"),  # GI 7
                            walls.Node(f"{dev}/nvidia-caps/nvidia-cap67", 234, 67, "r")]  # its CI 0
    assert walls.other_nvidia_nodes(mig, dev) == [f"{dev}/nvidia-caps/nvidia-cap75", f"{dev}/nvidia0"]
    assert walls.device_nodes(None, nvml, proc, dev) == []
    rules = walls.v1_device_rules(mig, proc)
    assert rules[:8] == ["c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm",
                         "c 5:0 rwm", "c 5:2 rwm", "c 136:* rw"]    # DevicePolicy=closed's list
    assert rules[8:] == ["c 195:255 rw", "c 510:0 rw", "c 510:1 rw", "c 195:1 rw", "c 234:66 r", "c 234:67 r"]


def test_the_systemd_applier_starts_each_server_in_a_scope_with_the_plan(machine):
    """Not run here (no systemd): the command is checked against systemd-run(1) and
    systemd.resource-control(5)."""
    proc, dev, nvml = machine
    nodes = walls.device_nodes(DEVICES[1], nvml, proc, dev)
    command, env = walls.Systemd("gpulab-learners").start("ada", LIMITS, nodes)
    assert command[:4] == ["systemd-run", "--scope", "--quiet", "--collect"] and command[-1] == "--"
    assert "--unit=gpulab-learners-ada.scope" in command and "--slice=gpulab-learners.slice" in command
    properties = [command[i + 1] for i, word in enumerate(command) if word == "--property"]
    assert properties == [f"MemoryMax={2**30}", "MemorySwapMax=0", "CPUWeight=100", "TasksMax=512",
                          "DevicePolicy=closed", f"DeviceAllow={dev}/nvidiactl rw",
                          f"DeviceAllow={dev}/nvidia-uvm rw", f"DeviceAllow={dev}/nvidia-uvm-tools rw",
                          f"DeviceAllow={dev}/nvidia1 rw"]
    assert env == {}


def test_the_cgroup_v2_applier_on_a_stand_in_hierarchy(tmp_path, machine):
    """Not run for real here (this machine mounts v1): what it writes, on plain folders."""
    proc, dev, nvml = machine
    base = tmp_path / "cgroup" / "hub.slice"
    base.mkdir(parents=True)
    (tmp_path / "cgroup" / "cgroup.controllers").write_text("cpu memory pids io\n")
    (base / "cgroup.controllers").write_text("cpu memory pids io\n")
    (base / "cgroup.procs").write_text("4242\n")
    applier, why = walls.detect("ws", tmp_path / "cgroup", tmp_path / "run", proc_with(tmp_path, "0::/hub.slice\n"), dev)
    assert isinstance(applier, walls.CgroupV2) and "cgroup v2" in why
    applier.prepare(30)
    assert (base / "ws-hub" / "cgroup.procs").read_text() == "4242\n"       # no internal process
    assert (base / "ws-hub" / "cpu.weight").read_text() == (base / "ws" / "cpu.weight").read_text() == "3000\n"
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids +cpu\n"
    assert (base / "ws" / "cgroup.subtree_control").read_text() == "+memory +pids +cpu\n"
    command, env = applier.start("ada", LIMITS, walls.device_nodes(DEVICES[0], nvml, proc, dev))
    folder = base / "ws" / "ada"
    assert {f: (folder / f).read_text() for f in ("memory.max", "pids.max", "cpu.weight")} == {
        "memory.max": f"{2**30}\n", "pids.max": "512\n", "cpu.weight": "100\n"}
    assert command == [] and env["GPULAB_WORKSHOP_CGROUPS"] == str(folder)
    assert env["GPULAB_WORKSHOP_MASK"].split(":") == [f"{dev}/nvidia-caps/nvidia-cap66",
                                                      f"{dev}/nvidia-caps/nvidia-cap75", f"{dev}/nvidia1"]


def proc_with(tmp_path: Path, cgroup: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


@pytest.mark.needs_root
def test_detect_says_which_applier_a_host_gets(tmp_path, monkeypatch):
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    monkeypatch.setattr(walls.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert isinstance(walls.detect("ws", run=tmp_path / "run")[0], walls.Systemd)
    monkeypatch.undo()
    applier, why = walls.detect("ws")                  # this machine, as the room uses it
    assert isinstance(applier, walls.CgroupV1), why
    nothing = proc_with(tmp_path, "5:memory:/\n")      # v1, but no pids, cpu or devices
    (tmp_path / "none" / "memory").mkdir(parents=True)
    assert walls.detect("ws", tmp_path / "none", tmp_path / "run-none", nothing) == (
        None, f"no systemd, and the cgroup v1 hierarchies pids, cpu, devices are not mounted "
              f"writable under {tmp_path / 'none'}")


def test_sign_in_lockout_grows_and_forgets():
    now = [0.0]
    lock = hub.SignInLockout(free=3, window_s=600, clock=lambda: now[0])
    for _ in range(3):
        lock.failed("ada")
    assert lock.wait_s("ada") == 0                     # three free tries
    waits = []
    for _ in range(4):
        lock.failed("ada")
        waits.append(lock.wait_s("ada"))
    assert waits == [1, 2, 4, 8]
    now[0] += 601                                      # old failures fall out of the window
    lock.failed("ada")
    assert lock.wait_s("ada") == 0
    lock.succeeded("ada")
    assert lock.times == {} and lock.locked_until == {}


def test_progress_reads_only_regular_files_of_the_learner(tmp_path):
    chapter = tmp_path / "course" / CHAPTER
    chapter.mkdir(parents=True)
    notebook = {"cells": [{"cell_type": "code", "source": 'check("01-a", a)', "outputs": [
        {"output_type": "display_data", "data": {"text/html": '<div class="gpulab-check-right">'}}]}]}
    elsewhere = tmp_path / "elsewhere.ipynb"
    elsewhere.write_text(json.dumps(notebook))
    (chapter / "linked.ipynb").symlink_to(elsewhere)
    os.mkfifo(chapter / "fifo.ipynb")
    with open(chapter / "huge.ipynb", "w") as f:
        f.truncate(2 * 10**9)
    (tmp_path / "course" / "02_x").symlink_to(tmp_path)            # a folder link out
    t = time.monotonic()
    assert progress.learner_progress(tmp_path)["chapters"] == {}
    assert time.monotonic() - t < 5                                # nothing waited on the FIFO
    (chapter / "own.ipynb").write_text(json.dumps(notebook))
    assert progress.learner_progress(tmp_path)["chapters"] == {CHAPTER: {"01-a": "right"}}
    assert progress.learner_progress(tmp_path, uid=65534)["chapters"] == {}   # not theirs: root's
    assert progress.learner_progress(tmp_path, budget_s=0)["complete"] is False


@pytest.mark.needs_root
def test_the_instructors_folders_close_to_learners(tmp_path):
    import tempfile
    checkout = Path(tempfile.mkdtemp(prefix="gpulab-checkout-"))    # under /tmp, open to nobody
    try:
        checkout.chmod(0o755)
        for name in ("solutions", "autograder/keys", "notebooks"):
            (checkout / name).mkdir(parents=True, mode=0o755)
        assert walls.readable_by_learners(checkout, None) == [str(checkout / "solutions"),
                                                              str(checkout / "autograder")]
        closed = walls.close_to_learners(checkout, None)
        assert closed == [checkout / "solutions", checkout / "autograder"]
        assert walls.readable_by_learners(checkout, None) == []
        assert (checkout / "solutions").stat().st_mode & 0o777 == 0o750
        assert (checkout / "notebooks").stat().st_mode & 0o777 == 0o755
    finally:
        import shutil
        shutil.rmtree(checkout)
