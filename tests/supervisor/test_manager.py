"""The manager's loop, driven step by step in this process: the concurrency cap,
the sweeper child, a claim a sweeper takes back, process titles, draining."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from jobs import Queue, State
from jobs.lease import OWNER_FILE
from tests import sample_jobs
from tests.processes import (
    Processes,
    cmdline,
    dump,
    error_json,
    is_gone,
    launch,
    outcome,
    read_pid,
    settle,
    wait_until,
)


def test_concurrency_cap_is_never_exceeded(procs: Processes, queue: Queue, barriers: Path) -> None:
    live, release = barriers / "live", barriers / "release"
    live.mkdir()
    release.mkdir()
    ids = [queue.enqueue(sample_jobs.count_live, str(live), str(release)) for _ in range(12)]
    manager = procs.manager(queue, concurrency=3)

    peak = 0
    released: set[str] = set()

    def all_done() -> bool:
        nonlocal peak
        running = len(manager.running)
        children = os.listdir(live)
        assert running <= 3, f"{running} jobs running at once: {manager.status_line()}"
        assert len(children) <= 3, f"{len(children)} children live at once: {children}"
        peak = max(peak, len(children))
        if len(children) == 3 or (children and queue.counts()["ready"] == 0):
            # a full house (or the last ones): let them finish
            for pid in set(children) - released:
                (release / pid).touch()
                released.add(pid)
        return queue.counts()["done"] == 12 and not manager.running

    # Hold the first three until a few more turns of the loop have passed: no fourth may start.
    wait_until(lambda: len(os.listdir(live)) == 3, 5, "three children were live", manager=manager)
    for _ in range(5):
        manager.step(timeout=0.02)
        assert len(manager.running) == 3
    assert queue.counts()["ready"] == 9
    wait_until(all_done, 20, "all 12 jobs were done", manager=manager)

    assert peak == 3
    seen = [queue.job(job_id).result for job_id in ids]
    assert max(seen) == 3, seen
    assert all(1 <= count <= 3 for count in seen), seen


def test_waiting_is_event_driven(procs: Processes, queue: Queue) -> None:
    """With every timer far away, a new job and a child's exit still wake the manager at once."""
    manager = procs.manager(queue, lease=90.0, sweep_interval=60.0, poll_interval=60.0)
    manager.step(timeout=0)  # the first heartbeat and poll are behind us
    started = time.monotonic()
    manager.step(timeout=0.05)
    assert time.monotonic() - started >= 0.04, "with nothing to do, step() should have waited its timeout"

    job_id = queue.enqueue(sample_jobs.ok, "wake up")
    started = time.monotonic()
    manager.step(timeout=30)
    assert len(manager.running) == 1, "the new job did not wake the manager"
    manager.step(timeout=30)  # the child's exit (SIGCHLD on the wakeup pipe) ends this wait
    if manager.running:
        manager.step(timeout=30)
    assert not manager.running
    assert time.monotonic() - started < 5, "the manager slept through an event"
    assert queue.job(job_id).state is State.DONE


def test_jobs_start_in_priority_order(procs: Processes, queue: Queue) -> None:
    ids = {
        priority: queue.with_options(priority=priority).enqueue(sample_jobs.ok, priority) for priority in (0, 10, -5)
    }
    manager = procs.manager(queue, concurrency=1)
    settle(manager, queue, list(ids.values()))

    started = {priority: outcome(queue.job(job_id))["started"] for priority, job_id in ids.items()}
    assert sorted(started, key=started.__getitem__) == [10, 0, -5]


def test_sweeper_is_restarted_after_sigkill(procs: Processes, queue: Queue) -> None:
    manager = procs.manager(queue)
    first = manager.sweeper_pid
    assert first is not None
    wait_until(lambda: "forkvisor: sweeper" in cmdline(first), 5, "the sweeper set its title")

    os.kill(first, signal.SIGKILL)
    wait_until(
        lambda: manager.sweeper_pid not in (None, first),
        5,
        f"the manager started a new sweeper after SIGKILL of pid {first}",
        manager=manager,
    )
    second = manager.sweeper_pid
    assert second is not None
    assert is_gone(first)
    wait_until(lambda: "forkvisor: sweeper" in cmdline(second), 5, "the new sweeper set its title")

    # The new sweeper sweeps: a job due now in scheduled/ gets promoted without the manager's help.
    job_id = queue.with_options(delay=0.2).enqueue(sample_jobs.ok, "late")
    settle(manager, queue, [job_id])
    assert queue.job(job_id).state is State.DONE


def test_titles_name_the_manager_and_the_job(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    queue.enqueue(sample_jobs.block, str(ready))
    manager = procs.manager(queue)
    [pid] = launch(manager)
    wait_until(ready.exists, 5, "the blocking job wrote its ready file")

    title = cmdline(pid)
    assert "forkvisor: job" in title
    assert "sample.block" in title
    assert "attempt 1/3" in title
    assert "forkvisor: manager" in cmdline(os.getpid())
    busy = lambda: "1/2 busy" in cmdline(os.getpid())  # noqa: E731
    wait_until(busy, 5, "the title showed the busy count (updated at most once a second)", manager=manager)


def test_stale_owner_stops_its_child_and_never_completes(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready, release = barriers / "ready", barriers / "release"
    job_id = queue.enqueue(sample_jobs.wait_release, str(ready), str(release))
    manager = procs.manager(queue, concurrency=1, lease=3.0)
    [stale_pid] = launch(manager)
    wait_until(ready.exists, 5, "the job wrote its ready file")
    old_owner = manager.owner.name

    # Another host's sweeper judges this owner dead and takes its claim back.
    now = queue.serving.filesystem_now() + 3.0 + 1
    swept = queue.serving.sweep(now, lambda owner: False if owner.name == old_owner else None)
    assert swept["reverted"] == 1
    assert queue.job(job_id).state is State.READY

    wait_until(lambda: is_gone(stale_pid), 5, f"the manager stopped stale child pid {stale_pid}", manager=manager)
    wait_until(lambda: stale_pid not in manager.running, 5, "the stale child was reaped", manager=manager)
    assert manager.owner.name != old_owner
    claimed = queue.path / "claimed"
    assert not (claimed / old_owner).exists()
    assert (claimed / manager.owner.name / OWNER_FILE).is_file()

    # The job runs again under the new owner; release it and it completes once.
    wait_until(
        lambda: ready.exists() and read_pid(ready) != stale_pid, 5, "the job's second run started", manager=manager
    )
    release.touch()
    settle(manager, queue, [job_id])
    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 2
    first, second = found.history
    assert first.outcome is not None
    assert first.outcome.get("lost") is True
    assert not (first.path / "result.json").exists()
    assert second.outcome is not None
    assert second.outcome["succeeded"] is True
    assert second.outcome["pid"] == read_pid(ready)
    assert f"run 1 by {old_owner} killed by SIGKILL after its claim was lost" in (found.path / "events").read_text()


def test_stale_owner_cannot_complete_a_job_that_finished_after_the_sweep(
    procs: Processes, queue: Queue, barriers: Path
) -> None:
    ready, release = barriers / "ready", barriers / "release"
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.wait_release, str(ready), str(release))
    manager = procs.manager(queue, concurrency=1)
    [stale_pid] = launch(manager)
    wait_until(ready.exists, 5, "the job wrote its ready file")
    old_owner = manager.owner.name

    queue.serving.sweep(
        queue.serving.filesystem_now() + 3.0 + 1, lambda owner: False if owner.name == old_owner else None
    )
    assert queue.job(job_id).state is State.DEAD  # its only attempt was lost
    # Let the stale child finish successfully before the manager notices anything.
    release.touch()
    wait_until(lambda: stale_pid not in manager.running, 5, "the stale child was reaped", manager=manager)
    wait_until(lambda: manager.owner.name != old_owner, 5, "the manager registered anew", manager=manager)

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    assert state_is_empty(queue, State.DONE)
    assert not (found.path / "result.json").exists()


def state_is_empty(queue: Queue, state: State) -> bool:
    return not os.listdir(queue.path / state.value)


def test_drain_releases_running_jobs_without_using_an_attempt(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    running = queue.enqueue(sample_jobs.ignore_term_block, str(ready))
    waiting = queue.enqueue(sample_jobs.ok, "never claimed")
    manager = procs.manager(queue, concurrency=1, drain_timeout=0.2, kill_grace=0.2)
    [pid] = launch(manager)
    wait_until(ready.exists, 5, "the blocking job wrote its ready file")

    manager.request_drain("test")
    wait_until(lambda: manager.finished(burst=False), 5, "the drained manager was finished", manager=manager)
    manager.close()

    found = queue.job(running)
    assert found.state is State.READY, dump(found)
    assert found.attempts == 0
    record = outcome(found)
    assert record["released"] is True
    assert record["limit"] == "drain"
    assert record["status"] == "killed by SIGKILL"
    assert record["pid"] == pid
    assert not found.history[0].counted
    assert queue.job(waiting).state is State.READY
    assert queue.job(waiting).attempts == 0
    assert os.listdir(queue.path / "claimed") == []


def test_cancelling_a_running_job_stops_it_and_buries_it(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    job_id = queue.enqueue(sample_jobs.block, str(ready))
    manager = procs.manager(queue, lease=1.5, sweep_interval=0.5)
    [pid] = launch(manager)
    wait_until(ready.exists, 5, "the blocking job wrote its ready file")

    assert queue.cancel(job_id) is State.CLAIMED
    settle(manager, queue, [job_id])
    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 1
    record = outcome(found)
    assert record["limit"] == "cancelled"
    assert record["pid"] == pid
    assert record["status"] == "killed by SIGTERM"
    assert "cancelled by an operator" in error_json(found)["message"]


def test_close_after_the_owner_was_reaped_finishes_cleanly(procs: Processes, queue: Queue) -> None:
    manager = procs.manager(queue)
    old_owner = manager.owner.name
    queue.serving.sweep(
        queue.serving.filesystem_now() + 3.0 + 1, lambda owner: False if owner.name == old_owner else None
    )
    assert not (queue.path / "claimed" / old_owner).exists()
    try:
        manager.close()
    except FileNotFoundError:
        queue.serving.register_owner(manager.owner)  # so that the fixture's close() can finish the job
        raise
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert os.listdir(queue.path / "claimed") == []


def test_no_busy_loop_between_sigterm_and_sigkill_of_a_timeout(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    queue.with_options(timeout=0.2).enqueue(sample_jobs.ignore_term_block, str(ready))
    manager = procs.manager(queue, kill_grace=1.0)
    wait_until(
        lambda: any(r.stopped for r in manager.running.values()), 10, "the timeout stopped the job", manager=manager
    )
    cpu = time.process_time()
    while manager.running:
        manager.step(timeout=None)
    cpu = time.process_time() - cpu
    assert cpu < 0.5, f"the manager spun for {cpu:.2f}s of CPU during a 1 s grace period"


def test_no_busy_loop_after_the_drain_timeout(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    queue.enqueue(sample_jobs.ignore_term_block, str(ready))
    manager = procs.manager(queue, kill_grace=1.0, drain_timeout=0.1)
    wait_until(ready.exists, 10, "the job started", manager=manager)
    manager.request_drain("test")
    manager.request_drain("a second request must not push the deadline out")
    stopped = lambda: any(r.stopped for r in manager.running.values())  # noqa: E731
    wait_until(stopped, 10, "the drain stopped the job", manager=manager)
    cpu = time.process_time()
    while manager.running:
        manager.step(timeout=None)
    cpu = time.process_time() - cpu
    assert cpu < 0.5, f"the manager spun for {cpu:.2f}s of CPU during a 1 s grace period"


def test_own_retries_are_promoted_by_name_without_sweeping_scheduled(procs: Processes, queue: Queue) -> None:
    first_junk = queue.path / "scheduled" / "junk-1"
    first_junk.write_text("not a job")  # before the start: the sweeper's first sweep must see it
    manager = procs.manager(queue, lease=90.0, sweep_interval=60.0)
    wait_until(lambda: not first_junk.exists(), 10, "the sweeper's first sweep", manager=manager)
    second_junk = queue.path / "scheduled" / "junk-2"
    second_junk.write_text("not a job")  # the next sweep is a minute away
    job_id = queue.enqueue(sample_jobs.fail, "twice")  # 2 attempts, 0.1 s apart
    wait_until(lambda: queue.job(job_id).state is State.DEAD, 10, "both attempts ran", manager=manager)
    assert queue.job(job_id).attempts == 2
    assert second_junk.exists(), "promoting the retry listed (and swept) all of scheduled/"
