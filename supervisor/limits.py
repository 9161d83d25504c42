"""A running job's limits: when its timeout runs out, whether its tree uses more memory
than it may (pure checks: `children` acts on what they find), and its output, whose
middle past the limit is given back to the file system as it runs (`jobs.output`); where
the file system cannot, the run is stopped once a stream holds more than its ceiling."""

from __future__ import annotations

import logging
import os

import psutil

from jobs import format_size, output, run_folder
from supervisor.running import Running, Stop

log = logging.getLogger(__name__)


def deadline_of(running: Running) -> float:
    """When the job's timeout runs out (monotonic; infinity without a timeout, or while it
    is frozen: its timeout counts the time it ran, not the time an operator held it)."""
    if running.frozen:
        return float("inf")
    return running.started + running.frozen_for + (running.claim.policy.timeout or float("inf"))


def limit_hit(running: Running, now: float, check_memory: bool) -> Stop | None:
    """The limit the job just went past, if any (none while it is frozen)."""
    if running.frozen:
        return None
    policy = running.claim.policy
    if policy.timeout and now >= deadline_of(running):
        return Stop.TIMEOUT
    if check_memory and policy.memory_limit and _over_memory(running, policy.memory_limit):
        return Stop.MEMORY
    return None


def _over_memory(running: Running, limit: int) -> bool:
    """Whether the run went past its memory limit: where the kernel holds the limit (a
    memory cgroup), whether its OOM killer took one of the run's processes; else whether
    the RSS of its tree and of the trees of its strays (where runs have no cgroup: what left
    its tree by `setsid` and a double fork, adopted by the manager) is above it now."""
    memory = running.box.memory if running.box is not None else None
    if memory is not None and memory.limit:
        return memory.oom_kills() > 0
    if running.box is not None:  # a cgroup without a memory controller of ours: every process in it
        return rss(running.box.pids()) > limit
    return tree_rss(running.pid, *running.strays) > limit  # (strays: what left the tree, `children`)


def bound_output(running: Running) -> bool:
    """Punch out what the job's stdout and stderr hold past its output limit; whether the run
    must stop: its output cannot be bounded as it runs, and a stream went past its ceiling."""
    try:
        run = run_folder.open_run(running.claim.place, running.claim.run)
    except OSError:
        return False  # its claim was taken back: nothing of it is ours to bound
    limit = running.claim.policy.output_limit or 0
    try:
        if not running.output_unbounded:  # (once it failed, the file system will not do it later)
            _punch_output(running, run, limit)
        return running.output_unbounded and output.allocated(run) > output.ceiling(limit)
    finally:
        os.close(run)


def _punch_output(running: Running, run: int, limit: int) -> None:
    try:
        output.bound(run, limit)
    except OSError as exc:  # a file system that cannot punch holes: the end of the run compacts it
        ceiling = format_size(output.ceiling(limit))
        log.warning(
            "job %s: its output cannot be bounded while it runs (%s); it is stopped if a stream holds over %s",
            running.claim.job_id,
            exc,
            ceiling,
        )
        running.output_unbounded = True


def rss(pids: list[int]) -> int:
    """Resident memory of these processes, in bytes (a pid gone meanwhile counts nothing)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue  # exited while we looked
    return total


def tree_rss(*roots: int) -> int:
    """Resident memory of processes and all their descendants, in bytes: one look at /proc
    finds the descendants of them all (a job that leaves many strays costs one look)."""
    processes: dict[int, psutil.Process] = {}
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        processes[process.pid] = process
        children.setdefault(process.info["ppid"], []).append(process.pid)
    total, seen, pending = 0, set(), list(roots)
    while pending:
        pid = pending.pop()
        if pid in seen or pid not in processes:
            continue  # (exited while we looked)
        seen.add(pid)
        pending += children.get(pid, [])
        try:
            total += processes[pid].memory_info().rss
        except psutil.Error:
            continue  # exited while we looked
    return total
