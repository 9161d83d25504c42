"""Periodic jobs with real managers: several `forkvisor run` processes on one queue
(one SIGKILLed on the way) fire each tick of a shell schedule and of a Python one
exactly once, and the jobs run like any other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs import Queue, State
from jobs import ticks as tick_marks
from jobs.ticks import tick_job_id
from tests.conftest import REPO
from tests.jobs_processes.invariants import check_invariants
from tests.processes import Processes, forkvisor_command, wait_until

APP = "tests.periodic_app:registry"


def forkvisor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*forkvisor_command(), *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def tick_jobs(queue: Queue) -> dict[str, dict[int, list[str]]]:
    """Every job a schedule enqueued, by schedule and tick."""
    found: dict[str, dict[int, list[str]]] = {}
    for state in (State.READY, State.SCHEDULED, State.CLAIMED, State.DONE, State.DEAD):
        for job in queue.jobs(state):
            name = job.spec.metadata.get("schedule")
            if name is not None:
                found.setdefault(name, {}).setdefault(job.spec.metadata["tick"], []).append(job.id)
    return found


@pytest.mark.slow
def test_three_managers_fire_each_tick_once_through_a_sigkill(procs: Processes, queue: Queue) -> None:
    added = forkvisor("schedule", "add", str(queue.path), "shell", "--every", "1s", "--", "true")
    assert added.returncode == 0, added.stderr
    managers = [procs.run_manager(queue, "--app", APP, name=f"manager{n}") for n in range(3)]

    def fired(name: str, count: int) -> bool:
        return len(tick_jobs(queue).get(name, {})) >= count

    wait_until(lambda: fired("shell", 2) and fired("heartbeat", 2), 20, "both schedules fired twice")
    managers[0].send_signal(signal.SIGKILL)  # one manager and its sweeper die mid-way
    managers[0].wait()
    seen = len(tick_jobs(queue)["shell"])
    wait_until(lambda: fired("shell", seen + 3) and fired("heartbeat", 5), 20, "the others fired on")
    for manager in managers[1:]:
        manager.send_signal(signal.SIGTERM)
    for manager in managers[1:]:
        assert procs.wait_exit(manager, 20, "a drained manager") == 0, procs.log(manager)

    found = tick_jobs(queue)
    for name in ("shell", "heartbeat"):
        ticks = sorted(found[name])
        assert all(len(found[name][tick]) == 1 for tick in ticks), f"{name}: a tick fired twice: {found[name]}"
        secret = tick_marks.secret(queue.folder)
        assert all(found[name][tick] == [tick_job_id(name, tick, secret)] for tick in ticks)
        assert ticks[-1] - ticks[0] <= len(ticks) + 2, f"{name}: ticks were lost: {ticks}"
    ids = [job_id for by_tick in found.values() for ids in by_tick.values() for job_id in ids]
    check_invariants(queue.path, ids)  # each in exactly one state, none lost
    ran = [queue.job(job_id) for job_id in ids if queue.job(job_id).state is State.DONE]
    assert len(ran) >= len(ids) - 4, "the ticks' jobs run like any other"


def test_schedule_list_shows_the_python_schedule_and_the_last_job(procs: Processes, queue: Queue) -> None:
    manager = procs.run_manager(queue, "--app", APP)
    wait_until(lambda: any(info.last_state is State.DONE for info in queue.schedules()), 20, "a tick's job ran")
    manager.send_signal(signal.SIGTERM)
    procs.wait_exit(manager, 20, "a drained manager")
    listed = forkvisor("schedule", "list", str(queue.path), "--json")
    assert listed.returncode == 0, listed.stderr
    (document,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (document["name"], document["source"], document["when"]) == ("heartbeat", "python", "every 1s")
    assert document["last_job"] == tick_job_id("heartbeat", document["last_tick"], tick_marks.secret(queue.folder))
    shown = forkvisor("schedule", "show", str(queue.path), "heartbeat")
    assert "a Python registry" in shown.stdout
    assert "every 1s" in shown.stdout
    removed = forkvisor("schedule", "remove", str(queue.path), "heartbeat")
    assert removed.returncode == 3
    assert "declared in Python" in removed.stderr


def test_a_schedule_added_while_a_manager_runs_fires_without_a_restart(procs: Processes, queue: Queue) -> None:
    manager = procs.run_manager(queue)
    wait_until(lambda: os.listdir(queue.path / "claimed"), 10, "the manager registered")
    started = time.time()
    added = forkvisor("schedule", "add", str(queue.path), "late", "--every", "1s", "--", sys.executable, "-c", "pass")
    assert added.returncode == 0, added.stderr
    wait_until(lambda: "late" in tick_jobs(queue), 15, "the new schedule fired")
    (tick,) = list(tick_jobs(queue)["late"])[:1]
    assert tick > started - 1, "no tick from before the schedule was added"
    manager.send_signal(signal.SIGTERM)
    procs.wait_exit(manager, 20, "a drained manager")
