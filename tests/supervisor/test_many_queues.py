"""One manager, several queues (issue 19): claimed from in the order given, under one
concurrency cap (and a cap per queue where asked), each queue with its own owner
folder, sweeper, settings and pause; a drain of any of them drains the manager;
a SIGKILL mid-work loses nothing in any of them."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from jobs import QUEUE_DEFAULTS, Queue, State, command_call
from supervisor import ConfigError, Manager
from tests import sample_jobs
from tests.processes import APP, APP_PATH, FAST_CLI, Processes, cmdline, dump, is_gone, outcome, settle, wait_until


@pytest.fixture
def low(tmp_path: Path) -> Queue:
    """A second queue beside the `queue` fixture."""
    return Queue(tmp_path / "low", create=True)


def test_queues_are_claimed_from_in_the_order_given(procs: Processes, queue: Queue, low: Queue) -> None:
    low_ids = [low.enqueue(sample_jobs.ok, n) for n in range(3)]  # first in time, last in order
    high_ids = [queue.enqueue(sample_jobs.ok, n) for n in range(3)]
    manager = procs.manager([queue, low], concurrency=1)
    settle(manager, low, low_ids)
    settle(manager, queue, high_ids)

    high = max(outcome(queue.job(job_id))["started"] for job_id in high_ids)
    first_low = min(outcome(low.job(job_id))["started"] for job_id in low_ids)
    assert high < first_low, "a job of the second queue started while the first had one ready"


def test_one_concurrency_cap_across_the_queues_and_a_cap_for_one(
    procs: Processes, queue: Queue, low: Queue, barriers: Path
) -> None:
    live, release = barriers / "live", barriers / "release"
    live.mkdir()
    release.mkdir()
    high_ids = [queue.enqueue(sample_jobs.count_live, str(live), str(release)) for _ in range(4)]
    low_ids = [low.enqueue(sample_jobs.count_live, str(live), str(release)) for _ in range(4)]
    manager = procs.manager([queue, low], concurrency=3, queue_concurrency={queue.path: 1})

    def from_each() -> tuple[int, int]:
        indexes = [running.queue for running in manager.running.values()]
        return indexes.count(0), indexes.count(1)

    wait_until(lambda: len(os.listdir(live)) == 3, 5, "three children were live", manager=manager)
    for _ in range(5):  # a few more turns: the first queue's cap holds although it has jobs ready
        manager.step(timeout=0.02)
        assert from_each() == (1, 2), manager.status_line()

    def all_done() -> bool:
        high, lows = from_each()
        assert high <= 1, manager.status_line()
        assert high + lows <= 3, manager.status_line()
        for pid in os.listdir(live):
            (release / pid).touch()
        return not manager.running and low.counts()["done"] == 4 and queue.counts()["done"] == 4

    wait_until(all_done, 20, "all eight jobs were done", manager=manager)
    assert all(queue.job(job_id).result <= 3 for job_id in high_ids)
    assert all(low.job(job_id).result <= 3 for job_id in low_ids)


def test_each_queue_has_its_own_owner_sweeper_and_rules(procs: Processes, queue: Queue, tmp_path: Path) -> None:
    shared = Queue(tmp_path / "shared", create=True, shared=True)
    queue.configure(lease=4)
    private_id = queue.enqueue_many([command_call(["true"])])[0]
    shared_id = shared.enqueue_many([command_call(["true"])])[0]
    manager = procs.manager([queue, shared], lease=None)  # each queue's own lease
    settle(manager, queue, [private_id])

    assert [served.settings.commands for served in manager.served] == [True, False]
    assert [served.tenancy.lease for served in manager.served] == [4, QUEUE_DEFAULTS["lease"]]
    assert shared.job(shared_id).state is State.READY, "a shared queue's command job ran as the manager's user"
    owners = [served.tenancy.name for served in manager.served]
    assert os.listdir(queue.path / "claimed") == [owners[0]]
    assert os.listdir(shared.path / "claimed") == [owners[1]]
    sweepers = [served.sweeper.pid for served in manager.served]
    assert None not in sweepers
    assert len(set(sweepers)) == 2
    assert all(f"sweeper {path}" in cmdline(pid) for pid, path in zip(sweepers, (queue.path, shared.path), strict=True))

    os.kill(sweepers[1], signal.SIGKILL)  # the second queue's sweeper comes back, the first's is untouched
    wait_until(lambda: manager.served[1].sweeper.pid not in (None, sweepers[1]), 10, "restarted", manager=manager)
    assert manager.served[0].sweeper.pid == sweepers[0]


def test_a_paused_queue_leaves_its_slots_to_the_others(procs: Processes, queue: Queue, low: Queue) -> None:
    queue.pause()
    high_id = queue.enqueue(sample_jobs.ok, "high")
    low_ids = [low.enqueue(sample_jobs.ok, n) for n in range(3)]
    manager = procs.manager([queue, low], concurrency=1)
    settle(manager, low, low_ids)
    assert queue.job(high_id).state is State.READY

    queue.resume()
    settle(manager, queue, [high_id])


def test_a_drain_request_in_any_queue_drains_the_manager(
    procs: Processes, queue: Queue, low: Queue, barriers: Path
) -> None:
    high_id = queue.enqueue(sample_jobs.block, str(barriers / "high"))
    low_id = low.enqueue(sample_jobs.block, str(barriers / "low"))
    manager = procs.forkvisor(
        "run", str(queue.path), str(low.path), "--app", APP, *APP_PATH, *FAST_CLI, "--drain-timeout", "0.3"
    )
    wait_until(lambda: (barriers / "high").exists() and (barriers / "low").exists(), 10, "both jobs started")
    low.request_drain()
    assert procs.wait_exit(manager, 10, "manager asked to drain through its second queue") == 0, procs.log(manager)
    for served, job_id in ((queue, high_id), (low, low_id)):
        found = served.job(job_id)
        assert (found.state, found.attempts) == (State.READY, 0), dump(found)
    assert os.listdir(queue.path / "claimed") == os.listdir(low.path / "claimed") == []


def test_a_sigkilled_manager_of_two_queues_loses_nothing(
    procs: Processes, queue: Queue, low: Queue, barriers: Path
) -> None:
    markers = {queue: barriers / "high", low: barriers / "low"}
    ids = {served: served.enqueue(sample_jobs.block_once, str(marker)) for served, marker in markers.items()}
    quick = {served: [served.enqueue(sample_jobs.ok, n) for n in range(5)] for served in markers}
    paths = [str(queue.path), str(low.path)]
    first = procs.forkvisor("run", *paths, "--app", APP, *APP_PATH, *FAST_CLI, "--lease", "60", name="first")
    wait_until(lambda: all(marker.exists() for marker in markers.values()), 10, "a job of each queue started")
    children = psutil.Process(first.pid).children()
    first.send_signal(signal.SIGKILL)
    assert procs.wait_exit(first, 5, "SIGKILLed manager") == -signal.SIGKILL
    wait_until(lambda: all(is_gone(child.pid) for child in children), 5, "its children died with it")

    second = procs.forkvisor("run", *paths, "--app", APP, *APP_PATH, *FAST_CLI, "--burst", name="second")
    assert procs.wait_exit(second, 20, "burst manager of both queues") == 0, procs.log(second)
    for served in markers:
        found = served.job(ids[served])
        assert (found.state, found.attempts, found.result) == (State.DONE, 2, "second run"), dump(found)
        assert [attempt.counted for attempt in found.history] == [True, True]
        assert all(served.job(job_id).state is State.DONE for job_id in quick[served])
        counts = served.counts()
        assert (counts["done"], counts["ready"], counts["claimed"], counts["dead"]) == (6, 0, 0, 0), counts
        assert os.listdir(served.path / "claimed") == []


def test_burst_ends_when_every_queue_is_empty(procs: Processes, queue: Queue, low: Queue) -> None:
    ids = {served: [served.enqueue(sample_jobs.ok, n) for n in range(20)] for served in (queue, low)}
    manager = procs.forkvisor("run", str(queue.path), str(low.path), "--app", APP, *APP_PATH, *FAST_CLI, "--burst")
    assert procs.wait_exit(manager, 20, "burst manager") == 0, procs.log(manager)
    for served, job_ids in ids.items():
        assert all(served.job(job_id).state is State.DONE for job_id in job_ids)
    assert f"from {low.path}" in procs.log(manager), "log lines name the queue a job came from"


def test_bad_queue_lists_and_caps_are_refused(queue: Queue) -> None:
    with pytest.raises(ConfigError, match="given twice"):
        Manager([queue, queue.path / ".." / queue.path.name], sample_jobs.registry)
    with pytest.raises(ConfigError, match="at least one queue"):
        Manager([], sample_jobs.registry)
    with pytest.raises(ConfigError, match="does not serve"):
        Manager(queue, sample_jobs.registry, queue_concurrency={"elsewhere": 1})
    with pytest.raises(ConfigError, match="at least 1"):
        Manager(queue, sample_jobs.registry, queue_concurrency={queue.path: 0})
