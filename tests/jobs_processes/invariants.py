"""Conservation checks read straight from a queue folder, with `os.scandir` only.

Nothing here goes through `Queue`: the point is to judge the store by what
`ls` would show (DESIGN guarantees 1 and 2), not by what the store says about
itself. Only the name parsers of `jobs.job` are used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from jobs.job import State, is_job_id, parse_ready_name, parse_scheduled_name

COUNTER_FILE = "attempts"  # docs/FORMAT.md: "attempts used so far, a decimal number; missing means 0"


def check_invariants(queue_path: str | os.PathLike[str], published_ids: Iterable[str]) -> dict[str, tuple[State, Path]]:
    """Assert that every published job is in exactly one state folder and that no
    other job is in any; return id -> (state, job directory).

    Places: `ready/RRR.ID`, `scheduled/DUE.RRR.ID`, `claimed/OWNER/ID` (also
    `claimed/reaping.OWNER/ID`, a sweep that was interrupted), `done/ID`, `dead/ID`.
    Anything else in a state folder (a bad name, a file, a symlink) is reported too.
    """
    root = Path(queue_path)
    published = set(published_ids)
    seen: dict[str, list[tuple[State, Path]]] = {}
    problems: list[str] = []

    def note(state: State, entry: os.DirEntry[str], job_id: str | None) -> None:
        where = os.path.relpath(entry.path, root)
        if job_id is None:
            problems.append(f"{where}: not a job entry name")
        elif entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            problems.append(f"{where}: not a job directory")
        else:
            seen.setdefault(job_id, []).append((state, Path(entry.path)))

    for state in (State.READY, State.SCHEDULED, State.WAITING, State.DONE, State.DEAD):
        for entry in _scan(root / state.value):
            note(state, entry, _id_of(state, entry.name))
    for owner in _scan(root / State.CLAIMED.value):
        if not owner.is_dir(follow_symlinks=False):
            problems.append(f"claimed/{owner.name}: not an owner folder")
            continue
        for entry in _scan(Path(owner.path)):
            if entry.name.startswith("."):  # .owner.json and its write-then-rename temporaries
                continue
            note(State.CLAIMED, entry, entry.name if is_job_id(entry.name) else None)

    for job_id in sorted(published):
        places = seen.get(job_id, [])
        if not places:
            problems.append(f"job {job_id} is lost: in none of ready, scheduled, claimed, done, dead")
        elif len(places) > 1:
            listed = ", ".join(os.path.relpath(path, root) for _, path in places)
            problems.append(f"job {job_id} is in {len(places)} places at once: {listed}")
    for job_id in sorted(set(seen) - published):
        listed = ", ".join(os.path.relpath(path, root) for _, path in seen[job_id])
        problems.append(f"job {job_id} was never published but is in {listed}")
    assert not problems, f"queue {root} breaks conservation:\n  " + "\n  ".join(problems)
    return {job_id: places[0] for job_id, places in seen.items()}


def job_ids_on_disk(queue_path: str | os.PathLike[str]) -> set[str]:
    """Every job id found in a state folder (to learn which ids an interrupted
    enqueue published before its caller could hear of them)."""
    root = Path(queue_path)
    found: set[str] = set()
    for state in (State.READY, State.SCHEDULED, State.WAITING, State.DONE, State.DEAD):
        found.update(job_id for entry in _scan(root / state.value) if (job_id := _id_of(state, entry.name)))
    for owner in _scan(root / State.CLAIMED.value):
        if owner.is_dir(follow_symlinks=False):
            found.update(entry.name for entry in _scan(Path(owner.path)) if is_job_id(entry.name))
    return found


def read_attempts(job_dir: str | os.PathLike[str]) -> int:
    """The job's `attempts` counter; a missing file means 0, anything but a
    decimal number is a torn write and fails the test."""
    try:
        with open(Path(job_dir) / COUNTER_FILE, "rb") as file:
            text = file.read().decode("ascii", "replace").strip()
    except FileNotFoundError:
        return 0
    assert text.isdigit(), f"{job_dir}/{COUNTER_FILE} holds {text!r}, not a decimal number"
    return int(text)


def all_attempts(places: Mapping[str, tuple[State, Path]]) -> dict[str, int]:
    """id -> attempts counter, for every job `check_invariants` located."""
    return {job_id: read_attempts(path) for job_id, (_, path) in places.items()}


def entries(folder: str | os.PathLike[str]) -> list[str]:
    """Names in `folder`, sorted (an absent folder has none)."""
    return sorted(entry.name for entry in _scan(Path(folder)))


def _id_of(state: State, name: str) -> str | None:
    if state is State.READY:
        ready = parse_ready_name(name)
        return ready[0] if ready else None
    if state is State.SCHEDULED:
        scheduled = parse_scheduled_name(name)
        return scheduled[0] if scheduled else None
    return name if is_job_id(name) else None


def _scan(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return list(found)
    except FileNotFoundError:
        return []
