"""The firer of periodic jobs: what one sweeper fires, and when its next tick is due.

Each pass reads `schedules/` again only if it changed, and looks only at the schedules
whose next tick has come: 10,000 schedules cost a pass nothing until one is due. How a
tick is taken once is `jobs.ticks`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import replace

from jobs import files, schedules, ticks
from jobs.errors import InvalidJob, JobsError
from jobs.folder import SCHEDULES, TICKS, QueueFolder
from jobs.handles import Dir
from jobs.schedules import PAUSED_SUFFIX, SCHEDULE_SUFFIX, Schedule
from jobs.submit import Call, Publisher
from jobs.ticks import DECLARED, NO_JOB, Handled

log = logging.getLogger(__name__)
JUMP = 30.0  # the wall clock moved this much against the monotonic one: a jump, not a delay


def read_schedules(folder: QueueFolder) -> tuple[list[Schedule], set[str], dict[str, str]]:
    """The schedules kept in `schedules/`, the names of the paused ones, and what is wrong
    with each file that is not a schedule (by file name; such a file is left alone)."""
    found: list[Schedule] = []
    paused: set[str] = set()
    bad: dict[str, str] = {}
    where = folder.at(SCHEDULES)
    for name in sorted(where.names()):
        if name.endswith(PAUSED_SUFFIX):
            paused.add(name.removesuffix(PAUSED_SUFFIX))
            continue
        if name.startswith(".") or not name.endswith(SCHEDULE_SUFFIX):
            continue
        try:
            schedule = schedules.read(where, name)
            if schedule.name != name.removesuffix(SCHEDULE_SUFFIX):
                raise InvalidJob(f"it names schedule {schedule.name!r}")
            found.append(schedule)
        except (OSError, JobsError, TypeError) as exc:
            bad[name] = str(exc)
    return found, paused, bad


class Planner:
    """What one sweeper fires: the queue's schedules and `declared` ones (Python's)."""

    def __init__(self, folder: QueueFolder, declared: Iterable[Schedule], publisher: Publisher) -> None:
        self._folder = folder
        self._declared = {schedule.name: schedule for schedule in declared}
        self._publisher = publisher
        self._seen: int | None = None  # schedules/' mtime when it was last read
        self._schedules: dict[str, Schedule] = {}
        self._paused: set[str] = set()
        self._next: dict[str, float] = {}  # no tick of a schedule is due before this (epoch)
        self._offset: float | None = None  # wall clock minus monotonic clock at the last pass
        self.bad: dict[str, str] = {}
        self._tick_secret: bytes | None = None

    def fire(self, now: float, monotonic: float) -> tuple[int, float | None]:
        """Fire every tick due at `now` (wall clock); return how many jobs this enqueued,
        and when the next tick is due (None: no schedule)."""
        offset, self._offset = self._offset, now - monotonic
        jumped = offset is not None and abs(self._offset - offset) > JUMP
        if jumped:
            log.warning("the clock jumped by %+.0fs: missed ticks run once at most", self._offset - (offset or 0.0))
        self._reload()
        fired = 0
        for name, schedule in self._schedules.items():
            if self._next.get(name, 0.0) > now:
                continue
            try:
                fired += self._fire_schedule(schedule, now, jumped)
            except (OSError, JobsError) as exc:  # one schedule never stops the others
                log.error("cannot fire schedule %s: %s", name, exc)
                self._next[name] = now + 5.0
        return fired, min(self._next.values(), default=None)

    def _reload(self) -> None:
        """Read `schedules/` again if it changed (a schedule added, removed, paused)."""
        try:
            seen = self._folder.root.lstat(SCHEDULES).st_mtime_ns
        except FileNotFoundError:
            seen = 0
        if seen == self._seen and seen:
            return
        stored, paused, self.bad = read_schedules(self._folder) if seen else ([], set(), {})
        for file, why in self.bad.items():
            log.error("schedules/%s is not a schedule, so nothing fires it: %s", file, why)
        merged = dict(self._declared)
        for schedule in stored:
            if schedule.name in merged:
                log.error(
                    "schedule %s is declared in Python and kept in schedules/: the Python one runs", schedule.name
                )
                continue
            merged[schedule.name] = schedule
        self._schedules, self._paused, self._seen = merged, paused, seen
        self._next = {name: when for name, when in self._next.items() if name in merged}
        for name in [name for name in merged if name in paused]:
            self._next.pop(name, None)

    def _fire_schedule(self, schedule: Schedule, now: float, jumped: bool) -> int:
        marks = self._ticks_dir(schedule.name)
        with marks:
            last = ticks.newest_in(marks)
            if schedule.source == "python":
                self._describe(marks, schedule)
            if last is None and schedule.source == "python":
                last = self._first_sight(marks, schedule, now)  # marks before it was declared are not missed
            start = max(schedule.created, last.tick if last else 0.0)
            fire, newest = schedules.due(schedule, start, now, jumped=jumped)
            if schedule.name in self._paused:
                fire = []
            fired = sum(self._fire_tick(marks, schedule, tick, now) for tick in fire)
            if newest is not None and newest not in fire:
                ticks.take(marks, newest, NO_JOB, self._folder)  # handled: not fired again
            ticks.forget_older(marks)
        self._next[schedule.name] = schedule.timing.after(max(now, start)) or float("inf")
        return fired

    def _fire_tick(self, marks: Dir, schedule: Schedule, tick: float, now: float) -> int:
        job_id = ticks.tick_job_id(schedule.name, tick, self._secret())
        if any(handled >= int(tick) for handled in ticks.marker_ticks(marks)):
            return 0  # this tick, or a newer one, was handled by another firer
        metadata = {**(schedule.options.metadata or {}), "schedule": schedule.name, "tick": int(tick)}
        call = Call(schedule.function, schedule.args, schedule.kwargs, replace(schedule.options, metadata=metadata))
        if self._publisher.submit_once(call, now, job_id, lambda: ticks.take(marks, tick, job_id, self._folder)):
            log.info("schedule %s: tick %s enqueued job %s", schedule.name, ticks.iso(tick), job_id)
            return 1
        return 0

    def _secret(self) -> bytes:
        if self._tick_secret is None:
            self._tick_secret = ticks.secret(self._folder)
        return self._tick_secret

    def _first_sight(self, marks: Dir, schedule: Schedule, now: float) -> Handled:
        newest = next(schedule.timing.back(now), 0.0)
        ticks.take(marks, newest, NO_JOB, self._folder)
        return Handled(newest, None)

    def _describe(self, marks: Dir, schedule: Schedule) -> None:
        """Keep `.declared.json` saying what the Python declaration says (for `schedule list`)."""
        data = (json.dumps(schedule.to_json(), indent=1) + "\n").encode()
        try:
            if files.read_limited(DECLARED, schedules.MAX_FILE, marks.fd) == data:
                return
        except OSError:
            pass
        files.replace_file(DECLARED, data, durable=False, mode=self._folder.file_mode, dir_fd=marks.fd)

    def _ticks_dir(self, name: str) -> Dir:
        where = self._folder.at(TICKS)
        try:
            return where.sub(name)
        except FileNotFoundError:
            try:
                self._folder.make_dir(where / name)
            except FileExistsError:
                pass  # made meanwhile by another firer
            return where.sub(name)
