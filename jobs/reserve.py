"""Room kept on the queue's disk for the purge's record, so that a purge can free a full disk.

A purge records each job in `purged.log` before the job goes (a power cut must not take
a job unrecorded), and on a full disk that line may need a block that only deleting can
free. As a file system keeps blocks for root, a queue keeps `RESERVE_FILE`: `RESERVE_SIZE`
bytes of real blocks that hold nothing. A purge that finds the disk full deletes it (its
records then fit, and each job it removes frees more than its line takes) and makes it
again once the purge is over; each sweep makes it again if it is missing.
"""

from __future__ import annotations

import errno
import logging
import os

from jobs import files
from jobs.handles import Dir

log = logging.getLogger(__name__)

RESERVE_FILE = ".purge-reserve"
RESERVE_SIZE = 64 * 1024  # a thousand purge lines; a page or a block more than any file system's
_CANNOT = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def release(root: Dir) -> bool:
    """Delete the reserve (the disk is full and a purge needs room); whether there was one."""
    try:
        os.unlink(RESERVE_FILE, dir_fd=root.fd)
    except FileNotFoundError:
        return False
    return True


def keep(root: Dir, mode: int) -> None:
    """Make the reserve if it is missing (or short: its writer was cut off); where it cannot
    be made now (a full, read-only or another's disk), a later purge or sweep makes it."""
    try:
        if root.lstat(RESERVE_FILE).st_size >= RESERVE_SIZE:
            return
        release(root)
    except FileNotFoundError:
        pass
    try:
        # Written, not allocated: real blocks on every file system (random: no compression shrinks them).
        files.write_new(RESERVE_FILE, os.urandom(RESERVE_SIZE), durable=True, mode=mode, dir_fd=root.fd)
    except OSError as exc:
        if exc.errno not in _CANNOT:
            raise
        files.unlink_if_there(RESERVE_FILE, root.fd)
        log.debug("cannot keep %s in %s now: %s", RESERVE_FILE, root.path, exc)
