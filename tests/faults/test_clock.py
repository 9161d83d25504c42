"""Clock jumps: a manager whose own clock is a day off judges leases and stale
submissions by the file system's clock (the mtime of `QUEUE/.clock`, which its
sweeper touches), so it neither steals a healthy lease nor keeps a dead one.

The manager runs under libfaketime (Debian package `faketime`), which moves
the clock of its whole process tree; the tests skip where it is missing. The
other owner is on "another host", so only its lease can tell whether it lives.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobs import Owner, Queue, State, new_job_id
from jobs.lease import OWNER_FILE
from tests.faults.conftest import DAY, cli_manager, faketime
from tests.processes import Processes, dump, wait_until

FAULT_APP = "tests.faults.fault_jobs:registry"
SPEC = '{"function": "fault.ok", "args": ["held elsewhere"]}'


def foreign_owner(queue: Queue, lease: float) -> tuple[Path, str]:
    """An owner on another host holding one job; return its folder and the job's id."""
    owner = Owner(name="otherhost.4242.abcdef", host="otherhost", pid=4242, lease=lease, started=time.time())
    queue.serving.register_owner(owner)
    folder = queue.path / "claimed" / owner.name
    job_id = new_job_id()
    (folder / job_id).mkdir()
    (folder / job_id / "job.json").write_text(SPEC)
    (folder / job_id / "attempts").write_text("1\n")
    (folder / job_id / "attempt-1").mkdir()
    return folder, job_id


def submission_in_progress(queue: Queue) -> Path:
    """A job being written in tmp/ by a submitter that is still alive."""
    staging = queue.path / "tmp" / new_job_id()
    staging.mkdir()
    (staging / "job.json").write_text(SPEC)
    return staging


def swept_twice(queue: Queue) -> None:
    """Wait for two sweeps: each quarantines a junk entry planted in scheduled/."""
    for n in range(2):
        junk = queue.path / "scheduled" / f"junk-{n}"
        junk.write_text("not a job")
        wait_until(lambda junk=junk: not junk.exists(), 10, f"sweep {n + 1} quarantined {junk.name}")  # type: ignore[misc]


def assert_clock_skewed(queue: Queue, ahead: bool) -> None:
    """The manager's children really run on the fake clock."""
    job_id = queue.enqueue("fault.now")
    wait_until(lambda: queue.job(job_id).state is State.DONE, 10, "the clock job ran")
    skew = queue.job(job_id).result - time.time()
    assert (skew > DAY / 2) if ahead else (skew < -DAY / 2), f"the manager's clock is off by only {skew:.0f}s"


def test_manager_a_day_ahead_steals_no_healthy_lease(procs: Processes, tmp_path: Path) -> None:
    prefix = faketime("+1d")
    queue = Queue(tmp_path / "queue")
    folder, held = foreign_owner(queue, lease=30.0)
    staging = submission_in_progress(queue)
    with cli_manager(procs, queue, "--app", FAULT_APP, prefix=prefix) as manager:
        swept_twice(queue)
        os.utime(folder / OWNER_FILE)  # the other owner heartbeats, as it would
        swept_twice(queue)
        assert (folder / held).is_dir(), f"a healthy lease was taken:\n{procs.log(manager)[-2000:]}"
        assert queue.job(held).state is State.CLAIMED
        assert staging.is_dir(), "a fresh submission in tmp/ was taken for abandoned"
        assert_clock_skewed(queue, ahead=True)
    assert manager.returncode == 0, procs.log(manager)


def test_manager_a_day_behind_still_reaps_an_expired_lease(procs: Processes, tmp_path: Path) -> None:
    prefix = faketime("-1d")
    queue = Queue(tmp_path / "queue")
    folder, held = foreign_owner(queue, lease=30.0)
    hour_ago = time.time() - 3600
    os.utime(folder / OWNER_FILE, (hour_ago, hour_ago))  # silent for an hour: its lease ran out long ago
    staging = submission_in_progress(queue)
    os.utime(staging, (hour_ago - 3600, hour_ago - 3600))  # abandoned two hours ago
    with cli_manager(procs, queue, "--app", FAULT_APP, prefix=prefix) as manager:
        wait_until(
            lambda: queue.job(held).state is State.DONE,
            10,
            f"the expired claim was reaped and run; log:\n{procs.log(manager)[-2000:]}",
        )
        found = queue.job(held)
        assert found.result == "held elsewhere", dump(found)
        assert not folder.exists()
        wait_until(lambda: not staging.exists(), 10, "the abandoned submission was quarantined")
        assert_clock_skewed(queue, ahead=False)
    assert manager.returncode == 0, procs.log(manager)
