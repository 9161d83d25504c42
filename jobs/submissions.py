"""Where members' submissions wait in `incoming/`, read as any reader may: the member
folders this process may look into, the submissions and requests in them, the spec a
submission holds (`jobs.incoming` takes them in; `view` shows them before it has).
docs/FORMAT.md has the layout."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator

from jobs import files
from jobs.folder import QueueFolder
from jobs.handles import Entry
from jobs.job import ID_PATTERN, MAX_SPEC_BYTES, JobSpec, State

TAKING = ".taking."  # a submission being taken in: `.taking.ID.json`
MAX_MEMBER_FOLDERS = 16  # folders of one user's taken from (the first, by name); the rest are set aside
JOB_RE = re.compile(rf"^({ID_PATTERN})\.json$")
REQUEST_RE = re.compile(rf"^({ID_PATTERN})\.(cancel|retry)$")


def member_folders(folder: QueueFolder) -> list[Entry]:
    """The member folders of `incoming/` this process may look into: for the owner (who may
    list incoming/), each user's first `MAX_MEMBER_FOLDERS` (those a take-in takes from);
    the caller's own otherwise (members cannot list it)."""
    incoming = folder.at(State.INCOMING)
    try:
        with incoming.scandir() as listed:
            found = sorted(
                (entry.name, entry.stat(follow_symlinks=False).st_uid)
                for entry in listed
                if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)
            )
    except OSError:  # a member: incoming/ may be entered, not listed (opened for search only)
        uid = os.geteuid()
        names = [name for name in [str(uid), *(f"{uid}.{n}" for n in range(1, 10))] if incoming.is_dir(name)]
        return [incoming / name for name in names]
    per_user: dict[int, int] = {}
    names = []
    for name, uid in found:
        per_user[uid] = per_user.get(uid, 0) + 1
        if per_user[uid] <= MAX_MEMBER_FOLDERS:
            names.append(name)
    return [incoming / name for name in names]


def submissions(folder: QueueFolder) -> Iterator[tuple[Entry, str]]:
    """(place, job id) of every submission not taken in yet that this process may see."""
    for member in member_folders(folder):
        try:
            with member.open() as opened:
                names = opened.names()
        except OSError:
            continue  # not ours to read, or gone
        for name in sorted(names):
            job_id = entry_id(name)
            place = member.dir / f"{member.name}/{name}"
            if job_id is not None and _is_file(place):
                yield place, job_id


def pending_requests(folder: QueueFolder) -> int:
    """How many requests (`ID.cancel`, `ID.retry`) wait in the members' folders this process
    may see (files only: what else bears their names is refused, and may stay where it is)."""
    found = 0
    for member in member_folders(folder):
        try:
            with member.open() as opened:
                found += sum(1 for name in opened.names() if REQUEST_RE.match(name) and _is_file(opened / name))
        except OSError:
            continue
    return found


def _is_file(place: Entry) -> bool:
    try:
        return stat.S_ISREG(place.lstat().st_mode)
    except OSError:
        return False


def find_submission(folder: QueueFolder, job_id: str, members: list[Entry] | None = None) -> Entry | None:
    """Where a submission of `job_id` waits (or is being taken in), if one does; looked for
    in `members` (default: `member_folders`)."""
    for member in member_folders(folder) if members is None else members:
        for name in (f"{job_id}.json", f"{TAKING}{job_id}.json"):
            place = member.dir / f"{member.name}/{name}"
            try:
                if stat.S_ISREG(place.lstat().st_mode):
                    return place
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
    return None


def entry_id(name: str) -> str | None:
    """The job id an entry of a member's folder submits (`ID.json`, or one being taken in), or None."""
    if name.startswith(TAKING):
        name = name[len(TAKING) :]
    found = JOB_RE.match(name)
    return found[1] if found else None


def read_spec(place: Entry, job_id: str) -> JobSpec:
    """The spec a submission file holds (for readers: `show` of a job not taken in yet)."""
    return JobSpec.from_json(files.read_limited(place.name, MAX_SPEC_BYTES, place.dir.fd), job_id)
