"""The workshop's system accounts: which are its learners', and removing them all afterwards.

Standard library only, so the tests and `make workshop-remove-learners` use it without
importing JupyterHub.
"""
from __future__ import annotations

import grp
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import homes

GROUP = "gpulab-learners"   # every workshop account is in it (hub.WorkshopAuthenticator)


def is_learner_account(name: str, group: str = GROUP) -> bool:
    try:
        return name in grp.getgrnam(group).gr_mem
    except KeyError:
        return False


def system_account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def system_name_taken(name: str) -> bool:
    """Whether ``name`` is an account or a group on this machine (adm, lp, a service's group):
    `useradd --user-group` could not make an account of that name."""
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return system_account_exists(name)


def remove_learners(group: str = GROUP, log=print) -> list[str]:
    """Delete every account in ``group`` with its home (and its disk) and processes, then the
    group."""
    try:
        names = list(grp.getgrnam(group).gr_mem)
    except KeyError:
        return []
    for name in names:
        uid = pwd.getpwnam(name).pw_uid
        for _ in range(50):   # stop what is left of their processes (kernels, terminals)
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        homes.remove(Path(pwd.getpwnam(name).pw_dir))      # its disk, where it has one
        subprocess.run(["userdel", "--remove", name], check=True, capture_output=True)
        log(f"removed account {name} and its home")
    subprocess.run(["groupdel", group], check=True, capture_output=True)
    return names


def _owner(pid: str) -> int | None:
    """The uid running process ``pid``; None once it has exited (a zombie waiting for its parent
    to collect it runs nothing: a container's init may take its time)."""
    try:
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            return None
        return os.stat(f"/proc/{pid}").st_uid
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
