"""Reading a queue without changing it: find a job, build its view, count states.

Readers never crash on a bad entry and never follow a symlink: they skip what
is not a job directory (claimers and the sweeper quarantine it).
Counting uses the link count of a state folder (2 + its subdirectories on
ext4 and most local file systems) so it costs one stat with a million jobs;
where the file system does not keep that count it falls back to a scan.
"""

from __future__ import annotations

import heapq
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from jobs import counter, document, files, submissions
from jobs.errors import InvalidJob, JobNotFound
from jobs.folder import ERROR_FILE, OUTCOME_FILE, RESULT_FILE, QueueFolder, frozen_run
from jobs.handles import Dir, Entry
from jobs.job import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    JobSpec,
    State,
    check_job_id,
    is_job_id,
    parse_ready_name,
    parse_scheduled_name,
    ready_name,
)
from jobs.job_view import Job, Run
from jobs.lease import FUNCTIONS_FILE, OWNER_FILE, OWNER_FILES, REAPING_PREFIX, SKIPPED_FILES, Liveness, Owner
from jobs.policy import POLICY_FILE, Policy, registration_from, resolve

_ATTEMPT_RE = re.compile(r"^attempt-([1-9][0-9]*)$")
MAX_RESULT_BYTES = 64 * 1024 * 1024


def job_id_of(state: State, name: str) -> str | None:
    """The job id an entry name of `state`'s folder stands for, or None if malformed."""
    if state is State.READY:
        parsed = parse_ready_name(name)
        return parsed[0] if parsed else None
    if state is State.SCHEDULED:
        scheduled = parse_scheduled_name(name)
        return scheduled[0] if scheduled else None
    if state is State.INCOMING:
        return submissions.entry_id(name)
    return name if is_job_id(name) else None


def owner_dirs(folder: QueueFolder) -> Iterator[Entry]:
    """Every folder under `claimed/` (owners, and owners being reaped)."""
    claimed = folder.at(State.CLAIMED)
    with claimed.scandir() as entries:
        names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    for name in names:
        yield claimed / name


def entries(folder: QueueFolder, state: State) -> Iterator[tuple[Entry, str]]:
    """(place, job id) of every well-formed job directory in one state (and of every
    submission this process may see, for INCOMING)."""
    if state is State.INCOMING:
        yield from submissions.submissions(folder)
        return
    if state is not State.CLAIMED:
        yield from entries_in(folder.at(state), state)
        return
    for owner in owner_dirs(folder):
        yield from entries_in(owner, state)


def first_entries(folder: QueueFolder, state: State, after: str | None, count: int) -> list[tuple[Entry, str]]:
    """The `count` first entries of one state in name order, from the one named after `after`:
    one pass over the names, holding only `count` of them (a page of a million-job folder)."""
    if state in (State.CLAIMED, State.INCOMING):  # spread over the owners' (members') folders, each small
        found = (entry for entry in entries(folder, state) if after is None or entry[0].name > after)
        return heapq.nsmallest(count, found, key=lambda entry: entry[0].name)
    parent = folder.at(state)
    is_job = _is_job_entry(state)
    with parent.scandir() as listed:
        names = (
            entry.name
            for entry in listed
            if (after is None or entry.name > after) and job_id_of(state, entry.name) and is_job(entry)
        )
        chosen = heapq.nsmallest(count, names)
    return [(parent / name, job_id_of(state, name) or "") for name in chosen]


def entries_in(parent: Dir | Entry, state: State, check_dirs: bool = True) -> Iterator[tuple[Entry, str]]:
    """(place, job id) of the well-named entries of one folder of `state` (an owner's
    folder, given as an Entry, for CLAIMED); `check_dirs=False` skips the per-entry type check."""
    if isinstance(parent, Entry):
        base, prefix = parent.dir, f"{parent.name}/"
        try:
            opened = parent.open()
        except FileNotFoundError:
            return  # an owner folder fenced or retired while we looked
    else:
        base, prefix, opened = parent, "", parent
    is_job = _is_job_entry(state)
    try:
        with opened.scandir() as found:  # types are read while the folder's handle is open
            named = [
                (entry.name, job_id)
                for entry in found
                if (job_id := job_id_of(state, entry.name)) and (not check_dirs or is_job(entry))
            ]
    finally:
        if opened is not parent:
            opened.close()
    for name, job_id in named:
        yield base / f"{prefix}{name}", job_id


def _is_job_entry(state: State) -> Callable[[os.DirEntry[str]], bool]:
    """What a job looks like in `state`'s folder: a submission file in incoming/, else a folder."""
    return _is_submission if state is State.INCOMING else _is_folder


def _is_folder(entry: os.DirEntry[str]) -> bool:
    return entry.is_dir(follow_symlinks=False)


def _is_submission(entry: os.DirEntry[str]) -> bool:
    """In incoming/, a job is a file (see jobs.incoming)."""
    return entry.is_file(follow_symlinks=False)


LOCATE_PASSES = 3
PRIORITIES = range(MIN_PRIORITY, MAX_PRIORITY + 1)


def locate(folder: QueueFolder, job_id: str) -> tuple[State, Entry]:
    """Find which state folder holds `job_id`; raise JobNotFound if none does.

    The folders are looked at one after another, so a job moving into one already
    looked at is missed by that pass; only several passes that all miss it say
    "not found" (a job in motion is always somewhere).
    """
    check_job_id(job_id)
    for _ in range(LOCATE_PASSES):
        found = Places(folder).locate_or_none(job_id)
        if found is not None:
            return found
    raise JobNotFound(
        f"no job {job_id} in queue {folder.path}: not in ready, scheduled, waiting, claimed, done or dead"
    )


class Places:
    """Where jobs are, for the look-ups of one turn (a take-in, a sweep's repair of
    dependencies), at a cost that does not grow with the queue for each job:

    - a job is looked for first by the names its id gives: done/ID, dead/ID, waiting/ID,
      claimed/OWNER/ID, ready/RRR.ID for each priority (the usual one first);
    - `scheduled/`, whose names begin with a due time no id tells, is listed at most once
      per Places, and only when a job was found nowhere else; so is `ready/`, instead of
      probing each priority, once it holds fewer entries than the probes would cost.

    A job that moves while it is looked for may be missed (`locate` looks again); what a
    Places listed stays as it was for its life, so it lives for one turn."""

    def __init__(self, folder: QueueFolder) -> None:
        self.folder = folder
        self._owners: list[Entry] | None = None
        self._listed: dict[State, dict[str, str]] = {}  # state -> job id -> entry name
        self._probes = 0  # ready/ names probed so far (to decide when a listing is cheaper)
        self._members: list[Entry] | None = None  # incoming/'s member folders, listed at the first need

    def by_name(self, job_id: str) -> tuple[State, Entry] | None:
        """Where `job_id` is found by the names its id gives (no listing of a folder), the
        first place found; None if none of them holds it."""
        folder, ready = self.folder, self.folder.at(State.READY)
        for state in (State.DONE, State.DEAD, State.WAITING):
            if folder.at(state).is_dir(job_id):
                return state, folder.at(state) / job_id
        if State.READY not in self._listed and ready.is_dir(usual := ready_name(job_id, 0)):
            return State.READY, ready / usual  # the usual priority first: one look
        for owner in self._owner_dirs():
            place = owner.dir / f"{owner.name}/{job_id}"
            if place.is_dir():
                return State.CLAIMED, place
        name = self._in_ready(job_id)
        return None if name is None else (State.READY, ready / name)

    def published(self, job_id: str) -> tuple[State, Entry] | None:
        """Where `job_id` is in the queue's state folders (one place), or None if nowhere."""
        found = self.by_name(job_id)
        if found is not None:
            return found
        name = self._listing(State.SCHEDULED).get(job_id)
        return None if name is None else (State.SCHEDULED, self.folder.at(State.SCHEDULED) / name)

    def locate_or_none(self, job_id: str) -> tuple[State, Entry] | None:
        """Where `job_id` is (one place), or None if nowhere."""
        found = self.published(job_id)
        if found is not None:
            return found
        if self._members is None:
            self._members = submissions.member_folders(self.folder)  # listed once: look-ups that fail cost no listing
        submission = submissions.find_submission(self.folder, job_id, self._members)  # last: a published place wins
        return None if submission is None else (State.INCOMING, submission)

    def moved(self) -> None:
        """A job was published (or moved) by the holder of this Places: what it listed is
        out of date, so the next look that needs a listing makes it again."""
        self._listed.clear()
        self._probes = 0

    def locate(self, job_id: str) -> tuple[State, Entry]:
        """`locate_or_none`, raising JobNotFound for nowhere (as `view.locate`, in one pass)."""
        found = self.locate_or_none(check_job_id(job_id))
        if found is None:
            raise JobNotFound(f"no job {job_id} in queue {self.folder.path}")
        return found

    def _in_ready(self, job_id: str) -> str | None:
        """Its `ready/` name at any priority: from this turn's listing, or by probing each."""
        ready = self.folder.at(State.READY)
        if State.READY in self._listed:
            return self._listed[State.READY].get(job_id)
        if self._probes > _folder_size(ready):
            return self._listing(State.READY).get(job_id)
        self._probes += len(PRIORITIES)
        for priority in PRIORITIES:
            if priority and ready.is_dir(name := ready_name(job_id, priority)):
                return name
        return None

    def _listing(self, state: State) -> dict[str, str]:
        if state not in self._listed:
            self._listed[state] = {job_id: place.name for place, job_id in entries_in(self.folder.at(state), state)}
        return self._listed[state]

    def _owner_dirs(self) -> list[Entry]:
        if self._owners is None:
            self._owners = list(owner_dirs(self.folder))
        return self._owners


def _folder_size(folder: Dir) -> int:
    """How many folders `folder` holds, from its link count (a large number where the file
    system keeps none: then probing is always the cheaper)."""
    links = os.fstat(folder.fd).st_nlink
    return links - 2 if links >= 2 else 1 << 62


def read_job(folder: QueueFolder, state: State, place: Entry) -> Job:
    """The view of the job at `place`, which is in `state`."""
    job_id = job_id_of(state, os.path.basename(place.name))
    if job_id is None:
        raise JobNotFound(f"{place.path} is not a job directory")
    if state is State.INCOMING:
        return _submission(place, job_id)
    with place.open() as job:
        return _read_open_job(folder, state, place, job, job_id)


def _read_open_job(folder: QueueFolder, state: State, place: Entry, job: Dir, job_id: str) -> Job:
    try:
        spec = folder.read_spec(job, job_id)
    except InvalidJob:
        spec = JobSpec(id=job_id, function="?")
    path = Path(place.path)
    history = _attempts(job, path)
    return Job(
        id=job_id,
        state=state,
        path=path,
        spec=spec,
        attempts=_counter_or_zero(folder, job),
        history=history,
        result=_read_json(job, RESULT_FILE, MAX_RESULT_BYTES) if state is State.DONE else None,
        error=_read_json(job, ERROR_FILE, 1 << 20) if state is State.DEAD else None,
        owner=path.parent.name if state is State.CLAIMED else None,
        policy=recorded_policy(job, history[-1].number) if history else None,
        frozen=state is State.CLAIMED and bool(history) and frozen_run(job) == history[-1].number,
    )


def _submission(place: Entry, job_id: str) -> Job:
    """The view of a member's submission not taken in yet: its spec, nothing run."""
    try:
        spec = submissions.read_spec(place, job_id)
    except (InvalidJob, OSError):
        spec = JobSpec(id=job_id, function="?")
    return Job(id=job_id, state=State.INCOMING, path=Path(place.path), spec=spec, attempts=0, history=())


def read_moving(folder: QueueFolder, state: State, place: Entry) -> Job | None:
    """`read_job`, or None when the job moved while it was read (its view would be torn)."""
    try:
        job = read_job(folder, state, place)
        still = place.lstat()
    except FileNotFoundError:
        return None
    kind_ok = stat.S_ISREG(still.st_mode) if state is State.INCOMING else stat.S_ISDIR(still.st_mode)
    return job if kind_ok else None


def _counter_or_zero(folder: QueueFolder, job: Dir) -> int:
    try:
        return counter.used(job)
    except InvalidJob:
        return 0  # a reader shows the job; the next claim or sweep buries it with the cause


def _attempts(job: Dir, path: Path) -> tuple[Run, ...]:
    found = []
    for number in _attempt_numbers(job):
        name = f"attempt-{number}"
        try:
            with job.sub(name) as run:
                outcome = _read_owners_json(run, OUTCOME_FILE, os.fstat(job.fd).st_uid)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed meanwhile
        found.append(Run(number, path / name, outcome))
    return tuple(sorted(found, key=lambda attempt: attempt.number))


def _attempt_numbers(job: Dir) -> list[int]:
    """The numbers of a job's `attempt-N` folders (real folders only, never links)."""
    with job.scandir() as found:
        return [
            int(match[1])
            for entry in found
            if (match := _ATTEMPT_RE.match(entry.name)) and entry.is_dir(follow_symlinks=False)
        ]


def attempt_names(job: Dir) -> list[str]:
    """The names of a job's `attempt-N` folders (real folders only, never links)."""
    return [f"attempt-{number}" for number in _attempt_numbers(job)]


def last_attempt(job: Dir) -> int:
    """The number of the newest `attempt-N` folder (0 if none); links and files do not count."""
    return max(_attempt_numbers(job), default=0)


def _read_owners_json(folder: Dir, name: str, owner: int, limit: int = 1 << 20) -> Any:
    """`_read_json` of a file the manager writes into a run's folder (`outcome.json`): one
    that another user wrote (a job run as its submitter owns its run's folder) is not it."""
    try:
        data, status = files.read_regular(name, limit, folder.fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"unreadable": f"cannot read {name}: {exc.strerror or exc}"}
    if status.st_uid != owner:
        return {"unreadable": f"{name} was not written by the queue's owner (uid {status.st_uid} wrote it)"}
    try:
        return document.parse(data, name)
    except InvalidJob as exc:
        return {"unreadable": str(exc)}


def _read_json(folder: Dir, name: str, limit: int) -> Any:
    try:
        return document.read(name, limit, name, folder.fd)
    except FileNotFoundError:
        return None
    except InvalidJob as exc:
        return {"unreadable": str(exc)}


def count(folder: QueueFolder) -> dict[str, int]:
    """Number of jobs in each state, by state name."""
    counts = {state.value: _count_subdirs(folder.at(state)) for state in State if state is not State.CLAIMED}
    counts[State.CLAIMED.value] = _count_claimed(folder)
    counts[State.INCOMING.value] = sum(1 for _ in submissions.submissions(folder))
    return {state.value: counts[state.value] for state in State}


def _count_claimed(folder: QueueFolder, tries: int = 3) -> int:
    """Jobs in every owner folder. A folder renamed while we count (a sweeper fencing an
    owner as `reaping.OWNER`) would hide its jobs: then count again, under the new names.
    (One retired meanwhile is gone with its jobs moved on: the last try counts without it.)"""
    for attempt in range(tries):
        total, vanished = 0, False
        for owner in owner_dirs(folder):
            try:
                with owner.open() as opened:
                    total += _count_subdirs(opened)
            except FileNotFoundError:
                vanished = True
        if not vanished or attempt == tries - 1:
            return total
    return total


def _count_subdirs(folder: Dir) -> int:
    links = os.fstat(folder.fd).st_nlink
    if links >= 2:  # ext4 and most local file systems: 2 + number of subfolders
        return links - 2
    with folder.scandir() as found:  # btrfs and overflowed ext4 report 1
        return sum(1 for entry in found if entry.is_dir(follow_symlinks=False))


def stray_names(owner_dir: Dir) -> Iterator[str]:
    """Names in an owner folder other than its own files (jobs and strays)."""
    for name in owner_dir.names():
        if name not in OWNER_FILES and not name.startswith("."):
            yield name


def recorded_policy(job: Dir, run: int) -> Policy | None:
    """The policy run `run` was started under (its `policy.json`), or None if it recorded none.
    Only a file the job folder's owner wrote counts: a job run as its submitter owns its run's
    folder, and must not raise its own attempt limit by writing one there."""
    if run < 1:
        return None
    try:
        with job.sub(f"attempt-{run}") as attempt:
            data, status = files.read_regular(POLICY_FILE, 1 << 16, attempt.fd)
        if status.st_uid != os.fstat(job.fd).st_uid:
            return None
        return Policy.from_json(data)
    except (OSError, InvalidJob):
        return None


@dataclass(frozen=True)
class OwnerFolder:
    """What one folder of `claimed/` says about its manager."""

    path: Path
    owner: Owner | None  # None: its owner file is missing or unreadable
    heartbeat: float | None  # the owner file's mtime (file system clock)
    functions: dict[str, dict[str, Any]] | None  # what it runs; None if it did not say
    reaping: bool
    place: Entry = field(compare=False, repr=False)  # where it is, through the queue's handles
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)  # "claims"/"sweep": entry -> why
    skipped_count: int = 0  # how many entries it skipped (`skipped` holds the first ones)

    def is_live(self, now: float, is_alive: Liveness) -> bool:
        """Serving now: not being reaped, within its lease, and not known dead."""
        if self.reaping or self.owner is None or self.heartbeat is None:
            return False
        return now <= self.heartbeat + self.owner.lease and is_alive(self.owner) is not False


def owner_folders(folder: QueueFolder) -> list[OwnerFolder]:
    """Every folder of `claimed/`, read without following links; unreadable parts are None."""
    found = []
    for place in owner_dirs(folder):
        try:
            with place.open() as opened:
                found.append(_owner_folder(place, opened))
        except FileNotFoundError:
            continue  # retired or fenced meanwhile
    return found


def _owner_folder(place: Entry, opened: Dir) -> OwnerFolder:
    try:
        heartbeat: float | None = opened.lstat(OWNER_FILE).st_mtime
        owner: Owner | None = Owner.from_json(files.read_limited(OWNER_FILE, 1 << 16, opened.fd))
    except (OSError, InvalidJob):
        heartbeat, owner = None, None
    reaping = place.name.startswith(REAPING_PREFIX)
    skipped, count = _skipped(opened)
    return OwnerFolder(Path(place.path), owner, heartbeat, _advertised(opened), reaping, place, skipped, count)


def _skipped(owner_dir: Dir) -> tuple[dict[str, dict[str, str]], int]:
    """What the owner and its sweeper recorded that they skip (entries they cannot handle)."""
    found: dict[str, dict[str, str]] = {}
    count = 0
    for source, name in SKIPPED_FILES.items():
        document = _read_json(owner_dir, name, 1 << 20)
        entries = document.get("skipped") if isinstance(document, dict) else None
        if isinstance(entries, dict) and entries:
            found[source] = {str(where): str(why) for where, why in entries.items()}
            recorded = document.get("count") if isinstance(document, dict) else None
            count += recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else len(entries)
    return found, count


def _advertised(owner_dir: Dir) -> dict[str, dict[str, Any]] | None:
    document = _read_json(owner_dir, FUNCTIONS_FILE, 1 << 20)
    functions = document.get("functions") if isinstance(document, dict) else None
    if not isinstance(functions, dict):
        return None
    return {name: declared for name, declared in functions.items() if isinstance(declared, dict)}


def served_functions(owners: Iterable[OwnerFolder], now: float, is_alive: Liveness) -> dict[str, dict[str, Any]]:
    """The functions live managers run, each with the policy the first of them declares."""
    served: dict[str, dict[str, Any]] = {}
    for found in owners:
        if found.functions is not None and found.is_live(now, is_alive):
            for name, declared in found.functions.items():
                served.setdefault(name, declared)
    return served


def effective_policy(folder: QueueFolder, job: Job, served: Mapping[str, Mapping[str, Any]]) -> Policy:
    """The policy to show for a job: its newest run's, as recorded; for a job that has not
    run, what a live manager that runs its function would resolve now (without one, the
    job's and the queue's levels only)."""
    if job.policy is not None:
        return job.policy
    declared = served.get(job.function)
    registered = registration_from(job.function, declared) if declared is not None else None
    return resolve(job.spec, registered, folder.stored_settings)


class Head(NamedTuple):
    """The head of `ready/`: how many jobs were read, and how many of each function."""

    read: int
    functions: dict[str, int]


def head_functions(folder: QueueFolder, limit: int) -> Head:
    """The functions named by the first `limit` ready jobs in claim order: (jobs read, count per
    function). Jobs nobody can run gather at the head, since every other job is claimed past them."""
    ready = folder.at(State.READY)
    with ready.scandir() as found:
        head = heapq.nsmallest(limit, (entry.name for entry in found))
    counts: dict[str, int] = {}
    read = 0
    for name in head:
        job_id = job_id_of(State.READY, name)
        if job_id is None:
            continue
        try:
            with ready.sub(name) as job:
                function = folder.read_spec(job, job_id).function
        except (InvalidJob, OSError):
            continue  # claimed meanwhile, or malformed (a claim buries it)
        counts[function] = counts.get(function, 0) + 1
        read += 1
    return Head(read, counts)
