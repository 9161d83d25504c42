"""Permissions of what forkvisor creates: private by default (folders 0700, files
0600, whatever the umask lets through), group-readable on request (folders 2750,
files 0640, and incoming/ 3770 for members' submissions: docs/SECURITY.md), checked
over everything enqueue, a manager's run, its sweeper and the CLI leave in the queue.
"""

from __future__ import annotations

import grp
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import Call, Queue, State
from tests import sample_jobs
from tests.faults.conftest import start_manager
from tests.processes import REPO, Processes, dump, forkvisor_command, wait_until

PRIVATE = (0o700, 0o600)
SHARED = (0o2750, 0o640)
SHARED_FOLDERS = {"incoming": 0o3773}  # the one folder members write in (a folder each): sticky, setgid
OWNERS_ONLY = "bells/"  # a doorbell's lock and FIFO: 0600 in every queue (a member could hold or drain them)
PLANTED = ("junk", "half-written")  # names the test itself plants: their modes are the test's


@pytest.fixture
def umask() -> Iterator[None]:
    """Restore this process's umask after a test that sets it."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def wrong_modes(root: Path, modes: tuple[int, int]) -> list[str]:
    """Every folder and file under `root` whose permission bits are not `modes` (dirs, files)."""
    found = []
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            if any(part in relative for part in PLANTED) or _quarantined_as_found(relative):
                continue
            status = path.lstat()
            want = modes[0] if stat.S_ISDIR(status.st_mode) else modes[1]
            if relative.startswith(OWNERS_ONLY):
                want = 0o600
            if modes == SHARED and relative in SHARED_FOLDERS:
                want = SHARED_FOLDERS[relative]
            if stat.S_IMODE(status.st_mode) != want:
                found.append(f"{oct(stat.S_IMODE(status.st_mode))} {relative}")
    own = stat.S_IMODE(root.stat().st_mode)
    return found if own == modes[0] else [*found, f"{oct(own)} (the queue folder)"]


def _quarantined_as_found(relative: str) -> bool:
    """A quarantined entry keeps the modes it was found with; only its .why note is forkvisor's."""
    parts = relative.split("/")
    return parts[0] == "quarantine" and len(parts) > 1 and not (len(parts) == 2 and parts[1].endswith(".why"))


def populate(queue: Queue, barrier: Path) -> list[str]:
    """Jobs in every state and entries for the sweeper; return the ids that must end done or dead."""
    ids = [
        queue.enqueue(sample_jobs.ok, "done"),
        queue.enqueue("forkvisor.command"),  # no command: dead without starting, the manager writes its outcome
        queue.with_options(timeout=0.2, max_attempts=1).enqueue(sample_jobs.block, str(barrier)),
        *queue.enqueue_many([Call(sample_jobs.ok, (n,)) for n in range(2)]),
    ]
    queue.with_options(delay=3600).enqueue(sample_jobs.ok, "later")
    (queue.path / "scheduled" / "junk").write_text("not a job")  # quarantined with a .why note
    half = queue.path / "tmp" / "half-written"
    half.mkdir()
    os.utime(half, (1, 1))  # an abandoned submission
    return ids


def run_until_settled(procs: Processes, queue: Queue, ids: list[str]) -> None:
    # commands on, shared queue or not: the malformed command job must reach dead/ through the manager
    manager = start_manager(procs, queue, registry=sample_jobs.registry, tmp_age=60.0, commands=True)

    def settled() -> bool:
        swept = not os.listdir(queue.path / "tmp") and "junk" not in os.listdir(queue.path / "scheduled")
        return swept and not manager.running and all(queue.job(i).state.terminal for i in ids)

    wait_until(settled, 15, "every job ended and the sweeper swept", manager=manager)
    assert queue.job(ids[0]).state is State.DONE, dump(queue.job(ids[0]))
    queue.purge(State.DONE, older_than=0, now=queue.serving.filesystem_now() + 1)  # writes purged.log
    manager.close()


def test_a_private_queue_is_private_whatever_the_umask_lets_through(
    procs: Processes, tmp_path: Path, umask: None
) -> None:
    os.umask(0o022)
    queue = Queue(tmp_path / "queue")
    ids = populate(queue, tmp_path / "blocked")
    run_until_settled(procs, queue, ids)
    assert (queue.path / "purged.log").exists()
    assert wrong_modes(queue.path, PRIVATE) == []


def test_a_shared_queue_is_shared_whatever_the_umask_takes_away(procs: Processes, tmp_path: Path, umask: None) -> None:
    os.umask(0o077)
    queue = Queue(tmp_path / "queue", shared=True)
    ids = populate(queue, tmp_path / "blocked")
    run_until_settled(procs, queue, ids)
    assert wrong_modes(queue.path, SHARED) == []


@pytest.mark.parametrize(
    ("shared", "modes", "mask"), [(False, PRIVATE, 0o022), (True, SHARED, 0o077)], ids=["private", "shared"]
)
def test_the_error_a_failing_job_records_has_the_queue_file_mode(
    procs: Processes, tmp_path: Path, umask: None, shared: bool, modes: tuple[int, int], mask: int
) -> None:
    os.umask(mask)
    queue = Queue(tmp_path / "queue", shared=shared)
    job_id = queue.enqueue(sample_jobs.print_and_fail, "boom")
    manager = start_manager(procs, queue, registry=sample_jobs.registry)
    wait_until(lambda: queue.job(job_id).state is State.DEAD, 10, "the job failed", manager=manager)
    assert (queue.job(job_id).path / "attempt-1" / "error.json").exists()
    assert wrong_modes(queue.path, modes) == []


def test_the_drain_file_is_private(tmp_path: Path, umask: None) -> None:
    os.umask(0o022)  # inherited by the command
    queue = Queue(tmp_path / "queue")
    done = subprocess.run([*forkvisor_command(), "drain", str(queue.path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done
    assert wrong_modes(queue.path, PRIVATE) == []


def test_a_group_member_submits_and_reads_results_in_a_shared_queue(
    procs: Processes, nobody: list[str], open_dir: Path
) -> None:
    """nobody (group nogroup) enqueues (a file in its folder of incoming/: a member may write
    nothing else); root's manager, told to run members' jobs as root, takes it in and runs
    it; nobody reads the result."""
    root = open_dir / "queue"
    root.mkdir()
    os.chown(root, 0, _gid("nogroup"))
    root.chmod(0o2750)  # the setgid bit hands the group down to everything created inside
    queue = Queue(root, shared=True)
    queue.serving.set_owner_group(0)  # incoming/ in a group of the owner's alone (as `forkvisor init --shared` does)
    script = "import sys; from jobs import Queue; print(Queue(sys.argv[1]).enqueue('fault.ok', 'shared'))"
    submitted = subprocess.run(
        [*nobody, sys.executable, "-c", script, str(root)], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    manager = start_manager(procs, queue, members_as_root=True)
    wait_until(lambda: queue.job(job_id).state is State.DONE, 10, "root's manager ran nobody's job", manager=manager)
    manager.close()
    read = "import sys; from jobs import Queue; print(Queue(sys.argv[1]).job(sys.argv[2]).result)"
    shown = subprocess.run(
        [*nobody, sys.executable, "-c", read, str(root), job_id], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "shared"
    incoming = root / "incoming"
    foreign = [
        path for path in root.rglob("*") if path.lstat().st_gid != _gid("nogroup") and incoming not in path.parents
    ]
    assert foreign == [incoming], "files outside the queue's group, but incoming/ (the owner group's)"


def _gid(name: str) -> int:
    return grp.getgrnam(name).gr_gid
