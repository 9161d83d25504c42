"""Where runs have cgroups, the kernel holds a run's memory limit and counts what the whole
run cost: an OOM kill anywhere in the run ends the run and is said in its record ("killed:
memory limit 64M, peak 64M"), and the CPU of processes that left the job (and that its
process never waited for) is in its cost. Real managers, real jobs, real kernel limits;
skipped, saying why, where this process may not make the cgroups."""

from __future__ import annotations

import signal
import sys

import pytest

from jobs import Queue, State
from supervisor import containment
from supervisor.containment import CgroupContainment
from tests.processes import Processes, wait_until


def _why_not() -> str:
    found = containment.detect()
    if not isinstance(found, CgroupContainment):
        return found.describe()
    return "" if found.memory is not None else found.why_no_memory


WHY_NOT = _why_not()
HOG = "x = []\nwhile True: x.append(bytearray(1 << 20))"  # writes each MiB: all of it resident
BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "-")
def test_an_oom_kill_in_the_tree_ends_the_run_and_is_said(procs: Processes, queue: Queue) -> None:
    """The hog is a grandchild: the kernel kills it at the run's limit, the manager ends the
    rest of the run (here a shell that would sleep on) and records why."""
    script = f"{sys.executable} -c '{HOG}'; sleep 300"
    job_id = queue.enqueue_command(["sh", "-c", script], memory_limit="64M", max_attempts=1)
    manager = procs.run_manager(queue, "--commands", "--containment", "cgroup", name="manager")
    wait_until(lambda: queue.job(job_id).state is State.DEAD, 30, "the run ended at its memory limit")
    outcome = queue.job(job_id).history[-1].outcome
    assert outcome["limit"] == "memory"
    assert outcome["error"]["message"].startswith("killed: memory limit 64M, peak ")
    assert outcome["cost"]["oom_kills"] >= 1
    assert 60 << 20 <= outcome["cost"]["peak_memory"] <= 64 << 20
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "the manager") == 0, procs.log(manager)
    metrics = procs.forkvisor("metrics", str(queue.path), name="metrics")
    assert procs.wait_exit(metrics, 20, "forkvisor metrics") == 0
    assert 'forkvisor_oom_kills_total{function="forkvisor.command"' in procs.log(metrics)


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "-")
def test_the_cost_counts_what_left_the_job(procs: Processes, queue: Queue) -> None:
    """A double fork burns 0.6 s of CPU that the job's process never waits for: wait4 does
    not see it, the run's cgroup does."""
    script = f"(setsid {sys.executable} -c '{BURN}' &); sleep 1.5"
    job_id = queue.enqueue_command(["sh", "-c", script], max_attempts=1)
    manager = procs.run_manager(queue, "--commands", "--containment", "cgroup", name="manager")
    wait_until(lambda: queue.job(job_id).state is State.DONE, 30, "the job is done")
    outcome = queue.job(job_id).history[-1].outcome
    assert outcome["cost"]["from"] == "cgroup"
    assert outcome["cost"]["cpu_user"] + outcome["cost"]["cpu_system"] >= 0.5
    assert outcome["cpu_user"] + outcome["cpu_system"] < 0.3, "wait4 counted the orphan: the test shows nothing"
    assert outcome["cost"]["oom_kills"] == 0
    assert outcome["cost"]["processes_seen"] >= 2, "the shell and the orphan it left, looked at twice a second"
    show = procs.forkvisor("show", str(queue.path), job_id, name="show")
    assert procs.wait_exit(show, 20, "forkvisor show") == 0
    assert "    all its processes: " in procs.log(show)
    assert "processes seen (at least)" in procs.log(show)
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "the manager") == 0, procs.log(manager)
