"""Periodic jobs: what a schedule is, when it ticks, and where the shell's are kept.

A schedule says when (a cron expression read in a time zone, or `every DURATION`)
and what (an ordinary job: a function or command, its arguments, its options).
Schedules come from two places, with one meaning:

- declared in Python (`@registry.periodic(...)`): every manager whose registry
  declares it fires it; the code is the record.
- added from the shell (`forkvisor schedule add`): one file, `schedules/NAME.json`,
  so every manager on every host agrees and it outlives restarts.

Firing (once per tick, whatever the number of managers) is `jobs.ticks`. The cron
arithmetic is cronsim's (see the README's dependencies): it follows Debian's cron
across daylight-saving changes: a time in the skipped hour runs at the first
minute after the change, and a time in the repeated hour runs once (a job every
N minutes runs in both halves).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobs import document
from jobs.errors import InvalidJob
from jobs.handles import Dir
from jobs.job import JobOptions
from jobs.units import format_duration, seconds_of

MISSED = ("skip", "once", "all")  # what to do with ticks that passed while no manager fired them
DEFAULT_MISSED = "once"  # like systemd's Persistent=true: one run for whatever was missed
DEFAULT_CAP = 100  # "all" catches up at most this many ticks
SKIP_GRACE = 60.0  # with "skip", a tick this late still runs (a sweeper's usual lateness is a second)
MAX_FILE = 1 << 20  # bytes of a schedule file
SCHEDULE_SUFFIX = ".json"
PAUSED_SUFFIX = ".paused"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@+=-]{0,99}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@+=-]")
_NICKNAMES = {  # cron's nicknames, which cronsim does not read
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_OPTION_FIELDS = ("max_attempts", "timeout", "priority", "memory_limit", "output_limit", "backoff", "metadata")


def check_name(name: object) -> str:
    """A schedule's name, or InvalidJob saying what a name may be."""
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith((SCHEDULE_SUFFIX, PAUSED_SUFFIX)):
        raise InvalidJob(
            f"schedule name {name!r} is not a name: use 1-100 letters, digits and _.:@+=- "
            "(not starting with one of .:@+=-, not ending in .json or .paused)"
        )
    return name


@dataclass(frozen=True)
class Timing:
    """When a schedule ticks: `text` is a cron expression (5 fields, or a nickname such as
    @daily) read in the time zone `tz` (default UTC), or `every DURATION` (ticks at the
    multiples of DURATION since the epoch, so that every host agrees)."""

    text: str
    tz: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise InvalidJob('a schedule needs a time: a cron expression such as "*/5 * * * *", or "every 30s"')
        if self.every is not None:
            if self.tz is not None:
                raise InvalidJob(f"{self.text!r} ticks at fixed intervals: a time zone means nothing to it")
            return
        try:
            CronSim(self.cron, datetime(2026, 1, 1, tzinfo=self.zone))
        except CronSimError as exc:
            raise InvalidJob(
                f"{self.text!r} is not a cron expression ({exc}): give five fields, minute hour day-of-month "
                'month day-of-week, such as "0 3 * * *", a nickname such as @daily, or "every 30s"'
            ) from None

    @functools.cached_property
    def every(self) -> float | None:
        """The interval in seconds of an `every DURATION` timing, else None."""
        words = self.text.split(None, 1)
        if len(words) != 2 or words[0] != "every":
            return None
        try:
            seconds = seconds_of(words[1].strip(), "every")
        except ValueError as exc:
            raise InvalidJob(f"{self.text!r}: {exc}") from None
        if seconds is None or seconds < 1 or seconds != int(seconds):
            raise InvalidJob(f"{self.text!r}: an interval is a whole number of seconds, at least 1s")
        return seconds

    @property
    def cron(self) -> str:
        text = " ".join(self.text.split())
        return _NICKNAMES.get(text, text)

    @functools.cached_property
    def zone(self) -> tzinfo:
        if self.tz is None:
            return UTC
        try:
            return ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidJob(f"time zone {self.tz!r} is unknown: give an IANA name such as Europe/Paris") from None

    def after(self, moment: float) -> float | None:
        """The first tick strictly after `moment` (epoch seconds); None if there is none."""
        if self.every is not None:
            return float((int(moment) // int(self.every) + 1) * int(self.every))
        return next((when.timestamp() for when in CronSim(self.cron, self._local(moment))), None)

    def back(self, moment: float) -> Iterator[float]:
        """Every tick at or before `moment`, newest first (epoch seconds, whole): found
        backwards, so that catching up after a year away costs no more than after a minute."""
        if self.every is not None:
            step = int(self.every)
            tick = int(moment) // step * step
            while tick >= 0:
                yield float(tick)
                tick -= step
            return
        for when in CronSim(self.cron, self._local(int(moment) + 1), reverse=True):
            yield when.timestamp()

    def _local(self, moment: float) -> datetime:
        return datetime.fromtimestamp(int(moment), self.zone)

    def describe(self) -> str:
        if self.every is not None:
            return f"every {format_duration(self.every)}"
        return f"{self.text} ({self.tz or 'UTC'})"


@dataclass(frozen=True)
class Schedule:
    """A periodic job: its `name`, its `timing`, the job each tick enqueues (`function`,
    `args`, `kwargs`, `options`), what happens to `missed` ticks (skip, once, all up to
    `cap`), and `source`: "shell" (a file in the queue) or "python" (a registry)."""

    name: str
    timing: Timing
    function: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: JobOptions = field(default_factory=JobOptions)
    missed: str = DEFAULT_MISSED
    cap: int = DEFAULT_CAP
    created: float = 0.0  # when it was added: missed ticks are counted from here at first
    source: str = "shell"

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.missed not in MISSED:
            raise InvalidJob(f"missed={self.missed!r}: say what to do with missed ticks: skip, once or all")
        if not isinstance(self.cap, int) or isinstance(self.cap, bool) or self.cap < 1:
            raise InvalidJob(f"cap={self.cap!r}: the most missed ticks to run is a whole number, at least 1")
        if not isinstance(self.function, str) or not self.function.strip():
            raise InvalidJob(f"schedule {self.name!r} names no function to run")
        options = self.options
        if options.key is not None or options.delay or options.run_at is not None or options.depends_on:
            raise InvalidJob(f"schedule {self.name!r}: a tick's job takes no key, delay, run_at or depends_on")
        given = (*self.args, *self.kwargs.values(), *(options.metadata or {}).values())
        if any(isinstance(value, dict | list | tuple) for value in given) and document.too_deep(self.to_json()):
            # (its file nests the job one level deeper than the tick's job.json: both are readable)
            raise InvalidJob(
                f"schedule {self.name!r}: its arguments or metadata nest JSON more than {document.MAX_DEPTH} "
                "levels deep (counting the schedule file's own), which no manager reads; pass flatter data"
            )

    def to_json(self) -> dict[str, Any]:
        """`schedules/NAME.json`'s content (docs/FORMAT.md)."""
        document: dict[str, Any] = {"format": 1, "name": self.name, "when": self.timing.text}
        if self.timing.tz is not None:
            document["tz"] = self.timing.tz
        document.update(missed=self.missed, cap=self.cap, created=self.created)
        job: dict[str, Any] = {"function": self.function, "args": list(self.args), "kwargs": dict(self.kwargs)}
        for name in _OPTION_FIELDS:
            value = getattr(self.options, name)
            if value is not None:
                job[name] = dict(value) if name == "metadata" else value
        document["job"] = job
        return document


def read(folder: Dir, file: str, source: str = "shell") -> Schedule:
    """The schedule in `file` of `folder`, read with the safe reader; InvalidJob saying what
    is wrong with it (FileNotFoundError passes through)."""
    return from_json(document.read(file, MAX_FILE, f"schedule {file}", folder.fd), source)


def from_json(document: Any, source: str = "shell") -> Schedule:
    """The schedule a `schedules/NAME.json` document describes; InvalidJob saying what is wrong."""
    if not isinstance(document, dict):
        raise InvalidJob("a schedule file must hold a JSON object")
    if document.get("format", 1) != 1:
        raise InvalidJob(f"a schedule of format {document.get('format')!r} was written by a newer forkvisor")
    job = document.get("job")
    if not isinstance(job, dict):
        raise InvalidJob('a schedule needs "job": {"function": ..., "args": [...], "kwargs": {...}}')
    args, kwargs = job.get("args", []), job.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise InvalidJob("a schedule's job has args (an array) and kwargs (an object)")
    options = JobOptions(**{name: job[name] for name in _OPTION_FIELDS if job.get(name) is not None})
    created = document.get("created", 0.0)
    if not isinstance(created, int | float) or isinstance(created, bool):
        raise InvalidJob('a schedule\'s "created" is epoch seconds')
    tz = document.get("tz")
    if tz is not None and not isinstance(tz, str):
        raise InvalidJob('a schedule\'s "tz" is an IANA time zone name')
    return Schedule(
        name=document.get("name"),  # type: ignore[arg-type]  # checked by Schedule
        timing=Timing(document.get("when"), tz),  # type: ignore[arg-type]
        function=job.get("function"),  # type: ignore[arg-type]
        args=tuple(args),
        kwargs=kwargs,
        options=options,
        missed=document.get("missed", DEFAULT_MISSED),
        cap=document.get("cap", DEFAULT_CAP),
        created=float(created),
        source=source,
    )


def name_for(function: str) -> str:
    """The default name of a schedule declared for `function` (its registered name, made safe)."""
    return _UNSAFE.sub("-", function)[-100:].lstrip(".:@+=-") or "schedule"


def declared(
    name: str,
    when: str,
    function: str,
    *,
    tz: str | None = None,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: JobOptions | None = None,
    missed: str = DEFAULT_MISSED,
    cap: int = DEFAULT_CAP,
) -> Schedule:
    """A schedule declared in Python (`Registry.periodic`)."""
    return Schedule(
        name=name,
        timing=Timing(when, tz),
        function=function,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        options=options or JobOptions(),
        missed=missed,
        cap=cap,
        source="python",
    )


def due(schedule: Schedule, since: float, now: float, *, jumped: bool = False) -> tuple[list[float], float | None]:
    """The ticks to fire now, and the newest tick that passed (to be marked handled even if
    not fired); ticks are counted after `since` (the newest tick handled, or when the
    schedule was made).

    `missed` decides what to do when several passed: "skip" fires only a tick less than
    `SKIP_GRACE` late, "once" the newest, "all" each up to `cap`. After a jump of the
    clock (`jumped`), at most the newest fires, whatever the policy: a clock set a day
    forward is not a day of missed work."""
    passed: list[float] = []  # newest first
    for tick in schedule.timing.back(now):
        if tick <= since or len(passed) == schedule.cap:
            break
        passed.append(tick)
    if not passed:
        return [], None
    newest = passed[0]
    if schedule.missed == "skip":
        return ([newest] if now - newest <= SKIP_GRACE else []), newest
    if schedule.missed == "once" or jumped:
        return [newest], newest
    return passed[::-1], newest
