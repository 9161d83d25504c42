"""Periodic jobs on a real manager whose clock is set (libfaketime) just before a
daylight-saving change in New York: a 02:30 job on the day clocks spring forward runs
at 03:00 EDT; a 01:30 job on the day they fall back runs once, at its first 01:30."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime

import pytest

from jobs import JobNotFound, Queue, Schedule, State, Timing
from jobs.ticks import secret, tick_job_id
from tests.faults.conftest import cli_manager, faketime
from tests.processes import Processes, forkvisor_command, wait_until


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("cron", "start", "tick", "then"),
    [
        # 2026-03-08 02:00 EST -> 03:00 EDT: 02:30 does not exist; it runs at 03:00 EDT (07:00 UTC)
        ("30 2 * * *", "2026-03-08 06:59:57", "2026-03-08T07:00:00", "2026-03-09 02:30:00-0400"),
        # 2026-11-01 02:00 EDT -> 01:00 EST: 01:30 happens twice; it runs at the first (05:30 UTC)
        ("30 1 * * *", "2026-11-01 05:29:57", "2026-11-01T05:30:00", "2026-11-02 01:30:00-0500"),
    ],
)
def test_a_daily_job_across_a_daylight_saving_change(
    procs: Processes, queue: Queue, cron: str, start: str, tick: str, then: str
) -> None:
    prefix = faketime(f"@{start}")
    made = Timing(cron, "America/New_York")
    queue.add_schedule(Schedule(name="daily", timing=made, function="fault.ok", args=("x",), created=utc(start) - 60))
    job_id = tick_job_id("daily", utc(tick), secret(queue.folder))
    with cli_manager(procs, queue, "--app", "tests.faults.fault_jobs:registry", prefix=prefix):
        wait_until(lambda: _state(queue, job_id) is State.DONE, 20, f"the job of the {tick} tick ran")
        shown = subprocess.run(
            [*prefix, *forkvisor_command(), "schedule", "show", str(queue.path), "daily"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert f"next tick:    {then}" in shown.stdout, shown.stdout + shown.stderr
    assert [job.id for job in queue.jobs(State.DONE)] == [job_id], "one job, for the one tick"


def _state(queue: Queue, job_id: str) -> State | None:
    try:
        return queue.job(job_id).state
    except JobNotFound:
        return None  # not fired yet
