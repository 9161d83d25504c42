"""The Python side of the same features: `Queue.result`, `Queue.wait` and
`Queue.enqueue_command`, against a real `forkvisor run` manager in the background."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs import (
    COMMAND,
    InvalidJob,
    InvalidJobId,
    JobFailed,
    JobNotFound,
    NotFinished,
    Queue,
    State,
    WaitTimeout,
)
from tests import sample_jobs
from tests.cli.conftest import FAST_RUN, stop_manager
from tests.processes import APP, APP_PATH, REPO, Processes, dump


@pytest.fixture
def queue(tmp_path: Path) -> Queue:
    found = Queue(tmp_path / "queue", create=True)
    found.configure(lease=3)
    return found


def test_result_returns_the_value_or_raises_why_not(procs: Processes, queue: Queue) -> None:
    later = queue.with_options(delay=3600).enqueue(sample_jobs.ok, "later")
    with pytest.raises(NotFinished, match="scheduled"):
        queue.result(later, wait=False)
    started = time.monotonic()
    with pytest.raises(WaitTimeout):
        queue.result(later, timeout=0.2)
    assert time.monotonic() - started < 3

    manager = procs.forkvisor("run", str(queue.path), *FAST_RUN, "--app", APP, *APP_PATH, name="manager")
    value_id = queue.enqueue(sample_jobs.ok, "api")
    dead_id = queue.enqueue(sample_jobs.cannot, "never possible")

    value = queue.result(value_id, wait=True, timeout=15)
    assert value["value"] == "api"
    assert value == queue.result(value_id, wait=False), "a done job's value, without waiting"
    with pytest.raises(JobFailed) as failed:
        queue.result(dead_id, timeout=15)
    assert failed.value.job_id == dead_id
    assert failed.value.error["reason"] == "cannot be completed"
    assert "never possible" in failed.value.error["message"]
    assert queue.job(later).state is State.SCHEDULED
    stop_manager(procs, manager)


def test_wait_returns_each_jobs_final_state(procs: Processes, queue: Queue) -> None:
    done_id = queue.enqueue(sample_jobs.ok, 1)
    dead_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.exit3)
    later = queue.with_options(delay=3600).enqueue(sample_jobs.ok, "later")
    with pytest.raises(JobNotFound):
        queue.wait(["20200101-000000-000000-0badc0de"], timeout=1)
    with pytest.raises(InvalidJobId):
        queue.wait(["not-an-id"], timeout=1)

    manager = procs.forkvisor("run", str(queue.path), *FAST_RUN, "--app", APP, *APP_PATH, name="manager")
    assert queue.wait([done_id, dead_id], timeout=15) == {done_id: State.DONE, dead_id: State.DEAD}
    assert queue.wait(done_id, timeout=1) == {done_id: State.DONE}, "one id as a string"
    started = time.monotonic()
    with pytest.raises(WaitTimeout):
        queue.wait([done_id, later], timeout=0.2)
    assert time.monotonic() - started < 3
    stop_manager(procs, manager)


def test_enqueue_command_runs_a_program(procs: Processes, queue: Queue, tmp_path: Path) -> None:
    script = 'echo "$GREETING from $(pwd)"; exit "$CODE"'
    succeeds = queue.enqueue_command(
        ["sh", "-c", script], cwd=str(tmp_path), env={"GREETING": "hello", "CODE": "0"}, priority=3, max_attempts=1
    )
    fails = queue.enqueue_command(["sh", "-c", script], env={"GREETING": "bye", "CODE": "4"}, max_attempts=1)
    spec = queue.job(succeeds).spec
    assert spec.function == COMMAND
    assert list(spec.args) == ["sh", "-c", script]
    assert dict(spec.kwargs) == {"cwd": str(tmp_path), "env": {"GREETING": "hello", "CODE": "0"}}
    assert spec.priority == 3
    assert spec.max_attempts == 1
    with pytest.raises(InvalidJob):
        queue.enqueue_command([])
    with pytest.raises(InvalidJob):
        queue.enqueue_command(["echo"], env={"A=B": "c"})

    manager = procs.forkvisor("run", str(queue.path), *FAST_RUN, name="manager")  # commands only
    assert queue.result(succeeds, timeout=15) is None, "a command job has no return value"
    found = queue.job(succeeds)
    assert (found.history[-1].path / "stdout").read_text() == f"hello from {tmp_path}\n", dump(found)
    with pytest.raises(JobFailed) as failed:
        queue.result(fails, timeout=15)
    assert failed.value.error["type"] == "CommandFailed"
    assert "exited 4" in failed.value.error["message"]
    found = queue.job(fails)
    assert (found.history[-1].path / "stdout").read_text() == f"bye from {REPO}\n", (
        "no cwd: the manager's folder (the repository root here), as documented"
    )
    stop_manager(procs, manager)
