"""A running job's limits: when its timeout runs out, and whether its tree uses more
memory than it may. Pure checks: `children` acts on what they find."""

from __future__ import annotations

import psutil

from supervisor import forking
from supervisor.running import Running, Stop


def deadline_of(running: Running) -> float:
    """When the job's timeout runs out (monotonic; infinity without a timeout)."""
    return running.started + (running.claim.policy.timeout or float("inf"))


def limit_hit(running: Running, now: float, check_memory: bool) -> Stop | None:
    """The limit the job just went past, if any."""
    policy = running.claim.policy
    if policy.timeout and now >= deadline_of(running):
        return Stop.TIMEOUT
    if check_memory and policy.memory_limit and tree_rss(running.pid) > policy.memory_limit:
        return Stop.MEMORY
    return None


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
