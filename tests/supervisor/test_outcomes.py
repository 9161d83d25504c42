"""How one attempt ends, and what the manager records about it.

A manager runs in this process and is driven step by step; each job runs in
a real forked child. Every ending (success, exception, hard exit, signal,
cannot complete, bad input) must leave the job in the right folder with an
outcome.json that says why.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import psutil
import pytest

from jobs import Queue, State
from tests import sample_jobs
from tests.processes import (
    Processes,
    dump,
    error_json,
    is_gone,
    launch,
    outcome,
    pids_in,
    read_pid,
    settle,
    wait_until,
)


def test_success_lands_in_done_with_result_and_outcome(procs: Processes, queue: Queue) -> None:
    job_id = queue.enqueue(sample_jobs.ok, "hello")
    manager = procs.manager(queue)
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 1
    assert found.result["value"] == "hello"
    assert (found.path / "result.json").is_file()
    assert [a.number for a in found.history] == [1]
    record = outcome(found)
    assert record["status"] == "exited 0"
    assert record["exit_code"] == 0
    assert record["signal"] is None
    assert record["limit"] is None
    assert record["released"] is False
    assert record["succeeded"] is True
    assert record["error"] is None
    assert record["pid"] == found.result["pid"]
    assert record["host"] == socket.gethostname()
    assert record["max_rss_kb"] > 0
    assert record["wall_time"] >= 0
    assert "sample.ok running with 'hello'" in (found.history[0].path / "stdout").read_text()
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 1,
        "dead": 0,
    }


def test_exception_is_retried_then_dead_with_every_cause(procs: Processes, queue: Queue) -> None:
    # sample.fail: max_attempts=2, retry after 0.1 s
    job_id = queue.enqueue(sample_jobs.fail, "the disk is on fire")
    manager = procs.manager(queue)
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 2
    assert [a.number for a in found.history] == [1, 2]
    for attempt in found.history:
        record = attempt.outcome
        assert record is not None, f"attempt {attempt.number} has no outcome: {dump(found)}"
        assert record["status"] == "exited 1"
        assert record["exit_code"] == 1
        assert record["succeeded"] is False
        assert record["error"]["type"] == "ValueError"
        assert record["error"]["message"] == "the disk is on fire"
        assert "the disk is on fire" in record["error"]["traceback"]
        assert "def fail" in record["error"]["traceback"] or "raise ValueError" in record["error"]["traceback"]
    error = error_json(found)
    assert error["reason"] == "attempts exhausted"
    assert error["attempt"] == 2
    assert error["message"] == "the disk is on fire"
    assert "Traceback" in error["traceback"]
    assert "failed: attempt 1/2" in (found.path / "events").read_text()


def test_hard_exit_is_recorded_as_exited_3(procs: Processes, queue: Queue) -> None:
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.exit3)
    manager = procs.manager(queue)
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 1
    record = outcome(found)
    assert record["status"] == "exited 3"
    assert record["exit_code"] == 3
    assert record["signal"] is None
    assert record["error"]["type"] == "Crashed"
    assert "exited 3" in error_json(found)["message"]


def test_segfault_is_recorded_as_killed_by_sigsegv(procs: Processes, queue: Queue) -> None:
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.segv)
    manager = procs.manager(queue)
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    record = outcome(found)
    assert record["status"] == "killed by SIGSEGV"
    assert record["signal"] == "SIGSEGV"
    assert record["exit_code"] is None
    # faulthandler's report starts with "Segmentation fault"; how much of it fits
    # in the tail depends on the stack's file paths, so check the file and that
    # the tail is its end.
    stderr = (found.history[-1].path / "stderr").read_text()
    assert "Segmentation fault" in stderr
    assert record["stderr_tail"]
    assert stderr.endswith(record["stderr_tail"])
    assert "killed by SIGSEGV" in error_json(found)["message"]


def test_cannot_complete_goes_dead_at_once(procs: Processes, queue: Queue) -> None:
    job_id = queue.with_options(max_attempts=5).enqueue(sample_jobs.cannot, "the account was closed")
    manager = procs.manager(queue)
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 1
    assert len(found.history) == 1
    assert outcome(found)["exit_code"] == 100
    error = error_json(found)
    assert error["reason"] == "cannot be completed"
    assert error["message"] == "the account was closed"


def test_a_function_the_manager_does_not_know_is_left_ready_and_the_manager_carries_on(
    procs: Processes, queue: Queue
) -> None:
    """Another manager (or this one after a deploy) may know it: the job is never destroyed."""
    unknown = queue.enqueue("sample.no_such_function", 1)
    fine = queue.enqueue(sample_jobs.ok, 2)
    manager = procs.manager(queue)
    settle(manager, queue, [fine])

    found = queue.job(unknown)
    assert found.state is State.READY, dump(found)
    assert (found.attempts, found.history) == (0, ())
    assert queue.job(fine).state is State.DONE


@pytest.mark.parametrize(
    ("how", "state", "status", "error_type"),
    [
        ("0", State.DONE, "exited 0", None),
        ("5", State.DEAD, "exited 5", "SystemExit"),
        ("interrupt", State.DEAD, "exited 1", "KeyboardInterrupt"),
    ],
)
def test_sys_exit_and_interrupts_end_the_child_not_the_manager(
    procs: Processes, queue: Queue, how: str, state: State, status: str, error_type: str | None
) -> None:
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.exit_with, how)
    manager = procs.manager(queue)
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is state, dump(found)
    record = outcome(found)
    assert record["status"] == status
    assert (record["error"] or {}).get("type") == error_type


def test_return_value_that_is_not_json_fails_the_attempt_clearly(procs: Processes, queue: Queue) -> None:
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.bad_return)
    manager = procs.manager(queue)
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    record = outcome(found)
    assert record["status"] == "exited 1"
    assert record["succeeded"] is False
    assert record["error"]["type"] == "TypeError"
    assert "cannot be encoded as JSON" in record["error"]["message"]
    assert "return plain data" in record["error"]["message"]
    assert not (found.history[0].path / "result.json").exists()


@pytest.mark.parametrize(
    ("max_attempts", "then"),
    [(3, {State.SCHEDULED, State.READY}), (1, {State.DEAD})],
    ids=["to-be-retried", "last-attempt"],
)
def test_sigkilled_child_uses_one_attempt(
    procs: Processes, queue: Queue, barriers: Path, max_attempts: int, then: set[State]
) -> None:
    ready = barriers / "ready"
    job_id = queue.with_options(max_attempts=max_attempts).enqueue(sample_jobs.block, str(ready))
    manager = procs.manager(queue)
    [pid] = launch(manager)
    wait_until(ready.exists, 5, "the blocking job wrote its ready file")
    assert read_pid(ready) == pid

    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: pid not in manager.running, 5, f"the manager reaped pid {pid}", manager=manager)

    found = queue.job(job_id)
    assert found.state in then, dump(found)
    assert found.attempts == 1
    record = outcome(found)
    assert record["status"] == "killed by SIGKILL"
    assert record["signal"] == "SIGKILL"
    assert record["limit"] is None
    assert record["pid"] == pid
    if found.state is State.DEAD:
        assert "killed by SIGKILL" in error_json(found)["message"]


def test_timeout_of_a_job_that_ignores_sigterm_ends_in_sigkill(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    job_id = queue.with_options(max_attempts=1, timeout=0.3).enqueue(sample_jobs.ignore_term_block, str(ready))
    manager = procs.manager(queue, kill_grace=0.3)
    launch(manager)
    # The manager only acts when stepped: this wait cannot let the timeout fire
    # before the job has set SIGTERM to ignored.
    wait_until(ready.exists, 5, "the job ignoring SIGTERM wrote its ready file")
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    record = outcome(found)
    assert record["limit"] == "timeout"
    assert record["status"] == "killed by SIGKILL"
    assert record["error"]["type"] == "Timeout"
    assert record["wall_time"] >= 0.3 + 0.3 - 0.05
    assert "timeout" in error_json(found)["message"]


@pytest.mark.parametrize(
    ("grandchildren_ignore_term", "child_ignores_term", "leave_group"),
    [
        pytest.param(False, False, True, id="setsid-all-obey-sigterm"),
        pytest.param(True, True, True, id="setsid-all-ignore-sigterm"),
        pytest.param(True, False, True, id="setsid-only-grandchildren-ignore-sigterm"),
        pytest.param(True, False, False, id="same-group-only-grandchildren-ignore-sigterm"),
    ],
)
def test_timeout_kills_every_grandchild(
    procs: Processes,
    queue: Queue,
    barriers: Path,
    grandchildren_ignore_term: bool,
    child_ignores_term: bool,
    leave_group: bool,
) -> None:
    pids_file = barriers / "grandchildren"
    job_id = queue.with_options(max_attempts=1, timeout=0.3).enqueue(
        sample_jobs.grandchildren, str(pids_file), grandchildren_ignore_term, child_ignores_term, leave_group
    )
    manager = procs.manager(queue, kill_grace=0.3)
    [child] = launch(manager)
    wait_until(pids_file.exists, 5, "the job wrote its grandchildren's pids")
    grandchildren = [psutil.Process(pid) for pid in pids_in(pids_file)]
    try:
        assert len(grandchildren) == 2
        in_own_session = [os.getsid(p.pid) == p.pid for p in grandchildren]
        assert in_own_session == [leave_group, leave_group]
        settle(manager, queue, [job_id])

        assert outcome(queue.job(job_id))["limit"] == "timeout"
        wait_until(
            lambda: all(is_gone(p.pid) for p in grandchildren),
            2,
            f"grandchildren {[p.pid for p in grandchildren]} of job pid {child} were gone",
            manager=manager,
        )
    finally:
        for process in grandchildren:  # on failure, end them here rather than as teardown leftovers
            try:
                process.kill()
            except psutil.Error:
                pass  # gone already, as it should be


def test_memory_limit_stops_the_job(procs: Processes, queue: Queue, barriers: Path) -> None:
    """Where no memory controller is the manager's, it watches the tree's RSS (the kernel's
    limit, where there is one: tests/supervisor/test_run_cost.py)."""
    ready = barriers / "ready"
    # A forked child's RSS starts with the pages it shares with this process.
    limit = psutil.Process().memory_info().rss + (64 << 20)
    job_id = queue.with_options(max_attempts=1, memory_limit=limit).enqueue(sample_jobs.hog, str(ready), 256)
    manager = procs.manager(queue, memory_poll=0.05, containment="processes")
    launch(manager)
    wait_until(ready.exists, 10, "the memory hog allocated its memory")
    settle(manager, queue, [job_id])

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    record = outcome(found)
    assert record["limit"] == "memory"
    assert record["status"] in ("killed by SIGTERM", "killed by SIGKILL")
    assert record["error"]["type"] == "MemoryLimit"
    assert record["max_rss_kb"] * 1024 > limit


def test_job_output_reaches_the_attempt_folder_when_the_host_replaced_sys_streams(
    procs: Processes, queue: Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A program embedding a Manager may have replaced sys.stdout / sys.stderr
    # (a log file, Jupyter, pytest's capture). Pin that down instead of relying
    # on how pytest was invoked.
    host_out = open(tmp_path / "host-stdout", "w")  # noqa: SIM115  # closed below
    host_err = open(tmp_path / "host-stderr", "w")  # noqa: SIM115  # closed below
    monkeypatch.setattr(sys, "stdout", host_out)
    monkeypatch.setattr(sys, "stderr", host_err)
    try:
        job_id = queue.enqueue(sample_jobs.print_and_fail, "tea")
        manager = procs.manager(queue)
        settle(manager, queue, [job_id])
    finally:
        monkeypatch.undo()
        host_out.close()
        host_err.close()

    found = queue.job(job_id)
    assert "stdout says tea" in (found.history[0].path / "stdout").read_text()
    assert "failing after printing tea" in outcome(found)["stderr_tail"]


def test_job_output_reaches_the_attempt_folder_when_the_manager_has_no_stdout(procs: Processes, queue: Queue) -> None:
    # Started with fd 1 closed, the child's open() of its stdout file returns fd 1 itself,
    # which must stay open rather than be "moved" onto itself and closed.
    job_id = queue.enqueue(sample_jobs.print_and_fail, "coffee")
    manager = procs.run_manager(queue, "--burst", prefix=["sh", "-c", 'exec "$@" >&-', "sh"])
    assert procs.wait_exit(manager, 60, "a manager started without stdout") == 0, procs.log(manager)
    found = queue.job(job_id)
    assert "stdout says coffee" in (found.history[0].path / "stdout").read_text()
    assert "failing after printing coffee" in outcome(found)["stderr_tail"]
