"""The doorbell (supervisor/bell.py): on each host one manager of a queue watches `ready/`;
a job it cannot take rings the bell, which wakes one idle manager, not all of them."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import termios
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs import Queue, State, host_part
from supervisor.bell import ANSWERED_AT_ONCE, Bell
from tests.processes import Processes, wait_until

# Long enough that neither a heartbeat nor the poll finds a job within a test's deadline:
# only inotify (the leader) or the bell (the others) can.
SLOW = ["--lease", "120", "--poll-interval", "60"]
HOST = host_part(socket.gethostname())


def leader(queue: Queue) -> int | None:
    """The pid holding this host's lock of the queue's bell (from /proc/locks)."""
    try:
        inode = (queue.path / "bells" / f"{HOST}.lock").stat().st_ino
    except FileNotFoundError:
        return None
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF" ("1: -> FLOCK ..." waits)
        if fields[1] == "FLOCK" and int(fields[5].rsplit(":", 1)[1]) == inode:
            return int(fields[4])
    return None


def registered(queue: Queue, count: int) -> None:
    wait_until(lambda: len(os.listdir(queue.path / "claimed")) >= count, 10, f"{count} managers registered")


def done(queue: Queue, job_id: str, timeout: float, what: str) -> None:
    wait_until(lambda: queue.job(job_id).state is State.DONE, timeout, what)


def drain(procs: Processes, managers: list[subprocess.Popen[bytes]]) -> None:
    for manager in managers:
        manager.send_signal(signal.SIGTERM)
    for manager in managers:
        assert procs.wait_exit(manager, 30, "a manager draining") == 0


def _wakeups_of(queue: Queue, pid: int) -> int:
    """One manager's wake-ups (a manager whose counts never changed writes none: 0)."""
    found = list((queue.path / "stats").glob(f"manager.*.{pid}.*.json"))
    return sum(json.loads(path.read_text())["wakeups"] for path in found)


def wakeups(queue: Queue) -> int:
    return sum(json.loads(path.read_text())["wakeups"] for path in (queue.path / "stats").glob("manager.*.json"))


def test_each_new_job_wakes_one_of_four_idle_managers_not_all(procs: Processes, queue: Queue) -> None:
    managers = [procs.run_manager(queue, *SLOW, name=f"m{n}") for n in range(4)]
    registered(queue, 4)
    wait_until(lambda: leader(queue) in {m.pid for m in managers}, 10, "one of them leads")
    for number in range(12):
        job_id = queue.enqueue("sample.ok", number)
        done(queue, job_id, 10, f"job {number} done")
    drain(procs, managers)
    assert wakeups(queue) <= 12 + 2  # one per job (each would have woken all four: 48)


def test_a_busy_leader_rings_and_an_idle_manager_takes_the_job_at_once(
    procs: Processes, queue: Queue, tmp_path: Path
) -> None:
    first = procs.run_manager(queue, *SLOW, "--concurrency", "1", name="leader")
    wait_until(lambda: leader(queue) == first.pid, 10, "the first manager leads")
    queue.enqueue("sample.wait_release", str(tmp_path / "busy"), str(tmp_path / "release"))
    wait_until((tmp_path / "busy").exists, 10, "the leader busy with its one job")
    second = procs.run_manager(queue, *SLOW, name="other")
    registered(queue, 2)
    wait_until(lambda: second.pid in _waiting_at_bell(queue), 10, "the other manager waits at the bell")
    job_id = queue.enqueue("sample.ok", "rung")
    done(queue, job_id, 5, "the job run by the idle manager, woken by the ring (its poll is a minute away)")
    (tmp_path / "release").touch()
    drain(procs, [first, second])


def test_a_leader_that_takes_the_new_job_into_its_last_slot_wakes_no_one(
    procs: Processes, queue: Queue, tmp_path: Path
) -> None:
    """The leader rings only for the new jobs it did not take this turn: filling its last slot
    with the new job is no reason to wake another manager (which would find nothing)."""
    first = procs.run_manager(queue, *SLOW, "--concurrency", "2", name="leader")
    wait_until(lambda: leader(queue) == first.pid, 10, "the first manager leads")
    queue.enqueue("sample.wait_release", str(tmp_path / "busy"), str(tmp_path / "release"))
    wait_until((tmp_path / "busy").exists, 10, "the leader running one job, one slot left")
    second = procs.run_manager(queue, *SLOW, name="other")
    registered(queue, 2)
    wait_until(lambda: second.pid in _waiting_at_bell(queue), 10, "the other manager waits at the bell")
    job_id = queue.enqueue("sample.ok", "into the last slot")
    done(queue, job_id, 10, "the job, run by the leader")
    (tmp_path / "release").touch()
    drain(procs, [first, second])
    assert _wakeups_of(queue, first.pid) == 2  # (its counts are written: one wake-up per job)
    assert _wakeups_of(queue, second.pid) == 0


def test_when_the_leader_dies_another_manager_leads_within_a_poll(procs: Processes, queue: Queue) -> None:
    first = procs.run_manager(queue, "--lease", "120", name="first")
    wait_until(lambda: leader(queue) == first.pid, 10, "the first manager leads")
    second = procs.run_manager(queue, "--lease", "120", name="second")
    registered(queue, 2)
    first.kill()
    first.wait()
    wait_until(lambda: leader(queue) == second.pid, 5, "the second leads once the first is gone (poll 0.2 s)")
    job_id = queue.enqueue("sample.ok", "after")
    done(queue, job_id, 10, "a job enqueued after the takeover")
    drain(procs, [second])


def test_a_flood_of_rings_costs_rescans_not_service(procs: Processes, queue: Queue) -> None:
    """Anyone who can open the FIFO (the owner's own jobs) may ring it for nothing: the
    managers answer with rescans that find nothing, drop the stale rings and go on serving."""
    managers = [procs.run_manager(queue, *SLOW, name=f"m{n}") for n in range(3)]
    registered(queue, 3)
    wait_until(lambda: leader(queue) in {m.pid for m in managers}, 10, "one of them leads")
    fifo = os.open(queue.path / "bells" / f"{HOST}.fifo", os.O_WRONLY | os.O_NONBLOCK)
    try:
        written = _fill(fifo)
    finally:
        os.close(fifo)
    assert written >= 4096
    wait_until(lambda: _unread(queue) == 0, 10, "the stale rings dropped")
    job_ids = [queue.enqueue("sample.ok", number) for number in range(6)]
    for job_id in job_ids:
        done(queue, job_id, 10, "a job after the flood")
    drain(procs, managers)
    assert [queue.job(job_id).attempts for job_id in job_ids] == [1] * len(job_ids)


def test_a_bell_not_a_fifo_of_the_owner_is_not_used(queue: Queue) -> None:
    bells = queue.path / "bells"
    folder = os.open(bells, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for plant in ("file", "link", "alien") if os.geteuid() == 0 else ("file", "link"):
            for entry in bells.iterdir():
                entry.unlink()
            if plant == "file":
                (bells / f"{HOST}.fifo").write_text("not a fifo")
            elif plant == "link":
                os.symlink("/dev/null", bells / f"{HOST}.fifo")
            else:
                os.mkfifo(bells / f"{HOST}.fifo", 0o600)
                os.chown(bells / f"{HOST}.fifo", os.geteuid() + 4242, -1)  # (root may give it away)
            assert Bell.open(folder, str(queue.path)) is None, plant
        (bells / f"{HOST}.fifo").unlink()
        bell = Bell.open(folder, str(queue.path))
        assert bell is not None
        assert bell.try_to_lead()
        bell.close()
    finally:
        os.close(folder)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=300), max_size=8), st.integers(min_value=0, max_value=100))
def test_a_bell_answers_whatever_was_written_to_it_within_its_bounds(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes], most: int
) -> None:
    inner = os.open(tmp_path_factory.mktemp("bells"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        bell = Bell.open(inner, "a test")
        assert bell is not None
        for chunk in chunks:
            os.write(bell.fifo, chunk)
        written = sum(map(len, chunks))
        taken = bell.answer(most)
        assert 0 <= taken <= min(written, max(1, min(most, ANSWERED_AT_ONCE)))
        bell.clear()
        assert bell.answer(most) == 0
        bell.ring(3)
        assert bell.answer(100) == 3  # after any garbage, a ring still reads as one
        bell.close()
    finally:
        os.close(inner)


def _fill(fifo: int) -> int:
    """Write into the FIFO until it is full; how many bytes went in."""
    written = 0
    try:
        while True:
            written += os.write(fifo, b"x" * 4096)
    except BlockingIOError:
        return written


def _unread(queue: Queue) -> int:
    """Bytes waiting in this host's bell (FIONREAD through a reader of our own)."""
    fd = os.open(queue.path / "bells" / f"{HOST}.fifo", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little")
    finally:
        os.close(fd)


def _waiting_at_bell(queue: Queue) -> set[int]:
    """Pids whose epoll waits on this host's bell (/proc/PID/fdinfo of their epoll descriptor)."""
    fifo_inode = (queue.path / "bells" / f"{HOST}.fifo").stat().st_ino
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fdinfo"):
                if fifo_inode in _epoll_targets(pid, Path(f"/proc/{pid}/fdinfo/{fd}").read_text()):
                    found.add(int(pid))
        except OSError:
            continue
    return found


def _epoll_targets(pid: str, info: str) -> set[int]:
    """The inodes of what an epoll descriptor's `tfd:` lines watch (none if it is no epoll)."""
    inodes = set()
    for line in info.splitlines():
        if line.startswith("tfd:"):
            try:
                inodes.add(os.stat(f"/proc/{pid}/fd/{line.split()[1]}").st_ino)
            except OSError:
                continue
    return inodes
