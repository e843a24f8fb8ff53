"""Workshop mode's figures (make bench): 30 learners sign up at the same moment.

Starts the workshop's hub as `make workshop` does (on free local ports, a throwaway folder, a
CPU-only plan), has 30 learners sign up and spawn their servers at once, and prints:

- the seconds until every server is ready, and the CPU seconds the room's processes used;
- the memory of each learner's server (PSS: shared pages split among the processes sharing
  them, so the figures add up) and of one kernel, before and after `import torch, gpulab`;
- the hub's own memory (hub, proxy, idle culler, progress page).

Needs root (it creates the learners' accounts; all are removed afterwards).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "workshop"))
from room import Browser, log_excerpt, start_hub, stop_hub  # noqa: E402

N = 30
MiB = 2**20


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
    try:
        browsers = [Browser(room["base"], f"bench{i:02d}") for i in range(N)]

        def arrive(b: Browser) -> float:
            assert b.sign_in("pw-bench", code="bench-code").status_code == 302
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
    finally:
        stop_hub(room)


if __name__ == "__main__":
    main()
