"""Nothing of a job outlives its run: every process it starts (pipelines, `setsid` double
forks, daemons, Python subprocesses) is ended with it, and none of a run is alive when its
retry starts, even when its manager was SIGKILLed. In both containment modes: cgroups
(skipped, saying why, where this process may not make one) and processes.

Each process of a job's tree carries a mark the tests look for in /proc (tests/tree_job.py),
knowing nothing of how forkvisor finds a run's processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs import Queue, State, unknown_liveness
from supervisor import containment, sweeper
from supervisor.containment import CgroupContainment
from tests.processes import Processes, _reap_zombies, dump, wait_until
from tests.tree_job import marked

KINDS = ("pipeline", "setsid", "daemon", "subprocess", "fork")


def _cgroups_or_why() -> str:
    found = containment.detect()
    return "" if isinstance(found, CgroupContainment) else found.describe()


WHY_NO_CGROUP = _cgroups_or_why()
MODES = [
    pytest.param("cgroup", marks=pytest.mark.skipif(bool(WHY_NO_CGROUP), reason=WHY_NO_CGROUP)),
    "processes",
]


def enqueue_tree(
    queue: Queue, kind: str, folder: Path, then: str = "block", **options: object
) -> tuple[str, str, Path]:
    """A job of `kind` (a command job but for "subprocess" and "fork", which are Python's)
    that blocks once its tree is up (or ends: `then` "return"); its id, mark and log."""
    mark, log = uuid.uuid4().hex, folder / f"{kind}.log"
    if kind in ("subprocess", "fork"):
        job_id = queue.with_options(**options).enqueue("sample.tree", kind, mark, str(log), then)
    else:
        argv = [sys.executable, "-m", "tests.tree_job", kind, mark, str(log), then]
        job_id = queue.enqueue_command(argv, env={"FVTEST_MARK": mark}, **options)
    return job_id, mark, log


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def gone(mark: str) -> bool:
    _reap_zombies()  # what ends comes back to this process (a subreaper while the test runs)
    return not marked(mark)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("successor", ["manager", "sweeper", "another host's sweeper"])
def test_no_run_overlaps_its_retry_after_its_manager_is_sigkilled(
    procs: Processes, queue: Queue, barriers: Path, mode: str, successor: str
) -> None:
    jobs = {kind: enqueue_tree(queue, kind, barriers, max_attempts=3) for kind in KINDS}
    first = procs.run_manager(queue, "--commands", "--concurrency", "5", "--containment", mode, name="first")
    for kind, (_, mark, log) in jobs.items():
        wait_until(lambda log=log: "up 1" in lines(log), 20, f"the {kind} job set up its tree")
        assert marked(mark), f"the {kind} job's tree is not marked: the test would see no overlap"
    assert f"runs contained by {mode}" in procs.log(first)
    first.send_signal(signal.SIGKILL)
    assert procs.wait_exit(first, 5, "SIGKILLed manager") == -signal.SIGKILL
    if successor == "sweeper":  # a sweep alone (as a sweeper child of any manager does) ends them
        wait_until(lambda: sweeper.sweep_once(queue, _functions(), 60.0, None)["reverted"] == len(KINDS), 10)
        for kind, (_, mark, _) in jobs.items():
            assert gone(mark), f"the sweep gave the {kind} job back while its earlier run lives: {marked(mark)}"
    if successor == "another host's sweeper":  # sees the lease run out, can end nothing here
        wait_until(lambda: _foreign_sweep(queue)["reverted"] == len(KINDS), 10)
        for kind, (_, mark, _) in jobs.items():
            assert marked(mark), f"the {kind} job's earlier run is gone: the successor would have nothing to end"
    last = procs.run_manager(queue, "--commands", "--concurrency", "5", "--containment", mode, "--burst", name="last")
    assert procs.wait_exit(last, 30, "the successor") == 0, procs.log(last)
    for kind, (job_id, mark, log) in jobs.items():
        assert queue.job(job_id).state is State.DONE, dump(queue.job(job_id))
        assert lines(log) == ["clean 1", "up 1", "clean 2"], f"{kind}: {lines(log)}"
        wait_until(lambda mark=mark: gone(mark), 5, f"no process of the {kind} job is left")


# A daemon that drops every mark of its run: it leaves the job's session and tree (a double
# fork), closes every descriptor (the run's memfd with them) and execs with a clean
# environment; then it says its pid (written whole: a rename) and sleeps. Its job waits
# for that before it ends.
UNMARKED = r"""
import os, sys, time
pidfile = sys.argv[1]
if os.fork():  # the job: it ends once the daemon is unmarked (an ended run's marked stray is ended at once)
    deadline = time.monotonic() + 10
    while not os.path.exists(pidfile) and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
os.closerange(3, 65536)
script = f"echo $$ > {pidfile}.new && mv {pidfile}.new {pidfile} && exec sleep 300"
os.execve("/bin/sh", ["sh", "-c", script], {})
"""


@pytest.mark.parametrize("beside", [False, True])
def test_what_drops_its_runs_mark_ends_once_no_run_that_lived_at_its_start_lives(
    procs: Processes, queue: Queue, barriers: Path, beside: bool
) -> None:
    """Where runs have no cgroup, a process that dropped its run's mark (no descriptor, no
    variable) cannot be told apart; the manager adopted it, so it is some run's, one that
    had started by its birth. It lives while such a run does (`beside`: a run started
    before it, still going), and is ended once none does."""
    script, pidfile, release = barriers / "unmarked.py", barriers / "unmarked.pid", barriers / "release"
    script.write_text(UNMARKED)
    other = None
    if beside:
        waits = ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"]
        other = queue.enqueue_command(waits, max_attempts=1)
    manager = procs.run_manager(queue, "--commands", "--concurrency", "2", "--containment", "processes")
    if other is not None:
        wait_until(lambda: queue.job(other).state is State.CLAIMED, 20, "the run beside it started first")
    leaver = queue.enqueue_command([sys.executable, str(script), str(pidfile)], max_attempts=1)
    wait_until(lambda: queue.job(leaver).state is State.DONE and pidfile.exists(), 20, "it left, its job ended")
    pid = int(pidfile.read_text())
    try:
        if other is not None:
            assert psutil.pid_exists(pid), "a run that lived at its start lives: it might be that run's"
            release.touch()
            wait_until(lambda: queue.job(other).state is State.DONE, 10, "the run beside it ended")
        wait_until(lambda: not _alive(pid), 5, "it was ended once no run that lived at its start lived")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "the manager") == 0, procs.log(manager)


def _alive(pid: int) -> bool:
    _reap_zombies()  # (were it ours: the manager's own dead are reaped by the manager)
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _foreign_sweep(queue: Queue) -> dict[str, int]:
    """A sweep as another host's sweeper makes it, a day on: it cannot tell whether the owner
    lives (the lease decides), and no process of this host is its to end."""
    later = queue.serving.filesystem_now() + 86_400
    return queue.serving.sweep(later, unknown_liveness, functions=_functions(), end_leftovers=lambda owner: True)


def _functions():  # type: ignore[no-untyped-def]
    from jobs import Functions
    from tests import sample_jobs

    return Functions(sample_jobs.registry, commands=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stop", ["timeout", "cancel", "drain", "end"])
def test_a_job_ends_with_every_process_it_started(
    procs: Processes, queue: Queue, barriers: Path, mode: str, stop: str
) -> None:
    """What left the job's session (`setsid`, a daemon's double fork) ends with it too: on
    its timeout, its cancel, the drain's stop (here a drain that gives jobs a tenth of a
    second), and when it ends by itself."""
    options = {"timeout": "1s"} if stop == "timeout" else {"timeout": "5m"}
    then = "return" if stop == "end" else "block"
    kinds = ("setsid", "daemon", "fork")
    jobs = {kind: enqueue_tree(queue, kind, barriers, then, max_attempts=1, **options) for kind in kinds}
    manager = procs.run_manager(
        queue, "--commands", "--concurrency", "3", "--containment", mode, "--drain-timeout", "0.1", name="manager"
    )
    for kind, (_, _, log) in jobs.items():
        wait_until(lambda log=log: "up 1" in lines(log), 20, f"the {kind} job set up its tree")  # (marked)
    if stop == "cancel":
        cli_cancel(procs, queue, [job_id for job_id, _, _ in jobs.values()])
    elif stop == "drain":
        manager.send_signal(signal.SIGTERM)
        assert procs.wait_exit(manager, 10, "the drained manager") == 0, procs.log(manager)
    ended = State.DONE if stop == "end" else State.DEAD
    for kind, (job_id, mark, _) in jobs.items():
        wait_until(lambda mark=mark: gone(mark), 5, f"every process of the {kind} job ended with its {stop}")
        if stop != "drain":
            wait_until(lambda job_id=job_id: queue.job(job_id).state is ended, 5, f"the {kind} job is {ended.value}")
    if manager.poll() is None:
        manager.send_signal(signal.SIGTERM)
        assert procs.wait_exit(manager, 10, "the manager") == 0, procs.log(manager)


def cli_cancel(procs: Processes, queue: Queue, job_ids: list[str]) -> None:
    cancel = procs.forkvisor("cancel", str(queue.path), *job_ids, name="cancel")
    assert procs.wait_exit(cancel, 20, "forkvisor cancel") == 0, procs.log(cancel)


# -- a run's mark is written by the job: whatever it holds, the readers take only the marks --


_OWNERS = ["h.1.abcdef", "other-host.22.123456"]
_TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=40)
_NAME = st.one_of(
    _TEXT,  # anything
    _TEXT.map(lambda text: containment.FD_MARK + text),  # a mark of no owner
    st.builds(lambda owner, text: f"{containment.FD_MARK}/claimed/{owner}/{text}", st.sampled_from(_OWNERS), _TEXT),
)


@settings(max_examples=200, deadline=None)
@given(names=st.lists(_NAME, max_size=4), owner=st.sampled_from(_OWNERS))
def test_whatever_a_process_names_its_memfds_only_a_runs_mark_is_read_as_one(names: list[str], owner: str) -> None:
    """A job names its memfds as it likes (a forged mark of another run included): the
    reader never fails, takes only names under `forkvisor-run:`, and counts a process as an
    owner's only for a mark under that owner's folder."""
    held = [os.memfd_create(name, os.MFD_CLOEXEC) for name in names]
    try:
        marks = containment._marks(os.getpid())
        named = {name[len(containment.FD_MARK) :] for name in names if name.startswith(containment.FD_MARK)}
        assert marks == named  # (this process has no mark in its environment)
        assert containment._of_owner(os.getpid(), owner) == any(name.startswith(f"/claimed/{owner}/") for name in named)
    finally:
        for fd in held:
            os.close(fd)


@settings(max_examples=25, deadline=None)
@given(value=st.binary(max_size=300).filter(lambda value: b"\0" not in value))
def test_whatever_a_process_puts_in_its_run_variable_the_reader_takes_only_a_mark(value: bytes) -> None:
    """A process's environment is its own: any bytes at FORKVISOR_ATTEMPT_DIR are read
    without failing, as the tail from its last `/claimed/` (or the whole, which no owner's
    prefix matches unless it is one)."""
    child = subprocess.Popen(["sleep", "30"], env={b"FORKVISOR_ATTEMPT_DIR": value})  # type: ignore[dict-item]
    try:
        wait_until(lambda: os.path.exists(f"/proc/{child.pid}/environ") and _exec_done(child.pid), 5)
        marks = containment._marks(child.pid)
        text = os.fsdecode(value)
        assert marks == {text[text.rfind("/claimed/") :]}
    finally:
        child.kill()
        child.wait()


def _exec_done(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().startswith(b"sleep")


def test_a_run_cgroup_removed_before_it_was_opened_leaves_the_run_without_one(tmp_path: Path) -> None:
    """A manager that stood still (SIGSTOP) between making a run's cgroup and opening its
    `cgroup.procs` may find it removed by the sweeper that reaped it (found by the chaos run:
    the manager died of the FileNotFoundError). Here the base is a plain folder, where the
    run's folder is made but holds no `cgroup.procs`, as after that removal."""
    (tmp_path / "owner").mkdir()
    found = CgroupContainment(str(tmp_path)).new_run("owner", "20261127-193321-736914-842e191e", 2)
    assert found is None
    assert not (tmp_path / "owner" / "20261127-193321-736914-842e191e.2").exists()  # not left behind


@pytest.mark.skipif(bool(WHY_NO_CGROUP), reason=WHY_NO_CGROUP)
def test_a_manager_s_command_jobs_are_in_their_run_s_cgroup(procs: Processes, queue: Queue) -> None:
    """Each command job's program finds itself in its run's cgroup: a vforked or spawned child
    moves itself in before its exec (docs/DECISIONS.md says why it is not born there)."""
    job_ids = [queue.enqueue_command(["sh", "-c", "grep '^0::' /proc/self/cgroup"]) for _ in range(3)]
    manager = procs.run_manager(queue, "--commands", "--containment", "cgroup", "--burst", "--concurrency", "2")
    assert procs.wait_exit(manager, 30, "the burst manager") == 0, procs.log(manager)
    for job_id in job_ids:
        job = queue.job(job_id)
        output = (job.path / "attempt-1" / "stdout").read_text().strip()
        assert output.endswith(f"/{job_id}.1"), output
