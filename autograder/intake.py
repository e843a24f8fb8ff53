"""What enters grading: regular files only, within size limits, looked at before nbgrader copies.

nbgrader copies a submission's files with shutil.copy, which follows a symbolic link (to the
answer key, a classmate's notebook, /dev/zero) and opens whatever a name opens (a FIFO blocks
it), before the sandbox exists. So each submission folder is looked at first, each name with
os.lstat, never followed:

- symbolic links, FIFOs, sockets and device files, at any depth, the notebook and the folders
  included, are refused: moved out to autograder/refused/<student>/<chapter>/ (kept for you, never
  opened; removed instead when refused/ is on another file system);
- so is a file with a hard link outside its submission folder (its content is another file);
- so are a file over nbgrader's ``CourseDirectory.max_file_size`` and, largest first, the files
  that take the folder over ``max_dir_size`` (both in kB, the settings ``nbgrader collect`` applies
  too), names past MAX_ENTRIES, folders deeper than MAX_DEPTH, and a timestamp.txt nbgrader could
  not read (one bad timestamp stops nbgrader's whole run).

A refused notebook is replaced by the chapter's release, so that the student still gets feedback
that says why they scored zero. Each refusal is kept in autograder/refused/<student>/<chapter>.json;
grading puts them in the student's feedback and in integrity.jsonl (secure_grading.NormalizeCells).
`make autograde` looks at every submission before nbgrader starts (grade.py); nbgrader's autograde
looks again in its pre-convert hook (the Formgrader's Autograde button, the nbgrader command);
``nbgrader collect`` and ``zip_collect`` copy only regular files (CheckedExchangeCollect,
CheckedExtractor, CheckedCollector, set in nbgrader_config.py).

Student ids are checked wherever one enters (a folder in submitted/, an inbound entry of the
exchange, a name zip_collect reads, the folder nbgrader's own autograde is given): letters,
digits and ``. _ -``, starting with a letter, a digit or ``_`` (``valid_student_id``). nbgrader
splits lists of ids at commas, globs them and puts them in paths: an id ``bob,x`` kept bob out of
grading. ``nbgrader collect`` counts an inbound submission only for the account that owns it:
nbgrader's ``check_owner`` only warns, so a classmate could submit under your name, or link your
folder under theirs (CheckedExchangeCollect refuses both, with a finding).
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import itertools
import json
import os
import pwd
import re
import shutil
import stat
import tarfile
import zipfile
from collections import Counter
from fnmatch import fnmatch
from pathlib import Path

import nbgrader.exchange.default.collect as nbgrader_collect
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.plugins import ExtractorPlugin, FileNameCollectorPlugin
from nbgrader.utils import parse_utc, unzip

AUTOGRADER = Path(__file__).resolve().parent
REFUSED = AUTOGRADER / "refused"
MAX_ENTRIES = 1000      # files and folders in one submission
MAX_DEPTH = 8           # folders within folders
TIMESTAMP = "timestamp.txt"


STUDENT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")


def invalid_student_id(student: str) -> str | None:
    """Why ``student`` cannot be a student id, in words naming it (None: it can)."""
    if STUDENT_ID.fullmatch(student):
        return None
    return (f"{student[:100]!r} is not a valid student id (up to 100 letters, digits, '.', '_' "
            "and '-', starting with a letter, a digit or '_'): not graded")


@dataclasses.dataclass(frozen=True)
class Limits:
    file_bytes: int
    folder_bytes: int


def limits_of(coursedir) -> Limits:
    """nbgrader's own limits (kB, as its exchange reads them: 1000 bytes)."""
    return Limits(coursedir.max_file_size * 1000, coursedir.max_dir_size * 1000)


@functools.cache
def course_limits() -> Limits:
    """The limits autograder/nbgrader_config.py sets."""
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(AUTOGRADER)).load_config()
    return limits_of(CourseDirectory(config=config))


def refused_kind(mode: int) -> str | None:
    """What a name is, in words, when grading refuses it (None for a file or a folder)."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "not a regular file"
    return None


def _describe(path: Path, kind: str) -> str:
    if kind == "a symbolic link":
        try:
            return f"{kind} (to {os.readlink(path)[:100]!r})"
        except OSError:
            pass
    return kind


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def survey(folder: Path, limits: Limits, keep_first=lambda rel: False) -> tuple[list[str], dict[str, str]]:
    """(regular files kept, {refused name: why}) under ``folder``, names relative to it. Files for
    which ``keep_first`` is true (the notebooks) are the last to go when the folder is too big."""
    refused: dict[str, str] = {}
    files: list[tuple[str, os.stat_result]] = []
    pending, count = [(folder, "", 0)], 0
    while pending:
        here, prefix, depth = pending.pop()
        with os.scandir(here) as entries:
            # Never more names than the limit, however many the folder holds: time bounded too.
            for entry in sorted(itertools.islice(entries, MAX_ENTRIES + 1 - count), key=lambda e: e.name):
                rel, count = prefix + entry.name, count + 1
                if count > MAX_ENTRIES:
                    pending = []
                    break
                info = entry.stat(follow_symlinks=False)
                if kind := refused_kind(info.st_mode):
                    refused[rel] = _describe(Path(entry.path), kind)
                elif stat.S_ISDIR(info.st_mode):
                    if depth + 1 >= MAX_DEPTH:
                        refused[rel] = f"a folder nested deeper than {MAX_DEPTH}"
                    else:
                        pending.append((Path(entry.path), rel + "/", depth + 1))
                else:
                    files.append((rel, info))
    if count > MAX_ENTRIES:    # too many names: only the notebooks and the timestamp stay
        refused = {rel: why for rel, why in refused.items() if "/" not in rel}
        for entry in os.scandir(folder):       # each name: what stays here is graded
            if entry.name not in refused and not (entry.is_file(follow_symlinks=False) and (
                    keep_first(entry.name) or entry.name == TIMESTAMP)):
                refused[entry.name] = f"the submission holds more than {MAX_ENTRIES} files and folders"
        files = [(rel, info) for rel, info in files if rel not in refused and "/" not in rel]
    links_inside = Counter((info.st_dev, info.st_ino) for _, info in files)
    total = 0
    for rel, info in sorted(files, key=lambda f: (not keep_first(f[0]), f[1].st_size)):
        if info.st_nlink > links_inside[(info.st_dev, info.st_ino)]:
            refused[rel] = "a hard link to a file outside the submission"
        elif info.st_size > limits.file_bytes:
            refused[rel] = f"{_mb(info.st_size)}, over the limit of {_mb(limits.file_bytes)} per file"
        elif total + info.st_size > limits.folder_bytes:
            refused[rel] = f"the submission is over its limit of {_mb(limits.folder_bytes)}"
        else:
            total += info.st_size
    stamp = folder / TIMESTAMP
    if TIMESTAMP not in refused and os.path.lexists(stamp) and not _readable_timestamp(stamp):
        refused[TIMESTAMP] = "not a timestamp nbgrader can read"
    kept = sorted(rel for rel, _ in files if rel not in refused)
    return kept, refused


def _readable_timestamp(path: Path) -> bool:
    try:
        text = read_regular(path, 200).decode().strip()
        return not text or parse_utc(text) is not None
    except (OSError, ValueError, UnicodeDecodeError, OverflowError):
        return False


def read_regular(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file, opened without following a link or blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return f.read(limit)


def copy_regular(src: Path, dest: Path) -> None:
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{src} is not a regular file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            shutil.copyfileobj(f, out)


# ------------------------------------------------------------------------------------------
# The record of what was refused, per submission

def record_path(student: str, chapter: str) -> Path:
    return REFUSED / student / f"{chapter}.json"


def recorded(student: str, chapter: str) -> list[str]:
    """What was refused of this submission, as sentences for its feedback."""
    try:
        return list(json.loads(record_path(student, chapter).read_text())["refused"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _record(student: str, chapter: str, messages: list[str], fresh: bool = False) -> None:
    """Add to the record (``fresh``: a new submission, which starts a record of its own)."""
    old = [] if fresh else recorded(student, chapter)
    path = record_path(student, chapter)
    if not old and not messages:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"refused": old + [m for m in messages if m not in old]}, indent=1) + "\n")


def _message(rel: str, why: str) -> str:
    return f"refused {rel!r}: {why} (only regular files within the size limits are graded)"


# ------------------------------------------------------------------------------------------
# Before grading: each submission folder

def _move_out(path: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    while os.path.lexists(dest):
        dest = dest.with_name(dest.name + "~")
    try:
        os.rename(path, dest)
    except OSError:                     # another file system: the name stays in the record
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def release_notebook(chapter: str, name: str) -> Path | None:
    """The chapter's notebook as released (the graded release first), to stand in for a
    refused one."""
    for folder in (AUTOGRADER / "graded_release", AUTOGRADER.parent / "notebooks"):
        if (folder / chapter / name).is_file():
            return folder / chapter / name
    return None


def check_submission(folder: Path, student: str, chapter: str, limits: Limits | None = None) -> list[str]:
    """Refuse what ``folder`` (submitted/<student>/<chapter>) holds that is not a regular file
    within the limits; a refused notebook gets the release in its place. The new refusals."""
    limits = limits or course_limits()
    messages = []
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):  # the chapter's folder itself: a link, say, to a classmate's
        messages.append(_message(folder.name + "/", _describe(folder, refused_kind(info.st_mode) or "a file")))
        _move_out(folder, REFUSED / student / chapter / "(the folder)")
        folder.mkdir()
        for name in (f"{chapter}.ipynb",):
            if standin := release_notebook(chapter, name):
                shutil.copyfile(standin, folder / name)
                messages[-1] += "; the blank release was graded in its place"
    _, refused = survey(folder, limits, keep_first=lambda rel: rel.endswith(".ipynb") and "/" not in rel)
    for rel, why in sorted(refused.items()):
        _move_out(folder / rel, REFUSED / student / chapter / rel)
        message = _message(rel, why)
        if rel.endswith(".ipynb") and "/" not in rel and (standin := release_notebook(chapter, rel)):
            shutil.copyfile(standin, folder / rel)
            message += "; the blank release was graded in its place"
        messages.append(message)
    if messages:
        _record(student, chapter, messages)
    return messages


def check_students(submitted: Path) -> list[tuple[str, str]]:
    """Refuse a student's folder that is a link or a special file (nbgrader's globs would follow
    it, to a classmate's work, say), or whose name is not a valid student id: [(student,
    message)]. Names starting with '.' (JupyterLab's checkpoints) are nbgrader's to skip, as its
    globs do. Their chapters are check_submission's."""
    found = []
    for entry in sorted(os.scandir(submitted), key=lambda e: e.name) if submitted.is_dir() else []:
        if entry.name.startswith("."):
            continue
        if kind := refused_kind(entry.stat(follow_symlinks=False).st_mode):
            found.append((entry.name, _message(entry.name + "/", _describe(Path(entry.path), kind))))
            _move_out(Path(entry.path), REFUSED / entry.name / "(the student's folder)")
        elif why := invalid_student_id(entry.name):
            found.append((entry.name, f"refused the folder {entry.name[:100]!r}: {why}"))
            _move_out(Path(entry.path), REFUSED / "(invalid ids)" / entry.name)
    return found


def pre_convert_hook(assignment: str, student: str, notebooks: list[str]) -> None:
    """nbgrader's ``Autograde.pre_convert_hook``: the same look at each submission it is about to
    copy, whoever started the autograde (make autograde has looked already; nothing new then)."""
    for folder in sorted({Path(notebook).parent for notebook in notebooks}):
        check_submission(folder, folder.parent.name, folder.name)


# ------------------------------------------------------------------------------------------
# nbgrader collect and zip_collect

class CheckedExchangeCollect(ExchangeCollect):
    """``nbgrader collect``, copying only the regular files within the limits (nbgrader's own
    copy follows links); what it leaves out is recorded for the student's feedback. An inbound
    entry counts only for the account that owns it (``check_owner``, on by default, which
    nbgrader's own collect only warns about): one that is a link or a file, is owned by another
    account, or has a name nbgrader cannot read (an invalid id, a timestamp it cannot parse:
    either stopped the whole collect) is refused, and named in the student's feedback."""

    def init_src(self):
        # nbgrader's own init_src (it globs the inbound entries, then keeps each name's latest),
        # given only the entries that count.
        self._refused_inbound: dict[str, list[str]] = {}
        nbgrader_collect.glob = _Kept(self._counts)
        try:
            super().init_src()
        finally:
            nbgrader_collect.glob = glob
        for student, messages in sorted(self._refused_inbound.items()):
            for message in messages:
                self.log.warning("%s, %s: %s", student, self.coursedir.assignment_id, message)

    def _counts(self, path: str) -> bool:
        """Whether the inbound entry ``path`` counts (its refusal recorded when it does not)."""
        name = os.path.basename(path)
        parts = name.rsplit("+", 3)
        student = parts[0] if len(parts) >= 3 else name
        info = os.lstat(path)
        why = None
        if invalid_student_id(student):
            why = invalid_student_id(student)
            student = "(invalid ids)"
        elif len(parts) < 3:
            why = "not a name nbgrader reads"
        elif not stat.S_ISDIR(info.st_mode):
            why = _describe(Path(path), refused_kind(info.st_mode) or "a file")
        elif not _readable_utc(parts[2]):
            why = "its timestamp is not one nbgrader can read"
        elif self.check_owner and (owner := _account(info.st_uid)) != student:
            why = f"it is owned by the account {owner!r}, not by {student!r}"
        if why:
            self._refused_inbound.setdefault(student, []).append(
                f"refused the inbound submission {name[:150]!r}: {why} (a submission counts only "
                "for the account that owns it)")
        return why is None

    def copy_files(self):
        super().copy_files()
        for student, messages in self._refused_inbound.items():    # not collected: still named
            if student != "(invalid ids)":
                _record(student, self.coursedir.assignment_id, messages)

    def do_copy(self, src, dest, log=None):
        src, dest = Path(src), Path(dest)
        kept, refused = survey(src, limits_of(self.coursedir), keep_first=lambda rel: rel.endswith(".ipynb"))
        ignored = self.coursedir.ignore
        for rel in kept:
            if not any(fnmatch(part, pattern) for part in rel.split("/") for pattern in ignored):
                copy_regular(src / rel, dest / rel)
        dest.mkdir(parents=True, exist_ok=True)
        messages = [_message(rel, why) for rel, why in sorted(refused.items())]
        for message in messages:
            self.log.warning("%s, %s: %s", dest.parent.name, dest.name, message)
        refused_inbound = self._refused_inbound.pop(dest.parent.name, [])
        _record(dest.parent.name, dest.name, refused_inbound + messages, fresh=True)


class _Kept:
    """The glob module, for nbgrader's collect: only the names ``keep`` is true of."""

    def __init__(self, keep):
        self.keep = keep

    def glob(self, pattern: str) -> list[str]:
        return [path for path in glob.glob(pattern) if self.keep(path)]


def _account(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _readable_utc(text: str) -> bool:
    try:
        return parse_utc(text) is not None
    except (ValueError, OverflowError):
        return False


class CheckedExtractor(ExtractorPlugin):
    """``zip_collect``'s extractor: an archive whose members add up to more than
    ``max_dir_size`` is left unextracted (an archive of a few kB can hold gigabytes), a file
    beside the archives is copied only if it is a regular file, and a link stays a link, for
    CheckedCollector to refuse with the student's name."""

    def extract(self, archive_path: str, extracted_path: str) -> None:
        limits = limits_of(self.parent.coursedir)
        for root, _, names in os.walk(archive_path):
            extract_to = Path(extracted_path) / os.path.relpath(root, archive_path)
            extract_to.mkdir(parents=True, exist_ok=True)
            for name in names:
                path = Path(root) / name
                info = os.lstat(path)
                stem, ext = os.path.splitext(name)
                if stat.S_ISREG(info.st_mode) and ext in self.zip_ext:
                    folder = extract_to / (os.path.splitext(stem)[0] if stem.endswith(".tar") else stem)
                    self._unpack(path, folder, limits)
                elif stat.S_ISREG(info.st_mode):
                    copy_regular(path, extract_to / name)
                elif stat.S_ISLNK(info.st_mode):
                    os.symlink(os.readlink(path), extract_to / name)
                else:
                    self.log.error("Skipped %s: %s, not a regular file", path, refused_kind(info.st_mode))

    def _unpack(self, archive: Path, folder: Path, limits: Limits) -> None:
        """Unpack an archive, and the archives in it, each after checking what it declares."""
        pending = [(archive, folder)]
        while pending:
            archive, folder = pending.pop()
            declared = _declared_bytes(archive)
            if declared is None or declared > limits.folder_bytes:
                self.log.error("Skipped archive %s: %s", archive, "not an archive nbgrader reads" if
                               declared is None else f"it unpacks to {_mb(declared)}, over {_mb(limits.folder_bytes)}")
                continue
            folder.mkdir(parents=True, exist_ok=True)
            self.log.info("Extracting from: %s", archive)
            unzip(str(archive), str(folder), zip_ext=self.zip_ext, create_own_folder=False, tree=False)
            for inner in sorted(folder.rglob("*")):
                if inner.suffix in self.zip_ext and inner.is_file() and not inner.is_symlink():
                    stem = inner.stem[:-4] if inner.stem.endswith(".tar") else inner.stem
                    pending.append((inner, inner.parent / stem))


def _declared_bytes(archive: Path) -> int | None:
    """The bytes an archive's members say they unpack to (None: neither zip nor tar)."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                return sum(info.file_size for info in z.infolist())
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as t:
                return sum(member.size for member in t.getmembers())
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError):
        return None
    return None


class CheckedCollector(FileNameCollectorPlugin):
    """``zip_collect``'s collector: a file that is not a regular file, a hard link, a file over
    ``max_file_size``, or one that takes a student over ``max_dir_size`` is not collected, and
    is recorded for that student's feedback."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.collected_bytes: dict[str, int] = {}

    def collect(self, submitted_file: str):
        info = super().collect(submitted_file)
        if not info:
            return info
        app = self.parent
        student, chapter = info["student_id"], app.coursedir.assignment_id
        if why := invalid_student_id(student):
            self.log.error("Not collected: %s (from %s)", why, submitted_file)
            return None
        limits, name = limits_of(app.coursedir), info["file_id"]
        seen = self.collected_bytes
        if student not in seen:
            seen[student] = 0
            _record(student, chapter, [], fresh=True)       # this collect makes a new submission
        status = os.lstat(submitted_file)
        why = refused_kind(status.st_mode)
        if why:
            why = _describe(Path(submitted_file), why)
        elif status.st_nlink > 1:
            why = "a hard link"
        elif status.st_size > limits.file_bytes:
            why = f"{_mb(status.st_size)}, over the limit of {_mb(limits.file_bytes)} per file"
        elif seen[student] + status.st_size > limits.folder_bytes:
            why = f"the submission is over its limit of {_mb(limits.folder_bytes)}"
        if why:
            self.log.warning("Not collected for %s: %s", student, _message(name, why))
            _record(student, chapter, [_message(name, why)])
            return None
        seen[student] += status.st_size
        return info
