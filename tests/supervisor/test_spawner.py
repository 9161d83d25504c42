"""Command jobs spawned without a fork (supervisor/spawner.py), vforked by the C module
or through the setpriv-sh chain: the same set-up as a forked child (folder, environment,
stdin, signals, process group), death with the manager, and the check that the manager
still lives before the program starts."""

from __future__ import annotations

import ast
import gc
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from jobs import JobOptions, Queue, State, command_call
from supervisor import Manager, forking
from supervisor.spawner import Chained, Spawner, Vforked
from tests.jobs_processes.invariants import check_invariants, read_attempts
from tests.processes import Processes, dump, is_gone, outcome, pids_in, read_pid, settle, wait_until

PROBE = "; ".join(
    [
        "pwd",
        'echo "$FORKVISOR_JOB_ID $FORKVISOR_ATTEMPT"',
        "readlink /proc/$$/fd/0",
        "ps -o pgid= -p $$",
        "echo $$",
        'for fd in /proc/$$/fd/*; do readlink "$fd" || :; done',  # the shell's descriptors' targets
        # Last, as the program itself: a shell blocks every signal while it waits for a child,
        # so the job's signal state is read by what it execs, not by a child of the shell.
        'exec grep -E "^Sig(Blk|Ign)" /proc/self/status',
    ]
)
GLIBC_INTERNAL = (1 << 31) | (1 << 32)  # signals 32 and 33: see SPAWN_DEFAULTS in supervisor/forking.py


@pytest.fixture
def spawner() -> Spawner:
    found = Spawner.find()
    if found is None:
        pytest.skip("no C module and no setpriv with --pdeathsig (util-linux 2.33+) here: command jobs are forked")
    return found


@pytest.fixture
def vforked() -> Vforked:
    found = Vforked.probe()
    if found is None:
        pytest.skip("forkvisor was installed without its C module (no C compiler at install)")
    return found


@pytest.fixture
def chain() -> Chained:
    found = Chained.probe()
    if found is None:
        pytest.skip("this host has no setpriv with --pdeathsig (util-linux 2.33+)")
    return found


def run_probe(procs: Processes, queue: Queue, tmp_path: Path, spawner: Spawner | None) -> tuple[list[str], set[str]]:
    """The probe's output lines, and what the manager's own descriptors (wakeup pipe,
    selector, inotify) point to, for the job's to be compared with."""
    [job_id] = queue.enqueue_many([command_call(["sh", "-c", PROBE], cwd=str(tmp_path))])
    manager = procs.manager(queue, start=False)
    for served in manager.served:
        served.launcher.spawner = spawner
    manager.start()
    own = {os.readlink(f"/proc/self/fd/{fd}") for fd in manager.wakeups.fds}
    settle(manager, queue, [job_id])
    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    return (found.history[-1].path / "stdout").read_text().splitlines(), own


@pytest.mark.parametrize("how", ["vforked", "chain", "forked"])
def test_a_command_job_starts_as_a_forked_one_would(
    procs: Processes, queue: Queue, tmp_path: Path, how: str, request: pytest.FixtureRequest
) -> None:
    spawner = None if how == "forked" else request.getfixturevalue(how)
    lines, manager_side = run_probe(procs, queue, tmp_path, spawner)
    assert len(lines) >= 7, lines
    folder, ids, stdin, group, pid, *targets, blocked, ignored = lines
    assert folder == str(tmp_path)
    assert ids.split()[1] == "1"
    assert stdin == "/dev/null"
    assert (blocked.split(":")[0], ignored.split(":")[0]) == ("SigBlk", "SigIgn"), lines
    ignored_mask = int(ignored.split()[1], 16)
    assert ignored_mask & ~GLIBC_INTERNAL == 0, f"signals ignored: {ignored}"  # SIGPIPE, SIGXFSZ are in Python
    assert int(blocked.split()[1], 16) == 0, f"signals blocked: {blocked}"
    assert group.strip() == pid, "the job is not the leader of its own process group"
    # Fork hygiene: none of the manager's descriptors, and of the queue only the output files (1, 2).
    assert not set(targets) & manager_side, f"the job kept the manager's descriptors: {targets}"
    inside = [target for target in targets if target.startswith(f"{queue.path}/")]
    assert sorted(Path(target).name for target in inside) == ["stderr", "stdout"], targets


def test_a_spawned_job_dies_with_its_manager(procs: Processes, queue: Queue, barriers: Path, spawner: Spawner) -> None:
    pid_file = barriers / "pid"
    job_id = queue.enqueue_command(
        ["sh", "-c", f"echo $$ > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}; exec sleep 300"]
    )
    manager = procs.run_manager(queue, "--commands")
    wait_until(pid_file.exists, 10, "the command job started")
    job_pid = read_pid(pid_file)
    assert read_pid(queue.job(job_id).history[-1].path / "pid") == job_pid, "the pid file names the spawned process"
    manager.send_signal(signal.SIGKILL)
    assert procs.wait_exit(manager, 5, "SIGKILLed manager") == -signal.SIGKILL
    wait_until(lambda: is_gone(job_pid), 5, f"the spawned job {job_pid} died with its manager")


def test_the_chain_runs_nothing_once_its_manager_is_gone(tmp_path: Path, chain: Chained) -> None:
    marker = tmp_path / "ran"
    not_the_parent = 1  # what getppid() says once the manager died and the helper was reparented
    done = subprocess.run(chain.argv(not_the_parent, None, ("touch", str(marker))), check=False)
    assert done.returncode == 71
    assert not marker.exists()


def test_a_vforked_child_runs_nothing_once_its_manager_is_gone(tmp_path: Path, vforked: Vforked) -> None:
    from supervisor import _vfork

    marker = tmp_path / "ran"
    not_the_parent = 1  # what getppid() says once the manager died and the child was reparented
    program = [b"/usr/bin/touch", str(marker).encode()]
    pid, stage, _ = _vfork.spawn(program[:1], program, [], 0, 1, 2, None, not_the_parent, -1, -1)
    assert stage == _vfork.STAGE_ORPHANED
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 71
    assert not marker.exists()


@pytest.mark.slow
def test_many_vforks_leave_the_managers_memory_intact(vforked: Vforked) -> None:
    """The child shares the manager's memory until it execs: a child that wrote into the
    frames it came from corrupted the heap, and a collection crashed later (a first version
    did, after some hundred spawns). In a forked child, so a crash fails only this test."""

    def spawn_and_collect() -> int:
        source = Path(forking.__file__).read_text()
        for number in range(300):
            program = ("true",) if number % 3 else ("no-such-program-here",)
            pid = vforked.start(program, {}, (0, 1, 2), None if number % 5 else "/")
            forking.wait_for(pid, 10)
            ast.parse(source)  # many objects made and freed
            gc.collect()
        return 0

    child = forking.start_child(spawn_and_collect)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


@pytest.mark.slow
def test_managers_killed_while_they_vfork_command_jobs_lose_none_and_count_every_run(
    procs: Processes, queue: Queue, tmp_path: Path, vforked: Vforked
) -> None:
    """Guarantees 1-3 with vforked command jobs: managers SIGKILLed again and again while they
    start short programs. In the end every job is in done/ or dead/, in one place; each run was
    counted (no run folder without its count; a failing job dead after all its attempts).
    (That a program dies with its manager: test_a_spawned_job_dies_with_its_manager.)"""
    started = tmp_path / "started"
    attempts = 6  # more than the kills: a run lost with its manager counts as an attempt
    options = JobOptions(max_attempts=attempts, backoff="none")
    argv = [["sh", "-c", f"echo $$ >> {started}; sleep 0.05; exit {n % 5 == 0:d}"] for n in range(150)]
    ids = queue.enqueue_many([command_call(words, options=options) for words in argv])
    rng = random.Random(20261125)
    for round_number in range(4):
        manager = procs.run_manager(queue, "--commands", "--concurrency", "4", name=f"killed-{round_number}")
        least = 10 * (round_number + 1)
        wait_until(lambda least=least: started.exists() and len(pids_in(started)) > least, 30, "programs ran")
        time.sleep(rng.uniform(0.05, 0.3))  # a moment among the spawns, chosen by the seed, not a wait for a state
        manager.send_signal(signal.SIGKILL)
        assert procs.wait_exit(manager, 10, "SIGKILLed manager") == -signal.SIGKILL
    last = procs.run_manager(queue, "--commands", "--burst", name="last")
    assert procs.wait_exit(last, 60, "the last manager, --burst") == 0, procs.log(last)
    places = check_invariants(queue.path, ids)
    for job_id, (state, path) in places.items():
        failing = argv[ids.index(job_id)][2].endswith("exit 1")
        assert state is (State.DEAD if failing else State.DONE), dump(queue.job(job_id))
        runs = len(list(path.glob("attempt-*")))
        assert 1 <= runs <= read_attempts(path), f"{job_id}: {runs} runs, {read_attempts(path)} counted"
        if failing:
            assert read_attempts(path) == attempts, dump(queue.job(job_id))


@pytest.mark.parametrize("how", ["vforked", "chain"])
def test_a_program_that_cannot_run_is_a_clear_error(
    procs: Processes, queue: Queue, how: str, request: pytest.FixtureRequest
) -> None:
    spawner = request.getfixturevalue(how)
    missing, not_executable = queue.enqueue_many(
        [command_call(["no-such-program-here"]), command_call([str(Path(__file__))])]
    )
    manager = procs.manager(queue, start=False)
    for served in manager.served:
        served.launcher.spawner = spawner
    manager.start()
    settle(manager, queue, [missing, not_executable], timeout=30)
    for job_id, code in ((missing, 127), (not_executable, 126)):
        found = queue.job(job_id)
        assert found.state is State.DEAD, dump(found)
        assert outcome(found)["exit_code"] == code, dump(found)
        assert found.error is not None
        assert found.error["type"] == "CannotRun"
        stderr = (found.history[-1].path / "stderr").read_text()
        assert ("no-such-program-here" if code == 127 else "test_spawner.py") in stderr, stderr


def test_a_folder_that_cannot_be_entered_is_a_clear_error(procs: Processes, queue: Queue, tmp_path: Path) -> None:
    [job_id] = queue.enqueue_many([command_call(["true"], cwd=str(tmp_path / "gone"))])
    manager = procs.manager(queue)
    settle(manager, queue, [job_id], timeout=30)
    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    assert outcome(found)["exit_code"] == 126
    assert found.error is not None
    assert found.error["type"] == "CannotRun"
    assert "cannot run 'true'" in found.error["message"] or "cannot enter" in found.error["message"]


def test_a_manager_without_command_jobs_does_not_look_for_the_helpers(queue: Queue) -> None:
    manager = Manager(queue, commands=False)
    assert all(served.launcher.spawner is None for served in manager.served)


def test_a_relative_folder_is_the_managers_and_ignores_cdpath(
    procs: Processes, queue: Queue, tmp_path: Path, spawner: Spawner, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "here" / "work").mkdir(parents=True)
    (tmp_path / "elsewhere" / "work").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "here")
    [job_id] = queue.enqueue_many([command_call(["pwd"], cwd="work", env={"CDPATH": str(tmp_path / "elsewhere")})])
    settle(procs.manager(queue), queue, [job_id])
    found = queue.job(job_id)
    assert (found.history[-1].path / "stdout").read_text() == f"{tmp_path / 'here' / 'work'}\n", dump(found)


@pytest.mark.parametrize("how", ["vforked", "chain"])
def test_a_program_finds_the_managers_environment_as_it_is_with_the_jobs_over_it(
    tmp_path: Path, how: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vforked path keeps the manager's environment encoded between jobs: a change the
    manager makes to it (a variable, its PATH) must reach the next program all the same."""
    spawner: Spawner = request.getfixturevalue(how)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "fv-probe-env").write_text('#!/bin/sh\necho "$FV_PROBE $FV_OVER"\n')
    (tmp_path / "bin" / "fv-probe-env").chmod(0o755)

    def run(program: str, env: dict[str, str]) -> str:
        out = tmp_path / "out"
        with out.open("wb") as stdout:
            status = forking.wait_for(spawner.start((program,), env, (0, stdout.fileno(), 2), None), 10)
        assert status is not None
        assert status.code == 0, status
        return out.read_text().strip()

    monkeypatch.setenv("FV_PROBE", "one")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert run("fv-probe-env", {"FV_OVER": "job"}) == "one job"
    monkeypatch.setenv("FV_PROBE", "two")
    assert run("fv-probe-env", {}) == "two"
    assert run("fv-probe-env", {"FV_PROBE": "the job's"}) == "the job's"
    monkeypatch.delenv("FV_PROBE")
    assert run("fv-probe-env", {}) == ""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    out = tmp_path / "missing"
    with out.open("wb") as stderr:
        status = forking.wait_for(spawner.start(("fv-probe-env",), {}, (0, 1, stderr.fileno()), None), 10)
    assert status is not None
    assert status.code == 127, "the program was found on a PATH the manager dropped"


@pytest.mark.parametrize("how", ["vforked", "chain"])
def test_a_manager_killed_right_after_a_spawn_leaves_no_program_running(
    procs: Processes, how: str, request: pytest.FixtureRequest
) -> None:
    """A parent that exits the moment each spawn returns, often before the chain's helper has
    armed the parent-death signal: a program that started before it died is killed with it,
    and one whose check came too late never starts. None may live on."""
    spawner: Spawner = request.getfixturevalue(how)

    def spawn_and_die() -> int:
        spawner.start(("sleep", "60"), {}, (0, 1, 2), None)
        return 0  # and the child exits at once (forking.start_child)

    for _ in range(200):
        parent = forking.start_child(spawn_and_die)
        os.waitpid(parent, 0)
    wait_until(lambda: not reap_orphans(), 10, "no spawned program outlived its parent")


def reap_orphans() -> list[int]:
    """Reap the helpers reparented to this process (a subreaper in tests); the pids still running."""
    alive = []
    for child in psutil.Process().children():
        try:
            pid, _ = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if pid == 0:
            alive.append(child.pid)
    return alive
