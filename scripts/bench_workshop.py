"""Workshop mode's figures (make bench): 30 learners sign up at the same moment, then one of
them turns hostile.

Starts the workshop's hub as `make workshop` does (on free local ports, a throwaway folder, a
CPU-only plan, the walls this machine gives: workshop/walls.py), has 30 learners sign up and
spawn their servers at once, and prints:

- the seconds until every server is ready, and the CPU seconds the room's processes used;
- the memory of each learner's server (PSS: shared pages split among the processes sharing
  them, so the figures add up) and of one kernel, before and after `import torch, gpulab`;
- the hub's own memory (hub, proxy, idle culler, progress page);
- a noisy neighbour: CLASSMATES learners time a small step (a pure-Python loop, one thread)
  in a quiet room, then again while learner 0 runs a memory hog (allocating until its memory
  wall stops it) and a 4-process CPU hog. Their step time relative to the quiet room (a ratio
  within one run), predicted beside it for fair shares per learner and for shares per process
  (what the kernel gives without the walls); the hub's API latency in both; and whether anyone
  but the hog lost anything (every server answering, every classmate's kernel alive).

Needs root (it creates the learners' accounts; all are removed afterwards).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workshop"))
from room import Browser, log_excerpt, start_hub, stop_hub  # noqa: E402

N = 30
MiB = 2**20
CLASSMATES = 3          # timed beside the hog: more than the cores, so that they contend
SECONDS = 8             # each phase
HOG_PROCESSES = 4
STEP = """
import json, time
def step():
    return sum(i * i for i in range(100_000))
step()
times, end = [], time.monotonic() + %d
while time.monotonic() < end:
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
print(json.dumps(times))
""" % SECONDS
CPU_HOG = """
import os, time
for _ in range(%d):
    if os.fork() == 0:
        end = time.monotonic() + %d
        while time.monotonic() < end:
            pass
        os._exit(0)
print("spinning")
""" % (HOG_PROCESSES, SECONDS + 2)
MEMORY_HOG = """
held = []
while len(held) < 64:                 # 64 x 256 MiB: far past any learner's memory here
    held.append(bytearray(256 * 2**20))
print("the hog got", len(held) / 4, "GiB")
"""


def predicted_ratio(classmates: int, cores: int, hog_contenders: int) -> float:
    """Step time beside the hog / in a quiet room, for CPU shared equally among contenders:
    each gets min(1, cores / contenders) of a core."""
    quiet = min(1.0, cores / classmates)
    noisy = min(1.0, cores / (classmates + hog_contenders))
    return quiet / noisy


def noisy_neighbour(room: dict, browsers: list) -> None:
    """The figures of a hostile learner 0 beside CLASSMATES timed classmates (module docstring)."""
    hog, classmates = browsers[0], browsers[1:1 + CLASSMATES]
    kernels = {b.name: b.start_kernel() for b in classmates}
    for b in classmates:                                   # warm: first run pays the imports
        b.execute(kernels[b.name], "print(1)")
    latencies: list[tuple[str, float]] = []
    phase = ["quiet"]
    stop = threading.Event()

    def ask_the_hub():
        import requests
        while not stop.is_set():
            t = time.perf_counter()
            ok = requests.get(f"{room['base']}/hub/api", timeout=30).ok
            latencies.append((phase[0] if ok else "failed", time.perf_counter() - t))
            stop.wait(0.2)

    def time_steps(b):
        result = b.execute(kernels[b.name], STEP, timeout=SECONDS * 10)
        return json.loads(result["stdout"].strip().splitlines()[-1])

    asker = threading.Thread(target=ask_the_hub)
    asker.start()
    try:
        with ThreadPoolExecutor(CLASSMATES) as pool:
            quiet = list(pool.map(time_steps, classmates))
        phase[0] = "noisy"
        hog_kernels = [hog.start_kernel(), hog.start_kernel()]
        with ThreadPoolExecutor(CLASSMATES + 2) as pool:
            cpu_hog = pool.submit(hog.execute, hog_kernels[0], CPU_HOG)
            time.sleep(0.5)
            memory_hog = pool.submit(hog.execute, hog_kernels[1], MEMORY_HOG, 120)
            noisy = list(pool.map(time_steps, classmates))
        phase[0] = "after"
    finally:
        stop.set()
        asker.join()
    alive = [b.execute(kernels[b.name], "print('alive')")["stdout"].strip() == "alive"
             for b in classmates]
    servers = [b.api("GET", "status").status_code for b in browsers]
    ratios = [statistics.median(n) / statistics.median(q) for q, n in zip(quiet, noisy)]
    cores = os.cpu_count()
    print(f"  noisy neighbour: learner 0 runs a memory hog and a {HOG_PROCESSES}-process CPU hog "
          f"beside {CLASSMATES} classmates timing a one-thread step ({SECONDS} s a phase, "
          f"{cores} cores, walls: {room['walls']}):")
    print(f"    classmates' step time beside the hog / in the quiet room, median: "
          f"{statistics.median(ratios):.2f} (each: {', '.join(f'{r:.2f}' for r in ratios)}); "
          f"predicted {predicted_ratio(CLASSMATES, cores, 1):.2f} with a fair share per learner, "
          f"{predicted_ratio(CLASSMATES, cores, HOG_PROCESSES):.2f} with one per process")
    print(f"    quiet-room step {statistics.median(sum(quiet, [])) * 1e3:.1f} ms (median)")
    for name in ("quiet", "noisy"):
        seconds = [s for p, s in latencies if p == name]
        if seconds:
            print(f"    hub API latency ({name}): median {statistics.median(seconds) * 1e3:.0f} ms, "
                  f"max {max(seconds) * 1e3:.0f} ms over {len(seconds)} requests")
    spun, grew = cpu_hog.result(), memory_hog.result()
    stopped = ("stopped by its wall (kernel restarted)" if grew["died"] else
               f"NOT STOPPED: {grew['stdout'].strip()}")
    print(f"    the hog: CPU hog {'spun' if 'spinning' in spun['stdout'] else 'FAILED'}, "
          f"memory hog {stopped}")
    lost = [b.name for b, ok in zip(classmates, alive) if not ok]
    lost += [b.name for b, status in zip(browsers, servers) if status != 200]
    failed = sum(p == "failed" for p, _ in latencies)
    print(f"    lost anything: {', '.join(lost) if lost else 'nobody'} (all {len(servers)} servers "
          f"answered, {len(alive)} classmates' kernels alive; {failed} hub requests failed)")


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")   # own + reaped children


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return 0


def processes() -> dict[int, str]:
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        except OSError:
            pass
    return found


def main() -> None:
    if os.geteuid() != 0:
        print("  skipped: workshop mode creates a system account per learner, which needs root")
        return
    room = start_hub({"WORKSHOP_GROUP": "gpulab-bench", "WORKSHOP_DEVICES": "none",
                      "WORKSHOP_LEARNERS": str(N), "WORKSHOP_CODE": "bench-code",
                      "WORKSHOP_ADMIN": "benchhost"})
    sys.path.insert(0, str(ROOT / "workshop"))
    import walls
    applier, _ = walls.detect("gpulab-bench")
    room["walls"] = applier.name if applier else "none"
    try:
        browsers = [Browser(room["base"], f"bench{i:02d}") for i in range(N)]

        def arrive(b: Browser) -> float:
            assert b.sign_up("pw-bench", code="bench-code").status_code == 302
            b.use_token()
            b.spawn()
            b.wait_ready(timeout=600)
            return time.monotonic()

        start = time.monotonic()
        try:
            with ThreadPoolExecutor(N) as pool:
                ready = sorted(pool.map(arrive, browsers))
        except Exception as error:
            raise RuntimeError(f"{error}\n{log_excerpt(room)}") from error
        all_ready = ready[-1] - start
        procs = processes()
        servers = [pid for pid, cmd in procs.items() if "jupyterhub-singleuser" in cmd]
        hub_pid = room["process"].pid
        hub_parts = {hub_pid: "hub"}
        for pid, cmd in procs.items():
            if parent(pid) == hub_pid and "jupyterhub-singleuser" not in cmd:
                hub_parts[pid] = ("proxy" if "configurable-http-proxy" in cmd else
                                  "idle culler" if "idle_culler" in cmd else "progress page")
        server_pss = [pss_bytes(pid) for pid in servers]
        room_cpu = sum(cpu_seconds(pid) for pid in servers) + sum(cpu_seconds(p) for p in hub_parts)

        # One learner's kernel, bare and after the chapters' first imports.
        b = browsers[0]
        kernel = b.start_kernel()
        bare = b.execute(kernel, "import os; print(os.getpid())")
        kernel_pid = int(bare["stdout"].split()[-1])
        kernel_bare = pss_bytes(kernel_pid)
        b.execute(kernel, "import torch, gpulab, gpulab.models")
        kernel_torch = pss_bytes(kernel_pid)

        print(f"  {N} learners signing up at once on {os.cpu_count()} CPU cores (hub up in "
              f"{room['hub_up_s']:.1f} s first):")
        print(f"    all {len(servers)} servers ready after {all_ready:.1f} s (first after "
              f"{ready[0] - start:.1f} s, median {statistics.median(ready) - start:.1f} s); the "
              f"room's processes used {room_cpu:.0f} CPU-seconds, {room_cpu / N:.1f} per learner")
        print(f"    memory per learner server (PSS): median {statistics.median(server_pss) / MiB:.0f} MiB, "
              f"all {len(servers)}: {sum(server_pss) / MiB:.0f} MiB")
        print(f"    one kernel: {kernel_bare / MiB:.0f} MiB bare, {kernel_torch / MiB:.0f} MiB after "
              "`import torch, gpulab, gpulab.models`")
        print("    the hub itself: " + ", ".join(f"{name} {pss_bytes(pid) / MiB:.0f} MiB"
                                              for pid, name in hub_parts.items())
              + f"; together {sum(map(pss_bytes, hub_parts)) / MiB:.0f} MiB")
        noisy_neighbour(room, browsers)
    finally:
        stop_hub(room)


if __name__ == "__main__":
    main()
