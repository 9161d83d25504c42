"""Submissions of those who do not own a queue (members of a shared queue), taken in by
the queue's managers (docs/SECURITY.md has why; docs/FORMAT.md the format).

    incoming/                 the owner's, in the owner group (a group only the owner is
                              in), setgid and sticky: a member may add a folder of their
                              own here, and can neither list nor touch anyone else's
    incoming/NAME/            a member's submission folder: theirs, in the owner group
                              (inherited), mode 2770: only the member and the owner's
                              managers may add or remove names in it
      ID.json                 a submission (the job's job.json), written as
                              `.ID.json.PID.tmp` and published with one rename
      ID.cancel, ID.retry     a request about one of the member's own jobs
      .taking.ID.json         being taken in by a manager

Who submitted a job is the owner of the folder its submission is in. The kernel says
who owns a folder, and only that user (and the owner's managers, through the owner
group) may add a name to it, so whatever stands in it, that user put there: no hard
link, rename or copy of another user's file lends their identity. (The owner of a file
says nothing of who put it where it is: that was the old rule, and a link forged it.)

A member's job id is dated ahead of its submission: its time must be later than the
submission file's last change (`st_ctime`, set by the file system's clock, which no
member can set back), and at most `MOST_AHEAD` later. Every id a member could have seen
in the queue was made before they could see it, so none of them can be submitted again;
a member's own ids, and another member's just taken in, are kept out by `taken/ID`, one
file per id a take-in took (removed once the id's time is past: no later submission can
carry it then). A schedule's tick ids are derived with a secret members cannot read
(`jobs.ticks`).

A take-in, by a manager of the owner's:

    incoming/NAME/ID.json -> incoming/NAME/.taking.ID.json   one manager wins the rename
    taken/ID                                                 the id is this submission's
    write tmp/ID/ as the owner's job folder                   job.json gains "submitted_by"
    tmp/ID -> ready/RRR.ID, scheduled/DUE.RRR.ID or waiting/ID
    unlink incoming/NAME/.taking.ID.json

A take-in that a crash interrupted leaves `.taking.ID.json`: a sweep finishes it (the job
is published already: the file goes; it is not: it is taken in again, `taken/ID` naming
the same file). Each turn takes in a bounded number of entries within a bounded time,
taking from each member's folder in turn; a folder or an entry that cannot be used (not a
member's own, unreadable, writable by others) is set aside, said once, shown by `status`,
and not looked at again until it changes.
"""

from __future__ import annotations

import errno
import functools
import heapq
import logging
import os
import pwd
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from jobs import depends, document, fate, files, keys, moves, view
from jobs.config import TMP_AGE
from jobs.errors import InternalError, InvalidJob, JobNotFound, JobsError, MoveCollision, WrongState
from jobs.fate import Cause
from jobs.folder import SPEC_FILE, TAKEN, QueueFolder
from jobs.handles import OPEN_DIR, Dir, Entry
from jobs.job import (
    LATEST_DUE,
    MAX_SPEC_BYTES,
    JobSpec,
    State,
    created_at,
    new_job_id,
    ready_name,
    scheduled_name,
    spec_json,
)
from jobs.submissions import JOB_RE, MAX_MEMBER_FOLDERS, REQUEST_RE, TAKING, find_submission

log = logging.getLogger(__name__)

AHEAD = 10.0  # seconds ahead of the file system's clock a member dates a new id (its write must end first)
MOST_AHEAD = 3600.0  # a submitted id may be dated at most this far after its file's last change
TAKEN_KEPT = 60.0  # seconds a `taken/ID` outlives its id's time (clocks round; a little slack)
STALE_TAKING = 60.0  # a take-in left this long was interrupted
FOLDER_MODE = 0o2770  # a member's folder: theirs and the owner group's
SUBMISSION_FILE = "submission.json"  # a refused submission's text, as its member wrote it (in dead/ID/)
SUBMISSION_MODE = 0o644  # readable by the owner's managers whatever the folder's group bits


# -- the member's side -----------------------------------------------------------------------


def my_folder(folder: QueueFolder, durable: bool = False) -> Entry:
    """The calling user's submission folder in `incoming/`, made on first use (`durable`: on
    disk before it is used): `incoming/UID`, or `UID.N` if another user took that name first
    (the queue's managers rename such a squat for its owner at their next take-in)."""
    incoming = folder.at(State.INCOMING)
    uid = os.geteuid()
    for name in [str(uid), *(f"{uid}.{n}" for n in range(1, 10))]:
        try:
            status = incoming.lstat(name)
        except FileNotFoundError:
            try:
                _make_member_folder(incoming, name, durable)
            except FileExistsError:
                status = incoming.lstat(name)  # made meanwhile: by us (another submit) or someone else
            else:
                return incoming / name
        if stat.S_ISDIR(status.st_mode) and status.st_uid == uid:
            return incoming / name
    raise JobsError(
        f"cannot submit to {folder.path}: incoming/{uid} and the nine names after it are other users' "
        "(the queue's managers rename them for their owners at their next take-in: submit again in a moment)"
    )


def _make_member_folder(incoming: Dir, name: str, durable: bool) -> None:
    """Make `incoming/NAME` with its mode whatever the umask, under a dot-name first (which
    managers pass over), so that no manager sees it half made; FileExistsError if it is there."""
    staging = f".{name}.{os.getpid()}.new"
    os.mkdir(staging, 0o700, dir_fd=incoming.fd)
    try:
        fd = os.open(staging, OPEN_DIR, dir_fd=incoming.fd)
        try:
            os.fchmod(fd, FOLDER_MODE)  # the owner group's bits (its setgid comes from incoming/)
        finally:
            os.close(fd)
        files.move(staging, name, src_dir_fd=incoming.fd, dst_dir_fd=incoming.fd)
        if durable:  # a member cannot fsync incoming/ (search only): the file system, through the folder
            with incoming.sub(name) as made:
                files.sync_filesystem(made.fd)
    except MoveCollision:
        os.rmdir(staging, dir_fd=incoming.fd)
        raise FileExistsError(name) from None
    except BaseException:
        os.rmdir(staging, dir_fd=incoming.fd)
        raise


def submit(folder: QueueFolder, build: Callable[[str], bytes], *, durable: bool) -> str:
    """Publish one job as a file in the caller's folder of `incoming/`, for a manager to take
    in; `build(id)` gives its `job.json` for the id chosen here (dated `AHEAD` of the file
    system's clock, read from the new file itself). Return the id."""
    mine = my_folder(folder, durable)
    with mine.open() as place:
        staging = f".new.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            job_id = _write_dated(place, staging, build, durable)
            files.move(staging, f"{job_id}.json", src_dir_fd=place.fd, dst_dir_fd=place.fd)
        except BaseException:
            files.unlink_if_there(staging, place.fd)
            raise
        if durable:
            place.fsync()
    return job_id


def _write_dated(place: Dir, staging: str, build: Callable[[str], bytes], durable: bool) -> str:
    """Write the submission under `staging` with an id dated ahead of the file's own change
    time (the file system's clock, whatever this host's says); a write slower than `AHEAD`
    is made again with a later id."""
    fd = os.open(staging, _NEW_FILE, SUBMISSION_MODE, dir_fd=place.fd)
    try:
        os.fchmod(fd, SUBMISSION_MODE)  # whatever the umask
        for _ in range(3):
            job_id = new_job_id(os.fstat(fd).st_ctime + AHEAD)
            os.ftruncate(fd, 0)
            _write_at_start(fd, build(job_id))
            if durable:
                os.fsync(fd)
            if os.fstat(fd).st_ctime < created_at(job_id) - 1.0:
                return job_id
        raise JobsError(f"cannot submit to {place.path}: writing a submission took over {AHEAD:g}s three times")
    finally:
        os.close(fd)


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_at_start(fd: int, data: bytes) -> None:
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], written)


def request(folder: QueueFolder, job_id: str, action: str, why: str) -> None:
    """Ask the queue's managers to `cancel` or `retry` job ID (see the module docstring)."""
    mine = my_folder(folder)
    with mine.open() as place:
        staging = f".{job_id}.{action}.{os.getpid()}.tmp"
        files.unlink_if_there(staging, place.fd)
        files.write_new(staging, f"{why}\n".encode(), durable=False, mode=SUBMISSION_MODE, dir_fd=place.fd)
        try:
            files.move(staging, f"{job_id}.{action}", src_dir_fd=place.fd, dst_dir_fd=place.fd)
        except MoveCollision:
            files.unlink_if_there(staging, place.fd)  # asked already


# -- the managers' side ------------------------------------------------------------------------


@dataclass
class Actions:
    """What the store does for the take-in, given by the caller."""

    cancel: Callable[[str], Any]  # an operator's cancel of job ID
    retry: Callable[[str], Any]  # an operator's retry of job ID
    on_ready: Callable[[str], None]  # a name put in ready/
    publish_waiting: Callable[[Entry, str, JobSpec], None]  # a job with depends_on, staged (`jobs.depends`)


@dataclass(frozen=True)
class _Source:
    """A member's folder, opened and checked: who it is, and where."""

    place: Entry
    handle: Dir
    uid: int


class SetAside:
    """What a take-in set aside (folders of incoming/, NAME, and entries of them, NAME/ENTRY):
    each not looked at again until it changes (its inode, change time or mode), said once per
    reason, and forgotten once gone; the first 100 shown by `status`."""

    SHOWN = 100
    SAID = 20  # set asides logged one by one per take-in; the rest in one line

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[int, int, int], str]] = {}  # name -> (what it was, why)
        self.shown: dict[str, str] = {}  # incoming/NAME... -> why (the first SHOWN)
        self.count = 0
        self._said = self._unsaid = 0

    def add(self, name: str, status: os.stat_result, why: str) -> None:
        earlier = self._known.get(name)
        self._known[name] = _unchanged_key(status), why
        if earlier is not None and earlier[1] == why:
            return  # changed, and still not usable for the same reason: said already
        if earlier is None:
            self.count += 1
        if len(self.shown) < self.SHOWN or f"incoming/{name}" in self.shown:
            self.shown[f"incoming/{name}"] = why
        self.say(f"set aside incoming/{name}: {why}")

    def say(self, message: str) -> None:
        """Log what a take-in did to a folder or an entry: one by one up to `SAID` a take-in."""
        if self._said < self.SAID:
            self._said += 1
            log.warning("%s", message)
        else:
            self._unsaid += 1

    def said(self) -> None:
        """At the end of a take-in: what was not said one by one, in one line."""
        if self._unsaid:
            log.warning("set aside or renamed %d more entries of incoming/ (forkvisor status shows them)", self._unsaid)
        self._said = self._unsaid = 0

    def holds(self, name: str, status: os.stat_result) -> bool:
        """Whether `name` was set aside and has not changed since."""
        found = self._known.get(name)
        return found is not None and found[0] == _unchanged_key(status)

    def __contains__(self, name: str) -> bool:
        return name in self._known

    def keep_only(self, folders: set[str]) -> None:
        """Forget what was set aside in (or as) folders of incoming/ that are gone."""
        gone = [name for name in self._known if name.split("/", 1)[0] not in folders]
        for name in gone:
            del self._known[name]
            self.shown.pop(f"incoming/{name}", None)
        self.count -= len(gone)

    def keep_entries(self, folder: str, names: set[str]) -> None:
        """Forget the entries of `folder` set aside that are gone from it."""
        prefix = f"{folder}/"
        gone = [name for name in self._known if name.startswith(prefix) and name[len(prefix) :] not in names]
        for name in gone:
            del self._known[name]
            self.shown.pop(f"incoming/{name}", None)
        self.count -= len(gone)


class Intake:
    """The take-in of one queue object: what it set aside, and whose turn it is.

    incoming/ is listed (again when it changed, or a second went by: a folder set aside may
    have been fixed), and its folders are opened one at a time as their turn comes, at most
    `budget` of them per take-in: ten thousand folders cost a listing, not ten thousand
    open descriptors. A folder named for another user's uid (a squat on their name) is
    renamed for its owner's; a user's folders past `MAX_MEMBER_FOLDERS` are set aside."""

    RELIST = 1.0  # seconds a listing of incoming/ is used while incoming/ itself is unchanged

    def __init__(self, folder: QueueFolder) -> None:
        self.folder = folder
        self.more = False  # the last take-in stopped at its budget or time: call again soon
        self.aside = SetAside()
        self._turn = 0  # which member's folder comes first
        self._listed: tuple[tuple[int, int], float, list[tuple[str, int]]] | None = None

    def take_in(
        self, now: float, actions: Actions, budget: int = 64, seconds: float | None = None, leftovers: bool = False
    ) -> int:
        """Take in up to `budget` submissions and requests (for at most `seconds`), from each
        member's folder in turn, oldest id first; with `leftovers` (the sweeper's), also finish
        interrupted take-ins and drop abandoned staging files. Return how many were handled."""
        deadline = None if seconds is None else time.monotonic() + seconds
        places = view.Places(self.folder)
        folders = self._folders()
        handled = looked = visited = 0
        self.more = False
        share = max(1, budget // max(1, len(folders)))
        start = self._turn % len(folders) if folders else 0
        for name, uid in folders[start:] + folders[:start]:
            if handled >= budget or visited >= budget or (looked and deadline and time.monotonic() > deadline):
                self.more = True  # (one entry at least: each call makes progress)
                break
            visited += 1
            source = self._open(name, uid)
            if source is None:
                continue
            try:
                for entry in self._names(source, share, leftovers):
                    if handled >= budget or (looked and deadline and time.monotonic() > deadline):
                        self.more = True
                        break
                    handled += self._guarded(source, entry, now, actions, places)
                    looked += 1
            finally:
                source.handle.close()
        self._turn = start + visited  # the next take-in goes on from the next folder
        self.aside.said()
        if leftovers:
            forget_taken(self.folder, now)
            _drop_abandoned_folders(self.folder, now)
        return handled

    def take_in_one(self, job_id: str, now: float, actions: Actions) -> None:
        """Take in the submission of job ID, if one waits (an operator's cancel of it)."""
        found = find_submission(self.folder, job_id)
        if found is None or found.name.startswith(TAKING):
            return  # (being taken in by a manager: it ends published, or a sweep finishes it)
        name = found.name.split("/", 1)[0]
        source = self._open(name, None)
        if source is not None:
            try:
                self._guarded(source, f"{job_id}.json", now, actions, view.Places(self.folder))
            finally:
                source.handle.close()

    # -- the folders of incoming/ -----------------------------------------------------------------

    def _folders(self) -> list[tuple[str, int]]:
        """(name, owner) of each folder of incoming/ to take from, by name; listed again when
        incoming/ changed or `RELIST` seconds went by."""
        incoming = self.folder.at(State.INCOMING)
        status = os.fstat(incoming.fd)
        version = (status.st_mtime_ns, status.st_ctime_ns)
        if self._listed is not None and self._listed[0] == version and time.monotonic() < self._listed[1]:
            return self._listed[2]
        with incoming.scandir() as listed:
            found = sorted((entry.name, entry.stat(follow_symlinks=False)) for entry in listed)
        self.aside.keep_only({name for name, _ in found})
        usable: list[tuple[str, int]] = []
        per_user: dict[int, int] = {}
        for name, entry in found:
            if name.startswith(".") or self.aside.holds(name, entry):
                continue  # a member's folder being made, or one that has not changed since it was set aside
            if not stat.S_ISDIR(entry.st_mode):
                self._refuse_flat(incoming / name, entry)
                continue
            why = _unusable(entry, status.st_gid)
            if why is None and not _named_for(name, entry.st_uid):
                why = self._rename_squat(name, entry.st_uid)
                if why is None:
                    continue  # listed again under its new name at the next take-in
            if why is None and (per_user.setdefault(entry.st_uid, 0) + 1) > MAX_MEMBER_FOLDERS:
                why = f"uid {entry.st_uid} has more than {MAX_MEMBER_FOLDERS} folders in incoming/: remove this one"
            if why is not None:
                self.aside.add(name, entry, why)
                continue
            per_user[entry.st_uid] += 1
            usable.append((name, entry.st_uid))
        self._listed = version, time.monotonic() + self.RELIST, usable
        return usable

    def _rename_squat(self, name: str, owner: int) -> str | None:
        """A folder named for another user's uid keeps them from their own name: it is
        renamed for its owner's (whose submissions it holds, and stay theirs). Why not, if not."""
        incoming = self.folder.at(State.INCOMING)
        new = f"{owner}.{os.urandom(4).hex()}"
        try:
            files.move(name, new, src_dir_fd=incoming.fd, dst_dir_fd=incoming.fd)
        except (OSError, MoveCollision) as exc:
            return f"it is uid {owner}'s, named for another user's uid, and cannot be renamed ({exc})"
        self.aside.say(f"renamed incoming/{name} to incoming/{new}: it is uid {owner}'s (named for its owner)")
        self._listed = None
        return None

    def _open(self, name: str, listed_owner: int | None) -> _Source | None:
        """A member's folder, opened; its owner read from the descriptor (the name may have
        been swapped since it was listed). None if it cannot be used now."""
        incoming = self.folder.at(State.INCOMING)
        try:
            handle = incoming.sub(name)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # this process's trouble, not the folder's
                log.warning("cannot open incoming/%s now: %s", name, exc.strerror)
                return None
            try:
                self.aside.add(name, incoming.lstat(name), f"the owner's managers cannot open it ({exc.strerror})")
            except OSError:
                pass  # gone
            return None
        status = os.fstat(handle.fd)
        why = _unusable(status, os.fstat(incoming.fd).st_gid)
        if why is None and listed_owner is not None and status.st_uid != listed_owner:
            why = "it was replaced while it was taken from"
        if why is not None:
            handle.close()
            self.aside.add(name, status, why)
            return None
        return _Source(incoming / name, handle, status.st_uid)

    def _names(self, source: _Source, share: int, leftovers: bool) -> list[str]:
        listed = source.handle.names()
        folder = source.place.name
        self.aside.keep_entries(folder, set(listed))
        names = [name for name in listed if not name.startswith(".") and not self._aside(source, name)]
        picked = heapq.nsmallest(share, names)
        self.more = self.more or len(names) > share  # the rest wait for the next turn
        if leftovers:
            picked += [name for name in listed if name.startswith(".")][:share]
        return picked

    def _refuse_flat(self, place: Entry, status: os.stat_result) -> None:
        why = (
            "a file directly in incoming/ cannot say who made it: submissions go into the submitter's own "
            "folder, incoming/UID/ (forkvisor submit does it; docs/FORMAT.md has the format)"
        )
        try:
            self.folder.quarantine(place, why, time.time())
        except OSError as exc:
            self.aside.add(place.name, status, f"{why}; cannot move it: {exc}")

    def _guarded(self, source: _Source, name: str, now: float, actions: Actions, places: view.Places) -> int:
        """Handle one entry; whatever it holds, the take-in goes on with the next one."""
        where = f"incoming/{source.place.name}/{name}"
        try:
            return int(_Entry(self.folder, source, name, now, actions, places).handle())
        except (OSError, JobsError) as exc:  # this entry, not the queue
            log.warning("cannot take in %s: %s", where, exc)
            self._set_aside_name(source, name, str(exc))
        except Exception as exc:  # a bug, or content no check foresaw: never a reason to stop every queue
            log.exception("could not handle %s (a bug in forkvisor: please report it)", where)
            self._set_aside_name(source, name, f"forkvisor could not handle it ({type(exc).__name__}: {exc})")
        return 0

    def _set_aside_name(self, source: _Source, name: str, why: str) -> None:
        try:
            status = source.handle.lstat(name)
        except OSError:
            return  # gone: nothing to remember
        self.aside.add(f"{source.place.name}/{name}", status, why)

    def _aside(self, source: _Source, name: str) -> bool:
        """Whether an entry of a member's folder was set aside and has not changed since."""
        key = f"{source.place.name}/{name}"
        if key not in self.aside:
            return False
        try:
            return self.aside.holds(key, source.handle.lstat(name))
        except OSError:
            return False


def _named_for(name: str, uid: int) -> bool:
    """Whether a folder's name is its owner's: UID, or UID.ANYTHING."""
    return name == str(uid) or name.startswith(f"{uid}.")


def _unchanged_key(status: os.stat_result) -> tuple[int, int, int]:
    """What must stay the same for an entry set aside to stay so: its inode, change time and
    mode (a change time is coarse: a chmod in the same tick as the mkdir keeps it)."""
    return status.st_ino, status.st_ctime_ns, status.st_mode


def _unusable(status: os.stat_result, group: int) -> str | None:
    """Why a folder of incoming/ cannot say who submitted what is in it (None: it can)."""
    mode = stat.S_IMODE(status.st_mode)
    if status.st_gid != group:
        return (
            f"its group is {status.st_gid}, not incoming/'s ({group}): others could write it; remove it "
            "and submit again (forkvisor submit makes it right)"
        )
    if mode & 0o002:
        return "every user may write it, so it cannot say who submitted what: chmod 2770 it"
    return None


class _Entry:
    """One entry of a member's folder, being handled."""

    def __init__(
        self, folder: QueueFolder, source: _Source, name: str, now: float, actions: Actions, places: view.Places
    ) -> None:
        self.folder, self.source, self.name, self.now = folder, source, name, now
        self.actions, self.places = actions, places
        self.folder_fd = source.handle.fd

    @property
    def place(self) -> Entry:
        return self.source.handle / self.name

    def handle(self) -> bool:
        name = self.name
        if name.startswith(TAKING):
            return self._finish_interrupted()
        if name.startswith("."):
            return self._drop_abandoned()
        if (job := JOB_RE.match(name)) is not None:
            return self._take_job(job[1])
        if (asked := REQUEST_RE.match(name)) is not None:
            return self._take_request(asked[1], asked[2])
        self._quarantine(self.place, "not a submission: a member's folder holds ID.json, ID.cancel and ID.retry")
        return True

    # -- a job -----------------------------------------------------------------------------------

    def _take_job(self, job_id: str) -> bool:
        try:
            published = self.source.handle.lstat(self.name)  # its publication, before our rename renews it
        except FileNotFoundError:
            return False  # another manager took it
        problem = _file_problem(published, self.source.uid) or self._id_problem(job_id, published)
        if problem:
            self._quarantine(self.place, problem)
            return True
        taking = f"{TAKING}{self.name}"
        try:
            files.move(self.name, taking, src_dir_fd=self.folder_fd, dst_dir_fd=self.folder_fd)
        except (FileNotFoundError, MoveCollision):
            return False  # another manager took it
        self._take_file(job_id, taking, published)
        return True

    def _take_file(self, job_id: str, taking: str, published: os.stat_result) -> None:
        try:
            data, status = files.read_regular(taking, MAX_SPEC_BYTES, self.folder_fd)
        except OSError as exc:
            self._quarantine(self.source.handle / taking, f"submission {job_id} cannot be read: {exc.strerror or exc}")
            return
        problem = _file_problem(status, self.source.uid)
        if problem is None and status.st_ino != published.st_ino:
            problem = "another file took its name while it was taken in: submit it again"
        if problem:
            self._quarantine(self.source.handle / taking, problem)
            return
        checked = _checked(data, job_id, self.source.uid)
        if checked.cause is None and checked.spec is not None:
            checked = replace(checked, cause=self._parents_missing(job_id, checked.spec))
        staging = self._stage(job_id, checked, data)
        cause = checked.cause or self._key_taken(job_id, checked)
        try:
            if cause is not None:
                self.folder.bury(staging, job_id, cause, self.now)  # straight to dead/, saying what to fix
            else:
                _publish(self.folder, staging, job_id, checked, self.actions)
                self.places.moved()  # later submissions of this turn may name it (a parent, a key's holder)
        except MoveCollision:  # a job of this id is there already: this one must not stand beside it
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
            self._quarantine(self.source.handle / taking, f"job {job_id} exists already")
            return
        files.unlink_if_there(taking, self.folder_fd)

    def _stage(self, job_id: str, checked: _Checked, data: bytes) -> Entry:
        folder = self.folder
        staging = folder.tmp / job_id
        files.remove_quietly(staging.name, dir_fd=staging.dir.fd)  # ours, left by an interrupted take-in
        folder.make_dir(staging)
        created = checked.spec.created if checked.spec is not None and checked.spec.created else created_at(job_id)
        submitter = {"uid": self.source.uid, "user": _user(self.source.uid)}
        with staging.open() as job:
            folder.log_event(job, "enqueued", created)
            folder.log_event(job, f"taken in from incoming/, submitted by {submitter['user']}", self.now)
            if checked.fields is not None:
                folder.write_new(job / SPEC_FILE, spec_json(checked.fields))
            else:  # refused: the member's text is kept aside, never as the job.json the owner vouches for
                folder.write_new(job / SUBMISSION_FILE, data)
                folder.write_new(job / SPEC_FILE, spec_json({"id": job_id, "submitted_by": submitter}))
            if folder.durable:
                job.fsync()  # its entries on disk before the move that publishes it (or buries it)
        return staging

    def _id_problem(self, job_id: str, published: os.stat_result) -> str | None:
        """Why this submission may not have its id: not dated ahead of its publication (an id
        seen in the queue), or taken by another submission (see the module docstring). The
        same submission, seen by two takers at once or taken in again after a crash, passes:
        `taken/ID` names its file (and the rename to `.taking.` decides who takes it)."""
        mark = f"{self.source.uid} {published.st_ino}\n".encode()
        taken = self.folder.at(TAKEN)
        if not taken.exists(job_id):
            problem = _dated_problem(job_id, published) or self._exists(job_id)
            if problem is not None:
                return problem
            if files.link_new(job_id, mark, durable=self.folder.durable, mode=self.folder.file_mode, dir_fd=taken.fd):
                if self.folder.durable:
                    taken.fsync()  # the id is this submission's before the job it names is published
                return None
        try:
            earlier = files.read_limited(job_id, 64, taken.fd)
        except OSError:
            earlier = None
        # Its file still stands, so no other file has its inode: the same submission, if the
        # job is nowhere yet (a take-in that published it removed the file after).
        found = self.places.locate_or_none(job_id)
        same = earlier == mark and (found is None or found[0] is State.INCOMING)
        return None if same else f"job {job_id} was submitted already"

    def _exists(self, job_id: str) -> str | None:
        """Whether a job has this id already. An id dated within `TAKEN_KEPT` is looked up by
        name alone: a job scheduled under it would have been taken in under a `taken/` mark,
        still there. An older one may be a held-back file's whose mark was forgotten while
        the job it named waits in scheduled/: then scheduled/ is listed too (once a turn)."""
        recent = created_at(job_id) >= self.now - TAKEN_KEPT / 2  # (half: the sweeper's clock may be ahead)
        found = self.places.by_name(job_id) if recent else self.places.published(job_id)
        return None if found is None else f"job {job_id} exists already (in {found[0].value}/)"

    def _parents_missing(self, job_id: str, spec: JobSpec) -> Cause | None:
        if not spec.depends_on:
            return None
        try:
            depends.check_parents(self.folder, job_id, spec.depends_on, self.places)
        except InvalidJob as exc:
            return fate.invalid(str(exc))
        return None

    def _key_taken(self, job_id: str, checked: _Checked) -> Cause | None:
        """Take the submission's key in its submitter's own key space (it is staged: it counts
        as live); why it is dead if a live job of the same submitter held the key first."""
        key = checked.spec.key if checked.spec is not None else None
        if key is None:
            return None
        # Looked for afresh, not in this turn's listings: the holder may be another process's
        # take-in, published since this turn listed ready/ (two jobs of one key both ran).
        holder = keys.reserve(self.folder, key, job_id, functools.partial(view.locate, self.folder), self.source.uid)
        return None if holder is None else fate.duplicate(key, holder)

    # -- a request -------------------------------------------------------------------------------

    def _take_request(self, job_id: str, action: str) -> bool:
        taking = f"{TAKING}{self.name}"
        try:
            if not stat.S_ISREG(self.source.handle.lstat(self.name).st_mode):
                self._quarantine(self.place, "not a file: a request is one regular file, ID.cancel or ID.retry")
                return True
            files.move(self.name, taking, src_dir_fd=self.folder_fd, dst_dir_fd=self.folder_fd)
        except (FileNotFoundError, MoveCollision):
            return False  # another manager took it
        requester = self.source.uid
        refusal = _refusal(self.folder, job_id, requester, self.places)
        if refusal is None:
            try:
                (self.actions.cancel if action == "cancel" else self.actions.retry)(job_id)
                log.info("%s of job %s asked by %s: done", action, job_id, _user(requester))
            except (JobNotFound, WrongState) as exc:
                refusal = str(exc)
        if refusal is not None:
            self._quarantine(
                self.source.handle / taking, f"{action} of job {job_id} by {_user(requester)} refused: {refusal}"
            )
        else:
            files.unlink_if_there(taking, self.folder_fd)
        return True

    # -- leftovers (the sweeper's) ------------------------------------------------------------------

    def _finish_interrupted(self) -> bool:
        """A take-in that stopped half way (its manager died): finish it once it is stale."""
        try:
            changed = self.source.handle.lstat(self.name).st_ctime
        except FileNotFoundError:
            return False
        if self.now - changed < STALE_TAKING:
            return False
        original = self.name[len(TAKING) :]
        job = JOB_RE.match(original) or REQUEST_RE.match(original)
        if job is None:
            self._quarantine(self.place, "not a submission")
            return True
        found = self.places.locate_or_none(job[1])
        if JOB_RE.match(original) is not None and found is not None and found[0] is not State.INCOMING:
            files.unlink_if_there(self.name, self.folder_fd)  # taken in already; its manager died before this
            return True
        if JOB_RE.match(original) is not None and self._marked_ours(job[1]):
            # Its id was checked and marked as its own before the take-in stopped: finish from
            # here (a rename back would renew its change time, and fail the dated check).
            self._take_file(job[1], self.name, self.source.handle.lstat(self.name))
            return True
        try:
            files.move(self.name, original, src_dir_fd=self.folder_fd, dst_dir_fd=self.folder_fd)  # take it in again
        except MoveCollision:
            self._quarantine(self.place, f"{original} was submitted twice")
        return True

    def _marked_ours(self, job_id: str) -> bool:
        """Whether `taken/ID` names this folder's `.taking.ID.json` (its owner and inode)."""
        try:
            status = self.source.handle.lstat(self.name)
            mark = files.read_limited(job_id, 64, self.folder.at(TAKEN).fd)
        except OSError:
            return False
        return mark == f"{self.source.uid} {status.st_ino}\n".encode()

    def _drop_abandoned(self) -> bool:
        """A member's staging file whose writer died: remove it once it is old."""
        try:
            status = self.source.handle.lstat(self.name)
        except FileNotFoundError:
            return False
        if self.now - status.st_mtime < TMP_AGE:
            return False
        files.unlink_if_there(self.name, self.folder_fd)  # the owner group may write the member's folder
        return True

    def _quarantine(self, place: Entry, why: str) -> None:
        self.folder.quarantine(place, why, self.now)


def _file_problem(status: os.stat_result, uid: int) -> str | None:
    """Why a submission file is not the member's own (None: it is)."""
    if not stat.S_ISREG(status.st_mode):
        return "not a file: a submission is one regular file, ID.json"
    if status.st_uid != uid:
        return f"it is not its folder's owner's own file (it belongs to uid {status.st_uid}, the folder to uid {uid})"
    if status.st_nlink != 1:
        return f"it has {status.st_nlink} names (a hard link): write each submission as a new file"
    return None


def _dated_problem(job_id: str, published: os.stat_result) -> str | None:
    ahead = created_at(job_id) - published.st_ctime
    if 0 < ahead <= MOST_AHEAD:
        return None
    return (
        f"its id {job_id} is not dated ahead of its submission (by up to {MOST_AHEAD:.0f}s): ids of "
        "members' submissions are dated after the moment they are published, so that no id already "
        "in the queue can be submitted again (forkvisor submit does it; docs/FORMAT.md)"
    )


def _drop_abandoned_folders(folder: QueueFolder, now: float) -> None:
    """Remove the empty dot-folders of incoming/ left by members' submits that died while
    making their folder (the owner of a sticky folder may remove any empty one of it)."""
    incoming = folder.at(State.INCOMING)
    for name in incoming.names():
        if not name.startswith(".") or not name.endswith(".new"):
            continue
        try:
            if now - incoming.lstat(name).st_mtime >= TMP_AGE:
                os.rmdir(name, dir_fd=incoming.fd)
        except OSError:
            continue  # gone, not empty, or not a folder: not ours to judge


def forget_taken(folder: QueueFolder, now: float, budget: int = 10_000) -> int:
    """Remove the `taken/` marks of ids dated over `TAKEN_KEPT` seconds before `now`: no new
    submission can carry them any more (an older file held back is looked for in every
    state folder: `_Taker._exists`), except the marks of take-ins that stopped half way
    (their `.taking.ID.json` is finished by its mark). Return how many went."""
    taken, incoming = folder.at(TAKEN), folder.at(State.INCOMING)
    folders: list[str] | None = None  # incoming/'s names: listed once, if a mark needs them
    gone = 0
    for name in taken.names()[:budget]:
        try:
            old = created_at(name) < now - TAKEN_KEPT
        except ValueError:
            old = True  # not an id: nothing of ours
        if not old:
            continue
        folders = incoming.names() if folders is None else folders
        if not _being_taken(incoming, folders, taken, name):
            files.unlink_if_there(name, taken.fd)
            gone += 1
    return gone


def _being_taken(incoming: Dir, folders: list[str], taken: Dir, job_id: str) -> bool:
    """Whether the folders of the member the mark names hold `.taking.ID.json`: a take-in
    that stopped half way (its folders are named for its uid: a squatter's were moved out)."""
    try:
        uid = files.read_limited(job_id, 64, taken.fd).split(b" ")[0].decode("ascii")
    except (OSError, UnicodeDecodeError):
        return False
    mine = [name for name in folders if name == uid or name.startswith(f"{uid}.")]
    return any(incoming.exists(f"{name}/{TAKING}{job_id}.json") for name in mine if uid.isdigit())


def _publish(folder: QueueFolder, staging: Entry, job_id: str, checked: _Checked, actions: Actions) -> None:
    spec, fields = checked.spec, checked.fields
    if spec is None or fields is None:
        raise InternalError(f"job {job_id} was taken in without a spec: a bug in forkvisor")
    due = fields.get("run_at")
    if spec.depends_on:
        actions.publish_waiting(staging, job_id, spec)
    elif due is not None and due > 0:
        target = folder.at(State.SCHEDULED) / scheduled_name(job_id, spec.priority, min(due, LATEST_DUE))
        moves.publish(staging, target, folder.durable)
    else:
        target = folder.at(State.READY) / ready_name(job_id, spec.priority)
        moves.publish(staging, target, folder.durable)
        actions.on_ready(target.name)


@dataclass(frozen=True)
class _Checked:
    """A submission, checked: its spec and the job.json the owner writes for it, or why it is dead."""

    spec: JobSpec | None = None
    fields: dict[str, Any] | None = field(default=None)
    cause: Cause | None = None


def _checked(data: bytes, job_id: str, uid: int) -> _Checked:
    try:
        spec = JobSpec.from_json(data, job_id)
        fields = dict(document.parse(data, SPEC_FILE))
        _check_run_at(fields.get("run_at"), spec)
    except InvalidJob as exc:
        return _Checked(cause=fate.invalid(str(exc)))
    # Who submitted it comes from the folder it was in, never from its text.
    fields.update(id=job_id, submitted_by={"uid": uid, "user": _user(uid)})
    return _Checked(replace(spec, submitted_by=uid), fields)


def _check_run_at(run_at: object, spec: JobSpec) -> None:
    """A submission's due time: epoch seconds within the range a `scheduled/` name holds."""
    if run_at is None:
        return
    if isinstance(run_at, bool) or not isinstance(run_at, int | float) or not 0 <= run_at <= LATEST_DUE:
        raise InvalidJob(
            f'job.json field "run_at" must be epoch seconds from 0 to {LATEST_DUE:.0f}, got {run_at!r:.40}'
        )
    if spec.depends_on:
        raise InvalidJob('job.json: a job with "depends_on" starts when they are done: give it no "run_at"')


def _refusal(folder: QueueFolder, job_id: str, requester: int, places: view.Places) -> str | None:
    """Why `requester` may not act on job ID, or None: the job's submitter may, so may the
    queue's owner and root."""
    if requester in (0, os.fstat(folder.root.fd).st_uid):
        return None
    found = places.locate_or_none(job_id)
    if found is None:
        return f"there is no job {job_id} in {folder.path}"
    state, place = found
    # Not taken in yet: its folder's owner submitted it; taken in: the owner recorded who.
    submitter = place.dir.lstat(place.name.split("/")[0]).st_uid if state is State.INCOMING else submitted_by(place)
    if submitter is None:
        return "it was not submitted through incoming/, so it is the owner's"
    if submitter != requester:
        return f"it was submitted by {_user(submitter)}"
    return None


def submitted_by(place: Entry) -> int | None:
    """The uid the job at `place` was submitted by, as recorded when it was taken in; None
    if it was not (the owner's own job)."""
    try:
        with place.open() as job:
            fields = document.read(SPEC_FILE, MAX_SPEC_BYTES, SPEC_FILE, job.fd)
    except (JobsError, OSError):
        return None
    by = fields.get("submitted_by") if isinstance(fields, dict) else None
    uid = by.get("uid") if isinstance(by, dict) else None
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else None


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


__all__ = [
    "Actions",
    "Intake",
    "forget_taken",
    "my_folder",
    "request",
    "submit",
    "submitted_by",
]
