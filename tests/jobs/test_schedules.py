"""Schedules as values: when they tick (cron in a time zone, daylight-saving changes
included, and fixed intervals), which ticks fire after a gap (skip, once, all, a
clock jump), and how they are written and read back."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from jobs import InvalidJob, JobOptions, Queue, Registry, Schedule, Timing
from jobs.schedules import SKIP_GRACE, due, from_json, name_for

NEW_YORK = ZoneInfo("America/New_York")


def at(text: str, zone: ZoneInfo = NEW_YORK) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def local(epoch: float, zone: ZoneInfo = NEW_YORK) -> str:
    return datetime.fromtimestamp(epoch, zone).isoformat()


def following(timing: Timing, start: float, count: int) -> list[str]:
    found, moment = [], start
    for _ in range(count):
        tick = timing.after(moment)
        assert tick is not None
        found.append(local(tick, timing.zone))  # type: ignore[arg-type]
        moment = tick
    return found


def test_a_time_in_the_skipped_hour_runs_at_the_first_minute_after_the_change() -> None:
    # 2026-03-08: New York's clocks go from 02:00 EST to 03:00 EDT; 02:30 does not exist that day.
    timing = Timing("30 2 * * *", "America/New_York")
    assert following(timing, at("2026-03-07T12:00"), 3) == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
        "2026-03-10T02:30:00-04:00",
    ]


def test_a_time_in_the_repeated_hour_runs_once() -> None:
    # 2026-11-01: clocks go from 02:00 EDT back to 01:00 EST; 01:30 happens twice that day.
    timing = Timing("30 1 * * *", "America/New_York")
    assert following(timing, at("2026-10-31T12:00"), 2) == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]


def test_a_job_every_thirty_minutes_runs_in_both_halves_of_the_repeated_hour() -> None:
    timing = Timing("*/30 * * * *", "America/New_York")
    ticks = following(timing, at("2026-11-01T00:40"), 5)
    assert ticks == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:00:00-05:00",
        "2026-11-01T01:30:00-05:00",
        "2026-11-01T02:00:00-05:00",
    ]


def test_backwards_is_forwards_reversed_across_a_change() -> None:
    timing = Timing("30 2 * * *", "America/New_York")
    newest_first = list(_take(timing.back(at("2026-03-10T12:00")), 3))
    assert [local(t) for t in newest_first] == [
        "2026-03-10T02:30:00-04:00",
        "2026-03-09T02:30:00-04:00",
        "2026-03-08T03:00:00-04:00",
    ]
    tick = at("2026-03-09T02:30")
    assert next(timing.back(tick)) == tick, "a tick at the very moment is at or before it"


def test_intervals_tick_at_multiples_of_the_interval_since_the_epoch() -> None:
    timing = Timing("every 90s")
    assert timing.after(1000.0) == 1080.0
    assert timing.after(1080.0) == 1170.0, "strictly after"
    assert list(_take(timing.back(1170.5), 2)) == [1170.0, 1080.0]
    assert timing.describe() == "every 90s"


def test_nicknames_and_utc_by_default() -> None:
    timing = Timing("@daily")
    assert timing.after(at("2026-01-01T10:00", ZoneInfo("UTC"))) == at("2026-01-02T00:00", ZoneInfo("UTC"))


@pytest.mark.parametrize(
    ("text", "tz", "says"),
    [
        ("61 * * * *", None, "not a cron expression"),
        ("* * *", None, "not a cron expression"),
        ("", None, "needs a time"),
        ("* * * * *", "Mars/Olympus", "time zone 'Mars/Olympus' is unknown"),
        ("every 0.5s", None, "whole number of seconds"),
        ("every soon", None, "every"),
        ("every 30s", "Europe/Paris", "a time zone means nothing"),
    ],
)
def test_a_bad_timing_says_what_is_wrong(text: str, tz: str | None, says: str) -> None:
    with pytest.raises(InvalidJob, match=says):
        Timing(text, tz)


def schedule(missed: str = "once", cap: int = 100, when: str = "every 10s") -> Schedule:
    return Schedule(name="s", timing=Timing(when), function="f", missed=missed, cap=cap)


def test_after_a_gap_once_fires_the_newest_tick_only() -> None:
    fire, newest = due(schedule("once"), 1000.0, 1095.0)
    assert fire == [1090.0]
    assert newest == 1090.0


def test_after_a_gap_all_fires_each_tick_up_to_the_cap() -> None:
    fire, _ = due(schedule("all"), 1000.0, 1095.0)
    assert fire == [1010.0 + 10 * n for n in range(9)]
    fire, newest = due(schedule("all", cap=3), 1000.0, 1095.0)
    assert (fire, newest) == ([1070.0, 1080.0, 1090.0], 1090.0), "the newest ticks, oldest first"


def test_skip_fires_a_tick_only_if_it_is_barely_late() -> None:
    assert due(schedule("skip"), 1000.0, 1091.0) == ([1090.0], 1090.0)
    late = 1090.0 + SKIP_GRACE + 1
    fire, newest = due(schedule("skip", when="every 1000s"), 0.0, late)
    assert (fire, newest) == ([], 1000.0), "a missed tick is marked handled, not fired"


def test_a_clock_jump_fires_one_tick_whatever_the_policy() -> None:
    fire, _ = due(schedule("all"), 1000.0, 1000.0 + 86400, jumped=True)
    assert fire == [1000.0 + 86400]


def test_nothing_is_due_before_the_next_tick() -> None:
    assert due(schedule(), 1090.0, 1099.0) == ([], None)


def test_catching_up_after_a_year_does_not_walk_every_tick() -> None:
    every_second = schedule("once", when="every 1s")
    fire, _ = due(every_second, 0.0, 365 * 86400.0)  # would be 31 million ticks walked forwards
    assert fire == [365 * 86400.0]


def test_a_schedule_is_written_and_read_back() -> None:
    made = Schedule(
        name="nightly",
        timing=Timing("0 3 * * *", "Europe/Paris"),
        function="tasks.report",
        args=(1, "a"),
        kwargs={"n": 2},
        options=JobOptions(timeout=60, priority=5, metadata={"team": "ops"}),
        missed="all",
        cap=7,
        created=1795430400.0,
    )
    assert from_json(made.to_json()) == made


MAX_DEPTH = 64  # levels of JSON a manager reads in a queue's documents (docs/SECURITY.md)


def _nested(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = {"a": value}
    return value


def test_a_schedule_nested_as_deep_as_a_manager_reads_is_kept_and_listed(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    deepest = _nested(MAX_DEPTH - 3)  # the file, its "job", its "kwargs": three levels already
    queue.add_schedule(Schedule(name="deep", timing=Timing("every 30s"), function="f", kwargs={"d": deepest}))
    [listed] = queue.schedules()  # read back through the reader the sweeper uses
    assert listed.schedule.kwargs == {"d": deepest}


@pytest.mark.parametrize("where", ["args", "kwargs", "metadata"])
def test_a_schedule_nested_deeper_than_a_manager_reads_is_refused_when_made(where: str) -> None:
    """Its file would be skipped as unreadable, and no tick would ever fire: say so at once."""
    deep = _nested(MAX_DEPTH - 2)
    given = {
        "args": {"args": (deep,)},
        "kwargs": {"kwargs": {"d": deep}},
        "metadata": {"options": JobOptions(metadata={"d": deep})},
    }[where]
    with pytest.raises(InvalidJob, match=f"nest JSON more than {MAX_DEPTH} levels deep"):
        Schedule(name="deep", timing=Timing("every 30s"), function="f", **given)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ([], "JSON object"),
        ({"name": "x", "when": "every 1s"}, '"job"'),
        ({"name": "x", "when": "every 1s", "job": {"function": "f", "args": {}}}, "args"),
        ({"name": "../x", "when": "every 1s", "job": {"function": "f"}}, "not a name"),
        ({"name": "x", "when": "every 1s", "missed": "twice", "job": {"function": "f"}}, "skip, once or all"),
        ({"name": "x", "when": "every 1s", "job": {"function": "f", "timeout": -1}}, "timeout"),
        ({"format": 2, "name": "x", "when": "every 1s", "job": {"function": "f"}}, "newer forkvisor"),
    ],
)
def test_a_bad_schedule_file_says_what_is_wrong(document: object, says: str) -> None:
    with pytest.raises(InvalidJob, match=says):
        from_json(document)


def test_periodic_registers_the_function_and_declares_the_schedule() -> None:
    registry = Registry()

    @registry.periodic("0 3 * * *", tz="Europe/Paris", missed="skip", args=(1,))
    @registry.periodic("every 1h", name="hourly-report", args=(2,), timeout="5m")
    def report(n: int) -> None: ...

    @registry.job(schedule="every 30s")
    def ping() -> None: ...

    names = {s.name: s for s in registry.schedules}
    registered = {registry.get(name).fn: name for name in registry}
    assert set(names) == {"hourly-report", name_for(registered[report]), name_for(registered[ping])}
    assert "<" not in name_for(registered[ping]), "a default name is made safe"
    hourly = names["hourly-report"]
    assert hourly.function == registry.get(hourly.function).name
    assert hourly.args == (2,)
    assert registry.get(hourly.function).timeout == 300, "the policy is the registration's"
    assert all(s.source == "python" for s in registry.schedules)


def test_periodic_checks_its_arguments_and_names_at_declaration() -> None:
    registry = Registry()
    with pytest.raises(InvalidJob, match="not a duration"):
        registry.periodic("every day at noon")
    with pytest.raises(InvalidJob, match="not a cron expression"):
        registry.periodic("at noon")
    with pytest.raises(Exception, match="missing a required argument"):

        @registry.periodic("every 1h")
        def needs(n: int) -> None: ...

    @registry.periodic("every 1h", name="one")
    def first() -> None: ...

    with pytest.raises(InvalidJob, match="declared twice"):

        @registry.periodic("every 2h", name="one")
        def second() -> None: ...

    with pytest.raises(InvalidJob, match="registered already: give its policy"):

        @registry.periodic("every 2h", name="two", timeout=5)
        @registry.job
        def third() -> None: ...


def _take(values: object, count: int) -> list[float]:
    found = []
    for value in values:  # type: ignore[attr-defined]
        found.append(value)
        if len(found) == count:
            break
    return found
