"""Workshop mode (issue 20): a real JupyterHub on localhost with ten learners.

One hub for the whole file (the `room` fixture), started by workshop/run.py as `make workshop`
starts it, on free ports, with three made-up GPU UUIDs. The fixture plays the room once, all
learners at the same time where a room would be: they sign up over HTTP, their servers spawn,
each runs code in a kernel through its server's REST and websocket API and saves its quizzes'
verdicts into its notebook; one learner's kernel dies first, another's is left idle after. The tests then
check what happened, and the last one stops the hub and checks nothing is left. Creating the
learners' system accounts needs root, as a workshop does.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import sys
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
import plan  # noqa: E402
import progress  # noqa: E402
from room import Browser, log_excerpt, start_hub, stop_hub  # noqa: E402

from gpulab import gpu_share  # noqa: E402
from gpulab.course.checks import load_key_module  # noqa: E402

N_LEARNERS = 10
DEVICES = tuple(f"GPU-{i}a1b2c3d-0000-4000-8000-00000000000{i}" for i in range(3))
KERNEL_IDLE_S = 6
CHAPTER = "01_device_basics"
KEY = load_key_module(ROOT / "autograder" / "keys" / f"{CHAPTER}.py")
ITEM_A, ITEM_B = "01-batch-bytes", "01-batch-mib"
GROUP = f"gpulab-test-{uuid.uuid4().hex[:6]}"   # never a real workshop's group


def learner(i: int) -> str:
    return f"wslearner{i:02d}"


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
print(json.dumps(seen))
"""


# --------------------------------------------------------------------------------------------
# The room, played once


@pytest.fixture(scope="module")
def room():
    if os.geteuid() != 0:
        pytest.fail("workshop mode creates a system account per learner, which needs root: run "
                    "the tests as root (as a container or CI does), or sudo make test.")
    if not (WORKSHOP / "node_modules" / ".bin" / "configurable-http-proxy").exists():
        pytest.fail("the workshop's proxy is not installed: make test installs it (npm ci --prefix workshop)")
    room = start_hub({"WORKSHOP_GROUP": GROUP, "WORKSHOP_DEVICES": ",".join(DEVICES),
                      "WORKSHOP_LEARNERS": str(N_LEARNERS), "WORKSHOP_KERNEL_IDLE_S": str(KERNEL_IDLE_S),
                      "WORKSHOP_CODE": "room-code-42", "WORKSHOP_ADMIN": "wshost"})
    room["timings"] = {"hub up": room["hub_up_s"]}
    try:
        play(room)
        yield room
    finally:
        stop_hub(room)


def play(room: dict) -> None:
    base, env, timings = room["base"], room["env"], room["timings"]
    start = time.monotonic()

    # Everyone signs up at once, and their servers spawn.
    browsers = [Browser(base, learner(i)) for i in range(N_LEARNERS)]

    def sign_up_and_spawn(b: Browser):
        reply = b.sign_in(password=f"pw-{b.name}", code=env["WORKSHOP_CODE"])
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
    room["wrong_code"] = Browser(base, "wsnewcomer").sign_in("pw-newcomer", code="wrong-code").status_code
    room["taken_name"] = Browser(base, learner(1)).sign_in("pw-impostor", code=env["WORKSHOP_CODE"]).status_code

    # Learner 0's kernel dies; their server starts it again (their probe runs in it, below).
    dying = browsers[0].start_kernel(path=f"course/{CHAPTER}")
    room["death"] = browsers[0].execute(dying, "import os; os._exit(1)")

    # Then everyone runs their probe (learner 2 imports torch too) and saves the verdicts.
    homes = {b.name: pwd.getpwnam(b.name).pw_dir for b in browsers}

    def probe(i: int) -> dict:
        b, other = browsers[i], browsers[(i + 1) % N_LEARNERS].name
        kernel = dying if i == 0 else b.start_kernel(path=f"course/{CHAPTER}")
        a = answers(i)
        code = PROBE.format(item_a=ITEM_A, answer_a=a[ITEM_A], item_b=ITEM_B, answer_b=a[ITEM_B],
                            chapter=CHAPTER, with_torch=i == 2, other_home=homes[other],
                            other_notebook=f"{homes[other]}/course/{CHAPTER}/{CHAPTER}.ipynb")
        result = b.execute(kernel, code)
        assert "error" not in result and not result["died"], (b.name, result)
        b.save_verdicts(CHAPTER, result["displays"])
        return json.loads(result["stdout"].strip().splitlines()[-1]), kernel

    t = time.monotonic()
    with ThreadPoolExecutor(N_LEARNERS) as pool:
        probed = list(pool.map(probe, range(N_LEARNERS)))
    room["seen"] = {b.name: seen for b, (seen, _) in zip(browsers, probed)}
    room["idle_kernel"] = probed[1][1]      # learner 1 leaves their kernel idle from now on
    timings["10 kernels probed"] = time.monotonic() - t
    room["servers_after"] = {b.name: b.api("GET", "status").status_code for b in browsers}

    # The host opens the progress page.
    host = Browser(base, env["WORKSHOP_ADMIN"])
    assert host.sign_in(env["WORKSHOP_ADMIN_CODE"]).status_code == 302
    page = host.http.get(f"{base}/services/progress/", timeout=60)
    room["progress"] = (page.status_code, page.text)
    room["learner_progress_blocked"] = browsers[3].http.get(
        f"{base}/services/progress/", timeout=60, allow_redirects=False).status_code

    # Learner 1's idle kernel goes within the culler's timeout and interval.
    t = time.monotonic()
    while time.monotonic() - t < 4 * KERNEL_IDLE_S:
        kernels = [k["id"] for k in browsers[1].api("GET", "kernels").json()]
        if room["idle_kernel"] not in kernels:
            break
        time.sleep(0.5)
    room["idle_kernel_left"] = room["idle_kernel"] in kernels
    timings["all"] = time.monotonic() - start + timings["hub up"]
    print("workshop timings (s):", {k: round(v, 1) for k, v in timings.items()})


# --------------------------------------------------------------------------------------------
# What happened


def test_learners_sign_up_with_the_code_and_their_servers_spawn(room):
    assert len(room["browsers"]) == N_LEARNERS
    assert all(status == 200 for status in room["servers_after"].values()), room["servers_after"]
    assert room["wrong_code"] == 403, "a wrong workshop code must not sign anyone up"
    assert room["taken_name"] == 403, "a claimed name must need its owner's password"


def test_each_learner_gets_the_planned_gpu_memory_cap_and_threads(room):
    seen = room["seen"]
    per_device = {d: sum(s["CUDA_VISIBLE_DEVICES"] == d for s in seen.values()) for d in DEVICES}
    assert sorted(per_device.values()) == [3, 3, 4], per_device     # 10 learners, 3 devices
    fraction = (1 - 0.15) / 4                                        # 4 share the fullest device
    for name, s in seen.items():
        assert s["fraction_env"] == f"{int(fraction * 1000) / 1000:g}", (name, s)
        assert s["fraction_read"] == pytest.approx(0.212), (name, s)
        assert s["omp"] == str(max(1, os.cpu_count() // N_LEARNERS)), (name, s)


def test_learners_run_as_their_own_account_and_cannot_read_each_other(room):
    for name, s in room["seen"].items():
        assert s["user"] == name and s["home"] == pwd.getpwnam(name).pw_dir
        assert s["own_notebook_bytes"] > 10_000, "each learner has their own copy of the course"
        assert s["other_notebook"] == "denied" and s["other_home"] == "denied", (name, s)
        assert os.stat(s["home"]).st_mode & 0o777 == 0o700


def test_gpulab_queues_the_cap_without_starting_cuda(room):
    s = room["seen"][learner(2)]
    assert s["cap_queued"] and s["applied_fraction"] == pytest.approx(0.212)
    assert s["cuda_initialised"] is False


def test_a_dead_kernel_leaves_the_other_learners_working(room):
    assert room["death"]["died"], room["death"]
    # Everyone's probe ran after learner 0's kernel died, learner 0's in the restarted kernel.
    assert set(room["seen"]) == {learner(i) for i in range(N_LEARNERS)}


def test_an_idle_kernel_is_culled(room):
    assert not room["idle_kernel_left"], f"kernel still there after {4 * KERNEL_IDLE_S} s"


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


def test_stopping_removes_every_process_account_and_file(room):
    names = [learner(i) for i in range(N_LEARNERS)]
    uids = {pwd.getpwnam(n).pw_uid for n in names}
    stop_hub(room)
    assert set(room["removed"]) == set(names) | {room["env"]["WORKSHOP_ADMIN"]}
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
                                "02_x": {}}, "current": CHAPTER}


def test_workshop_check_counts_the_learners_that_fit(tmp_path):
    import check
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
