"""A full disk: the queue on a 1 MiB tmpfs, filled to the last byte.

Submitting fails with a clear error and leaves nothing half-visible; a manager
that cannot write a result or an outcome keeps running, keeps the job, and
moves it on once there is room again; a job that fills the disk itself is
recorded with its failure once an operator frees space.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from jobs import Call, Owner, Queue, QueueError, State, unknown_liveness
from tests import sample_jobs
from tests.faults import fault_jobs
from tests.faults.conftest import Tmpfs, start_manager, step_cpu
from tests.processes import REPO, Processes, dump, forkvisor_command, outcome, wait_until

RESERVE_FILE, RESERVE_SIZE = ".purge-reserve", 64 * 1024  # as docs/FORMAT.md says


def staged_and_published(queue: Queue) -> dict[str, list[str]]:
    return {name: sorted(os.listdir(queue.path / name)) for name in ("tmp", "ready", "scheduled")}


def test_enqueue_on_a_full_disk_fails_clearly_and_publishes_nothing(tmpfs: Tmpfs) -> None:
    queue = Queue(tmpfs.path / "queue")
    kept = queue.enqueue("sample.ok", "before the disk filled")
    before = staged_and_published(queue)
    filler = tmpfs.fill()

    attempts = {
        "enqueue": lambda: queue.enqueue("sample.ok", "x" * 10_000),
        "enqueue_many": lambda: queue.enqueue_many([Call("sample.ok", (n,)) for n in range(5)]),
        "delayed": lambda: queue.with_options(delay=60).enqueue("sample.ok"),
    }
    for what, submit in attempts.items():
        with pytest.raises(QueueError, match=r"cannot enqueue into .*: its file system is full; free space"):
            submit()
        assert staged_and_published(queue) == before, f"{what} left something in tmp/, ready/ or scheduled/"
    assert queue.counts()["ready"] == 1
    assert queue.job(kept).state is State.READY

    filler.unlink()
    published = queue.enqueue("sample.ok", "after space was freed")
    assert queue.job(published).state is State.READY, "a failed enqueue must not poison the queue"


def test_cli_init_on_a_full_disk_exits_111_with_one_line(tmpfs: Tmpfs) -> None:
    tmpfs.fill()
    done = subprocess.run(
        [*forkvisor_command(), "init", str(tmpfs.path / "queue")], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 111, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert "its file system is full; free space and try again" in done.stderr
    assert "Traceback" not in done.stderr


def test_init_that_failed_on_a_full_disk_succeeds_once_space_is_freed(tmpfs: Tmpfs) -> None:
    filler = tmpfs.fill()
    with pytest.raises(QueueError, match="its file system is full"):
        Queue(tmpfs.path / "queue")
    filler.unlink()
    queue = Queue(tmpfs.path / "queue")
    assert queue.counts()["ready"] == 0
    assert os.listdir(queue.path / "tmp") == []


def test_manager_that_cannot_record_an_outcome_keeps_the_job_and_retries_it(
    procs: Processes, tmpfs: Tmpfs, barriers: Path
) -> None:
    ready, release = barriers / "ready", barriers / "release"
    queue = Queue(tmpfs.path / "queue")
    job_id = queue.enqueue(sample_jobs.wait_release, str(ready), str(release))
    manager = procs.manager(queue)
    wait_until(ready.exists, 10, "the job started", manager=manager)
    filler = tmpfs.fill()
    release.touch()  # the child now cannot write result.json, nor the manager outcome.json
    wait_until(lambda: not manager.running, 10, "the child exited", manager=manager)

    cpu = step_cpu(manager, 1.5)
    assert cpu < 0.5, f"the manager spun for {cpu:.2f}s of CPU while the disk was full"
    stuck = queue.job(job_id)
    assert stuck.state is State.CLAIMED, f"the job must stay held while its outcome cannot be written: {dump(stuck)}"

    filler.unlink()
    wait_until(lambda: queue.job(job_id).state is State.DONE, 10, "the job was retried and done", manager=manager)
    found = queue.job(job_id)
    assert found.attempts == 2, dump(found)
    first = outcome(found, 0)
    assert first["succeeded"] is False, "a result that could not be written never completes the job"
    assert outcome(found)["succeeded"] is True
    assert found.result == "released"


def test_cannot_complete_on_a_full_disk_still_goes_dead_at_once(procs: Processes, tmpfs: Tmpfs, barriers: Path) -> None:
    ready, release = barriers / "ready", barriers / "release"
    queue = Queue(tmpfs.path / "queue")
    job_id = queue.enqueue(fault_jobs.cannot_after_release, str(ready), str(release))
    manager = start_manager(procs, queue)
    wait_until(ready.exists, 10, "the job started", manager=manager)
    filler = tmpfs.fill()
    release.touch()
    wait_until(lambda: not manager.running, 10, "the child exited", manager=manager)
    filler.unlink()
    wait_until(lambda: queue.job(job_id).state is not State.CLAIMED, 10, "the job moved on", manager=manager)
    found = queue.job(job_id)
    assert outcome(found, 0)["exit_code"] == 100, dump(found)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 1


def test_job_that_fills_the_disk_with_stdout_is_recorded_once_space_is_freed(
    procs: Processes, tmpfs: Tmpfs, barriers: Path
) -> None:
    queue = Queue(tmpfs.path / "queue")
    ballast = tmpfs.ballast(256 * 1024)  # what an operator frees later
    flooding = queue.enqueue(fault_jobs.flood, str(barriers / "ready"))
    behind = queue.with_options(priority=-1).enqueue("fault.ok", "behind the flood")
    manager = start_manager(procs, queue, concurrency=1)
    wait_until(lambda: not manager.running and (barriers / "ready").exists(), 20, "the flood ended", manager=manager)

    cpu = step_cpu(manager, 1.5)  # meanwhile it fails to record the flood and to claim the next job
    assert cpu < 0.5, f"the manager spun for {cpu:.2f}s of CPU on a full disk"
    assert queue.job(flooding).state is State.CLAIMED, "the job is held, not lost, while nothing can be written"
    waiting = queue.job(behind)
    assert waiting.state in (State.READY, State.CLAIMED), dump(waiting)
    assert waiting.attempts == 0, "a claim that could not count its attempt must not use one"

    ballast.unlink()
    wait_until(lambda: queue.job(flooding).state is State.DEAD, 10, "the flood's outcome was recorded", manager=manager)
    found = queue.job(flooding)
    record = outcome(found)
    assert record["succeeded"] is False
    assert record["status"].startswith("exited"), dump(found)
    assert found.error is not None
    assert found.error["reason"] == "attempts exhausted"
    assert (found.history[-1].path / "stdout").stat().st_size > 512 * 1024, "the job really filled the disk"
    wait_until(lambda: queue.job(behind).state is State.DONE, 10, "the job behind ran", manager=manager)
    assert queue.job(behind).attempts == 1


# -- the operator's way out of a full disk, and a manager that cannot get anywhere --------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*forkvisor_command(), *args], capture_output=True, text=True, timeout=60, cwd=REPO)


def _assert_full_disk_message(done: subprocess.CompletedProcess[str], queue: Queue, action: str) -> None:
    assert done.returncode == 111, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"forkvisor: cannot {action} {queue.path}: its file system is full; free space and try again" in done.stderr
    assert f"forkvisor purge {queue.path} --state done" in done.stderr, "it says what frees space"
    assert "permission" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_manager_on_a_full_disk_says_so_and_leaves_nothing_behind(tmpfs: Tmpfs) -> None:
    queue = Queue(tmpfs.path / "queue")
    queue.enqueue("sample.ok")
    tmpfs.fill()
    for _ in range(3):
        _assert_full_disk_message(_cli("run", str(queue.path), "--burst"), queue, "serve")
    assert os.listdir(queue.path / "tmp") == [], "a failed start leaves no tmp/.owner.* folder"
    assert os.listdir(queue.path / "claimed") == []


def test_a_burst_manager_that_cannot_record_anything_gives_up_with_the_reason(
    procs: Processes, tmpfs: Tmpfs, barriers: Path
) -> None:
    ready, release = barriers / "ready", barriers / "release"
    queue = Queue(tmpfs.path / "queue")
    job_id = queue.enqueue(sample_jobs.wait_release, str(ready), str(release))
    manager = procs.run_manager(queue, "--burst", "--stall-timeout", "1")
    wait_until(ready.exists, 20, "the job started")
    filler = tmpfs.fill()
    release.touch()  # its result and outcome cannot be written: the manager keeps the job and retries
    code = procs.wait_exit(manager, 30, "a burst manager stuck on a full disk")
    log = procs.log(manager)
    assert code == 111, log
    assert f"gave up on {queue.path} after 1s in which every change to it failed" in log
    assert "No space left on device" in log
    assert "Traceback" not in log

    filler.unlink()  # space again: the next manager finishes what was left, and nothing was lost
    assert queue.job(job_id).state is State.CLAIMED, "held by the manager that gave up, until a sweeper returns it"
    rerun = procs.run_manager(queue, "--burst")
    assert procs.wait_exit(rerun, 30, "the burst manager after space was freed") == 0, procs.log(rerun)
    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 2, "the run whose outcome was lost used its attempt"
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 1,
        "dead": 0,
    }


def _done_jobs_with_output(queue: Queue, count: int, size: int) -> list[str]:
    """Jobs in done/ whose stdout holds `size` bytes each, written as a finished run leaves them."""
    ids = []
    for n in range(count):
        job_id = queue.enqueue("sample.ok", n)
        ready = queue.path / "ready" / f"100.{job_id}"
        (ready / "attempt-1").mkdir()
        (ready / "attempt-1" / "stdout").write_bytes(b"x" * size)
        (ready / "attempts").write_text("1\n")
        os.rename(ready, queue.path / "done" / job_id)
        ids.append(job_id)
    return ids


def test_purge_frees_a_full_disk_of_jobs_with_no_output(tmpfs: Tmpfs) -> None:
    """Jobs with nothing to delete but their records: the purge's own line is written in the
    room the queue keeps for it (jobs.reserve), and kept again once the purge freed room."""
    queue = Queue(tmpfs.path / "queue")
    assert (queue.path / RESERVE_FILE).stat().st_size == RESERVE_SIZE, "a new queue keeps room for purges"
    purged_ids = _done_jobs_with_output(queue, 3, 0)
    filler = tmpfs.fill()
    done = _cli("purge", str(queue.path), "--state", "done", "--older-than", "0s")
    assert done.returncode == 0, done
    assert done.stdout.startswith("purged 3 done job(s)"), done
    logged = (queue.path / "purged.log").read_text().splitlines()
    assert sorted(line.split()[-1] for line in logged) == sorted(purged_ids), "every purged job is recorded"
    assert (queue.path / RESERVE_FILE).stat().st_size == RESERVE_SIZE, "kept again, in the room the purge freed"
    (queue.path / RESERVE_FILE).unlink()
    filler.unlink()
    queue.serving.sweep(time.time(), unknown_liveness)
    assert (queue.path / RESERVE_FILE).stat().st_size == RESERVE_SIZE, "and a sweep keeps it if it is missing"


def test_purge_frees_space_on_a_full_disk(tmpfs: Tmpfs) -> None:
    """The line in purged.log needs a new block, which only deleting can free: purge must
    not ask for it first and fail (a purge that cannot free space is no way out)."""
    queue = Queue(tmpfs.path / "queue")
    purged_ids = _done_jobs_with_output(queue, 3, 100_000)
    tmpfs.fill()
    assert not (queue.path / "purged.log").exists()
    done = _cli("purge", str(queue.path), "--state", "done", "--older-than", "0s")
    assert done.returncode == 0, done
    assert done.stdout.startswith("purged 3 done job(s)"), done
    assert sorted(line.split()[-1] for line in (queue.path / "purged.log").read_text().splitlines()) == sorted(
        purged_ids
    ), "every purged job is recorded, even on the full disk"
    assert os.listdir(queue.path / "done") == []
    assert os.listdir(queue.path / "tmp") == []
    assert queue.enqueue("sample.ok", "room again")


def test_cancel_works_on_a_full_disk(tmpfs: Tmpfs) -> None:
    queue = Queue(tmpfs.path / "queue")
    waiting = queue.enqueue("sample.ok")
    running = queue.enqueue("sample.ok")
    owner_dir = queue.path / "claimed" / "host.1.abcdef"
    owner_dir.mkdir()
    os.rename(queue.path / "ready" / f"100.{running}", owner_dir / running)
    tmpfs.fill()

    done = _cli("cancel", str(queue.path), waiting, running)
    assert done.returncode == 0, done
    assert done.stdout.splitlines() == [
        f"{waiting} cancelled: moved to dead/",
        f"{running} running: its manager stops it and moves it to dead/",
    ]
    assert queue.job(waiting).state is State.DEAD
    assert (owner_dir / running / "cancel").exists(), "the marker is made, empty if need be"


@pytest.mark.parametrize("output", ["stdout", "result"])
def test_purge_frees_a_job_s_own_output_when_the_room_kept_is_gone(tmpfs: Tmpfs, output: str) -> None:
    """No room kept (`.purge-reserve` gone) and the disk full: the purge deletes the job's
    output first, its run's stdout or its result (the run's file and the job's link to it,
    or no block comes free), and records the job in the room that made."""
    queue = Queue(tmpfs.path / "queue")
    [job_id] = _done_jobs_with_output(queue, 1, 0)
    run = queue.path / "done" / job_id / "attempt-1"
    if output == "stdout":
        (run / "stdout").write_bytes(b"x" * 100_000)
    else:
        (run / "result.json").write_bytes(b'"' + b"x" * 100_000 + b'"\n')
        os.link(run / "result.json", run.parent / "result.json")
    (queue.path / RESERVE_FILE).unlink()
    tmpfs.fill()
    assert queue.purge(State.DONE, older_than=0) == [job_id]
    assert (queue.path / "purged.log").read_text().split()[-1] == job_id


def test_purge_on_a_full_disk_with_nothing_to_free_says_the_disk_is_full(tmpfs: Tmpfs) -> None:
    queue = Queue(tmpfs.path / "queue")
    [job_id] = _done_jobs_with_output(queue, 1, 0)
    (queue.path / RESERVE_FILE).unlink()
    tmpfs.fill()
    with pytest.raises(OSError, match="No space left"):
        queue.purge(State.DONE, older_than=0)
    assert queue.job(job_id).state is State.DONE, "not purged unrecorded"


def test_a_sweep_on_a_full_disk_runs_every_chore_and_raises_the_first_failure(tmpfs: Tmpfs) -> None:
    """Returning a dead owner's job needs a block (its lost run's outcome): that chore fails,
    the promotion of a due job (a rename) still runs, and the sweep raises the failure after
    them, so its sweeper says the sweep failed and tries again."""
    queue = Queue(tmpfs.path / "queue")
    owner = Owner.new(lease=60.0)
    queue.serving.register_owner(owner)
    queue.enqueue("sample.ok")
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    due = queue.with_options(delay=1.0).enqueue("sample.ok")
    tmpfs.fill()
    with pytest.raises(OSError, match="No space left"):
        queue.serving.sweep(time.time() + 3600, unknown_liveness)
    assert queue.job(due).state is State.READY, "the promotion ran, after the reap failed"
    assert queue.job(claim.job_id).state is State.CLAIMED, "not returned without its lost run's outcome"
