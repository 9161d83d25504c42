"""A manager never destroys a job it cannot run: it leaves it ready, untouched, for a manager
that can (a rolling deploy heals by itself), without spinning on it; `status` names what no
running manager serves, and `cancel --function` ends jobs that no manager ever will."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobs.files
from jobs import Queue, State
from tests.cli.conftest import ok
from tests.processes import APP_PATH, Processes, dump, wait_until

OLD = ["--app", "tests.sample_jobs:registry", *APP_PATH]
NEW = ["--app", "tests.sample_jobs:next_release", *APP_PATH]


def _status(queue: Queue) -> dict[str, object]:
    document: dict[str, object] = ok("status", queue.path, "--json").json()
    return document


def test_a_rolling_deploy_heals_by_itself(procs: Processes, queue: Queue) -> None:
    old = procs.run_manager(queue, *OLD, name="old")
    wait_until(lambda: len(_status(queue)["managers"]) == 1, 20, "the old manager registered")  # type: ignore[arg-type]
    new_jobs = [queue.enqueue("sample.added_later", n) for n in range(20)]
    old_jobs = [queue.enqueue("sample.ok", n) for n in range(5)]
    wait_until(lambda: all(queue.job(i).state is State.DONE for i in old_jobs), 20, "the old manager ran its jobs")
    wait_until(lambda: "leaving jobs of sample.added_later" in procs.log(old), 20, "the old manager said why")

    for job_id in new_jobs:
        found = queue.job(job_id)
        assert found.state is State.READY, dump(found)
        assert (found.attempts, found.history) == (0, ()), dump(found)
        assert (found.path / "events").read_text().split()[1:] == ["enqueued"], "untouched, not even logged"
    status = _status(queue)
    assert status["unserved"] == {"checked": 20, "functions": {"sample.added_later": 20}, "known": True, "count": 20}
    [manager] = status["managers"]  # type: ignore[misc]
    assert "sample.ok" in manager["functions"]
    assert "sample.added_later" not in manager["functions"]
    text = ok("status", queue.path).out
    assert "ready jobs no running manager runs: 20: sample.added_later (20)" in text

    new = procs.run_manager(queue, *NEW, name="new")
    wait_until(lambda: all(queue.job(i).state is State.DONE for i in new_jobs), 30, "the new manager ran them")
    for job_id in new_jobs:
        found = queue.job(job_id)
        assert found.attempts == 1, dump(found)
        assert found.policy is not None
        assert found.policy.max_attempts == 4, "the new deploy's registration applies"
    assert _status(queue)["unserved"]["count"] == 0  # type: ignore[index]
    for manager in (old, new):
        manager.send_signal(signal.SIGTERM)
        assert procs.wait_exit(manager, 20, "a manager's drain") == 0


@pytest.fixture
def claims() -> Iterator[list[str]]:
    """Every claim's rename in this process, counted at its checkpoint."""
    seen: list[str] = []
    jobs.files.checkpoint_hook = lambda name: seen.append(name) if name == "claim:moved" else None
    yield seen
    jobs.files.checkpoint_hook = None


def test_a_head_of_jobs_for_other_managers_costs_one_look_each(
    procs: Processes, queue: Queue, claims: list[str]
) -> None:
    foreign = [queue.enqueue("sample.added_later", n) for n in range(300)]
    manager = procs.manager(queue)
    wait_until(
        lambda: sum(manager.queue.serving.left_for_others.values()) == 300, 20, "all were looked at", manager=manager
    )
    looked = len(claims)
    for _ in range(50):
        manager.step(timeout=0.01)
    assert len(claims) == looked == 300, "a job given back is not claimed again by this manager"
    runnable = queue.enqueue("sample.ok", "behind the foreign head")
    wait_until(lambda: queue.job(runnable).state is State.DONE, 10, "the job behind ran", manager=manager)
    assert all(queue.job(i).attempts == 0 for i in foreign)


def test_cancel_function_ends_the_jobs_no_manager_will_ever_run(queue: Queue, tmp_path: Path) -> None:
    stuck = [queue.enqueue("retired.function", n) for n in range(3)]
    later = queue.with_options(delay=3600).enqueue("retired.function")
    other = queue.enqueue("sample.ok")
    done = ok("cancel", queue.path, "--function", "retired.function")
    assert sorted(line.split()[0] for line in done.lines) == sorted([*stuck, later])
    for job_id in [*stuck, later]:
        found = queue.job(job_id)
        assert found.state is State.DEAD
        assert found.error is not None
        assert found.error["reason"] == "cancelled"
    assert queue.job(other).state is State.READY
    assert json.loads(ok("status", queue.path, "--json").out)["unserved"]["functions"] == {"sample.ok": 1}
