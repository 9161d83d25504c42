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

from jobs import COMMAND, Job, Owner, OwnerFolder, Policy, Queue, State
from supervisor import liveness

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
    concurrency: int | None = None  # how many of the queue's jobs it runs at once, at most
    busy: int = 0  # how many it runs now
    live: bool = False  # serving now, as a sweeper judges it (`OwnerFolder.is_live`)
    containment: str | None = None  # how it contains its runs: "cgroup" or "processes"


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
    progress: dict[str, Any] | None = None  # what the job last said (`jobs.current().progress`)


@dataclass(frozen=True)
class Snapshot:
    queue: str
    counts: dict[str, int]
    managers: list[ManagerInfo]
    running: list[RunningJob]
    oldest_ready_age: float | None  # seconds since the longest-waiting ready job was enqueued
    unserved: Unserved
    paused: str  # what `forkvisor pause` paused ("" for nothing)
    paused_all: bool = False  # the whole queue, not only some functions

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["unserved"]["count"] = self.unserved.count
        return document


def take(queue: Queue) -> Snapshot:
    now = queue.serving.filesystem_now()
    folders = queue.serving.owners()
    served = queue.serving.served_functions(folders, now, liveness.is_alive)
    managers, running = [], []
    for found in folders:
        if found.owner is None:
            continue  # retired or fenced as we looked, or not an owner: a sweeper deals with it
        jobs = _running_jobs(queue, found, found.owner, now, served)
        managers.append(_manager_info(found, found.owner, now, len(jobs)))
        running += jobs
    unserved = _unserved(queue, folders, served, now)
    paused = queue.paused()
    oldest = queue.serving.oldest_ready_age(now)
    described = paused.describe() if paused else ""
    return Snapshot(str(queue.path), queue.counts(), managers, running, oldest, unserved, described, paused.all)


def _unserved(queue: Queue, folders: list[OwnerFolder], served: dict[str, Any], now: float) -> Unserved:
    checked, functions = queue.serving.head_functions(UNSERVED_SCAN)
    silent = any(f.functions is None and f.is_live(now, liveness.is_alive) for f in folders)
    missing = {name: count for name, count in functions.items() if name not in served}
    return Unserved(checked, missing, known=not silent)


def served(queue: Queue) -> dict[str, Any]:
    """The functions live managers of `queue` run, each with the policy one of them declares."""
    return queue.serving.served_functions(queue.serving.owners(), queue.serving.filesystem_now(), liveness.is_alive)


def policy_of(queue: Queue, job: Job, served_now: dict[str, Any]) -> Policy:
    """The policy to show for `job` (see `queue.serving.effective_policy`)."""
    return queue.serving.effective_policy(job, served_now)


def describe(job: Job) -> str:
    """How people see a job: its function's name, or a command job's command line."""
    return f"$ {shlex.join(map(str, job.spec.args))}" if job.function == COMMAND else job.function


def job_summary(job: Job, policy: Policy) -> dict[str, Any]:
    """A job as `list --json` and the web page's job list show it."""
    return {
        "id": job.id,
        "state": job.state.value,
        "function": job.function,
        "attempts": job.attempts,
        "max_attempts": policy.max_attempts,
        "priority": job.spec.priority,
        "created": job.created,
        "owner": job.owner,
        "frozen": job.frozen,
        "error": (job.error or {}).get("message") if job.state is State.DEAD else None,
        "entry": job.path.name,  # its name in its state's folder: `list --after` takes it
        "key": job.spec.key,
        "depends_on": list(job.spec.depends_on),
        "allow_failure": job.spec.allow_failure,
    }


def job_document(job: Job, policy: Policy, events: list[str]) -> dict[str, Any]:
    """A job whole, as `show --json` and the web page's job page show it."""
    return {
        **job_summary(job, policy),
        "spec": {
            "function": job.spec.function,
            "args": list(job.spec.args),
            "kwargs": dict(job.spec.kwargs),
            "max_attempts": job.spec.max_attempts,
            "timeout": job.spec.timeout,
            "memory_limit": job.spec.memory_limit,
            "output_limit": job.spec.output_limit,
            "backoff": job.spec.backoff,
            "metadata": dict(job.spec.metadata),
        },
        "policy": {name: {"value": value, "source": str(policy.sources[name])} for name, value in _policy(policy)},
        "result": job.result,
        "error": job.error,
        "history": [{"run": attempt.number, "outcome": attempt.outcome} for attempt in job.history],
        "events": events,
    }


def _policy(policy: Policy) -> list[tuple[str, Any]]:
    return [(name, value) for name, value in policy.to_json().items() if name != "sources"]


def _manager_info(found: OwnerFolder, owner: Owner, now: float, busy: int) -> ManagerInfo:
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
        owner.concurrency,
        busy,
        found.is_live(now, liveness.is_alive),
        owner.containment,
    )


def _running_jobs(
    queue: Queue, folder: OwnerFolder, owner: Owner, now: float, served: dict[str, Any]
) -> list[RunningJob]:
    local = liveness.is_alive(owner) is not None
    found = []
    for job in queue.serving.claimed_jobs(folder):
        pid, started = queue.serving.run_pid(job) or (None, None)
        cpu, rss = _tree_usage(pid, owner.pid) if local and pid is not None else (None, None)
        age = None if started is None else max(0.0, now - started)
        limit = queue.serving.effective_policy(job, served).max_attempts
        what = describe(job)
        progress = queue.serving.run_progress(job)
        found.append(
            RunningJob(job.id, job.function, what, job.attempts, limit, owner.name, age, pid, cpu, rss, progress)
        )
    return found


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
