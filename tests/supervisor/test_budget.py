"""`--max-jobs` and `--max-runtime` (issue 19): a manager that has spent its budget
drains and exits 0, leaving the rest of the queue as it is."""

from __future__ import annotations

import time
from pathlib import Path

from jobs import Queue, State
from tests import sample_jobs
from tests.processes import Processes, dump


def test_max_jobs_starts_that_many_then_drains(procs: Processes, queue: Queue) -> None:
    ids = [queue.enqueue(sample_jobs.ok, n) for n in range(5)]
    manager = procs.manager(queue, start=False, max_jobs=3)
    assert manager.run() == 0  # not --burst: only the budget ends it
    states = [queue.job(job_id).state for job_id in ids]
    assert states.count(State.DONE) == 3, states
    assert states.count(State.READY) == 2, states
    assert all(queue.job(job_id).attempts == 0 for job_id in ids if queue.job(job_id).state is State.READY)


def test_max_runtime_drains_and_running_jobs_go_back_unspent(procs: Processes, queue: Queue, barriers: Path) -> None:
    job_id = queue.enqueue(sample_jobs.block, str(barriers / "ready"))
    manager = procs.manager(queue, start=False, max_runtime=0.5, drain_timeout=0.3, kill_grace=0.3)
    started = time.monotonic()
    assert manager.run() == 0
    assert time.monotonic() - started >= 0.5
    found = queue.job(job_id)
    assert (found.state, found.attempts) == (State.READY, 0), dump(found)
