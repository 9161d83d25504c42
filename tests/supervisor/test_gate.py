"""The gate (guarantee 3, issue 30): a durable manager forks a run's child before the run's
count is on disk; the child waits at its gate, and runs nothing, writes nothing into its
run's folder, until the manager has the count on disk. A count that cannot be put there
lets the child go without running: the claim lost to a sweep is not run, a disk that fails
gives the job back uncounted. (The order of the barriers under a power cut: the
crash-state tests; the checkpoints of the commit: tests/jobs_processes/test_crash_points.)"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import jobs
from jobs import Queue, State
from supervisor import forking
from tests.processes import Processes, dump, wait_until


def _child_at_gate(tmp_path: Path) -> tuple[int, forking.Gate, Path]:
    """A forked child that writes a file once it passes its gate, and exits 0 (71 if shut)."""
    gate, ran = forking.Gate(), tmp_path / "ran"

    def body() -> int:
        if not forking.pass_gate(gate.child_end):
            return forking.EXIT_ORPHANED
        ran.write_text("ran")
        return forking.EXIT_OK

    return forking.start_child(body, (), gate), gate, ran


def _waiting(pid: int) -> bool:
    """Blocked reading its gate (not merely not yet there)."""
    process = psutil.Process(pid)
    waits_in = Path(f"/proc/{pid}/wchan").read_text()  # (the kernel's name for it: pipe_read, anon_pipe_read)
    return process.status() == psutil.STATUS_SLEEPING and waits_in.endswith("pipe_read")


def test_a_child_runs_nothing_until_its_gate_opens(tmp_path: Path) -> None:
    pid, gate, ran = _child_at_gate(tmp_path)
    try:
        wait_until(lambda: _waiting(pid), 5, "the child waits at its gate")
        assert not ran.exists()
    finally:
        gate.open()
    status = forking.wait_for(pid, 5)
    assert status is not None
    assert status.code == forking.EXIT_OK
    assert ran.read_text() == "ran"


def test_a_shut_gate_lets_the_child_go_without_running(tmp_path: Path) -> None:
    pid, gate, ran = _child_at_gate(tmp_path)
    gate.shut()
    status = forking.wait_for(pid, 5)
    assert status is not None
    assert status.code == forking.EXIT_ORPHANED
    assert not ran.exists()


@pytest.fixture
def at_checkpoint() -> Iterator[dict[str, object]]:
    """Run `hooks[NAME]()` once, the first time checkpoint NAME is passed in this process."""
    hooks: dict[str, object] = {}

    def hook(name: str) -> None:
        action = hooks.pop(name, None)
        if callable(action):
            action()

    jobs.files.checkpoint_hook = hook
    yield hooks
    jobs.files.checkpoint_hook = None


def _runs(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_claim_taken_back_before_its_count_is_on_disk_is_not_run(
    procs: Processes, queue: Queue, tmp_path: Path, at_checkpoint: dict[str, object]
) -> None:
    """A sweep takes the job back while its child waits (here: between the count's fsync and
    its rename): the child is let go, the count is not moved, no run folder was made, and
    the job runs once, later."""
    log = tmp_path / "runs"
    job_id = queue.enqueue("sample.log_run", str(log))
    manager = procs.manager(queue)
    owner = manager.served[0].tenancy.name
    claimed, ready = queue.path / "claimed" / owner / job_id, queue.path / "ready" / f"100.{job_id}"
    taken: list[str] = []

    def take_back() -> None:
        taken.append(sorted(name for name in os.listdir(claimed) if name.startswith("attempt-")))
        os.rename(claimed, ready)

    at_checkpoint["count:synced"] = take_back
    wait_until(lambda: taken, 10, "the claim was taken back at the commit", manager=manager)
    assert taken == [[]], "no run folder before the count is in place"
    wait_until(lambda: queue.job(job_id).state is State.DONE, 20, "the job ran later", manager=manager)
    found = queue.job(job_id)
    assert _runs(log) == 1, dump(found)
    assert found.attempts == 1, dump(found)
    done = queue.path / "done" / job_id
    assert not (done / "attempt-1").exists(), "the run let go has no run folder (its staged one stays hidden)"
    assert (done / ".attempt-1").is_dir()
    run = done / "attempt-2"  # never the let-go run's number: its cgroup and its marks were that run's
    assert {"outcome.json", "pid", "stdout", "policy.json"} <= set(os.listdir(run)), "staged whole, policy too"
    assert json.loads((run / "outcome.json").read_text())["succeeded"] is True, dump(found)


def test_a_count_the_disk_cannot_take_gives_the_job_back_uncounted(
    procs: Processes, queue: Queue, tmp_path: Path, at_checkpoint: dict[str, object]
) -> None:
    """The staged count cannot be made durable (here a fifo stands where it was written:
    fsync refuses it): the child is let go without running, the job goes back with no
    attempt used, and runs once, later."""
    log = tmp_path / "runs"
    job_id = queue.enqueue("sample.log_run", str(log))
    manager = procs.manager(queue)
    owner = manager.served[0].tenancy.name
    staged = queue.path / "claimed" / owner / job_id / jobs.files.staging_name("attempts")

    def unsyncable() -> None:
        staged.unlink()
        os.mkfifo(staged)

    at_checkpoint["claim:counted"] = unsyncable
    wait_until(lambda: queue.job(job_id).state is State.DONE, 20, "the job ran after going back", manager=manager)
    found = queue.job(job_id)
    assert _runs(log) == 1, dump(found)
    assert found.attempts == 1, dump(found)
    assert "attempts" in os.listdir(queue.path / "done" / job_id)
    assert not stat.S_ISFIFO(os.lstat(queue.path / "done" / job_id / "attempts").st_mode)
    assert not (queue.path / "done" / job_id / "attempt-1").exists(), "the refused run left no run folder"


def test_a_manager_reaped_while_its_children_wait_at_their_gates_lets_them_go_once(
    procs: Processes, queue: Queue, tmp_path: Path, at_checkpoint: dict[str, object]
) -> None:
    """The chaos run's find: a manager stood still (SIGSTOP) between forking children at their
    gates and opening them, and a sweeper reaped it meanwhile. At its next claim it learns
    it was reaped and kills every run it had as lost, those at their gates too; their
    counts then find no place, and letting them go lost them a second time: the manager
    exited 101 ("cannot go from lost to lost"). Here the reaping happens at the first
    claim's count; the second claim finds the owner gone."""
    log = tmp_path / "runs"
    first, second = queue.enqueue("sample.log_run", str(log)), queue.enqueue("sample.log_run", str(log))
    manager = procs.manager(queue, concurrency=2)
    reaped: list[dict[str, int]] = []
    dead = lambda owner: False  # noqa: E731  # (a sweeper that finds the manager dead: a SIGSTOP long past its lease)
    at_checkpoint["claim:counted"] = lambda: reaped.append(Queue(queue.path).serving.sweep(time.time(), dead))
    wait_until(lambda: reaped, 10, "the manager was reaped at its first claim", manager=manager)
    # The job goes back through this sweep, or through the manager's own sweeper, which finishes
    # a reap it finds under way (`.reaping-OWNER`) and may take the job first on a loaded host.
    assert reaped[0]["expired"] == 1, reaped
    wait_until(lambda: queue.counts()["done"] == 2, 20, "both jobs ran, later", manager=manager)
    for job_id in (first, second):
        assert queue.job(job_id).attempts == 1, dump(queue.job(job_id))
    assert _runs(log) == 2, "each job ran once: the run let go at its gate ran nothing"
