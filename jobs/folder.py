"""One queue folder: its marker, its state folders, and the mechanics every
transition shares (durable moves, the events log, quarantine, the counter).

Invariants kept here:
- Every state change is one `files.move` of a job directory between sibling
  state folders; with `durable=True` both folders are fsynced after it.
- An entry that is not a job (bad name, not a directory, a symlink) is moved
  into `quarantine/` under a fresh safe name, with a `.why` note beside it; it
  is never deleted and never followed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobs import access, config, document, files, moves, reserve
from jobs.errors import FULL, InvalidJob, QueueError, storage_error
from jobs.fate import Cause
from jobs.handles import OPEN_DIR, Dir, Entry
from jobs.job import MAX_SPEC_BYTES, JobSpec, State, indented_json

log = logging.getLogger(__name__)

MARKER = "queue.json"
MARKER_KIND = "forkvisor-queue"
FORMAT_VERSION = 1
SPEC_FILE = "job.json"
PURGED_LOG = "purged.log"  # one line per job purged: "STAMP purged STATE ID"
COUNTER_FILE = "attempts"
EVENTS_FILE = "events"
ERROR_FILE = "error.json"
RESULT_FILE = "result.json"
OUTCOME_FILE = "outcome.json"
CANCEL_FILE = "cancel"
FREEZE_FILE = "frozen"  # in a running job's folder: its manager freezes the run it names (`forkvisor pause --job`)
DRAIN_FILE = "drain"  # in the queue folder: a request that every manager drain (`forkvisor drain`)
QUARANTINE = "quarantine"
TMP = "tmp"
STATS = "stats"  # each manager's and sweeper's counters (`jobs.stats`)
KEYS = "keys"  # which job holds each unique key (`jobs.keys`)
SCHEDULES = "schedules"  # the schedules added from the shell (`jobs.schedules`)
TICKS = "ticks"  # each schedule's handled ticks (`jobs.ticks`)
EDGES = "edges"  # which jobs wait for which (`jobs.depends`)
TAKEN = "taken"  # the ids of members' submissions taken in lately (`jobs.incoming`)
BELLS = "bells"  # each host's doorbell for its managers (`supervisor.bell`)
FOLDERS = (TMP, QUARANTINE, *(state.value for state in State), STATS, KEYS, SCHEDULES, TICKS, EDGES, TAKEN, BELLS)


def cancel_requested(job: Dir) -> bool:
    """Whether an operator cancelled the job (its `cancel` marker is there): it never runs again."""
    return job.exists(CANCEL_FILE)


def frozen_run(job: Dir) -> int | None:
    """The run an operator froze (its `frozen` marker says `run N`), if any: a marker left
    from an earlier run names that one, and freezes no other."""
    if not job.exists(FREEZE_FILE):
        return None
    try:
        words = files.read_limited(FREEZE_FILE, 64, job.fd).split()
    except OSError:
        return None
    return int(words[1]) if len(words) == 2 and words[0] == b"run" and words[1].isdigit() else None


class QueueFolder:
    """The folder of one queue, opened (and created if asked) and checked.

    The folder is opened once (`root`) and so is each of its state folders (`at`), on
    first use; everything below them is reached through these handles (`jobs.handles`),
    and `replaced` tells when one of them no longer stands at its name."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool, durable: bool, shared: bool) -> None:
        self.path = Path(path).absolute()
        self.durable = durable
        self._dirs: dict[str, Dir] = {}
        try:
            self.root = _open_root(self.path, create, shared)
            marker = self._open_or_create(create, shared)
        except PermissionError as exc:
            where = "" if exc.filename in (None, os.fspath(self.path)) else f" ({exc.filename})"
            raise QueueError(f"cannot open queue {self.path}: {exc.strerror}{where}") from None
        self.shared = marker.get("shared", False) is True
        self.layout = access.layout(self.shared)
        self.stored_settings = _settings(self.path, marker)  # what queue.json sets
        self.settings = config.effective(self.stored_settings)  # and the built-in values for the rest
        self.dir_mode = self.layout.folder
        self.file_mode = self.layout.file
        self._open_folders()

    def _open_folders(self) -> None:
        """Open every state folder now, so that `replaced` compares each with what it was at the
        start, and one swapped later is never opened through its name. (One that cannot be
        opened yet, missing or not this user's to read, is opened when first used.)"""
        for name in FOLDERS:
            try:
                self.at(name)
            except (QueueError, PermissionError):
                continue

    def _open_or_create(self, create: bool, shared: bool) -> dict[str, Any]:
        if not self.root.exists(MARKER):
            if not create:
                raise QueueError(f"cannot open queue {self.path}: no {MARKER}, so it is not a queue")
            _initialise(self.root, self.path, shared)
        marker = _read_marker(self.root, self.path)
        if self.owned():  # only the owner makes folders; a member or a reader does without
            self._ensure_state_folders(access.layout(marker.get("shared", False) is True))
        return marker

    def _ensure_state_folders(self, shape: access.Layout) -> None:
        made = False
        for name in FOLDERS:
            try:
                mode = self.root.lstat(name).st_mode
            except FileNotFoundError:
                try:
                    self.make_dir(self.root / name, shape.of_folder(name))
                    made = True
                except FileExistsError:
                    pass  # made meanwhile by another opener
                except OSError as exc:
                    raise storage_error(exc, f"create {name}/ in queue", self.path) from None
                continue
            if not stat.S_ISDIR(mode):
                raise QueueError(
                    f"cannot open queue {self.path}: {name}/ is not a plain folder (a link or a file); "
                    "a queue's folders must be its own, so move it away and let forkvisor create it"
                )
        if made:  # on disk before the first job is acknowledged in one of them (a power cut would lose them)
            self.root.fsync()

    def owned(self) -> bool:
        """Whether this process is the queue's owner (the owner of its folder)."""
        return os.fstat(self.root.fd).st_uid == os.geteuid()

    def problems(self) -> list[str]:
        """Why a manager running as this process must not serve the queue (empty if it may)."""
        return access.problems(self.root, MARKER, list(FOLDERS), os.geteuid())

    def set_group(self, gid: int) -> None:
        """Give the queue folder, its marker and its state folders the group `gid` (a shared
        queue's members); what is made inside them later inherits it (setgid). `incoming/`
        keeps the owner group (`set_owner_group`)."""
        os.chown(self.root.fd, -1, gid)
        for name in (MARKER, *FOLDERS):
            if name != State.INCOMING.value:
                os.chown(name, -1, gid, dir_fd=self.root.fd, follow_symlinks=False)

    def set_owner_group(self, gid: int) -> None:
        """Give `incoming/` the group `gid`, one only the owner is in (docs/SECURITY.md)."""
        os.chown(State.INCOMING.value, -1, gid, dir_fd=self.root.fd, follow_symlinks=False)

    def tighten(self) -> list[str]:
        """Give the queue folder, its marker and its state folders the modes of its layout."""
        return access.tighten(self.root, MARKER, list(FOLDERS), self.layout)

    def write_settings(self, changes: dict[str, Any]) -> None:
        """Check and store new settings in `queue.json` (see `jobs.config`); a value of
        None unsets one (it takes the built-in value again)."""
        checked = {key: _checked_or_unset(key, value) for key, value in changes.items()}
        marker = _read_marker(self.root, self.path)
        current = marker.get("defaults", {})
        marker["defaults"] = {key: value for key, value in {**current, **checked}.items() if value is not None}
        data = json.dumps(marker, indent=1).encode() + b"\n"
        files.replace_file(MARKER, data, durable=True, mode=self.layout.marker, dir_fd=self.root.fd)
        self.stored_settings = _settings(self.path, marker)
        self.settings = config.effective(self.stored_settings)

    def reload_settings(self) -> bool:
        """Read `queue.json` again (an operator may have changed a setting); whether it changed."""
        stored = _settings(self.path, _read_marker(self.root, self.path))
        changed = stored != self.stored_settings
        self.stored_settings, self.settings = stored, config.effective(stored)
        return changed

    # -- handles and paths ------------------------------------------------------

    def at(self, name: State | str) -> Dir:
        """The handle of a state folder (or `tmp`, `quarantine`), opened on first use."""
        key = name.value if isinstance(name, State) else name
        found = self._dirs.get(key)
        if found is None:
            try:
                found = self._dirs[key] = self._open_folder(key)
            except FileNotFoundError:
                raise QueueError(
                    f"queue {self.path} has no {key}/ folder (its owner's `forkvisor init` makes it)"
                ) from None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise QueueError(f"queue {self.path}: {key}/ is not a plain folder (a link or a file)") from None
        return found

    def _open_folder(self, name: str) -> Dir:
        try:
            return self.root.sub(name).pinned()
        except PermissionError:
            if name != State.INCOMING.value:
                raise
            return self.root.search_only(name).pinned()  # a member: may enter incoming/, not list it

    def replaced(self) -> str | None:
        """Why this process must stop using the queue: its folder, or a state folder it has
        open, no longer stands at its name (moved, or replaced by another folder or a link).
        None while every handle still names what it opened."""
        why = self.root.replaced(os.fspath(self.path), follow=True)
        if why:
            return f"the queue folder {self.path} changed under this process: {why}"
        for name, handle in list(self._dirs.items()):
            why = handle.replaced(name, self.root)
            if why and not (name == QUARANTINE and not self.root.exists(name)):  # made again when needed
                return f"{name}/ of queue {self.path} was replaced while this process used it: {why}"
        return None

    def close(self) -> None:
        """Close every handle (the queue cannot be used afterwards)."""
        for handle in self._dirs.values():
            handle.close()
        self._dirs.clear()
        self.root.close()

    def state_dir(self, state: State) -> Path:
        """A state folder's path: for messages and display (operations go through `at`)."""
        return self.path / state.value

    @property
    def tmp(self) -> Dir:
        return self.at(TMP)

    # -- moving ------------------------------------------------------------

    def make_dir(self, entry: Entry, mode: int | None = None) -> None:
        """Create the folder `entry` with the queue's mode (or `mode`), whatever the umask."""
        mode = self.dir_mode if mode is None else mode
        os.mkdir(entry.name, mode & 0o777, dir_fd=entry.dir.fd)
        if mode & 0o7077:  # group or special bits, which the umask may take away
            fd = os.open(entry.name, OPEN_DIR, dir_fd=entry.dir.fd)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

    def write_new(self, entry: Entry, data: bytes) -> None:
        files.write_new(entry.name, data, durable=self.durable, mode=self.file_mode, dir_fd=entry.dir.fd)

    def replace_file(self, entry: Entry, data: bytes) -> None:
        files.replace_file(entry.name, data, durable=self.durable, mode=self.file_mode, dir_fd=entry.dir.fd)

    def append_line(self, entry: Entry, line: str) -> None:
        files.append_line(entry.name, line, mode=self.file_mode, dir_fd=entry.dir.fd)

    def mark(self, entry: Entry, line: str) -> None:
        """A marker file whose existence is what counts (`cancel`): with its line, or empty on a
        full disk (an empty file needs no data block)."""
        try:
            self.append_line(entry, line)
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            os.close(os.open(entry.name, flags, self.file_mode, dir_fd=entry.dir.fd))

    # -- inside a job directory -------------------------------------------------

    def read_spec(self, job: Dir, job_id: str) -> JobSpec:
        """Read and check `job.json`; raise InvalidJob saying what is wrong."""
        try:
            data = files.read_limited(SPEC_FILE, MAX_SPEC_BYTES, job.fd)
        except FileNotFoundError:
            raise InvalidJob(f"job {job_id} has no {SPEC_FILE}; write it before publishing (docs/FORMAT.md)") from None
        except OSError as exc:
            raise InvalidJob(f"job {job_id}: cannot read {SPEC_FILE}: {exc.strerror or exc}") from None
        return JobSpec.from_json(data, job_id)

    def log_event(self, job: Dir, event: str, now: float) -> None:
        """Append one line to the job's `events` log; the log is informative, so a
        failure to write it is logged, never raised."""
        stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        try:
            self.append_line(job / EVENTS_FILE, f"{stamp} {event}")
        except OSError as exc:
            log.warning("cannot append to the events log of %s: %s", job.path, exc)

    def write_json(self, entry: Entry, document: dict[str, Any]) -> None:
        self.replace_file(entry, indented_json(document))

    def bury(self, entry: Entry, job_id: str, cause: Cause, now: float, *, even_if_full: bool = False) -> Entry:
        """Move the job at `entry` to `dead/` with its cause in `error.json`; `even_if_full`: on
        a full disk, without it (an operator's cancel must work then; its command says what it did).

        Raises FileNotFoundError when the job is gone (someone else moved it).
        """
        with entry.open() as job:
            self.clear_the_way(job, RESULT_FILE, now)
            files.unlink_if_there(RESULT_FILE, job.fd)  # a stale owner's result never stands for this job
            self.clear_the_way(job, ERROR_FILE, now)
            try:  # (durable with its name: the folder's fsync makes the unlink above durable too)
                self.write_json(job / ERROR_FILE, cause.to_json())
            except OSError as exc:
                if not (even_if_full and exc.errno in FULL):
                    raise
                log.warning("job %s goes to dead/ without its error.json: %s", job_id, exc.strerror)
            # Logged before the move, so a kill right after it cannot leave the story without its end.
            self.log_event(job, f"dead: {cause.reason.value}: {cause.message}".rstrip(": "), now)
        target = self.at(State.DEAD) / job_id
        moves.move_on(entry, target, self.durable)
        log.info("job %s is dead: %s", job_id, cause.message or cause.reason.value)
        return target

    # -- quarantine -----------------------------------------------------------

    def clear_the_way(self, job: Dir, name: str, now: float) -> None:
        """Quarantine a folder standing where the file `job/name` belongs: renaming a new
        file over it would fail for ever. (A link or fifo there is simply replaced.)"""
        if job.is_dir(name):
            self.quarantine(job / name, f"{name} of job {_name(job.path)} was a folder, not a file", now)

    def quarantine(self, entry: Entry, why: str, now: float) -> Entry | None:
        """Move `entry` aside with a note; None if it was gone already."""
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%d-%H%M%S")
        where, name = _name(os.path.dirname(entry.path)), _name(entry.name)
        target = self._quarantine() / f"{where}.{stamp}.{os.urandom(4).hex()}"
        try:
            moves.set_aside(entry, target)
        except FileNotFoundError:
            if not entry.exists():
                return None  # someone else moved it first
            target = self._quarantine(remake=True) / target.name  # an operator removed quarantine/
            moves.set_aside(entry, target)
        files.checkpoint("quarantine:moved")
        note = f"from: {where}/{name!r}\nwhen: {stamp} UTC\nwhy: {why}\n"
        note_file = f"{target.name}.why"  # informative: not worth an fsync per entry
        data = note.encode("utf-8", "backslashreplace")  # whole or not at all, whenever its writer dies:
        files.link_new(note_file, data, durable=False, mode=self.file_mode, dir_fd=target.dir.fd)
        log.warning("quarantined %s/%r as %s: %s", where, name, target.name, why)
        return target

    def _quarantine(self, remake: bool = False) -> Dir:
        """The handle of `quarantine/`, made again if an operator removed it (the one
        state folder whose removal is no reason to stop: it holds nothing in flight)."""
        if not remake and QUARANTINE in self._dirs:
            return self._dirs[QUARANTINE]
        gone = self._dirs.pop(QUARANTINE, None)
        if gone is not None:
            gone.close()
        try:
            self.make_dir(self.root / QUARANTINE)
        except FileExistsError:
            pass
        return self.at(QUARANTINE)


def _make_parents(folder: Path) -> None:
    """Make the missing folders above a new queue, mode 0755 whatever the umask (a umask of
    000 once left them open to every user; a narrow one would hide a shared queue)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs to set
        os.chmod(path, 0o755)


def _checked_or_unset(key: str, value: Any) -> Any:
    """The stored form of a setting's new value; None (unset) for None."""
    if value is None:
        config.check_key(key)
        return None
    return config.checked(key, value)


# -- opening a queue's folder ---------------------------------------------------------------


def _open_root(path: Path, create: bool, shared: bool) -> Dir:
    """The queue's folder, opened (made first, if asked, with the mode its kind needs)."""
    try:
        return Dir.open(path, follow=True)
    except FileNotFoundError:
        if not create:
            raise QueueError(f"cannot open queue {path}: no such folder (create it with `forkvisor init`)") from None
    except NotADirectoryError:
        if os.path.lexists(path) or not create:
            raise QueueError(f"cannot open queue {path}: it is not a folder") from None
    try:
        _make_parents(path.parent)
        os.mkdir(path, access.layout(shared).root)
    except FileExistsError:
        pass  # made meanwhile by another creator
    except OSError as exc:
        raise storage_error(exc, "create queue", path) from None
    root = Dir.open(path, follow=True)
    if os.fstat(root.fd).st_uid == os.geteuid():
        os.fchmod(root.fd, access.layout(shared).root)  # the umask must not narrow a shared queue
    return root


def _initialise(root: Dir, path: Path, shared: bool) -> None:
    """Make the folder a queue: its marker, linked into place (a racing creator's wins), durable."""
    stray = sorted(name for name in root.names() if name != MARKER and not _is_marker_staging(name))
    if stray:
        raise QueueError(
            f"cannot create a queue in {path}: the folder is not empty and has no {MARKER} "
            f"(found {', '.join(stray[:5])}); use an empty or new folder"
        )
    document = {"kind": MARKER_KIND, "version": FORMAT_VERSION, "shared": shared, "defaults": {}}
    data = json.dumps(document, indent=1).encode() + b"\n"
    tmp = f".{MARKER}.{os.getpid()}.tmp"
    files.unlink_if_there(tmp, root.fd)  # left by an earlier attempt of this pid
    try:
        files.write_new(tmp, data, durable=True, mode=access.layout(shared).marker, dir_fd=root.fd)
    except OSError as exc:
        files.unlink_if_there(tmp, root.fd)  # a failed init (disk full) must not block the next one
        raise storage_error(exc, "create queue", path) from None
    try:
        os.link(tmp, MARKER, src_dir_fd=root.fd, dst_dir_fd=root.fd)  # link: a racing creator's marker wins
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp, dir_fd=root.fd)
    root.fsync()
    reserve.keep(root, access.layout(shared).file)


def _read_marker(root: Dir, path: Path) -> dict[str, Any]:
    """`queue.json`, checked: a forkvisor queue's marker, of a format this version reads."""
    try:
        marker = document.read(MARKER, 1 << 20, MARKER, root.fd)
    except (OSError, InvalidJob) as exc:
        raise QueueError(f"cannot open queue {path}: {MARKER} is unreadable ({exc})") from None
    if not isinstance(marker, dict) or marker.get("kind") != MARKER_KIND:
        raise QueueError(f"cannot open queue {path}: {MARKER} does not mark a forkvisor queue")
    version = marker.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise QueueError(f"cannot open queue {path}: {MARKER} has no valid version (got {version!r})")
    if version > FORMAT_VERSION:
        raise QueueError(
            f"cannot open queue {path}: it has format version {version!r}, and this forkvisor "
            f"reads up to version {FORMAT_VERSION}; upgrade forkvisor"
        )
    return marker


def _settings(path: Path, marker: dict[str, Any]) -> dict[str, Any]:
    """The settings `queue.json` stores, checked."""
    stored = marker.get("defaults", {})
    if not isinstance(stored, dict):
        raise QueueError(f'cannot open queue {path}: {MARKER} "defaults" must be a JSON object')
    try:
        return config.stored(stored)
    except InvalidJob as exc:
        raise QueueError(
            f"cannot open queue {path}: {MARKER} has a bad setting: {exc}; fix it with `forkvisor config`"
        ) from None


def _name(path: files.StrPath) -> str:
    """The last part of a path given as a string or a Path."""
    return os.path.basename(os.fspath(path))


def _is_marker_staging(name: str) -> bool:
    """A marker being written (or left by an init that failed): `.queue.json.PID.tmp`."""
    return name.startswith(f".{MARKER}.") and name.endswith(".tmp")


def entry_problem(place: Entry, missing_ok: bool = True) -> str | None:
    """Why the entry is not a job directory (None when it is one, or is gone: unless not
    `missing_ok`, then FileNotFoundError)."""
    try:
        mode = place.lstat().st_mode
    except FileNotFoundError:
        if not missing_ok:
            raise
        return None
    if stat.S_ISLNK(mode):
        return "a symlink: state folders hold job directories only, never links"
    if not stat.S_ISDIR(mode):
        return "not a directory: a job is a directory holding job.json"
    return None


def filesystem_now(folder: Dir, mode: int = files.PRIVATE) -> float:
    """The file system's clock: touch a file in `folder` and read back its mtime."""
    clock = ".clock"
    try:
        try:
            os.utime(clock, dir_fd=folder.fd, follow_symlinks=False)  # a planted link must not touch a file elsewhere
        except FileNotFoundError:
            files.append_line(clock, "", mode, folder.fd)
        return folder.lstat(clock).st_mtime
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        return time.time()  # a reader that may not write (status on a read-only queue): the local clock
