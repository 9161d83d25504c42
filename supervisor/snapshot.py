"""What `forkvisor status` shows: counts, managers, running jobs, the oldest wait.

Everything comes from the queue folder, so it works for managers on any host;
for managers on this host, psutil adds the CPU and memory of each job's
process tree. A snapshot is read one folder at a time while managers keep
working, so it may be a moment out of date, never wrong about what it shows.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from jobs import COMMAND, InvalidJob, Job, Owner, Queue, State, view
from jobs.job import created_at
from jobs.lease import OWNER_FILE, REAPING_PREFIX
from supervisor import liveness
from supervisor.child import PID_FILE


@dataclass(frozen=True)
class ManagerInfo:
    owner: str
    host: str
    pid: int
    heartbeat_age: float  # seconds since its last heartbeat, by the file system's clock
    lease: float
    alive: bool | None  # this host can tell; None for another host
    reaping: bool  # a sweeper is returning its claims


@dataclass(frozen=True)
class RunningJob:
    id: str
    function: str
    what: str  # the function, or a command job's command line
    attempt: int
    max_attempts: int
    owner: str
    age: float | None  # seconds since its child started
    pid: int | None
    cpu: float | None  # seconds of CPU, whole process tree (this host only)
    rss: int | None  # bytes resident, whole process tree (this host only)


@dataclass(frozen=True)
class Snapshot:
    queue: str
    counts: dict[str, int]
    managers: list[ManagerInfo]
    running: list[RunningJob]
    oldest_ready_age: float | None  # seconds since the longest-waiting ready job was enqueued

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def take(queue: Queue) -> Snapshot:
    now = queue.filesystem_now()
    managers, running = [], []
    for owner_dir in view.owner_dirs(queue.folder):
        owner = _read_owner(owner_dir)
        if owner is None:
            continue
        managers.append(_manager_info(owner, owner_dir, now))
        running += _running_jobs(queue, owner, owner_dir, now)
    return Snapshot(str(queue.path), queue.counts(), managers, running, _oldest_ready_age(queue, now))


def describe(job: Job) -> str:
    """How people see a job: its function's name, or a command job's command line."""
    return f"$ {shlex.join(map(str, job.spec.args))}" if job.function == COMMAND else job.function


def _read_owner(owner_dir: Path) -> Owner | None:
    try:
        return Owner.from_json((owner_dir / OWNER_FILE).read_bytes())
    except (OSError, InvalidJob):
        return None  # retired or fenced as we looked, or not an owner: a sweeper deals with it


def _manager_info(owner: Owner, owner_dir: Path, now: float) -> ManagerInfo:
    try:
        heartbeat = os.stat(owner_dir / OWNER_FILE).st_mtime
    except OSError:
        heartbeat = now
    reaping = owner_dir.name.startswith(REAPING_PREFIX)
    return ManagerInfo(
        owner.name, owner.host, owner.pid, max(0.0, now - heartbeat), owner.lease, liveness.is_alive(owner), reaping
    )


def _running_jobs(queue: Queue, owner: Owner, owner_dir: Path, now: float) -> list[RunningJob]:
    local = liveness.is_alive(owner) is not None
    found = []
    for path, job_id in view.entries_in(owner_dir, State.CLAIMED):
        job = view.read_moving(queue.folder, State.CLAIMED, path)
        if job is None:
            continue  # finished as we looked
        attempt_dir = path / f"attempt-{view.last_attempt(path)}"
        pid, started = _pid_of(attempt_dir)
        cpu, rss = _tree_usage(pid, owner.pid) if local and pid is not None else (None, None)
        age = None if started is None else max(0.0, now - started)
        found.append(
            RunningJob(
                job_id, job.function, describe(job), job.attempts, job.spec.max_attempts, owner.name, age, pid, cpu, rss
            )
        )
    return found


def _pid_of(attempt_dir: Path) -> tuple[int | None, float | None]:
    """The child's pid and start time, from the pid file it writes first thing."""
    try:
        with open(attempt_dir / PID_FILE, "rb") as file:
            pid = int(file.read(32))
            return pid, os.fstat(file.fileno()).st_mtime
    except (OSError, ValueError):
        return None, None  # not started yet, or gone


def _tree_usage(pid: int, manager_pid: int) -> tuple[float | None, int | None]:
    """CPU seconds and RSS bytes of the job's process and its descendants."""
    try:
        process = psutil.Process(pid)
        if process.ppid() != manager_pid:
            return None, None  # the pid was reused: not our job's process any more
        tree = [process, *process.children(recursive=True)]
    except psutil.Error:
        return None, None
    cpu, rss = 0.0, 0
    for member in tree:
        try:
            times = member.cpu_times()
            cpu += times.user + times.system
            rss += member.memory_info().rss
        except psutil.Error:
            continue  # exited as we looked
    return round(cpu, 3), rss


def _oldest_ready_age(queue: Queue, now: float) -> float | None:
    ready = view.entries_in(queue.folder.state_dir(State.READY), State.READY, check_dirs=False)
    oldest = min((job_id for _, job_id in ready), default=None)
    if oldest is None:
        return None
    return max(0.0, now - created_at(oldest))
