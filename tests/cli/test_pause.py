"""`forkvisor pause` and `resume` (issue 19): every manager of the queue, on any host,
starts no job (or no job of some functions) until resumed; running jobs finish."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs import State
from tests.cli.conftest import FAST_RUN, burst, cli, counts, enqueue, job, new_queue, ok, refused, stop_manager
from tests.processes import APP, APP_PATH, Processes, wait_until


def held_back(queue: Path, job_id: str, seconds: float) -> None:
    """The job stays ready for `seconds` (several of the manager's polls: it would have run)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert job(queue, job_id).state is State.READY, "a paused job ran"
        time.sleep(0.05)  # watching that nothing happens: a duration, not a synchronisation


def test_pause_and_resume_everything(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    manager = procs.forkvisor("run", str(queue), "--app", APP, *APP_PATH, *FAST_RUN)
    first = enqueue(queue, "sample.ok")
    wait_until(lambda: job(queue, first).state is State.DONE, 20, "the manager ran a job")
    assert "paused in" in ok("pause", queue).out
    wait_until(lambda: "paused: everything" in procs.log(manager), 10, "the manager saw the pause")
    waiting = enqueue(queue, "sample.ok")
    held_back(queue, waiting, 1.0)
    assert "PAUSED: everything" in ok("status", queue).out
    assert "nothing is paused" in ok("resume", queue).out
    wait_until(lambda: job(queue, waiting).state is State.DONE, 20, "the job ran once resumed")
    assert "PAUSED" not in ok("status", queue).out
    stop_manager(procs, manager)


@pytest.mark.slow
def test_pause_one_function_lets_the_others_run(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    assert "sample.ok" in ok("pause", queue, "--function", "sample.ok").out
    manager = procs.forkvisor("run", str(queue), "--app", APP, *APP_PATH, *FAST_RUN)
    paused = enqueue(queue, "sample.ok")
    other = enqueue(queue, "sample.cannot")
    wait_until(lambda: job(queue, other).state is State.DEAD, 20, "the other function's job ran")
    held_back(queue, paused, 1.0)
    assert "leaving jobs of sample.ok" not in procs.log(manager)  # paused, not left for other managers
    ok("resume", queue, "--function", "sample.ok")
    wait_until(lambda: job(queue, paused).state is State.DONE, 20, "the job ran once its function was resumed")
    assert counts(queue)["ready"] == 0
    stop_manager(procs, manager)


def test_resuming_one_function_of_a_whole_pause_is_refused(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    ok("pause", queue)
    refused(cli("resume", queue, "--function", "sample.ok"), 2, "everything is paused")


def test_a_burst_manager_leaves_a_paused_queue_as_it_is(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    waiting = enqueue(queue, "sample.ok")
    ok("pause", queue)
    result = burst(queue)  # exits 0: nothing it may run is left
    assert "left the paused jobs ready" in result.err, result
    assert job(queue, waiting).state is State.READY
    assert job(queue, waiting).attempts == 0
