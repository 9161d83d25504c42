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

from jobs import access, config, document, files
from jobs.errors import FULL, InvalidJob, QueueError, storage_error
from jobs.job import MAX_SPEC_BYTES, JobSpec, State, spec_json

log = logging.getLogger(__name__)

MARKER = "queue.json"
MARKER_KIND = "forkvisor-queue"
FORMAT_VERSION = 1
SPEC_FILE = "job.json"
COUNTER_FILE = "attempts"
EVENTS_FILE = "events"
ERROR_FILE = "error.json"
RESULT_FILE = "result.json"
OUTCOME_FILE = "outcome.json"
CANCEL_FILE = "cancel"
QUARANTINE = "quarantine"
TMP = "tmp"
FOLDERS = (TMP, QUARANTINE, *(state.value for state in State))


class QueueFolder:
    """The folder of one queue, opened (and created if asked) and checked."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool, durable: bool, shared: bool) -> None:
        self.path = Path(path).absolute()
        self.durable = durable
        try:
            marker = self._open_or_create(create, shared)
        except PermissionError as exc:
            raise QueueError(f"cannot open queue {self.path}: {exc.strerror} ({exc.filename or exc})") from None
        self.shared = marker.get("shared", False) is True
        self.layout = access.layout(self.shared)
        self.stored_settings = self._settings(marker)  # what queue.json sets
        self.settings = config.effective(self.stored_settings)  # and the built-in values for the rest
        self.dir_mode = self.layout.folder
        self.file_mode = self.layout.file

    # -- opening -----------------------------------------------------------

    def _open_or_create(self, create: bool, shared: bool) -> dict[str, Any]:
        if not self.path.exists():
            if not create:
                raise QueueError(f"cannot open queue {self.path}: no such folder (create it with `forkvisor init`)")
            try:
                _make_parents(self.path.parent)
                self._mkdir(self.path, access.layout(shared).root)
            except OSError as exc:
                raise storage_error(exc, "create queue", self.path) from None
        elif not self.path.is_dir():
            raise QueueError(f"cannot open queue {self.path}: it is not a folder")
        marker_path = self.path / MARKER
        if not marker_path.exists():
            if not create:
                raise QueueError(f"cannot open queue {self.path}: no {MARKER}, so it is not a queue")
            self._initialise(shared)
        marker = self._read_marker(marker_path)
        if self.owned():  # only the owner makes folders; a member or a reader does without
            self._ensure_state_folders(access.layout(marker.get("shared", False) is True))
        return marker

    def _initialise(self, shared: bool) -> None:
        stray = sorted(name for name in os.listdir(self.path) if name != MARKER and not _is_marker_staging(name))
        if stray:
            raise QueueError(
                f"cannot create a queue in {self.path}: the folder is not empty and has no {MARKER} "
                f"(found {', '.join(stray[:5])}); use an empty or new folder"
            )
        document = {"kind": MARKER_KIND, "version": FORMAT_VERSION, "shared": shared, "defaults": {}}
        data = json.dumps(document, indent=1).encode() + b"\n"
        tmp = self.path / f".{MARKER}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)  # left by an earlier attempt of this pid
        try:
            files.write_new(tmp, data, durable=True, mode=access.layout(shared).marker)
        except OSError as exc:
            tmp.unlink(missing_ok=True)  # a failed init (disk full) must not block the next one
            raise storage_error(exc, "create queue", self.path) from None
        try:
            os.link(tmp, self.path / MARKER)  # link, not rename: a racing creator's marker wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        files.fsync_dir(self.path)

    def _read_marker(self, marker_path: Path) -> dict[str, Any]:
        try:
            marker = document.read(marker_path, 1 << 20, MARKER)
        except (OSError, InvalidJob) as exc:
            raise QueueError(f"cannot open queue {self.path}: {MARKER} is unreadable ({exc})") from None
        if not isinstance(marker, dict) or marker.get("kind") != MARKER_KIND:
            raise QueueError(f"cannot open queue {self.path}: {MARKER} does not mark a forkvisor queue")
        version = marker.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise QueueError(f"cannot open queue {self.path}: {MARKER} has no valid version (got {version!r})")
        if version > FORMAT_VERSION:
            raise QueueError(
                f"cannot open queue {self.path}: it has format version {version!r}, and this forkvisor "
                f"reads up to version {FORMAT_VERSION}; upgrade forkvisor"
            )
        return marker

    def _ensure_state_folders(self, shape: access.Layout) -> None:
        for name in FOLDERS:
            folder = self.path / name
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise QueueError(
                    f"cannot open queue {self.path}: {name}/ is not a plain folder (a link or a file); "
                    "a queue's folders must be its own, so move it away and let forkvisor create it"
                )
            if not folder.is_dir():
                try:
                    self._mkdir(folder, shape.of_folder(name))
                except OSError as exc:
                    raise storage_error(exc, f"create {name}/ in queue", self.path) from None

    def owned(self) -> bool:
        """Whether this process is the queue's owner (the owner of its folder)."""
        try:
            return os.stat(self.path).st_uid == os.geteuid()
        except OSError:
            return False

    def problems(self) -> list[str]:
        """Why a manager running as this process must not serve the queue (empty if it may)."""
        return access.problems(self.path, MARKER, list(FOLDERS), os.geteuid())

    def set_group(self, gid: int) -> None:
        """Give the queue folder, its marker and its state folders the group `gid` (a shared
        queue's members); what is made inside them later inherits it (setgid)."""
        for path in [self.path, self.path / MARKER, *(self.path / name for name in FOLDERS)]:
            os.chown(path, -1, gid, follow_symlinks=False)

    def tighten(self) -> list[str]:
        """Give the queue folder, its marker and its state folders the modes of its layout."""
        return access.tighten(self.path, MARKER, list(FOLDERS), self.layout)

    def _mkdir(self, path: Path, mode: int) -> None:
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            return
        os.chmod(path, mode)  # the umask must not narrow a shared queue

    def _settings(self, marker: dict[str, Any]) -> dict[str, Any]:
        stored = marker.get("defaults", {})
        if not isinstance(stored, dict):
            raise QueueError(f'cannot open queue {self.path}: {MARKER} "defaults" must be a JSON object')
        try:
            return config.stored(stored)
        except InvalidJob as exc:
            raise QueueError(
                f"cannot open queue {self.path}: {MARKER} has a bad setting: {exc}; fix it with `forkvisor config`"
            ) from None

    def write_settings(self, changes: dict[str, Any]) -> None:
        """Check and store new settings in `queue.json` (see `jobs.config`); a value of
        None unsets one (it takes the built-in value again)."""
        checked = {key: _checked_or_unset(key, value) for key, value in changes.items()}
        marker = self._read_marker(self.path / MARKER)
        current = marker.get("defaults", {})
        marker["defaults"] = {key: value for key, value in {**current, **checked}.items() if value is not None}
        data = json.dumps(marker, indent=1).encode() + b"\n"
        files.replace_file(self.path / MARKER, data, durable=True, mode=self.file_mode)
        self.stored_settings = self._settings(marker)
        self.settings = config.effective(self.stored_settings)

    def reload_settings(self) -> bool:
        """Read `queue.json` again (an operator may have changed a setting); whether it changed."""
        stored = self._settings(self._read_marker(self.path / MARKER))
        changed = stored != self.stored_settings
        self.stored_settings, self.settings = stored, config.effective(stored)
        return changed

    # -- paths ---------------------------------------------------------------

    def state_dir(self, state: State) -> Path:
        return self.path / state.value

    @property
    def tmp(self) -> Path:
        return self.path / TMP

    @property
    def quarantine_dir(self) -> Path:
        return self.path / QUARANTINE

    # -- moving ------------------------------------------------------------

    def move(self, src: files.StrPath, dst: files.StrPath) -> None:
        """Move a job directory between state folders: one rename, then fsync both."""
        files.move(src, dst)
        if self.durable:
            src_parent, dst_parent = os.path.dirname(os.fspath(src)), os.path.dirname(os.fspath(dst))
            files.fsync_dir(dst_parent or ".")
            if src_parent != dst_parent:
                files.fsync_dir(src_parent or ".")

    def make_dir(self, path: files.StrPath) -> None:
        os.mkdir(path, self.dir_mode & 0o777)
        if self.shared:
            os.chmod(path, self.dir_mode)  # the umask must not narrow a shared queue

    def write_new(self, path: files.StrPath, data: bytes) -> None:
        files.write_new(path, data, durable=self.durable, mode=self.file_mode)

    def replace_file(self, path: files.StrPath, data: bytes) -> None:
        files.replace_file(path, data, durable=self.durable, mode=self.file_mode)

    def append_line(self, path: files.StrPath, line: str) -> None:
        files.append_line(path, line, mode=self.file_mode)

    def mark(self, path: files.StrPath, line: str) -> None:
        """A marker file whose existence is what counts (`cancel`): with its line, or empty on a
        full disk (an empty file needs no data block)."""
        try:
            self.append_line(path, line)
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, self.file_mode))

    # -- inside a job directory -------------------------------------------------

    def read_spec(self, job_dir: files.StrPath, job_id: str) -> JobSpec:
        """Read and check `job.json`; raise InvalidJob saying what is wrong."""
        try:
            data = files.read_limited(f"{job_dir}/{SPEC_FILE}", MAX_SPEC_BYTES)
        except FileNotFoundError:
            raise InvalidJob(f"job {job_id} has no {SPEC_FILE}; write it before publishing (docs/FORMAT.md)") from None
        except OSError as exc:
            raise InvalidJob(f"job {job_id}: cannot read {SPEC_FILE}: {exc.strerror or exc}") from None
        return JobSpec.from_json(data, job_id)

    def read_counter(self, job_dir: files.StrPath) -> int:
        """Attempts used so far (the `attempts` file; missing means 0).

        Raises InvalidJob when the file is unreadable or not a number: reading it
        as 0 would hand a crash-looping job a fresh set of attempts.
        """
        try:
            text = files.read_limited(f"{job_dir}/{COUNTER_FILE}", 64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise InvalidJob(f"cannot read the attempts counter of {_name(job_dir)}: {exc.strerror or exc}") from None
        if not text.isdigit():
            raise InvalidJob(f"the attempts counter of {_name(job_dir)} holds {text[:20]!r}, not a number")
        return int(text)

    def write_counter(self, job_dir: files.StrPath, value: int) -> None:
        self.replace_file(f"{job_dir}/{COUNTER_FILE}", f"{value}\n".encode())

    def log_event(self, job_dir: files.StrPath, event: str, now: float) -> None:
        """Append one line to the job's `events` log; the log is informative, so a
        failure to write it is logged, never raised."""
        stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        try:
            self.append_line(f"{job_dir}/{EVENTS_FILE}", f"{stamp} {event}")
        except FileNotFoundError:
            log.debug("job %s moved before its event %r was logged", _name(job_dir), event)
        except OSError as exc:
            log.warning("cannot append to the events log of %s: %s", job_dir, exc)

    def write_json(self, path: files.StrPath, document: dict[str, Any]) -> None:
        self.replace_file(path, indented_json(document))

    def bury(
        self, job_dir: Path, job_id: str, cause: dict[str, Any], now: float, *, even_if_full: bool = False
    ) -> Path:
        """Move a job to `dead/` with its cause in `error.json`; `even_if_full`: on a full disk,
        without it (an operator's cancel must work then; its command says what it did).

        Raises FileNotFoundError when `job_dir` is gone (someone else moved it).
        """
        self.clear_the_way(job_dir, ERROR_FILE, now)
        try:
            self.write_json(job_dir / ERROR_FILE, cause)
        except OSError as exc:
            if not (even_if_full and exc.errno in FULL):
                raise
            log.warning("job %s goes to dead/ without its error.json: %s", job_id, exc.strerror)
        self.clear_the_way(job_dir, RESULT_FILE, now)
        (job_dir / RESULT_FILE).unlink(missing_ok=True)  # a stale owner's result never stands for this job
        target = self.state_dir(State.DEAD) / job_id
        # Logged before the move, so a kill right after it cannot leave the story without its end.
        self.log_event(job_dir, f"dead: {cause.get('reason')}: {cause.get('message', '')}".rstrip(": "), now)
        self.move(job_dir, target)
        log.info("job %s is dead: %s", job_id, cause.get("message") or cause.get("reason"))
        return target

    # -- quarantine -----------------------------------------------------------

    def clear_the_way(self, job_dir: Path, name: str, now: float) -> None:
        """Quarantine a folder standing where the file `job_dir/name` belongs: renaming a new
        file over it would fail for ever. (A link or fifo there is simply replaced.)"""
        try:
            mode = os.lstat(job_dir / name).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            self.quarantine(job_dir, name, f"{name} of job {job_dir.name} was a folder, not a file", now)

    def quarantine(self, folder: Path, name: str, why: str, now: float) -> Path | None:
        """Move entry `name` of `folder` aside with a note; None if it was gone already."""
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%d-%H%M%S")
        target = self.quarantine_dir / f"{folder.name}.{stamp}.{os.urandom(4).hex()}"
        try:
            files.move(folder / name, target)
        except FileNotFoundError:
            if not os.path.lexists(folder / name):
                return None  # someone else moved it first
            self._mkdir(self.quarantine_dir, self.dir_mode)  # an operator removed quarantine/
            files.move(folder / name, target)
        files.checkpoint("quarantine:moved")
        note = f"from: {folder.name}/{name!r}\nwhen: {stamp} UTC\nwhy: {why}\n"
        note_path = target.with_name(target.name + ".why")  # informative: not worth an fsync per entry
        files.write_new(note_path, note.encode("utf-8", "backslashreplace"), durable=False, mode=self.file_mode)
        log.warning("quarantined %s/%r as %s: %s", folder.name, name, target.name, why)
        return target


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


def _name(path: files.StrPath) -> str:
    """The last part of a path given as a string or a Path."""
    return os.path.basename(os.fspath(path))


def _is_marker_staging(name: str) -> bool:
    """A marker being written (or left by an init that failed): `.queue.json.PID.tmp`."""
    return name.startswith(f".{MARKER}.") and name.endswith(".tmp")


def entry_problem(folder: files.StrPath, name: str) -> str | None:
    """Why the entry is not a job directory (None when it is one)."""
    try:
        mode = os.lstat(f"{folder}/{name}").st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "a symlink: state folders hold job directories only, never links"
    if not stat.S_ISDIR(mode):
        return "not a directory: a job is a directory holding job.json"
    return None


def filesystem_now(path: Path, mode: int = files.PRIVATE) -> float:
    """The file system's clock: touch a file in `path` and read back its mtime."""
    clock = path / ".clock"
    try:
        try:
            os.utime(clock, follow_symlinks=False)  # a planted link must not touch a file elsewhere
        except FileNotFoundError:
            files.append_line(clock, "", mode)
        return os.lstat(clock).st_mtime
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        return time.time()  # a reader that may not write (status on a read-only queue): the local clock


def indented_json(document: dict[str, Any]) -> bytes:
    """`json.dumps(document, indent=1, default=repr)` and a newline. Every attempt's
    `outcome.json` goes through here, so a flat record takes `spec_json`'s fast path;
    what it refuses (NaN, an object JSON cannot encode) gets the standard encoder."""
    try:
        return spec_json(document)
    except (TypeError, ValueError):
        return json.dumps(document, indent=1, default=repr).encode() + b"\n"
