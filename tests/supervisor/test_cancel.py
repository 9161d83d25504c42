"""A cluster's cancel is not a job's failure (issue 19).

Slurm's `scancel` (and a container runtime's stop) SIGTERMs every process of the
allocation, often the jobs' children before their manager. A child killed by a
SIGTERM its manager did not send is held for `CANCEL_WINDOW`: released (attempt
not counted) if the manager drains by then, a failed attempt otherwise; and the
manager starts nothing while it holds one. Real forks and real signals: the test
process is the manager's process, so a SIGTERM to it is the manager's own.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from jobs import Queue, State
from supervisor.outcomes import CANCEL_WINDOW
from tests import sample_jobs
from tests.processes import Processes, dump, launch, outcome, wait_until


@pytest.mark.parametrize("order", ["children-first", "manager-first"])
def test_a_cancel_that_kills_the_children_releases_them(
    procs: Processes, queue: Queue, barriers: Path, order: str
) -> None:
    ids = [queue.enqueue(sample_jobs.block, str(barriers / f"ready-{n}")) for n in range(2)]
    manager = procs.manager(queue)
    children = launch(manager, count=2)
    cancel = [*children, os.getpid()] if order == "children-first" else [os.getpid(), *children]
    for pid in cancel:  # what scancel does: SIGTERM to every process, deepest first
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: manager.finished(burst=False), 10, "the manager drained", manager=manager)
    for job_id in ids:
        found = queue.job(job_id)
        assert (found.state, found.attempts) == (State.READY, 0), dump(found)
        record = outcome(found)
        assert record["status"] == "killed by SIGTERM", record
        assert record["released"] is True, record


def test_a_child_killed_from_outside_without_a_cancel_fails_its_attempt(
    procs: Processes, queue: Queue, barriers: Path
) -> None:
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.block, str(barriers / "ready"))
    manager = procs.manager(queue)
    [child] = launch(manager)
    os.kill(child, signal.SIGTERM)
    killed, killed_wall = time.monotonic(), time.time()
    wait_until(lambda: queue.job(job_id).state is State.DEAD, 10, "the job was judged", manager=manager)
    assert time.monotonic() - killed >= CANCEL_WINDOW * 0.9  # held through the window first
    found = queue.job(job_id)
    assert found.attempts == 1, dump(found)
    assert outcome(found)["released"] is False
    assert outcome(found)["ended"] < killed_wall + CANCEL_WINDOW / 2  # when it died, not when it was judged


def test_the_manager_starts_nothing_while_a_cancel_may_be_under_way(
    procs: Processes, queue: Queue, barriers: Path
) -> None:
    first = queue.enqueue(sample_jobs.block, str(barriers / "first"))
    second = queue.enqueue(sample_jobs.block, str(barriers / "second"))
    manager = procs.manager(queue, concurrency=1)
    [child] = launch(manager)
    os.kill(child, signal.SIGTERM)
    wait_until(lambda: not manager.running, 5, "the manager reaped the killed child", manager=manager)
    started = time.monotonic()
    while time.monotonic() - started < CANCEL_WINDOW / 2:  # inside the window: nothing starts
        manager.step(timeout=0.05)
        assert not manager.running, "a job started while a cancel might be under way"
    assert queue.job(second).state is State.READY
    wait_until(lambda: manager.running, 10, "the next job started after the window", manager=manager)
    assert queue.job(first).attempts == 1  # no cancel came: the killed run counted
