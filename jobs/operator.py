"""What an operator does to a queue's jobs and its managers: cancel, freeze, retry, ask for a drain.

Functions over a `QueueFolder`, as `jobs.sweep` and `jobs.view` are; `Queue` calls them.
A member of a shared queue does none of these directly: they ask through `incoming/`
(`jobs.incoming`), and the queue's owner does it for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from jobs import counter, depends, fate, files, keys, moves, view
from jobs.errors import InvalidJob, WrongState
from jobs.folder import CANCEL_FILE, DRAIN_FILE, FREEZE_FILE, QueueFolder
from jobs.job import State, ready_name


def cancel(folder: QueueFolder, job_id: str, now: float, take_in: Callable[[float], object]) -> State:
    """Cancel a job: ready or scheduled goes to `dead/` at once; a claimed one is marked,
    and its manager stops it. A submission still in `incoming/` is taken in first
    (`take_in(now)` takes in that one submission).
    Return the job's state after the call."""
    while True:  # a job that moves while we act on it is looked for again (it always ends somewhere)
        state, place = view.locate(folder, job_id)
        if state is State.INCOMING:
            take_in(now)
            state, place = view.locate(folder, job_id)
        if state.terminal:
            raise WrongState(f"cannot cancel job {job_id}: it is already {state.value}")
        try:
            if state is State.CLAIMED:
                with place.open() as job:
                    folder.mark(job / CANCEL_FILE, f"cancelled at {now}")
                    folder.log_event(job, "cancel requested", now)
                return State.CLAIMED
            folder.bury(place, job_id, fate.cancelled(), now, even_if_full=True)
            return State.DEAD
        except FileNotFoundError:
            continue  # it finished, went back, was claimed or promoted meanwhile


def freeze(folder: QueueFolder, job_id: str, frozen: bool, now: float) -> int:
    """Mark (or unmark) the run of a running job as frozen; its manager acts on it at once.
    The run's number; WrongState if the job is not running."""
    state, place = view.locate(folder, job_id)
    if state is not State.CLAIMED:
        raise WrongState(
            f"cannot {'pause' if frozen else 'resume'} job {job_id}: it is {state.value}, and only a running "
            "job can be (`forkvisor pause QUEUE --function F` holds the jobs of F that have not started)"
        )
    try:
        with place.open() as job:
            run = view.last_attempt(job)
            if frozen:
                files.replace_file(
                    FREEZE_FILE, f"run {run}\n".encode(), durable=False, mode=folder.file_mode, dir_fd=job.fd
                )
            else:
                files.unlink_if_there(FREEZE_FILE, job.fd)
            folder.log_event(job, f"{'pause' if frozen else 'resume'} of run {run} requested", now)
    except FileNotFoundError:
        raise WrongState(f"cannot {'pause' if frozen else 'resume'} job {job_id}: its run ended meanwhile") from None
    return run


def retry(folder: QueueFolder, job_id: str, now: float, on_ready: Callable[[str], None]) -> None:
    """`Queue.retry`: its key taken again, its counter reset and its cancel mark dropped before the move."""
    state, place = view.locate(folder, job_id)
    if state is not State.DEAD:
        raise WrongState(f"cannot retry job {job_id}: it is {state.value}, and only dead jobs can be retried")
    with place.open() as job:
        try:
            spec = folder.read_spec(job, job_id)
        except InvalidJob as exc:  # (a member's submission refused at take-in: its text is aside)
            raise InvalidJob(f"cannot retry job {job_id}: {exc} (the owner may fix its job.json)") from None
        locate = functools.partial(view.locate, folder)
        if (
            spec.key is not None
            and (holder := keys.reserve(folder, spec.key, job_id, locate, spec.submitted_by)) is not None
        ):
            raise WrongState(
                f"cannot retry job {job_id}: its key {spec.key!r} is held by job {holder}, which is not finished"
            )
        counter.reset(folder, job)
        folder.clear_the_way(job, CANCEL_FILE, now)
        files.unlink_if_there(CANCEL_FILE, job.fd)
        if spec.depends_on:
            folder.log_event(job, "waiting: retried by an operator, attempts reset", now)
        else:
            folder.log_event(job, "ready: retried by an operator, attempts reset", now)
    if spec.depends_on:  # it waits for its dependencies again (one may have been retried too)
        depends.write_edges(folder, job_id, spec.depends_on)
        moves.move_on(place, folder.at(State.WAITING) / job_id, folder.durable)
        depends.settle(folder, job_id, now, on_ready)
        return
    target = folder.at(State.READY) / ready_name(job_id, spec.priority)
    moves.move_on(place, target, folder.durable)
    on_ready(target.name)


def request_drain(folder: QueueFolder, now: float) -> None:
    """`Queue.request_drain`: a new `drain` file each time."""
    # Renamed into place each time, so that watching managers see a change of file.
    data = f"drain requested at {now}\n".encode()
    files.replace_file(DRAIN_FILE, data, durable=False, mode=folder.file_mode, dir_fd=folder.root.fd)


class DrainRequest(NamedTuple):
    """One drain request: its file, told from a later one by inode and change time."""

    inode: int
    mtime_ns: int


def drain_request(folder: QueueFolder) -> DrainRequest | None:
    """Which drain request stands now (its file's inode and mtime), None if none does."""
    try:
        found = folder.root.lstat(DRAIN_FILE)
    except FileNotFoundError:
        return None
    return DrainRequest(found.st_ino, found.st_mtime_ns)
