"""The queue's timetable: adding, removing, pausing schedules, and what each did last.

A schedule added here is one file, `schedules/NAME.json`, written under a dot-name and
renamed into place; pausing is one more file, `schedules/NAME.paused`. Schedules
declared in Python are listed from what their firers wrote (`ticks/NAME/.declared.json`);
they are changed in the code, but they can be paused and resumed here like the others.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from jobs import files, schedules, ticks
from jobs.errors import InvalidJob, JobNotFound, JobsError, WrongState
from jobs.folder import SCHEDULES, TICKS, QueueFolder
from jobs.job import State
from jobs.schedules import PAUSED_SUFFIX, SCHEDULE_SUFFIX, Schedule


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as `forkvisor schedule list` shows it."""

    schedule: Schedule
    paused: bool
    next_tick: float | None  # the next tick that will fire (None: never, or paused)
    last_tick: float | None  # the newest tick handled
    last_job: str | None  # the job that tick enqueued (None: handled without one)
    last_state: State | None  # where that job is now (None: purged, or no job)


def add(folder: QueueFolder, schedule: Schedule, *, replace: bool = False) -> None:
    """Keep `schedule` in `schedules/`; WrongState if one of that name is there (unless `replace`)."""
    _owner_only(folder, "add a schedule")
    where = folder.at(SCHEDULES)
    data = (json.dumps(schedule.to_json(), indent=1, allow_nan=False) + "\n").encode()
    name = schedule.name + SCHEDULE_SUFFIX
    if replace:
        files.replace_file(name, data, durable=folder.durable, mode=folder.file_mode, dir_fd=where.fd)
        return
    if not files.link_new(name, data, durable=folder.durable, mode=folder.file_mode, dir_fd=where.fd):
        raise WrongState(
            f"schedule {schedule.name!r} exists in {folder.path}: remove it first, or replace it (--replace)"
        )
    if folder.durable:
        where.fsync()


def remove(folder: QueueFolder, name: str) -> None:
    """Remove the schedule `name` from `schedules/` (its handled ticks stay in `ticks/`, so
    that adding it again does not fire them again)."""
    _owner_only(folder, "remove a schedule")
    where = folder.at(SCHEDULES)
    try:
        os.unlink(schedules.check_name(name) + SCHEDULE_SUFFIX, dir_fd=where.fd)
    except FileNotFoundError:
        if _declared(folder, name) is not None:
            raise WrongState(
                f"schedule {name!r} is declared in Python: remove it from the code (or pause it here)"
            ) from None
        raise JobNotFound(f"no schedule {name!r} in {folder.path} (see `forkvisor schedule list`)") from None
    files.unlink_if_there(name + PAUSED_SUFFIX, where.fd)
    if folder.durable:
        where.fsync()


def set_paused(folder: QueueFolder, name: str, paused: bool) -> None:
    """Pause (no tick fires; the ticks that pass are skipped) or resume a schedule."""
    _owner_only(folder, "pause or resume a schedule")
    find(folder, name)  # a typo is an error, not a pause of nothing
    where = folder.at(SCHEDULES)
    if paused:
        try:
            files.write_new(name + PAUSED_SUFFIX, b"", durable=folder.durable, mode=folder.file_mode, dir_fd=where.fd)
        except FileExistsError:
            return
    else:
        files.unlink_if_there(name + PAUSED_SUFFIX, where.fd)
    if folder.durable:
        where.fsync()


def find(folder: QueueFolder, name: str) -> Schedule:
    """The schedule `name`, kept in `schedules/` or declared in Python; JobNotFound if neither."""
    schedules.check_name(name)
    where = folder.at(SCHEDULES)
    try:
        return schedules.read(where, name + SCHEDULE_SUFFIX)
    except FileNotFoundError:
        pass
    declared = _declared(folder, name)
    if declared is None:
        raise JobNotFound(f"no schedule {name!r} in {folder.path} (see `forkvisor schedule list`)")
    return declared


def every(folder: QueueFolder, now: float, locate: Callable[[str], tuple[State, object]]) -> list[ScheduleInfo]:
    """Every schedule of the queue, the shell's and Python's, by name, with its last and next ticks."""
    found: dict[str, Schedule] = {}
    for name in folder.at(TICKS).names():
        declared = _declared(folder, name)
        if declared is not None:
            found[name] = declared
    paused: set[str] = set()
    for file in folder.at(SCHEDULES).names():
        if file.endswith(PAUSED_SUFFIX):
            paused.add(file.removesuffix(PAUSED_SUFFIX))
        elif file.endswith(SCHEDULE_SUFFIX) and not file.startswith("."):
            try:
                found[file.removesuffix(SCHEDULE_SUFFIX)] = find(folder, file.removesuffix(SCHEDULE_SUFFIX))
            except (OSError, JobsError, TypeError):
                continue  # not a schedule: the firers log it, `schedule show NAME` says why
    return [_info(folder, schedule, schedule.name in paused, now, locate) for _, schedule in sorted(found.items())]


def info(folder: QueueFolder, name: str, now: float, locate: Callable[[str], tuple[State, object]]) -> ScheduleInfo:
    schedule = find(folder, name)
    return _info(folder, schedule, folder.at(SCHEDULES).exists(name + PAUSED_SUFFIX), now, locate)


def _info(
    folder: QueueFolder, schedule: Schedule, paused: bool, now: float, locate: Callable[[str], tuple[State, object]]
) -> ScheduleInfo:
    last = ticks.newest(folder, schedule.name)
    state = None
    if last is not None and last.job_id is not None:
        try:
            state, _ = locate(last.job_id)
        except (JobNotFound, InvalidJob):
            state = None
    since = max(now, last.tick if last else 0.0, schedule.created)
    upcoming = None if paused else schedule.timing.after(since)
    return ScheduleInfo(
        schedule=schedule,
        paused=paused,
        next_tick=upcoming,
        last_tick=last.tick if last else None,
        last_job=last.job_id if last else None,
        last_state=state,
    )


def _declared(folder: QueueFolder, name: str) -> Schedule | None:
    """A Python schedule as its firers described it, or None."""
    try:
        with folder.at(TICKS).sub(name) as marks:
            return schedules.read(marks, ticks.DECLARED, source="python")
    except (OSError, JobsError, TypeError):
        return None


def _owner_only(folder: QueueFolder, what: str) -> None:
    if not folder.owned():
        raise WrongState(f"cannot {what} in {folder.path}: only the queue's owner keeps its schedules")
