"""`forkvisor` as an operator runs it: real subprocesses, real signals, real SIGKILL.

Each manager here is `forkvisor run QUEUE --app tests.sample_jobs:registry`
started from the repository root. Barriers: a job's ready file says it runs;
the manager's process title says it is draining.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest

from jobs import Call, JobOptions, Queue, State
from tests import sample_jobs
from tests.processes import (
    APP_PATH,
    FAST_CLI,
    Processes,
    cmdline,
    dump,
    is_gone,
    outcome,
    read_pid,
    wait_until,
)


def draining(pid: int) -> bool:
    return "draining" in cmdline(pid)


def assert_released(queue: Queue, job_id: str, status: str) -> None:
    """The job went back to ready/ without using an attempt, and its run says why."""
    found = queue.job(job_id)
    assert found.state is State.READY, dump(found)
    assert found.attempts == 0, dump(found)
    record = outcome(found)
    assert record["released"] is True
    assert record["limit"] == "drain"
    assert record["status"] == status
    assert record["error"]["type"] == "Released"
    assert not found.history[-1].counted
    assert "released by the manager's shutdown" in (found.path / "events").read_text()


def test_sigterm_drain_lets_a_running_job_finish_and_claims_nothing_more(
    procs: Processes, queue: Queue, barriers: Path
) -> None:
    ready, release = barriers / "ready", barriers / "release"
    finishing = queue.enqueue(sample_jobs.wait_release, str(ready), str(release))
    waiting = queue.enqueue(sample_jobs.ok, "after the drain")
    manager = procs.run_manager(queue, "--concurrency", "1", "--drain-timeout", "30")
    wait_until(ready.exists, 10, "the finishing job started")

    manager.send_signal(signal.SIGTERM)
    wait_until(lambda: draining(manager.pid), 5, "the manager's title said it was draining")
    release.touch()
    assert procs.wait_exit(manager, 10, "drained manager") == 0, procs.log(manager)

    found = queue.job(finishing)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 1
    assert found.result == "released"
    assert queue.job(waiting).state is State.READY
    assert queue.job(waiting).attempts == 0
    assert os.listdir(queue.path / "claimed") == []


def test_sigterm_drain_timeout_releases_blocked_jobs(procs: Processes, queue: Queue, barriers: Path) -> None:
    obeys, ignores = barriers / "obeys", barriers / "ignores"
    stops = queue.enqueue(sample_jobs.block, str(obeys))
    hangs = queue.enqueue(sample_jobs.ignore_term_block, str(ignores))
    manager = procs.run_manager(queue, "--drain-timeout", "0.3", "--kill-grace", "0.3")
    wait_until(lambda: obeys.exists() and ignores.exists(), 10, "both blocking jobs started")
    children = [read_pid(obeys), read_pid(ignores)]

    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "manager draining with a 0.3 s drain timeout") == 0, procs.log(manager)

    assert_released(queue, stops, "killed by SIGTERM")
    assert_released(queue, hangs, "killed by SIGKILL")
    assert os.listdir(queue.path / "claimed") == []
    wait_until(lambda: all(is_gone(pid) for pid in children), 5, f"job children {children} were gone")


def test_released_job_runs_again_with_its_attempt_given_back(procs: Processes, queue: Queue, barriers: Path) -> None:
    marker = barriers / "first-run"
    job_id = queue.enqueue(sample_jobs.block_once, str(marker))
    first = procs.run_manager(queue, "--drain-timeout", "0.2", name="first")
    wait_until(marker.exists, 10, "the job's first run started")
    first.send_signal(signal.SIGTERM)
    assert procs.wait_exit(first, 10, "drained manager") == 0, procs.log(first)
    assert_released(queue, job_id, "killed by SIGTERM")

    second = procs.run_manager(queue, "--burst", name="second")
    assert procs.wait_exit(second, 15, "burst manager") == 0, procs.log(second)
    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 1, "the released run used up an attempt"
    assert [a.counted for a in found.history] == [False, True]
    assert found.result == "second run"


def test_second_sigterm_stops_at_once(procs: Processes, queue: Queue, barriers: Path) -> None:
    first, second = barriers / "first", barriers / "second"
    ids = [queue.enqueue(sample_jobs.block, str(first)), queue.enqueue(sample_jobs.ignore_term_block, str(second))]
    manager = procs.run_manager(queue, "--drain-timeout", "60", "--kill-grace", "30")
    wait_until(lambda: first.exists() and second.exists(), 10, "both blocking jobs started")

    manager.send_signal(signal.SIGTERM)
    wait_until(lambda: draining(manager.pid), 5, "the manager's title said it was draining")
    assert manager.poll() is None, "one SIGTERM must only drain"
    started = time.monotonic()
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "manager after a second SIGTERM") == 0, procs.log(manager)
    assert time.monotonic() - started < 5, "the second SIGTERM did not stop the manager at once"

    for job_id in ids:
        assert_released(queue, job_id, "killed by SIGKILL")


def test_drain_command_makes_a_running_manager_drain(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    job_id = queue.enqueue(sample_jobs.block, str(ready))
    manager = procs.run_manager(queue, "--drain-timeout", "0.3")
    wait_until(ready.exists, 10, "the blocking job started")

    command = procs.forkvisor("drain", str(queue.path), name="drain")
    assert procs.wait_exit(command, 10, "forkvisor drain") == 0, procs.log(command)
    assert "drain" in procs.log(command)
    assert procs.wait_exit(manager, 10, "manager asked to drain through the queue") == 0, procs.log(manager)
    assert_released(queue, job_id, "killed by SIGTERM")


def test_sigkilled_manager_claim_is_recovered_by_the_next_manager(
    procs: Processes, queue: Queue, barriers: Path
) -> None:
    marker = barriers / "first-run"
    job_id = queue.enqueue(sample_jobs.block_once, str(marker))
    # A long lease: recovery must come from seeing the owner's pid is dead, not from the lease.
    first = procs.run_manager(queue, "--lease", "60", "--sweep-interval", "0.5", name="first")
    wait_until(marker.exists, 10, "the job's first run started")
    child = read_pid(marker)
    old_owner = queue.job(job_id).owner
    children = [p.pid for p in psutil.Process(first.pid).children()]
    assert child in children
    assert len(children) == 2, "expected the job's child and the sweeper"

    first.send_signal(signal.SIGKILL)
    assert procs.wait_exit(first, 5, "SIGKILLed manager") == -signal.SIGKILL
    wait_until(lambda: all(is_gone(pid) for pid in children), 5, f"children {children} died with their manager")
    assert queue.job(job_id).state is State.CLAIMED
    assert queue.job(job_id).attempts == 1

    second = procs.run_manager(queue, "--burst", "--lease", "60", name="second")
    assert procs.wait_exit(second, 15, "restarted burst manager") == 0, procs.log(second)

    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 2
    assert found.result == "second run"
    lost, rerun = found.history
    assert lost.outcome is not None
    assert lost.outcome.get("lost") is True
    assert f"owner {old_owner}" in lost.outcome["error"]
    assert "is dead" in lost.outcome["error"]
    assert rerun.outcome is not None
    assert rerun.outcome["succeeded"] is True
    assert os.listdir(queue.path / "claimed") == []


def test_two_managers_complete_every_job_exactly_once(procs: Processes, queue: Queue, barriers: Path) -> None:
    release = barriers / "release"
    # Four gates (claimed first) hold both managers' two slots until both run: the rest
    # then flows through two managers at once.
    gates = [barriers / f"gate-{n}" for n in range(4)]
    gate_ids = queue.enqueue_many(
        Call(sample_jobs.wait_release, (str(gate), str(release)), options=JobOptions(priority=10)) for gate in gates
    )
    quick_ids = queue.enqueue_many(Call(sample_jobs.ok, (n,)) for n in range(200))
    managers = [procs.run_manager(queue, "--burst", "--concurrency", "2", name=f"m{n}") for n in range(2)]
    wait_until(lambda: all(gate.exists() for gate in gates), 15, "both managers ran two gate jobs each")
    release.touch()
    for manager in managers:
        assert procs.wait_exit(manager, 60, "burst manager") == 0, procs.log(manager)

    owners: dict[str, str] = {}
    for job_id in [*gate_ids, *quick_ids]:
        found = queue.job(job_id)
        assert found.state is State.DONE, dump(found)
        assert found.attempts == 1, dump(found)
        assert sorted(p.name for p in found.path.iterdir() if p.name.startswith("attempt-")) == ["attempt-1"]
        claims = re.findall(r"claimed by (\S+): attempt", (found.path / "events").read_text())
        assert len(claims) == 1, claims
        owners[job_id] = claims[0]
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 204,
        "dead": 0,
    }
    assert os.listdir(queue.path / "claimed") == []
    gate_owners = sorted(owners[job_id] for job_id in gate_ids)
    assert len(set(gate_owners)) == 2, gate_owners


def test_titles_of_manager_sweeper_and_job(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready = barriers / "ready"
    job_id = queue.enqueue(sample_jobs.block, str(ready))
    manager = procs.run_manager(queue, "--drain-timeout", "0.2")
    wait_until(ready.exists, 10, "the blocking job started")
    child = read_pid(ready)

    assert "forkvisor: manager" in cmdline(manager.pid)
    assert str(queue.path) in cmdline(manager.pid)
    job_title = cmdline(child)
    assert "forkvisor: job" in job_title
    assert job_id in job_title
    assert "sample.block" in job_title
    others = [p.pid for p in psutil.Process(manager.pid).children() if p.pid != child]
    sweepers = [pid for pid in others if "forkvisor: sweeper" in cmdline(pid)]
    assert len(sweepers) == 1, [cmdline(pid) for pid in others]

    # The manager holds an inotify descriptor and an epoll selector; its children must not.
    assert any("inotify" in target for target in _fd_targets(manager.pid))
    for pid in (child, sweepers[0]):
        kept = [target for target in _fd_targets(pid) if "inotify" in target or "eventpoll" in target]
        assert kept == [], f"pid {pid} ({cmdline(pid)}) kept the manager's descriptors"

    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "drained manager") == 0, procs.log(manager)


def _fd_targets(pid: int) -> list[str]:
    targets = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except FileNotFoundError:
            continue  # closed while we looked
    return targets


def test_burst_exits_once_nothing_is_left_within_the_horizon(procs: Processes, queue: Queue) -> None:
    now_id = queue.enqueue(sample_jobs.ok, "now")
    soon_id = queue.with_options(delay=0.5).enqueue(sample_jobs.ok, "soon")
    later_id = queue.with_options(delay=3600).enqueue(sample_jobs.ok, "in an hour")
    manager = procs.run_manager(queue, "--burst", "--horizon", "60")
    assert procs.wait_exit(manager, 15, "burst manager") == 0, procs.log(manager)

    assert queue.job(now_id).state is State.DONE
    assert queue.job(soon_id).state is State.DONE
    later = queue.job(later_id)
    assert later.state is State.SCHEDULED, dump(later)
    assert later.attempts == 0
    assert "left 1 job(s) scheduled beyond the 60s horizon" in procs.log(manager)


def test_burst_on_an_empty_queue_exits_at_once(procs: Processes, queue: Queue) -> None:
    manager = procs.run_manager(queue, "--burst")
    assert procs.wait_exit(manager, 10, "burst manager on an empty queue") == 0, procs.log(manager)
    assert os.listdir(queue.path / "claimed") == []


def test_job_output_goes_to_the_attempt_folder(procs: Processes, queue: Queue) -> None:
    job_id = queue.enqueue(sample_jobs.print_and_fail, "biscuits")
    manager = procs.run_manager(queue, "--burst")
    assert procs.wait_exit(manager, 15, "burst manager") == 0, procs.log(manager)

    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    assert "stdout says biscuits" in (found.history[0].path / "stdout").read_text()
    record = outcome(found)
    assert "RuntimeError: failing after printing biscuits" in record["stderr_tail"]
    assert "Traceback" in record["stderr_tail"]


def test_children_start_clean(procs: Processes, queue: Queue) -> None:
    """Fork hygiene: no manager descriptor, no blocked signal, default handlers, own random stream."""
    ids = [queue.enqueue(sample_jobs.hygiene) for _ in range(3)]
    manager = procs.run_manager(queue, "--burst", "--concurrency", "3")
    assert procs.wait_exit(manager, 15, "burst manager") == 0, procs.log(manager)

    reports = [queue.job(job_id).result for job_id in ids]
    for report in reports:
        assert report is not None
        leaked = {fd: target for fd, target in report["fds"].items() if "inotify" in target or "eventpoll" in target}
        assert leaked == {}, f"the job's child kept the manager's descriptors: {report['fds']}"
        assert not [t for fd, t in report["fds"].items() if t.startswith("pipe:") and int(fd) > 2], report["fds"]
        assert report["blocked"] == []
        assert all(report["default_handlers"].values()), report["default_handlers"]
        assert report["wakeup_fd"] == -1
        assert report["pgid"] == report["pid"], "the child is not the leader of its own process group"
    assert len({report["random"] for report in reports}) == 3, "children share the manager's random stream"


def test_demo_leaves_done_and_dead_jobs(procs: Processes, tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    demo = procs.forkvisor("demo", "--dir", str(folder), name="demo")
    assert procs.wait_exit(demo, 60, "forkvisor demo") == 0, procs.log(demo)
    assert os.listdir(folder / "done"), procs.log(demo)
    assert os.listdir(folder / "dead"), procs.log(demo)
    assert os.listdir(folder / "claimed") == []
    assert "demo queue" in procs.log(demo)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_idle_manager_exits_0_on_a_drain_signal(procs: Processes, queue: Queue, signum: signal.Signals) -> None:
    manager = procs.run_manager(queue)
    wait_until(lambda: "forkvisor: manager" in cmdline(manager.pid), 10, "the manager started and set its title")
    # SIGHUP and SIGUSR1 must not stop it: the first reopens log files (none here), the second logs a status line.
    manager.send_signal(signal.SIGHUP)
    wait_until(lambda: "SIGHUP: reopened 0 log file(s)" in procs.log(manager), 5, "the manager logged its SIGHUP")
    manager.send_signal(signal.SIGUSR1)
    wait_until(lambda: "status: 0/2 busy" in procs.log(manager), 5, "the manager logged its status on SIGUSR1")
    assert manager.poll() is None
    manager.send_signal(signum)
    assert procs.wait_exit(manager, 10, f"idle manager after {signum.name}") == 0, procs.log(manager)
    assert os.listdir(queue.path / "claimed") == []


def test_sighup_reopens_the_log_file_that_logrotate_moved(procs: Processes, queue: Queue, tmp_path: Path) -> None:
    log_file = tmp_path / "manager.log"
    manager = procs.forkvisor("--log-file", str(log_file), "run", str(queue.path), *FAST_CLI)
    wait_until(lambda: log_file.exists() and "serving" in log_file.read_text(), 10, "the manager logged to its file")
    rotated = log_file.rename(tmp_path / "manager.log.1")  # what logrotate does
    manager.send_signal(signal.SIGHUP)
    wait_until(log_file.exists, 10, "the manager reopened its log file by name")
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "the manager after SIGTERM") == 0
    assert "serving" in rotated.read_text()
    assert "reopened 1 log file(s)" in log_file.read_text()
    assert "stopped" in log_file.read_text()
    assert procs.log(manager) == ""  # nothing on stderr: the log went to the file


def test_drain_request_older_than_the_manager_is_ignored(procs: Processes, queue: Queue) -> None:
    command = procs.forkvisor("drain", str(queue.path), name="drain")
    assert procs.wait_exit(command, 10, "forkvisor drain") == 0, procs.log(command)
    assert (queue.path / "drain").exists()

    manager = procs.run_manager(queue)
    wait_until(lambda: "forkvisor: manager" in cmdline(manager.pid), 10, "the manager started")
    job_id = queue.enqueue(sample_jobs.ok, "after an old drain request")
    wait_until(lambda: queue.job(job_id).state is State.DONE, 10, "the new manager ran a job")
    assert manager.poll() is None, "the manager obeyed a drain request made before it started"

    command = procs.forkvisor("drain", str(queue.path), name="drain-again")
    assert procs.wait_exit(command, 10, "forkvisor drain") == 0, procs.log(command)
    assert procs.wait_exit(manager, 10, "manager asked to drain") == 0, procs.log(manager)


def test_sigkilled_sweeper_is_restarted(procs: Processes, queue: Queue) -> None:
    manager = procs.run_manager(queue)

    def sweepers() -> list[int]:
        try:
            children = psutil.Process(manager.pid).children()
        except psutil.NoSuchProcess:
            return []
        return [p.pid for p in children if not is_gone(p.pid) and "forkvisor: sweeper" in cmdline(p.pid)]

    wait_until(lambda: len(sweepers()) == 1, 10, "the manager's sweeper was running")
    [first] = sweepers()
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: sweepers() not in ([], [first]), 10, f"a new sweeper replaced SIGKILLed pid {first}")
    assert len(sweepers()) == 1
    assert "restarting it" in procs.log(manager)

    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "idle manager") == 0, procs.log(manager)


def test_heartbeat_keeps_a_long_job_claimed_past_several_leases(procs: Processes, queue: Queue) -> None:
    job_id = queue.enqueue(sample_jobs.nap, 2.5)
    manager = procs.run_manager(queue, "--burst", "--lease", "0.8", "--sweep-interval", "0.2")
    assert procs.wait_exit(manager, 20, "burst manager") == 0, procs.log(manager)

    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 1
    assert [a.number for a in found.history] == [1]
    assert "reaping" not in procs.log(manager)


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("tests.no_such_module:registry", "no module named 'tests.no_such_module' on the search path"),
        ("tests.sample_jobs:announce", "tests.sample_jobs.announce is a function, not a jobs.Registry"),
        ("tests.sample_jobs:nothing", "tests.sample_jobs.nothing is missing, not a jobs.Registry"),
        ("tests.sample_jobs", "must look like MODULE:REGISTRY"),
    ],
)
def test_bad_app_is_refused_with_exit_111(procs: Processes, queue: Queue, app: str, message: str) -> None:
    manager = procs.forkvisor("run", str(queue.path), "--app", app, *APP_PATH, "--burst", name="bad-app")
    assert procs.wait_exit(manager, 10, "forkvisor run with a bad --app") == 111, procs.log(manager)
    assert message in procs.log(manager)


NOBODY = 65534


@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("prlimit")),
    reason="needs root, setpriv and prlimit to make fork fail with EAGAIN",
)
def test_fork_failure_backs_off_and_still_obeys_sigterm(procs: Processes, queue: Queue) -> None:
    job_id = queue.enqueue(sample_jobs.ok, "no room to fork")
    # Root ignores RLIMIT_NPROC, so keep uid 0 for file access but make the real uid
    # `nobody` and drop the capabilities that lift the limit: the manager and its
    # sweeper fit under the limit, a job's child does not (fork fails with EAGAIN).
    others = sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == NOBODY)
    prefix = [
        "setpriv",
        f"--ruid={NOBODY}",
        "--bounding-set=-sys_resource,-sys_admin",
        "--inh-caps=-sys_resource,-sys_admin",
        "prlimit",
        f"--nproc={others + 2}",
        "--",
    ]
    # A long lease: the spinning manager must not be rescued by its own sweeper reaping it.
    manager = procs.run_manager(queue, "--lease", "60", prefix=prefix)
    wait_until(lambda: "cannot fork for job" in procs.log(manager), 10, "a fork failed")

    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 5, "manager whose forks fail, after SIGTERM") == 0, procs.log(manager)[-4000:]
    found = queue.job(job_id)
    assert found.state is State.READY, dump(found)
    assert found.attempts == 0
    assert len(found.history) < 50, f"{len(found.history)} attempt folders for a job that never ran"


def _fewer_processes(others: int, allowed: int) -> list[str]:
    """A command prefix that runs the rest with at most `allowed` processes of its own (see above)."""
    return [
        "setpriv",
        f"--ruid={NOBODY}",
        "--bounding-set=-sys_resource,-sys_admin",
        "--inh-caps=-sys_resource,-sys_admin",
        "prlimit",
        f"--nproc={others + allowed}",
        "--",
    ]


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("setpriv") and shutil.which("prlimit")),
    reason="needs root, setpriv and prlimit to make fork fail with EAGAIN",
)
def test_sweeper_restart_survives_a_failed_fork(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready, release, forked = barriers / "ready", barriers / "release", barriers / "forked"
    queue.enqueue(sample_jobs.fork_on_release, str(ready), str(release), str(forked))
    others = sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == NOBODY)
    # Room for three: the manager, its sweeper and the job's child.
    manager = procs.run_manager(queue, "--concurrency", "1", prefix=_fewer_processes(others, 3))
    wait_until(ready.exists, 10, "the job started")
    [sweeper] = [p.pid for p in psutil.Process(manager.pid).children() if "forkvisor: sweeper" in cmdline(p.pid)]

    os.kill(sweeper, signal.SIGKILL)
    wait_until(lambda: f"sweeper pid {sweeper} killed by SIGKILL" in procs.log(manager), 5, "the sweeper was reaped")
    release.touch()  # the job forks a grandchild into the sweeper's place
    wait_until(forked.exists, 5, "the job's grandchild took the last process slot")
    wait_until(lambda: "Resource temporarily unavailable" in procs.log(manager), 10, "the sweeper's restart failed")
    # Free the slots: the next restart must work. Kill the job's child too: until
    # someone reaps it, a killed grandchild is a zombie that still holds its slot,
    # and the job's child never reaps it; the manager, as subreaper, reaps both.
    for pid in (read_pid(forked), read_pid(ready)):
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass  # the manager stopped the job's whole group already

    def new_sweeper_or_exit() -> bool:
        if manager.poll() is not None:
            return True
        try:
            children = psutil.Process(manager.pid).children()
        except psutil.NoSuchProcess:
            return True
        return any("forkvisor: sweeper" in cmdline(p.pid) for p in children if not is_gone(p.pid))

    wait_until(new_sweeper_or_exit, 10, "a new sweeper started once a process slot was free")
    assert manager.poll() is None, f"the manager died of a failed fork:\n{procs.log(manager)[-2000:]}"
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "manager after SIGTERM") == 0, procs.log(manager)[-4000:]
