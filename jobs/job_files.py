"""Reading one job's own files wherever it is now: its events, a run's output, what its
newest run says (its child's pid, its progress). For `Queue` and `queue.serving`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import BinaryIO, TypeVar

from jobs import files, view
from jobs.errors import InvalidJob, JobsError
from jobs.folder import EVENTS_FILE, QueueFolder
from jobs.job import State
from jobs.job_view import Job

_T = TypeVar("_T")


def job(folder: QueueFolder, job_id: str) -> Job:
    """`Queue.job`: a job that moves while it is read is looked for again (it always ends somewhere)."""
    while True:
        state, place = view.locate(folder, job_id)
        found = view.read_moving(folder, state, place)
        if found is not None:
            return found


def events(folder: QueueFolder, job_id: str, limit: int) -> list[str]:
    state, place = view.locate(folder, job_id)
    if state is State.INCOMING:
        return []
    try:
        with place.open() as opened:
            data = files.read_limited(EVENTS_FILE, limit, opened.fd)
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()


def open_output(folder: QueueFolder, job_id: str, run: int, name: str) -> BinaryIO | None:
    if name not in ("stdout", "stderr"):
        raise InvalidJob(f"a run's output is stdout or stderr, not {name!r}")
    _, place = view.locate(folder, job_id)
    try:
        with place.dir.sub(f"{place.name}/attempt-{run}") as attempt:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=attempt.fd)
    except FileNotFoundError:
        return None
    return os.fdopen(fd, "rb")


def newest_run(folder: QueueFolder, job: Job, read: Callable[[int], _T | None]) -> _T | None:
    """What `read` finds in the folder of the job's newest run (given its descriptor); None
    if it has no run or the run cannot be read now."""
    if not job.history:
        return None
    try:
        _, place = view.locate(folder, job.id)
        with place.dir.sub(f"{place.name}/attempt-{job.history[-1].number}") as run:
            return read(run.fd)
    except (OSError, JobsError):
        return None
