"""Each learner's disk: their home folder is a file system of its own, of a fixed size.

A learner who writes past it gets ENOSPC in their own home; the disk that holds the hub's
state, the course and everyone else's homes never fills. What z2jh does with a volume of fixed
size per user (``singleuser.storage.capacity``), on one machine: an ext4 image per learner
(sparse, so it takes on disk only what they wrote), loop-mounted at their home with nosuid and
nodev. The images lie beside the homes, in ``<homes>/.gpulab-disks/`` (mode 0700), and are
mounted in the host's mount namespace, so every server of the learner (each in a namespace of
its own, workshop/start_learner.sh) sees the same home. Neither systemd nor a quota-enabled
file system is needed: root, loop devices (``/dev/loop-control``) and mkfs.ext4, which a GPU
server and this test machine both have. Where they are missing, ``why_not`` says so, homes are
plain folders, and `make workshop` and `make workshop-check` warn.

Standard library only: the tests, `make workshop-check` and accounts.py use it without JupyterHub.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

DISKS = ".gpulab-disks"


def why_not(homes: Path, dev: Path = Path("/dev")) -> str | None:
    """Why learners' homes cannot get a disk of their own here, or None when they can."""
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount", "losetup") if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not installed"
    if not (dev / "loop-control").exists():
        return f"no loop devices ({dev}/loop-control is missing: a container without them?)"
    if not homes.is_dir():
        return f"{homes} does not exist"
    return None


def image(home: Path) -> Path:
    return home.parent / DISKS / f"{home.name}.ext4"


def is_mounted(path: Path) -> bool:
    return os.path.ismount(path)


def create(home: Path, size_bytes: int, uid: int, gid: int, skel: Path = Path("/etc/skel")) -> None:
    """A new home of ``size_bytes``: the image, its file system, mounted at ``home``, owned by
    the learner (mode 0700), with the system's skeleton files as useradd would copy them."""
    disk = image(home)
    disk.parent.mkdir(mode=0o700, exist_ok=True)
    with open(disk, "xb") as f:           # never over a learner's existing disk
        f.truncate(size_bytes)
    # -m 0: no blocks kept for root; nodiscard: the sparse image stays sparse.
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(disk)],
                   check=True, capture_output=True)
    home.mkdir(mode=0o700, exist_ok=True)
    mount(home)
    (home / "lost+found").rmdir()         # e2fsck makes it again when it needs one
    if skel.is_dir():
        shutil.copytree(skel, home, symlinks=True, dirs_exist_ok=True)
    for folder, names, files in os.walk(home):
        for path in [folder, *(os.path.join(folder, n) for n in names + files)]:
            os.lchown(path, uid, gid)
    home.chmod(0o700)


def mount(home: Path) -> bool:
    """Mount the learner's image at their home unless it is already (a hub restarted after a
    reboot finds the images unmounted). False when the learner has no image (a home made
    where no disk could be given)."""
    disk = image(home)
    if not disk.exists():
        return False
    if not is_mounted(home):
        home.mkdir(mode=0o700, exist_ok=True)
        subprocess.run(["mount", "-o", "loop,nosuid,nodev", str(disk), str(home)],
                       check=True, capture_output=True)
    return True


def remove(home: Path) -> None:
    """Unmount the learner's home and delete their image (their files go with it) and the
    folder it was mounted on (root's: userdel would refuse to remove it)."""
    if not image(home).exists():
        return
    if is_mounted(home):
        subprocess.run(["umount", str(home)], check=True, capture_output=True)
    home.rmdir()
    image(home).unlink()
    try:
        image(home).parent.rmdir()        # the last one out
    except OSError:
        pass


def size_bytes(home: Path) -> int | None:
    """The size of the learner's disk image, or None when their home has none."""
    disk = image(home)
    return disk.stat().st_size if disk.exists() else None
