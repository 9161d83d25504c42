"""What `forkvisor status` shows: counts, managers, running jobs, the oldest wait,
and the ready jobs that no running manager can serve.

Everything comes from the queue folder, so it works for managers on any host;
for managers on this host, psutil adds the CPU and memory of each job's
process tree. A snapshot is read one folder at a time while managers keep
working, so it may be a moment out of date, never wrong about what it shows.

Jobs that no manager runs are never claimed, so they gather at the head of
`ready/`: reading the first `UNSERVED_SCAN` ready jobs in claim order finds
them without reading a million specs.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from jobs import COMMAND, Job, Owner, Policy, Queue, State, files, view
from jobs.handles import Entry
from jobs.job import created_at
from supervisor import liveness
from supervisor.child import PID_FILE

UNSERVED_SCAN = 1000


@dataclass(frozen=True)
class ManagerInfo:
    owner: str
    host: str
    pid: int
    heartbeat_age: float  # seconds since its last heartbeat, by the file system's clock
    lease: float
    alive: bool | None  # this host can tell; None for another host
    reaping: bool  # a sweeper is returning its claims
    functions: list[str] | None  # what it runs (forkvisor.command: command jobs); None if it does not say
    skipped: dict[str, dict[str, str]]  # "claims" or "sweep": entry -> why it is skipped (the first ones)
    skipped_count: int  # entries it and its sweeper skip, all told


@dataclass(frozen=True)
class Unserved:
    """Ready jobs that no live manager runs, among the first `checked` in claim order."""

    checked: int
    functions: dict[str, int]  # function: how many of those jobs name it
    known: bool = True  # False: a live manager does not say what it runs (an older forkvisor)

    @property
    def count(self) -> int:
        return sum(self.functions.values())


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
    unserved: Unserved

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["unserved"]["count"] = self.unserved.count
        return document


def take(queue: Queue) -> Snapshot:
    now = queue.filesystem_now()
    folders = view.owner_folders(queue.folder)
    served = view.served_functions(folders, now, liveness.is_alive)
    managers, running = [], []
    for found in folders:
        if found.owner is None:
            continue  # retired or fenced as we looked, or not an owner: a sweeper deals with it
        managers.append(_manager_info(found, found.owner, now))
        running += _running_jobs(queue, found.owner, found.place, now, served)
    unserved = _unserved(queue, folders, served, now)
    return Snapshot(str(queue.path), queue.counts(), managers, running, _oldest_ready_age(queue, now), unserved)


def _unserved(queue: Queue, folders: list[view.OwnerFolder], served: dict[str, Any], now: float) -> Unserved:
    checked, functions = view.head_functions(queue.folder, UNSERVED_SCAN)
    silent = any(f.functions is None and f.is_live(now, liveness.is_alive) for f in folders)
    missing = {name: count for name, count in functions.items() if name not in served}
    return Unserved(checked, missing, known=not silent)


def served(queue: Queue) -> dict[str, Any]:
    """The functions live managers of `queue` run, each with the policy one of them declares."""
    return view.served_functions(view.owner_folders(queue.folder), queue.filesystem_now(), liveness.is_alive)


def policy_of(queue: Queue, job: Job, served_now: dict[str, Any]) -> Policy:
    """The policy to show for `job` (see `jobs.view.effective_policy`)."""
    return view.effective_policy(queue.folder, job, served_now)


def describe(job: Job) -> str:
    """How people see a job: its function's name, or a command job's command line."""
    return f"$ {shlex.join(map(str, job.spec.args))}" if job.function == COMMAND else job.function


def _manager_info(found: view.OwnerFolder, owner: Owner, now: float) -> ManagerInfo:
    heartbeat = now if found.heartbeat is None else found.heartbeat
    return ManagerInfo(
        owner.name,
        owner.host,
        owner.pid,
        max(0.0, now - heartbeat),
        owner.lease,
        liveness.is_alive(owner),
        found.reaping,
        None if found.functions is None else sorted(found.functions),
        found.skipped,
        found.skipped_count,
    )


def _running_jobs(queue: Queue, owner: Owner, owner_dir: Entry, now: float, served: dict[str, Any]) -> list[RunningJob]:
    local = liveness.is_alive(owner) is not None
    found = []
    for place, job_id in view.entries_in(owner_dir, State.CLAIMED):
        job = view.read_moving(queue.folder, State.CLAIMED, place)
        if job is None:
            continue  # finished as we looked
        pid, started = _pid_of(place, job.history[-1].number if job.history else 0)
        cpu, rss = _tree_usage(pid, owner.pid) if local and pid is not None else (None, None)
        age = None if started is None else max(0.0, now - started)
        limit = view.effective_policy(queue.folder, job, served).max_attempts
        found.append(
            RunningJob(job_id, job.function, describe(job), job.attempts, limit, owner.name, age, pid, cpu, rss)
        )
    return found


def _pid_of(job: Entry, run: int) -> tuple[int | None, float | None]:
    """The child's pid and start time, from the pid file it writes first thing."""
    try:
        with job.dir.sub(f"{job.name}/attempt-{run}") as attempt:
            data, status = files.read_regular(PID_FILE, 32, attempt.fd)
        return int(data), status.st_mtime
    except (OSError, ValueError):
        return None, None  # not started yet, gone, or not a pid file


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
    ready = view.entries_in(queue.folder.at(State.READY), State.READY, check_dirs=False)
    oldest = min((job_id for _, job_id in ready), default=None)
    if oldest is None:
        return None
    return max(0.0, now - created_at(oldest))
