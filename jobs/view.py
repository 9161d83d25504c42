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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs import document, files, incoming
from jobs.errors import InvalidJob, JobNotFound
from jobs.folder import ERROR_FILE, OUTCOME_FILE, RESULT_FILE, QueueFolder
from jobs.job import (
    Attempt,
    Job,
    JobSpec,
    State,
    check_job_id,
    is_job_id,
    parse_ready_name,
    parse_scheduled_name,
    ready_name,
)
from jobs.lease import FUNCTIONS_FILE, OWNER_FILE, OWNER_FILES, REAPING_PREFIX, Liveness, Owner
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
        return incoming.entry_id(name)
    return name if is_job_id(name) else None


def owner_dirs(folder: QueueFolder) -> Iterator[Path]:
    """Every folder under `claimed/` (owners, and owners being reaped)."""
    with os.scandir(folder.state_dir(State.CLAIMED)) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield Path(entry.path)


def entries(folder: QueueFolder, state: State) -> Iterator[tuple[Path, str]]:
    """(path, job id) of every well-formed job directory in one state."""
    parents = list(owner_dirs(folder)) if state is State.CLAIMED else [folder.state_dir(state)]
    for parent in parents:
        yield from entries_in(parent, state)


def entries_in(parent: Path, state: State, check_dirs: bool = True) -> Iterator[tuple[Path, str]]:
    """(path, job id) of the well-named entries of one folder of `state` (an owner's
    folder for CLAIMED); `check_dirs=False` skips the per-entry type check."""
    try:
        with os.scandir(parent) as found:
            named = [(entry, job_id_of(state, entry.name)) for entry in found]
    except FileNotFoundError:
        return  # an owner folder fenced or retired while we looked
    is_job = _is_submission if state is State.INCOMING else _is_folder
    for entry, job_id in named:
        if job_id and (not check_dirs or is_job(entry)):
            yield Path(entry.path), job_id


def _is_folder(entry: os.DirEntry[str]) -> bool:
    return entry.is_dir(follow_symlinks=False)


def _is_submission(entry: os.DirEntry[str]) -> bool:
    """In incoming/, a job is a file (see jobs.incoming)."""
    return entry.is_file(follow_symlinks=False)


LOCATE_PASSES = 3


def locate(folder: QueueFolder, job_id: str) -> tuple[State, Path]:
    """Find which state folder holds `job_id`; raise JobNotFound if none does.

    The folders are looked at one after another, so a job moving into one already
    looked at is missed by that pass; only several passes that all miss it say
    "not found" (a job in motion is always somewhere).
    """
    check_job_id(job_id)
    for _ in range(LOCATE_PASSES):
        found = _look_once(folder, job_id)
        if found is not None:
            return found
    raise JobNotFound(f"no job {job_id} in queue {folder.path}: not in ready, scheduled, claimed, done or dead")


def _look_once(folder: QueueFolder, job_id: str) -> tuple[State, Path] | None:
    for state in (State.DONE, State.DEAD):
        path = folder.state_dir(state) / job_id
        if path.is_dir() and not path.is_symlink():
            return state, path
    guess = folder.state_dir(State.READY) / ready_name(job_id, 0)
    if guess.is_dir() and not guess.is_symlink():
        return State.READY, guess
    for owner_dir in owner_dirs(folder):
        path = owner_dir / job_id
        if path.is_dir() and not path.is_symlink():
            return State.CLAIMED, path
    for state in (State.READY, State.SCHEDULED):
        for path, found in entries(folder, state):
            if found == job_id:
                return state, path
    # Last: a published place wins over a take-in's leftover file of the same job.
    for name in (f"{job_id}.json", f"{incoming.TAKING}{job_id}.json"):  # a member's, not taken in yet
        path = folder.state_dir(State.INCOMING) / name
        if path.is_file() and not path.is_symlink():
            return State.INCOMING, path
    return None


def read_job(folder: QueueFolder, state: State, path: Path) -> Job:
    """The view of the job directory at `path`, which is in `state`."""
    job_id = job_id_of(state, path.name)
    if job_id is None:
        raise JobNotFound(f"{path} is not a job directory")
    if state is State.INCOMING:
        return _submission(path, job_id)
    try:
        spec = folder.read_spec(path, job_id)
    except InvalidJob:
        spec = JobSpec(id=job_id, function="?")
    history = _attempts(path)
    return Job(
        id=job_id,
        state=state,
        path=path,
        spec=spec,
        attempts=_counter_or_zero(folder, path),
        history=history,
        result=_read_json(path / RESULT_FILE, MAX_RESULT_BYTES) if state is State.DONE else None,
        error=_read_json(path / ERROR_FILE, 1 << 20) if state is State.DEAD else None,
        owner=path.parent.name if state is State.CLAIMED else None,
        policy=recorded_policy(path, history[-1].number) if history else None,
    )


def _submission(path: Path, job_id: str) -> Job:
    """The view of a member's submission not taken in yet: its spec, nothing run."""
    try:
        spec = incoming.read_spec(path, job_id)
    except (InvalidJob, OSError):
        spec = JobSpec(id=job_id, function="?")
    return Job(id=job_id, state=State.INCOMING, path=path, spec=spec, attempts=0, history=())


def read_moving(folder: QueueFolder, state: State, path: Path) -> Job | None:
    """`read_job`, or None when the job moved while it was read (its view would be torn)."""
    try:
        job = read_job(folder, state, path)
    except FileNotFoundError:
        return None
    return job if path.is_dir() or (state is State.INCOMING and path.is_file()) else None


def _counter_or_zero(folder: QueueFolder, job_dir: Path) -> int:
    try:
        return folder.read_counter(job_dir)
    except InvalidJob:
        return 0  # a reader shows the job; the next claim or sweep buries it with the cause


def _attempts(job_dir: Path) -> tuple[Attempt, ...]:
    found = []
    with os.scandir(job_dir) as entries_:
        for entry in entries_:
            match = _ATTEMPT_RE.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                outcome = _read_json(Path(entry.path) / OUTCOME_FILE, 1 << 20)
                found.append(Attempt(int(match[1]), Path(entry.path), outcome))
    return tuple(sorted(found, key=lambda attempt: attempt.number))


def attempt_dirs(job_dir: Path) -> list[Path]:
    """The `attempt-N` folders of a job (real folders only, never links)."""
    with os.scandir(job_dir) as found:
        return [Path(e.path) for e in found if _ATTEMPT_RE.match(e.name) and e.is_dir(follow_symlinks=False)]


def last_attempt(job_dir: Path) -> int:
    """The number of the newest `attempt-N` folder (0 if none); links and files do not count."""
    with os.scandir(job_dir) as found:
        numbers = [
            int(match[1])
            for entry in found
            if (match := _ATTEMPT_RE.match(entry.name)) and entry.is_dir(follow_symlinks=False)
        ]
    return max(numbers, default=0)


def _read_json(path: Path, limit: int) -> Any:
    try:
        return document.read(path, limit, path.name)
    except FileNotFoundError:
        return None
    except InvalidJob as exc:
        return {"unreadable": str(exc)}


def count(folder: QueueFolder) -> dict[str, int]:
    """Number of jobs in each state, by state name."""
    counts = {state.value: _count_subdirs(folder.state_dir(state)) for state in State if state is not State.CLAIMED}
    counts[State.CLAIMED.value] = sum(_count_subdirs(owner) for owner in owner_dirs(folder))
    counts[State.INCOMING.value] = sum(1 for _ in entries_in(folder.state_dir(State.INCOMING), State.INCOMING))
    return {state.value: counts[state.value] for state in State}


def _count_subdirs(path: Path) -> int:
    try:
        links = os.stat(path).st_nlink
    except FileNotFoundError:
        return 0  # an owner folder fenced or retired while we counted (counts are a snapshot)
    if links >= 2:  # ext4 and most local file systems: 2 + number of subfolders
        return links - 2
    try:
        with os.scandir(path) as found:  # btrfs and overflowed ext4 report 1
            return sum(1 for entry in found if entry.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return 0


def stray_names(owner_dir: Path) -> Iterator[str]:
    """Names in an owner folder other than its own files (jobs and strays)."""
    for name in os.listdir(owner_dir):
        if name not in OWNER_FILES and not name.startswith("."):
            yield name


def recorded_policy(job_dir: Path, run: int) -> Policy | None:
    """The policy run `run` was started under (its `policy.json`), or None if it recorded none."""
    if run < 1:
        return None
    try:
        return Policy.from_json(files.read_limited(job_dir / f"attempt-{run}" / POLICY_FILE, 1 << 16))
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

    def is_live(self, now: float, is_alive: Liveness) -> bool:
        """Serving now: not being reaped, within its lease, and not known dead."""
        if self.reaping or self.owner is None or self.heartbeat is None:
            return False
        return now <= self.heartbeat + self.owner.lease and is_alive(self.owner) is not False


def owner_folders(folder: QueueFolder) -> list[OwnerFolder]:
    """Every folder of `claimed/`, read without following links; unreadable parts are None."""
    return [_owner_folder(path) for path in owner_dirs(folder)]


def _owner_folder(path: Path) -> OwnerFolder:
    try:
        heartbeat: float | None = os.lstat(path / OWNER_FILE).st_mtime
        owner: Owner | None = Owner.from_json(files.read_limited(path / OWNER_FILE, 1 << 16))
    except (OSError, InvalidJob):
        heartbeat, owner = None, None
    return OwnerFolder(path, owner, heartbeat, _advertised(path), path.name.startswith(REAPING_PREFIX))


def _advertised(owner_dir: Path) -> dict[str, dict[str, Any]] | None:
    document = _read_json(owner_dir / FUNCTIONS_FILE, 1 << 20)
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


def head_functions(folder: QueueFolder, limit: int) -> tuple[int, dict[str, int]]:
    """The functions named by the first `limit` ready jobs in claim order: (jobs read, count per
    function). Jobs nobody can run gather at the head, since every other job is claimed past them."""
    with os.scandir(folder.state_dir(State.READY)) as found:
        head = heapq.nsmallest(limit, (entry.name for entry in found))
    counts: dict[str, int] = {}
    read = 0
    for name in head:
        job_id = job_id_of(State.READY, name)
        if job_id is None:
            continue
        try:
            function = folder.read_spec(folder.state_dir(State.READY) / name, job_id).function
        except (InvalidJob, OSError):
            continue  # claimed meanwhile, or malformed (a claim buries it)
        counts[function] = counts.get(function, 0) + 1
        read += 1
    return read, counts
