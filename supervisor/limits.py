"""A running job's limits: when its timeout runs out, whether its tree uses more memory
than it may (pure checks: `children` acts on what they find), and its output, whose
middle past the limit is given back to the file system as it runs (`jobs.output`)."""

from __future__ import annotations

import logging
import os

import psutil

from jobs import output, run_folder
from supervisor import forking
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
    the tree's RSS is above it now."""
    memory = running.box.memory if running.box is not None else None
    if memory is not None and memory.limit:
        return memory.oom_kills() > 0
    return tree_rss(running.pid) > limit


def bound_output(running: Running) -> None:
    """Punch out what the job's stdout and stderr hold past its output limit."""
    try:
        run = run_folder.open_run(running.claim.place, running.claim.run)
    except OSError:
        return  # its claim was taken back: nothing of it is ours to bound
    try:
        output.bound(run, running.claim.policy.output_limit or 0)
    except OSError as exc:  # a file system that cannot punch holes: the end of the run compacts it
        if not running.output_unbounded:
            log.warning("job %s: its output cannot be bounded while it runs: %s", running.claim.job_id, exc)
            running.output_unbounded = True
    finally:
        os.close(run)


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    try:
        tree = [psutil.Process(pid), *forking.job_tree(pid)]
    except psutil.Error:
        return 0  # exited while we looked
    total = 0
    for process in tree:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue  # exited while we looked
    return total
