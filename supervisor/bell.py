"""A queue's doorbell on one host: one manager watches `ready/`, the others wait at the bell.

inotify wakes every process that watches a folder: with M idle managers on one queue,
each new job woke all M, and all but one lost the race for it (docs/PERFORMANCE.md,
"Many managers on one queue"). So on each host one manager of a queue, the one that
holds the lock `bells/HOST.lock` (`flock`), watches `ready/`: it takes a new job itself
when it has a free slot, and rings the bell, the FIFO `bells/HOST.fifo`, once for each
one it cannot take. The other managers of the host wait on the FIFO with
`EPOLLEXCLUSIVE`, so that each ring wakes one of them (`supervisor.wakeups`), which
rescans `ready/`. A manager that does not hold the lock tries it again at each poll:
the kernel drops the lock of a manager that dies, and another takes over within a poll
interval. Per host, since inotify and FIFOs are local to a kernel (on NFS, other hosts'
jobs are found by the poll, as before).

A ring is a hint, never a job: a manager answers with a rescan, and a lost or extra ring
costs a poll interval of latency or a rescan, nothing else. So does a leader that rings for
nothing it cannot see: one stopped (SIGSTOP) keeps the lock, and the others find new jobs at
their polls until it goes on or dies. Only the queue's owner can
write `bells/` (its managers run as the owner); a job that runs as the owner could ring
or steal rings, which is no more than it could do to the queue (docs/SECURITY.md).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
from collections.abc import Callable

from jobs import host_part

log = logging.getLogger(__name__)
MOST_RINGS = 64  # rings of one turn, at most: more wake no more managers than a host has
ANSWERED_AT_ONCE = 64  # rings one wake reads, at most
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


class Bell:
    """This host's doorbell of one queue, and whether this manager leads (watches `ready/`)."""

    def __init__(self, lock: int, fifo: int) -> None:
        self.lock, self.fifo = lock, fifo
        self.leads = False

    @classmethod
    def open(cls, folder: int, queue: str) -> Bell | None:
        """The bell in the folder open at `folder` (the queue's `bells/`), made if missing; None
        if it cannot be used (every manager then watches `ready/` itself, as without a bell)."""
        host = host_part(socket.gethostname())
        lock = fifo = -1
        try:
            # Read-only (flock needs no more): a file open for writing would stop a remount read-only.
            lock = os.open(f"{host}.lock", os.O_RDONLY | os.O_CREAT | _OPEN, 0o600, dir_fd=folder)
            _check(lock, stat.S_ISREG, f"bells/{host}.lock", "a regular file")
            try:
                os.mkfifo(f"{host}.fifo", 0o600, dir_fd=folder)
            except FileExistsError:
                pass  # made by another manager of this host (checked below, whoever made it)
            fifo = os.open(f"{host}.fifo", os.O_RDWR | os.O_NONBLOCK | _OPEN, dir_fd=folder)
            _check(fifo, stat.S_ISFIFO, f"bells/{host}.fifo", "a FIFO")
        except OSError as exc:
            for fd in (lock, fifo):
                if fd >= 0:
                    os.close(fd)
            log.warning("no doorbell for %s on this host (%s): every manager watches ready/ itself", queue, exc)
            return None
        return cls(lock, fifo)

    def try_to_lead(self) -> bool:
        """Take the lead if no manager of this host holds it; whether this one leads now.
        Where the lock cannot be taken at all (a file system without locks), every manager
        leads: each watches `ready/` itself, as without a bell."""
        if not self.leads:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.leads = True
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    log.warning("cannot lock the doorbell (%s): this manager watches ready/ itself", exc)
                    self.leads = True
        return self.leads

    def ring(self, times: int) -> None:
        """Wake up to `times` waiting managers: one write each (a write wakes one waiter)."""
        for _ in range(min(times, MOST_RINGS)):
            try:
                os.write(self.fifo, b"\n")
            except BlockingIOError:
                return  # full: rings enough stand
            except OSError as exc:
                log.warning("cannot ring the doorbell: %s", exc)
                return

    def answer(self, most: int) -> int:
        """Take up to `most` rings (a manager with that many free slots); how many were taken."""
        try:
            return len(os.read(self.fifo, max(1, min(most, ANSWERED_AT_ONCE))))
        except (BlockingIOError, InterruptedError):
            return 0  # another manager answered first

    def clear(self) -> None:
        """Drop the rings left: a manager that answered found nothing to claim, so they are stale."""
        try:
            while os.read(self.fifo, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    @property
    def fds(self) -> list[int]:
        """What a job's child must not keep: an inherited lock would outlive its manager."""
        return [self.lock, self.fifo]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.lock = self.fifo = -1


def _check(fd: int, is_kind: Callable[[int], bool], name: str, kind: str) -> None:
    """Refuse what is not `kind` or not this user's (a bell is the owner's managers' alone)."""
    found = os.fstat(fd)
    if not is_kind(found.st_mode) or found.st_uid != os.geteuid():
        raise OSError(errno.EPERM, f"{name} is not {kind} of uid {os.geteuid()}: remove it, a manager makes it anew")
