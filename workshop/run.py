"""`make workshop`: start the course's JupyterHub for a room of learners, and say how to use it.

    python workshop/run.py                   start the hub (Ctrl-C stops it and every server)
    python workshop/run.py --remove-learners delete every learner account and home folder

Runs as root: it creates a system account for each learner and puts each learner's server
inside walls (workshop/walls.py). Before the hub starts it closes the instructor's folders of
the checkout to learners (solutions/, autograder/, the built book) and keeps the hub, and every
process it starts before a learner's, out of the OOM killer's reach. The settings are
environment variables (workshop/jupyterhub_config.py, workshop/plan.py). The learners' sign-up
code and the admin code are generated on first start and kept in the state folder, so a
restarted hub keeps them; set WORKSHOP_CODE / WORKSHOP_ADMIN_CODE to choose your own.
"""
from __future__ import annotations

import grp
import json
import os
import secrets
import signal
import socket
import string
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import homes  # noqa: E402
import plan  # noqa: E402
import walls  # noqa: E402

PROXY = HERE / "node_modules" / ".bin" / "configurable-http-proxy"


def learner_code() -> str:
    """Easy to read aloud and type: 'gpu-' and 6 letters or digits without look-alikes."""
    alphabet = "".join(c for c in string.ascii_lowercase + string.digits if c not in "01lo")
    return "gpu-" + "".join(secrets.choice(alphabet) for _ in range(6))


def codes(state: Path) -> dict[str, str]:
    path = state / "codes.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    chosen = {"learners": os.environ.get("WORKSHOP_CODE") or saved.get("learners") or learner_code(),
              "admin": os.environ.get("WORKSHOP_ADMIN_CODE") or saved.get("admin")
              or secrets.token_urlsafe(24)}
    if len(chosen["learners"]) < 6 or len(chosen["admin"]) < 32:
        sys.exit("workshop: WORKSHOP_CODE needs 6 characters or more, WORKSHOP_ADMIN_CODE 32 or more.")
    path.write_text(json.dumps(chosen))
    path.chmod(0o600)
    return chosen


def room_address(ip: str) -> str:
    """The address to give the room: the one the hub listens on, when it is a single one; else
    this machine's name if it resolves to an address other machines can use, else the address
    of the interface its default route leaves by (a UDP connect picks it, sending nothing)."""
    if ip not in ("", "0.0.0.0", "::"):
        return ip
    name = socket.getfqdn()
    try:
        if not socket.gethostbyname(name).startswith("127."):
            return name
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("8.8.8.8", 53))
            return probe.getsockname()[0]
        except OSError:
            return name


def unmappable_devices(devices: tuple[str, ...], nvml) -> list[str]:
    """The devices of WORKSHOP_DEVICES whose nodes this machine cannot find, each with why (no
    NVML, a UUID the driver does not know, a MIG instance without capability nodes): a learner
    given one could not start (every spawn would answer 500)."""
    refused = []
    for uuid in devices:
        try:
            walls.device_nodes(uuid, nvml)
        except Exception as error:  # noqa: BLE001 (NVMLError_*, LookupError, OSError)
            refused.append(f"{uuid} ({type(error).__name__}: {error})")
    return refused


def main() -> None:
    if "--remove-learners" in sys.argv[1:]:
        if os.geteuid() != 0:
            sys.exit("workshop: run it as root (sudo make workshop-remove-learners).")
        import accounts
        removed = accounts.remove_learners(os.environ.get("WORKSHOP_GROUP", accounts.GROUP))
        print(f"workshop: removed {len(removed)} account(s)" + (f": {', '.join(removed)}" if removed else ""))
        return
    try:
        settings = plan.settings_from_env()
    except ValueError as error:
        sys.exit(f"workshop: {error}")
    # Before anything is created: a device this machine cannot map stops the start, not every spawn.
    refused = unmappable_devices(settings.devices, walls.nvml())
    if refused:
        sys.exit("workshop: WORKSHOP_DEVICES names devices this machine cannot map to their device "
                 "nodes, so no learner given one could start:\n  " + "\n  ".join(refused) +
                 "\n`make workshop-check` lists the GPUs and MIG instances the driver knows; give "
                 "those UUIDs, or WORKSHOP_DEVICES=none for a CPU workshop.")
    if os.geteuid() != 0:
        sys.exit("workshop: run it as root (sudo make workshop): the hub creates a system account "
                 "for each learner and starts their server as that account.")
    if not os.access(PROXY, os.X_OK):
        sys.exit(f"workshop: the proxy is not installed ({PROXY}); run `make workshop`, which "
                 "installs it with npm.")
    state = Path(os.environ.setdefault("WORKSHOP_STATE", str(HERE / "state")))
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)       # the database, cookie secret, codes and password hashes
    code = codes(state)
    os.environ["WORKSHOP_CODE"], os.environ["WORKSHOP_ADMIN_CODE"] = code["learners"], code["admin"]
    group = os.environ.get("WORKSHOP_GROUP", "gpulab-learners")
    home_root = Path(os.environ.get("WORKSHOP_HOMES", "/home")).resolve()
    if any(home_root.is_relative_to(scratch) for scratch in ("/tmp", "/var/tmp", "/dev/shm")):
        sys.exit(f"workshop: WORKSHOP_HOMES={home_root} lies in a folder each learner gets a private "
                 "copy of (/tmp, /var/tmp, /dev/shm), where their home would vanish: use /home.")
    applier, why = walls.detect(group)
    if settings.walls and applier is None:
        sys.exit(f"workshop: no way to wall learners in on this machine: {why}. Without walls one "
                 "learner can starve the room: run it where systemd or writable cgroups are, or "
                 "start it anyway with WORKSHOP_WALLS=off.")
    walled = (f"{applier.name} ({why}): {settings.memory_bytes / plan.GiB:.1f} GiB, "
              f"{settings.tasks} tasks, an equal CPU share and their own GPU each; "
              f"/tmp, /var/tmp, /dev/shm of {settings.scratch_bytes / plan.GiB:.1f} GiB each"
              if settings.walls else "OFF (WORKSHOP_WALLS=off): learners can starve each other")
    no_disk = homes.why_not(home_root)
    disk = (f"a home of {settings.disk_bytes / plan.GiB:.1f} GiB each, a disk of its own "
            "(ENOSPC past it)" if no_disk is None else
            f"NO CAP ({no_disk}): one learner can fill the disk of {home_root}")
    places = (f"{settings.signups} may sign up with the code; later sign-ups wait until you add "
              f"their name on the Admin page; at most {settings.learners} servers run at once")
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        gid = None
    closed = walls.close_to_learners(HERE.parent, gid)
    shut = ", ".join(f"{p.relative_to(HERE.parent)}/" for p in closed) or "nothing to close"
    # The hub, its proxy and services never die of the OOM killer; learners' processes go first
    # (+500, start_learner.sh). Lowering needs CAP_SYS_RESOURCE, which a container's root may lack:
    # then the hub stays at 0, still chosen after every learner process.
    try:
        Path("/proc/self/oom_score_adj").write_text(str(walls.HUB_OOM_SCORE_ADJ))
        oom = f"hub {walls.HUB_OOM_SCORE_ADJ} (never chosen), learners +{walls.LEARNER_OOM_SCORE_ADJ}"
    except PermissionError:
        oom = (f"hub 0 (root here lacks CAP_SYS_RESOURCE to lower it), learners "
               f"+{walls.LEARNER_OOM_SCORE_ADJ}: chosen first")
    if settings.walls:
        # Beside the hub's start, in its cgroup: done long before a first learner's kernel starts.
        import subprocess
        import sysconfig
        warm = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import walls; from pathlib import Path; "
                f"walls.warm_shared_pages(Path({sys.executable!r}), Path({sysconfig.get_paths()['purelib']!r}))")
        subprocess.Popen([sys.executable, "-c", warm], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        shared = ("the course's libraries are read ahead by the hub, so that their pages count in "
                  "no learner's memory")
    else:
        shared = "not read ahead (WORKSHOP_WALLS=off)"
    import check
    short = [line.strip() for line in check.needs_lines(settings) if line.lstrip().startswith("!")]
    port = os.environ.get("WORKSHOP_PORT", "8000")
    ip = os.environ.get("WORKSHOP_IP", "0.0.0.0")
    address = room_address(ip)
    reach = ("" if not address.startswith("127.") and address != "localhost" else
             "  (only this machine can reach it: set WORKSHOP_IP=0.0.0.0 for the room)")
    admin = os.environ.get("WORKSHOP_ADMIN", "host")
    if settings.devices:
        per = plan.learners_per_device(settings.learners, len(settings.devices))
        gpus = (f"{len(settings.devices)} device(s), up to {per} learner(s) each, memory cap "
                f"{settings.memory_fraction:g} of the device per learner")
    else:
        gpus = "no GPU: experiments run on the CPU at reduced size"
    print(f"""
GPU Training Lab workshop, planned for {settings.learners} learners
  open       http://{address}:{port}/{reach}
  learners   sign up with a name, a password of their own, and the workshop code {code['learners']}
  host       sign in as {admin!r} with the admin code {code['admin']}
             (Admin page: every learner's server; Services > progress: who answered what)
  places     {places}
  walls      {walled}
  disk       {disk}
  shared     {shared}
  OOM killer {oom}{"".join(chr(10) + "  " + line for line in short)}
  closed     to learners: {shut} (the course's instructor side;
             each learner works in their own copy of the release)
  GPUs       {gpus}
  CPU        {settings.threads} thread(s) per learner; idle kernels stop after \
{settings.kernel_idle_s} s, idle servers after {settings.server_idle_s} s
  stop       Ctrl-C here stops the hub and every learner's server; their files stay.
             After the workshop: sudo make workshop-remove-learners deletes the accounts and
             their files. (The codes are kept in {state}/codes.json.)
""", flush=True)
    os.chdir(state)
    # Started in the background (nohup ... &), a process inherits SIGINT ignored, and so would the
    # hub's servers and services: each would then hold the hub's shutdown for its full timeout.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    hub_command = [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(HERE / "jupyterhub_config.py")]
    os.execv(hub_command[0], hub_command + sys.argv[1:])


if __name__ == "__main__":
    main()
