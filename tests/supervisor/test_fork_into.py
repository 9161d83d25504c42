"""A job's child is born in its run's cgroup (clone3's CLONE_INTO_CGROUP) where the host
allows it, so that no cgroup migration (an RCU grace period each, on a default cgroup2
mount) delays its start; elsewhere, and into a cgroup the kernel would kill it in, it moves
itself in as before. Real cgroups, real forks: skipped, saying why, where this process may
not make cgroups."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobs import Queue
from supervisor import containment, forking
from supervisor.containment import CgroupContainment
from tests.processes import Processes

try:
    from supervisor._vfork import fork_into
except ImportError:  # installed without a C compiler
    fork_into = None  # type: ignore[assignment]

FOUND = containment.detect()
WHY_NOT = "" if isinstance(FOUND, CgroupContainment) else FOUND.describe()
WHY_NOT = WHY_NOT or ("" if fork_into is not None else "the C module (supervisor/_vfork.c) is not built")
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


@pytest.fixture
def cgroup() -> Iterator[str]:
    """A new, empty cgroup v2 beside where runs go."""
    assert isinstance(FOUND, CgroupContainment)
    path = os.path.join(FOUND.base, f"test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    yield path
    with contextlib.suppress(OSError):
        os.rmdir(path)


@pytest.fixture
def forks_into(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process may fork into cgroups, as a new manager starts (a test that finds it may
    not must not decide for the tests after it)."""
    monkeypatch.setattr(forking, "_forks_into", True)


def alone(check: Callable[[], None]) -> None:
    """Run `check` in a forked child of this process, which has one thread: as a manager has
    (pytest's faulthandler keeps a watchdog thread here, and clone3 is used only without
    other threads). Its failure is this test's."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            check()
            code = 0
        except BaseException:
            os.write(write_end, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as report:
        failure = report.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, failure


def _where_the_child_is(cgroup: tuple[int, int]) -> tuple[str, int]:
    """Fork a child into `cgroup` with `start_child`; the first thing its body sees: its own
    cgroup v2 (as /proc names it); and its exit status."""
    read_end, write_end = os.pipe()

    def body() -> int:
        with open("/proc/self/cgroup", "rb") as groups:
            own = next(line for line in groups.read().splitlines() if line.startswith(b"0::"))
        os.write(write_end, own[3:])
        return 0

    pid = forking.start_child(body, [read_end], cgroup=cgroup)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as seen:
        where = seen.read().decode()
    _, status = os.waitpid(pid, 0)
    return where, os.waitstatus_to_exitcode(status)


def _relative(path: str) -> str:
    return "/" + os.path.relpath(path, containment.cgroup2_mount() or "/")


def test_a_child_forked_into_a_cgroup_is_in_it_before_its_body_runs_without_moving(
    cgroup: str, forks_into: None
) -> None:
    """No `cgroup.procs` to write itself into (-1): only a child born there is there."""
    folder = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        alone(lambda: _assert_equal(_where_the_child_is((folder, -1)), (_relative(cgroup), 0)))
    finally:
        os.close(folder)


def _assert_equal(found: object, expected: object) -> None:
    assert found == expected


def test_a_manager_with_other_threads_forks_as_before_and_its_child_moves_in(cgroup: str, forks_into: None) -> None:
    """clone3 skips what glibc's fork resets for other threads (its locks): with a second
    thread alive, `fork_into` refuses, and the child moves itself in through `cgroup.procs`."""
    folder = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    procs = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with pytest.raises(OSError, match="Operation not supported") as refused:
            fork_into(folder)
        assert refused.value.errno == errno.ENOTSUP
        assert _where_the_child_is((folder, procs)) == (_relative(cgroup), 0)
    finally:
        stop.set()
        other.join()
        os.close(folder)
        os.close(procs)


def test_the_probe_says_whether_a_child_born_in_a_killed_cgroup_lives(cgroup: str, forks_into: None) -> None:
    """Linux 6.18 SIGKILLs a child born in a cgroup whose `cgroup.kill` count differs from its
    parent's cgroup's. Whatever this kernel does, the probe says it."""
    Path(cgroup, "cgroup.kill").write_text("1")

    def check() -> None:
        folder = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        pid = fork_into(folder)
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert forking.forks_into(cgroup) == (status == 0)

    alone(check)


def test_a_run_cgroup_left_by_an_earlier_claim_is_moved_into_never_forked_into(forks_into: None) -> None:
    """The cgroup of a run whose claim went back is killed (what it left must go) before the
    run starts again: a child born in it would be killed with it on this kernel, so the child
    moves itself in. It lives, and it is there."""
    assert isinstance(FOUND, CgroupContainment)
    owner = f"test-{uuid.uuid4().hex[:8]}"
    job_id = "20261127-224400-000000-0f0f0f0f"

    def check() -> None:
        here = CgroupContainment(FOUND.base)
        here.open_owner(owner)
        assert here.forks_into  # this host: a child is born in a new cgroup
        os.mkdir(os.path.join(FOUND.base, owner, f"{job_id}.1"))  # left by the earlier claim
        box = here.new_run(owner, job_id, 1)
        assert box is not None
        cgroup, left = box.fork_into()
        assert cgroup is not None
        assert cgroup[0] == -1  # no folder to fork into
        assert left == (-1, -1)
        assert _where_the_child_is(cgroup) == (_relative(box.path), 0)
        box.started()
        assert box.remove()
        again = here.new_run(owner, job_id, 2)  # a new one, as a run's first: born in it
        assert again is not None
        assert again.cgroup_fd >= 0
        assert _where_the_child_is(again.fork_into()[0]) == (_relative(again.path), 0)
        again.started()
        assert again.remove()

    try:
        alone(check)
    finally:  # (a failed check leaves its runs' cgroups: empty, their children were waited for)
        folder = os.path.join(FOUND.base, owner)
        with contextlib.suppress(OSError):
            for run in os.scandir(folder):
                if run.is_dir(follow_symlinks=False):
                    os.rmdir(run.path)
            os.rmdir(folder)


def test_a_manager_s_jobs_are_born_in_their_run_s_cgroup_and_keep_nothing_of_it(procs: Processes, queue: Queue) -> None:
    """The whole path, as users run it (`forkvisor run`: a process of one thread): the
    manager says its runs are born in their cgroup, each job finds itself in its run's
    cgroup, and holds no descriptor of any cgroup (its folder and `cgroup.procs` stay the
    manager's)."""
    job_ids = [queue.enqueue("sample.own_cgroup") for _ in range(3)]
    manager = procs.run_manager(queue, "--containment", "cgroup", "--burst", "--concurrency", "2")
    assert procs.wait_exit(manager, 30, "the burst manager") == 0, procs.log(manager)
    assert "its first process born in it" in procs.log(manager)
    for job_id in job_ids:
        report = queue.job(job_id).result
        assert report is not None
        assert report["cgroup"].endswith(f"/{job_id}.1"), report["cgroup"]
        held = [target for target in report["fds"].values() if target.startswith(("/sys/fs/cgroup", "cgroup"))]
        assert held == [], f"the job holds the manager's cgroup descriptors: {report['fds']}"
