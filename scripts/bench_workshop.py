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

Then every chapter inside one learner's walls (``chapters_inside_the_walls``): a room planned for
30 learners on this machine (512 tasks, its threads) but with a memory wall of NEEDS_WALL, so
that the figures are what each chapter needs, not where a smaller wall cut it; one learner runs
each chapter's release top to bottom as Run All does. Per chapter: the time beside the same
notebook run outside any wall with the same threads and CPU weight, the peak memory of everything
the learner runs (their server, the kernel and its children, their scratch files: RSS + tmpfs),
the peak tasks, and the major page faults (a learner thrashing against their wall makes
thousands). Then chapter 07 again in the plan's own memory wall (0.7 GiB here: issue 34's case).
``--write-needs`` saves the figures to workshop/chapter_needs.json, which `make workshop-check`
compares with the plan; ``--chapters-only`` skips the room of 30 (and takes chapter names:
``--chapters-only 11_model_parallel --write-needs`` replaces that chapter's row only).

Needs root (it creates the learners' accounts; all are removed afterwards).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
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


NEEDS = ROOT / "workshop" / "chapter_needs.json"
PLANNED = 30                          # the room the chapters are measured in: a full one's walls
NEEDS_WALL = "2G"                     # above every chapter's peak: what they need, uncut


def memory_sample(memory: Path, pids: Path) -> tuple[int, int, int]:
    """(RSS + tmpfs bytes, tasks, major faults so far) of a learner's cgroups (v1)."""
    stat = dict(line.split() for line in (memory / "memory.stat").read_text().splitlines())
    return (int(stat["total_rss"]) + int(stat["total_shmem"]),
            int((pids / "pids.current").read_text()), int(stat["total_pgmajfault"]))


def run_inside(b, chapter: str, memory: Path, pids: Path) -> dict:
    """One chapter's release, every code cell in turn in a fresh kernel (as Run All runs them),
    the learner's cgroups sampled every 0.1 s."""
    import nbformat
    cells = [c.source for c in nbformat.read(ROOT / "notebooks" / chapter / f"{chapter}.ipynb",
                                             as_version=4).cells if c.cell_type == "code"]
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(memory_sample(memory, pids))
            stop.wait(0.1)

    kernel = b.start_kernel(path=f"course/{chapter}")
    before = memory_sample(memory, pids)
    sampler = threading.Thread(target=sample)
    start = time.monotonic()
    sampler.start()
    ran, failed, slowest = 0, None, (0.0, -1)
    try:
        for i, source in enumerate(cells):
            t = time.monotonic()
            result = b.execute(kernel, source, timeout=600)
            slowest = max(slowest, (time.monotonic() - t, i))
            if result.get("error") or result["died"] or result.get("timed out"):
                failed = (f"code cell {i}: " + (result["died"] or ("ran past 600 s" if result.get("timed out")
                          else result["error"].strip().splitlines()[-1][:200])))
                break
            ran += 1
    finally:
        seconds = time.monotonic() - start
        stop.set()
        sampler.join()
        b.api("DELETE", f"kernels/{kernel}")
    return {"seconds_inside": round(seconds, 1), "code_cells": len(cells), "ran": ran,
            "failed": failed, "slowest_cell": [slowest[1], round(slowest[0], 1)],
            "peak_memory_bytes": max(s[0] for s in samples + [before]),
            "peak_tasks": max(s[1] for s in samples + [before]),
            "major_faults": samples[-1][2] - before[2] if samples else 0}


def run_outside(chapter: str, threads: int, cpu: Path, home_cpu: Path) -> float:
    """The same release with nbclient in a scratch copy, no walls, the plan's threads; in a cpu
    cgroup beside the learner's, so that on a busy machine it gets the room's CPU weight as the
    learner does (a plain process outside it would weigh 1/30 as much)."""
    import nbformat
    from nbclient import NotebookClient
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / chapter
        shutil.copytree(ROOT / "notebooks" / chapter, folder)
        nb = nbformat.read(folder / f"{chapter}.ipynb", as_version=4)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        (cpu / "cgroup.procs").write_text(str(os.getpid()))         # the kernel inherits it
        try:
            start = time.monotonic()
            NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                           resources={"metadata": {"path": str(folder)}}).execute()
            return round(time.monotonic() - start, 1)
        finally:
            (home_cpu / "cgroup.procs").write_text(str(os.getpid()))


def chapters_inside_the_walls(only: list[str] | None = None, memory_wall: str | None = None) -> dict:
    """Each chapter's needs and time inside one learner's walls (module docstring), ``only``
    these chapters; ``memory_wall``: instead of the plan's. The figures, with the walls."""
    import walls
    room = start_hub({"WORKSHOP_GROUP": "gpulab-bench-chapters", "WORKSHOP_DEVICES": "none",
                      "WORKSHOP_LEARNERS": str(PLANNED), "WORKSHOP_CODE": "bench-code",
                      "WORKSHOP_ADMIN": "benchhost",
                      **({"WORKSHOP_MEMORY": memory_wall} if memory_wall else {})})
    try:
        b = Browser(room["base"], "benchchapters")
        assert b.sign_up("pw-bench", code="bench-code").status_code == 302
        b.use_token()
        b.spawn()
        b.wait_ready(timeout=300)
        applier, _ = walls.detect("gpulab-bench-chapters")
        if not isinstance(applier, walls.CgroupV1):
            print("  skipped: the chapters are measured in cgroup v1 walls, which this machine lacks")
            return {}
        memory, pids = applier.folder("memory", b.name), applier.folder("pids", b.name)
        wall = int((memory / "memory.limit_in_bytes").read_text())
        tasks = int((pids / "pids.max").read_text())
        probe = b.start_kernel()
        threads = int(b.execute(probe, "import os; print(os.environ['OMP_NUM_THREADS'])")["stdout"])
        b.api("DELETE", f"kernels/{probe}")
        print(f"  Run All in one learner's walls: a room planned for {PLANNED} on this machine "
              f"({tasks} tasks, {threads} thread(s), {os.cpu_count()} cores), memory wall "
              f"{wall / 2**30:.2f} GiB{'' if memory_wall else ' (the plan' + chr(39) + 's)'}, one "
              "learner; outside: the same notebook, no walls, the same threads and CPU weight")
        chapters = {}
        outside = applier.folder("cpu") / "bench-outside"
        outside.mkdir()
        home_cpu = applier.root / "cpu" / applier.own["cpu"].lstrip("/")
        for folder in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*")):
            if only and folder.name not in only:
                continue
            found = run_inside(b, folder.name, memory, pids)
            found["seconds_outside"] = run_outside(folder.name, threads, outside, home_cpu)
            chapters[folder.name] = found
            print(f"    {folder.name}: {found['seconds_inside']:6.1f} s inside, "
                  f"{found['seconds_outside']:6.1f} s outside; peak {found['peak_memory_bytes'] / MiB:4.0f} MiB "
                  f"(server included), {found['peak_tasks']:3d} tasks, {found['major_faults']} major "
                  f"faults; slowest cell {found['slowest_cell'][0]} ({found['slowest_cell'][1]} s)"
                  + (f"; STOPPED at {found['failed']}" if found["failed"] else ""), flush=True)
    finally:
        stop_hub(room)
    return {"walls": {"planned_for": PLANNED, "memory_bytes": wall, "tasks": tasks,
                      "threads": threads}, "chapters": chapters}


def chapters(write: bool, only: list[str] | None = None) -> None:
    """Every chapter in a wall above its needs; chapter 07 in the plan's own (module docstring)."""
    needs = chapters_inside_the_walls(only, NEEDS_WALL)
    tight = chapters_inside_the_walls(["07_input_pipeline"])
    if write and needs:
        if only and NEEDS.exists():
            # Some chapters measured again (a new one, say): their rows replace the old ones, with
            # this run's date beside them; the walls must be the same plan's.
            saved = json.loads(NEEDS.read_text())
            if saved["walls"] != needs["walls"]:
                raise SystemExit(f"{NEEDS.name} was measured in other walls: measure every chapter again")
            for row in needs["chapters"].values():
                row["date"] = time.strftime("%Y-%m-%d")
            saved["chapters"] = dict(sorted({**saved["chapters"], **needs["chapters"]}.items()))
            NEEDS.write_text(json.dumps(saved, indent=1) + "\n")
        else:
            NEEDS.write_text(json.dumps({
                "measured_by": "sudo .venv/bin/python scripts/bench_workshop.py --chapters-only --write-needs",
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, no GPU (CUDA_VISIBLE_DEVICES='')",
                **needs, "07_in_the_plans_wall": tight}, indent=1) + "\n")
        print(f"  written to {NEEDS.relative_to(ROOT)}")


def main() -> None:
    if os.geteuid() != 0:
        print("  skipped: workshop mode creates a system account per learner, which needs root")
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))     # the rooms still stop
    if "--chapters-only" in sys.argv:
        only = [a for a in sys.argv[sys.argv.index("--chapters-only") + 1:] if not a.startswith("--")]
        chapters("--write-needs" in sys.argv, only)
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
    chapters("--write-needs" in sys.argv)


if __name__ == "__main__":
    main()
