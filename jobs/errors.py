"""The exceptions of the job store: one root, `JobsError`, and families under it.

Every message says what was tried, on what, and why, and where it can, what
would fix it.
"""

from __future__ import annotations

import errno
import os
from typing import Any


class JobsError(Exception):
    """Root of every error the job store raises on purpose."""


class QueueError(JobsError):
    """The queue folder cannot be used: missing, not a queue, too new, unwritable."""


class QueueReplaced(QueueError):
    """The queue's folder, or one of its state folders, was moved or replaced while this
    process had it open: it stops rather than follow the name somewhere else."""


class StorageError(QueueError):
    """The queue's file system refused: it is full, over quota, read-only, or not permitted."""

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_


FULL = (errno.ENOSPC, errno.EDQUOT)


def storage_error(exc: OSError, action: str, queue: str | os.PathLike[str]) -> StorageError:
    """One line for a file system error met while trying to `action` on `queue`: what
    happened in words, and what to do, without the temporary path the syscall saw."""
    return StorageError(f"cannot {action} {queue}: {storage_reason(exc, queue)}", exc.errno)


def storage_reason(exc: OSError, queue: str | os.PathLike[str]) -> str:
    if exc.errno == errno.ENOSPC:
        return (
            "its file system is full; free space and try again "
            f"(`forkvisor purge {queue} --state done --older-than 7d` deletes finished jobs, even on a full disk)"
        )
    if exc.errno == errno.EDQUOT:
        return f"the disk quota is used up; free space (`forkvisor purge {queue} ...`) or raise the quota"
    if exc.errno == errno.EROFS:
        return "it is on a read-only file system; remount it read-write (status, list, show and logs work as it is)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        where = f" on {os.fspath(exc.filename)}" if exc.filename else ""
        return f"permission denied{where}; this needs write access to the whole queue folder"
    return exc.strerror or str(exc)


class JobNotFound(JobsError, LookupError):
    """No job with this id is in any state folder of the queue."""


class InvalidJobId(JobsError, ValueError):
    """A string given as a job id is not one (ids are safe file names)."""


class InvalidJob(JobsError, ValueError):
    """A job spec is malformed: bad `job.json`, wrong types, bad options."""


class UnsupportedFormat(InvalidJob):
    """A job was written in a newer format than this forkvisor reads; a newer manager can run it."""


class BadArguments(JobsError, TypeError):
    """The arguments given to `enqueue` do not fit the registered function's signature."""


class ArgumentNotSerializable(JobsError, TypeError):
    """An argument given to `enqueue` cannot be encoded as JSON."""


class UnknownCallable(JobsError, LookupError):
    """A job names a function that is not in the registry."""


class ClaimLost(JobsError):
    """The job is no longer held by this owner: a sweeper took it back."""


class MoveCollision(JobsError):
    """A rename would have replaced an entry that already exists; nothing moved."""


class WrongState(JobsError):
    """The job is not in a state that allows the asked-for transition."""


class KeyTaken(WrongState):
    """A live job holds the key (`if_key_taken="raise"`); `.job_id` is that job."""

    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(f"key {key!r} is held by job {job_id}, which is not finished")
        self.key = key
        self.job_id = job_id


class JobFailed(JobsError):
    """The job ended in `dead/`: `error` is its last cause (as in its `error.json`)."""

    def __init__(self, job_id: str, error: dict[str, Any]) -> None:
        self.job_id = job_id
        self.error = error
        reason = error.get("reason", "failed")
        super().__init__(f"job {job_id} is dead ({reason}): {error.get('message', 'no message recorded')}")


class NotFinished(JobsError):
    """The job has not reached `done/` or `dead/` yet."""


class WaitTimeout(JobsError, TimeoutError):
    """Waiting for jobs took longer than the timeout given; they are still running or queued."""


class InternalError(JobsError):
    """An invariant of the store broke. This is a bug in forkvisor: please report it."""


class CannotComplete(Exception):  # named for what the job says, not as an error class
    """Raise from a job to say it can never succeed: it goes to `dead/` at once, with no retry."""
