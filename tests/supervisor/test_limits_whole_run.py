"""A run's limits hold for all of it, where runs have no cgroup too:

- its memory limit counts what left its tree (`setsid` and a double fork: adopted by the
  manager, found by the run's mark), and the daemon that holds the memory ends with it;
- its output, on a file system that cannot punch holes (a ramfs, made here; skipped,
  saying why, where this process may not mount one), stops it once a stream holds more
  than its ceiling, rather than filling the queue's disk.

Real managers, real jobs; each process of a job carries a mark the tests look for in /proc
(tests/tree_job.py), knowing nothing of how forkvisor finds a run's processes."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import Queue, State, output
from supervisor.running import Life
from tests.processes import Processes, _reap_zombies, dump, outcome, settle, wait_until
from tests.tree_job import marked

# The hog: holds 150M (every page written: all of it resident) and waits; as a daemon
# ("double-fork") it first leaves its parent's session and tree as daemons do.
HOG = """
import os, sys, time
if sys.argv[1] == "double-fork":
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
data = b"\\1" * (150 << 20)
time.sleep(300)
"""
SHAPES = {
    "setsid": "(setsid {python} {hog} as-is &); exec sleep 300",  # a subshell's background job, in a new session
    "double-fork": "{python} {hog} double-fork; exec sleep 300",  # a Python daemon's double fork
}


def gone(mark: str) -> bool:
    _reap_zombies()  # what ends comes back to this process (a subreaper while the test runs)
    return not marked(mark)


def release_command(release: Path) -> list[str]:
    """A job that waits (with a small tree: one shell) until the test creates `release`."""
    return ["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"]


# A manager with a cgroup per run but no memory controller of its own: here (a hybrid host,
# whose memory controller is cgroup v1's), one started in a mount namespace of its own
# without the v1 hierarchies; it then watches the RSS of every process of each run's cgroup.
NO_MEMORY_CONTROLLER = ["unshare", "--mount", "sh", "-c", 'umount -a -t cgroup && exec "$@"', "sh"]
WAYS = {
    "processes": ("--containment", "processes"),
    "cgroup without a memory controller": ("--containment", "cgroup"),
}
SLOW_WAYS = {"cgroup without a memory controller"}  # (in the slow suite, which CI runs too)


@pytest.mark.parametrize(
    "way", [pytest.param(way, marks=[pytest.mark.slow] if way in SLOW_WAYS else []) for way in WAYS]
)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_memory_limit_counts_what_left_the_tree(
    procs: Processes, queue: Queue, barriers: Path, shape: str, way: str
) -> None:
    """The hog left the job's tree: the job's own processes (a shell, then `sleep`) hold a
    few MiB, its daemon 150M. The run is stopped for its memory limit, its daemon ends with
    it, and another run's limit (whose tree is small), checked at the same moments, does
    not count the hog's memory."""
    hog, release, mark = barriers / "hog.py", barriers / "release", uuid.uuid4().hex
    hog.write_text(HOG)
    other_id = queue.enqueue_command(release_command(release), memory_limit="64M", max_attempts=1)
    prefix = NO_MEMORY_CONTROLLER if way.startswith("cgroup") else []
    manager = procs.run_manager(queue, "--commands", *WAYS[way], name="manager", prefix=prefix)
    wait_until(lambda: queue.job(other_id).state is State.CLAIMED or manager.poll() is not None, 20, "the other runs")
    _skip_unless_contained_as(procs.log(manager), way)
    script = SHAPES[shape].format(python=sys.executable, hog=hog)
    hog_id = queue.enqueue_command(["sh", "-c", script], env={"FVTEST_MARK": mark}, memory_limit="64M", max_attempts=1)
    wait_until(lambda: queue.job(hog_id).state is State.DEAD, 20, "the hog's run was stopped at its memory limit")
    record = outcome(queue.job(hog_id))
    assert record["limit"] == "memory", dump(queue.job(hog_id))
    assert record["error"]["type"] == "MemoryLimit"
    wait_until(lambda: gone(mark), 5, "the hog ended with its run")
    assert queue.job(other_id).state is State.CLAIMED, dump(queue.job(other_id))
    release.touch()
    wait_until(lambda: queue.job(other_id).state is State.DONE, 10, "the other job ended by itself")
    assert outcome(queue.job(other_id))["limit"] is None
    manager.terminate()
    assert procs.wait_exit(manager, 10, "the manager") == 0, procs.log(manager)


def _skip_unless_contained_as(log: str, way: str) -> None:
    if way == "processes":
        return
    if "cgroup (each run in its own" not in log:
        pytest.skip(f"no cgroup per run here: {log[-300:]}")
    if "memory limits by watching the RSS" not in log:
        pytest.skip("this host lends its manager a memory controller however it is started")


# -- output, where holes cannot be punched -----------------------------------------------------


@pytest.fixture
def no_holes(tmp_path: Path) -> Iterator[Path]:
    """A ramfs (its files hold pages, counted in st_blocks; it cannot punch holes) of this
    test's own, unmounted (lazily if busy) at teardown."""
    where = tmp_path / "ramfs"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0755", "ramfs", str(where)], capture_output=True)
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()
        pytest.skip(f"cannot mount a ramfs, a file system without hole punching (needs root): {why}")
    try:
        if _can_punch(where):
            pytest.skip("this kernel's ramfs punches holes: no file system here to show the ceiling on")
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _can_punch(folder: Path) -> bool:
    (folder / "stdout").write_bytes(b"\1" * (1 << 20))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        output.bound(fd, 0)
    except OSError:
        return False
    finally:
        os.close(fd)
        (folder / "stdout").unlink()
    return True


@pytest.mark.slow  # (a 64M write to a ramfs)
def test_output_that_cannot_be_bounded_stops_the_run_past_its_ceiling(procs: Processes, no_holes: Path) -> None:
    """The job writes 64M to stdout (its limit 1M: its ceiling 20M) and ignores SIGTERM: it
    is stopped for its output, and killed at the next check, not after its long grace."""
    queue = Queue(no_holes / "queue", create=True)
    script = "trap '' TERM; head -c 64M /dev/zero; exec sleep 300"  # (SIGTERM ignored by what it execs too)
    job_id = queue.enqueue_command(["sh", "-c", script], output_limit="1M", max_attempts=1)
    manager = procs.manager(queue, containment="processes", kill_grace=60)
    settle(manager, queue, [job_id], timeout=15)
    found = queue.job(job_id)
    assert found.state is State.DEAD, dump(found)
    record = outcome(found)
    assert record["limit"] == "output", dump(found)
    assert record["status"] == "killed by SIGKILL"
    assert record["output_dropped"]["stdout"] > output.ceiling(1 << 20) - (1 << 20)
    assert (found.history[-1].path / "stdout").stat().st_size < 2 << 20, "compacted at its end, as anywhere"


def test_output_past_its_limit_but_under_its_ceiling_lets_the_run_end(procs: Processes, no_holes: Path) -> None:
    """3M with a limit of 1M, where holes cannot be punched: the run goes on (its middle is
    dropped at its end, as anywhere) and succeeds."""
    queue = Queue(no_holes / "queue", create=True)
    release = no_holes / "release"
    script = f"head -c 3M /dev/zero; while [ ! -e {release} ]; do sleep 0.05; done"
    job_id = queue.enqueue_command(["sh", "-c", script], output_limit="1M", max_attempts=1)
    manager = procs.manager(queue, containment="processes")

    def checked() -> bool:  # a check found its output past its limit, and could not punch it
        return any(running.output_unbounded for running in manager.running.values())

    wait_until(checked, 10, "the manager found the output past its limit, unbounded", manager=manager)
    assert [running.life for running in manager.running.values()] == [Life.RUNNING]
    release.touch()
    settle(manager, queue, [job_id])
    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert outcome(found)["limit"] is None
    assert outcome(found)["output_dropped"] == {"stdout": 2 << 20}
