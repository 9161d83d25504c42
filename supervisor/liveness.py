"""Is an owner's process alive? pid + process start time, on this very kernel.

A pid alone lies after reuse, so the start time must match too. Both mean
something only on the same kernel and in the same pid namespace: an owner
whose host name, boot id or pid namespace differs from ours (another machine
or container with the same host name, or a reboot) gets "cannot tell", and
its lease decides.
"""

from __future__ import annotations

import os
import socket
from functools import cache

import psutil

from jobs import Owner

_START_TIME_TOLERANCE = 1.0  # psutil reports start times to the clock tick


@cache
def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
    except OSError:
        return None


@cache
def pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def this_owner(lease: float, started: float, concurrency: int | None = None) -> Owner:
    """An Owner describing this process (which runs at most `concurrency` jobs of the queue)."""
    owner = Owner.new(
        lease=lease, started=started, boot_id=boot_id(), pid_namespace=pid_namespace(), concurrency=concurrency
    )
    return Owner(**{**owner.__dict__, "start_time": start_time(owner.pid)})


def is_alive(owner: Owner) -> bool | None:
    """True or False for an owner on this host; None for one elsewhere."""
    if owner.host != socket.gethostname():
        return None
    if owner.boot_id != boot_id() or owner.pid_namespace != pid_namespace():
        return None  # another machine or container with our hostname, or a reboot: the lease decides
    current = start_time(owner.pid)
    if current is None:
        return False
    if owner.start_time is None:
        return True
    return abs(current - owner.start_time) < _START_TIME_TOLERANCE
