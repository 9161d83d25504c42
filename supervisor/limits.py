"""Limits on a running job: its timeout and memory, and how it is stopped.

A job is stopped as a whole tree: SIGTERM to its process group and to every
descendant psutil can find (some leave the group with setsid), then SIGKILL
after the grace period. Descendants are remembered as they are found, so the
SIGKILL still reaches those the child's exit orphaned.
"""

from __future__ import annotations

import logging
import signal

import psutil

from supervisor import forking
from supervisor.harvest import Running

log = logging.getLogger(__name__)


def deadline_of(running: Running) -> float:
    """When the job's timeout runs out (monotonic; infinity without a timeout)."""
    return running.started + (running.claim.policy.timeout or float("inf"))


def limit_hit(running: Running, now: float, check_memory: bool) -> str | None:
    """ "timeout" or "memory" if the job just went past one of its limits."""
    policy = running.claim.policy
    if policy.timeout and now >= deadline_of(running):
        return "timeout"
    if check_memory and policy.memory_limit and tree_rss(running.pid) > policy.memory_limit:
        return "memory"
    return None


def stop(running: Running, limit: str, now: float, grace: float) -> None:
    """SIGTERM the job's tree now; `escalate` SIGKILLs it after `grace` seconds."""
    running.limit = limit
    running.kill_at = now + grace
    log.warning("job %s pid %d: %s, sending SIGTERM", running.claim.job_id, running.pid, limit)
    signal_job(running, signal.SIGTERM)


def escalate(running: Running, now: float) -> None:
    """SIGKILL a stopped job's tree once its grace period is over."""
    if running.kill_at is not None and now >= running.kill_at:
        log.warning("job %s pid %d: still running after SIGTERM, sending SIGKILL", running.claim.job_id, running.pid)
        signal_job(running, signal.SIGKILL)
        running.kill_at = None


def signal_job(running: Running, signum: signal.Signals) -> None:
    """Signal the job's group and every descendant seen so far."""
    known = {process.pid for process in running.descendants}
    running.descendants += [p for p in forking.job_tree(running.pid) if p.pid not in known]
    forking.signal_tree(running.pid, signum, running.descendants)


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
