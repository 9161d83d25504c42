"""One entry never stops a loop (issue 18, class "one entry stops a loop or a process"): a
document nested 100,000 deep, a fifo or a link where a file belongs, a tree 100,000 folders
deep, 20,000 junk entries, a job file of 16 MB. Each is planted, the manager, its sweeper
and the operator's commands carry on, and nothing is lost or duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobs.files
from jobs import Queue, State, new_job_id
from jobs.job import MAX_SPEC_BYTES, ready_name
from jobs.lease import OWNER_FILE
from tests import sample_jobs
from tests.faults.conftest import Outside, start_manager, watchdog
from tests.jobs_processes import invariants
from tests.processes import REPO, Processes, dump, forkvisor_command, wait_until

DEEP = b"[" * 100_000


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*forkvisor_command(), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )


def _conserved(queue: Queue, published: list[str]) -> None:
    """Every job in exactly one state folder, none lost (tests/jobs_processes/invariants.py)."""
    invariants.check_invariants(queue.path, published)


def _ready_job(queue: Queue, spec: bytes) -> str:
    job_id = new_job_id()
    job_dir = queue.path / "ready" / ready_name(job_id, 0)
    job_dir.mkdir()
    (job_dir / "job.json").write_bytes(spec)
    return job_id


def test_a_deep_job_json_is_buried_and_the_manager_carries_on(procs: Processes, queue: Queue) -> None:
    deep = _ready_job(queue, DEEP)
    nested = _ready_job(queue, json.dumps({"function": "sample.ok", "args": [[[[[[[[[[1]]]]]]]]]]}).encode())
    fine = queue.enqueue(sample_jobs.ok, "after the trap")
    manager = procs.manager(queue)
    wait_until(lambda: queue.job(fine).state is State.DONE, 10, "the job after the trap ran", manager=manager)
    wait_until(lambda: queue.job(deep).state is State.DEAD, 10, "the deep job was buried", manager=manager)
    error = queue.job(deep).error
    assert error is not None
    assert "job.json is nested too deeply to read (JSON nested over 64 levels)" in error["message"], error
    wait_until(lambda: queue.job(nested).state is State.DONE, 10, "ordinary nesting is fine", manager=manager)
    _conserved(queue, [deep, nested, fine])


def test_a_job_json_over_the_limit_is_refused_without_reading_it_whole(procs: Processes, queue: Queue) -> None:
    big = new_job_id()
    job_dir = queue.path / "ready" / ready_name(big, 0)
    job_dir.mkdir()
    with open(job_dir / "job.json", "wb") as file:  # 16 MB once cost ~300 MB per running job
        file.write(b'{"function": "sample.ok", "args": ["')
        file.truncate(16 * 1024 * 1024)
    manager = procs.manager(queue)
    wait_until(lambda: queue.job(big).state is State.DEAD, 10, "the huge job was refused", manager=manager)
    error = queue.job(big).error
    assert error is not None
    assert f"larger than {MAX_SPEC_BYTES} bytes" in error["message"]
    assert MAX_SPEC_BYTES == 1 << 20


@pytest.mark.parametrize("kind", ["deep", "fifo", "link", "not-an-object"])
def test_a_planted_error_json_is_never_followed_blocked_on_or_copied(
    procs: Processes, queue: Queue, barriers: Path, outside: Outside, kind: str
) -> None:
    """error.json is written by the job's child: a job (or whoever can write its folder) can put
    anything there. The manager reads it with the safe reader and keeps going."""
    ready, release = barriers / "ready", barriers / "release"
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.wait_release, str(ready), str(release))
    manager = procs.manager(queue)
    wait_until(ready.exists, 10, "the job started", manager=manager)
    planted = queue.job(job_id).history[-1].path / "error.json"
    if kind == "deep":
        planted.write_bytes(DEEP)
    elif kind == "fifo":
        os.mkfifo(planted)
    elif kind == "link":
        planted.symlink_to(outside.secret)
    else:
        planted.write_text('"just a string"')
    [pid] = manager.running
    os.kill(pid, signal.SIGKILL)  # the run fails, so the manager reads its error.json
    with watchdog(20, "the manager reading a planted error.json"):
        wait_until(lambda: queue.job(job_id).state is State.DEAD, 15, "the job was buried", manager=manager)
    record = queue.job(job_id).history[-1].outcome
    assert record is not None, dump(queue.job(job_id))
    assert Outside.SECRET.decode() not in json.dumps(record), "a linked file's content was copied"
    outside.check()
    _conserved(queue, [job_id])


def test_a_fifo_or_deep_owner_file_stops_neither_the_sweeper_nor_status(
    procs: Processes, queue: Queue, tmp_path: Path
) -> None:
    for name, plant in (("host.1.aaaaaa", "fifo"), ("host.2.bbbbbb", "deep")):
        owner_dir = queue.path / "claimed" / name
        owner_dir.mkdir()
        if plant == "fifo":
            os.mkfifo(owner_dir / OWNER_FILE)
        else:
            (owner_dir / OWNER_FILE).write_bytes(DEEP)
        os.utime(owner_dir, (1, 1))  # registered long ago: its lease is over
    later = queue.with_options(delay=0.2).enqueue(sample_jobs.ok, "promoted by the sweeper")
    with watchdog(30, "status or the sweeper on a planted owner file"):
        status = _cli("status", queue.path, "--json")
        assert status.returncode == 0, status
        manager = start_manager(procs, queue, registry=sample_jobs.registry)
        wait_until(lambda: queue.job(later).state is State.DONE, 15, "the delayed job ran", manager=manager)
        wait_until(
            lambda: sorted(os.listdir(queue.path / "claimed")) == [manager.owner.name],
            15,
            "the sweeper reaped both broken owner folders",
            manager=manager,
        )


@pytest.fixture
def deep_trees(tmp_path: Path) -> Iterator[None]:
    """Whatever the test's outcome, remove the deep trees it made (pytest's own clean-up of
    old temporary folders recurses, and would fail on them in a later run)."""
    yield
    for folder in sorted(tmp_path.rglob("*"), key=lambda path: len(path.parts)):
        if folder.is_dir() and not folder.is_symlink():
            jobs.files.remove_quietly(folder)
            break


def _deep_tree(top: Path, depth: int) -> None:
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)


@pytest.mark.slow
def test_a_deep_tree_is_purged_without_recursion_and_the_sweeper_finishes_the_rest(
    procs: Processes, queue: Queue, deep_trees: None
) -> None:
    done = queue.enqueue(sample_jobs.ok, "to purge")
    manager = procs.manager(queue)
    wait_until(lambda: queue.job(done).state is State.DONE, 10, "the job was done", manager=manager)
    _deep_tree(queue.job(done).path / "attempt-1" / "deep", 30_000)  # what a job can leave in its folder
    stale = queue.path / "tmp" / ".purge.20200101-000000-000000-00000000"
    _deep_tree(queue.path / "built-aside", 30_000)  # a purge killed half way: made aside, then moved in
    os.rename(queue.path / "built-aside", stale)

    purged = _cli("purge", queue.path, "--state", "done", "--older-than", "0s")
    assert purged.returncode == 0, purged  # was 101: RecursionError in shutil.rmtree
    assert purged.stdout.startswith("purged 1 done job(s)")
    wait_until(lambda: not stale.exists(), 60, "sweeps removed the deep leftover", manager=manager)
    assert os.listdir(queue.path / "tmp") == []


@pytest.fixture
def quarantined() -> Iterator[list[int]]:
    """How many entries each turn of the manager quarantines (counted at its checkpoint)."""
    counts = [0]  # before the first turn: the manager's start

    def count(name: str) -> None:
        if name == "quarantine:moved":
            counts[-1] += 1

    jobs.files.checkpoint_hook = count
    yield counts
    jobs.files.checkpoint_hook = None


def test_a_flood_of_junk_in_ready_costs_no_running_job_its_lease(
    procs: Processes, queue: Queue, barriers: Path, quarantined: list[int]
) -> None:
    """20,000 junk entries once stalled the loop past the lease: the manager's own sweeper
    reaped it and killed its running job. A turn now looks at 64 entries at most (and for
    50 ms at most), so the heartbeat and the running children are never starved."""
    ready, release = barriers / "ready", barriers / "release"
    running = queue.enqueue(sample_jobs.wait_release, str(ready), str(release))
    manager = procs.manager(queue, lease=2.0, sweep_interval=0.3)
    wait_until(ready.exists, 10, "the job started", manager=manager)
    owner = manager.owner.name

    def turn() -> None:  # this in-process manager turns only when the test lets it
        quarantined.append(0)
        manager.step(timeout=0)

    for n in range(20_000):
        (queue.path / "ready" / f"junk-{n}").write_bytes(b"")
        if n % 200 == 0:
            turn()
    started = time.monotonic()
    while os.listdir(queue.path / "ready") and time.monotonic() - started < 300:
        turn()
    assert not os.listdir(queue.path / "ready"), "the junk was not quarantined within 300 s"
    assert max(quarantined) <= 64, f"a turn quarantined {max(quarantined)} entries"
    release.touch()
    wait_until(lambda: queue.job(running).state is State.DONE, 20, "the running job finished", manager=manager)
    found = queue.job(running)
    assert manager.owner.name == owner, (
        f"the manager was reaped while it quarantined ({time.monotonic() - started:.0f}s)"
    )
    assert found.attempts == 1, dump(found)
    assert len([n for n in os.listdir(queue.path / "quarantine") if not n.endswith(".why")]) == 20_000


def test_an_unreadable_owner_folder_does_not_stop_the_other_chores_of_a_sweep(
    queue: Queue, nobody: list[str], open_dir: Path
) -> None:
    """Run as nobody, so that root's bypass of permissions does not hide the problem."""
    path = open_dir / "queue"
    mine = Queue(path)
    due = mine.with_options(delay=0.1).enqueue("sample.ok")
    subprocess.run(["chown", "-R", "nobody:nogroup", str(path)], check=True)
    locked = path / "claimed" / "other.9.cccccc"
    locked.mkdir(mode=0o700)  # root's: nobody can neither list nor reap it
    os.utime(locked, (1, 1))
    script = (
        "import sys; from jobs import Queue, unknown_liveness; q = Queue(sys.argv[1], create=False); "
        "print(q.serving.sweep(q.serving.filesystem_now() + 1, unknown_liveness))"  # a second on: the job is due
    )
    done = subprocess.run(
        [*nobody, sys.executable, "-c", script, str(path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "'promoted': 1" in done.stdout, done
    assert "Permission denied" in done.stderr, "the folder it could not read is named in the log"
    assert Queue(path, create=False).job(due).state is State.READY
