"""Waiting for jobs to finish, for `Queue.wait` and `Queue.result`.

A job has finished when its folder is in `done/` or `dead/`: two `stat`s per
job, whatever the size of the queue. The store runs no threads and watches
nothing, so waiting polls, starting at a few milliseconds and backing off to
a ceiling that grows with the number of jobs still pending.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from jobs import view
from jobs.errors import WaitTimeout
from jobs.folder import QueueFolder
from jobs.job import State

POLL_FIRST = 0.002
POLL_CEILING = 0.1  # for a few jobs: a finished job is noticed within 0.1 s
POLL_PER_PENDING = 1e-4  # ten thousand pending jobs are looked at once a second
Progress = Callable[[dict[str, State], int], None]  # finished so far, number still pending


def finished_state(folder: QueueFolder, job_id: str) -> State | None:
    """`State.DONE` or `State.DEAD` if the job is there now, else None."""
    for state in (State.DONE, State.DEAD):
        if folder.at(state).is_dir(job_id):
            return state
    return None


def unfinished_ids(folder: QueueFolder) -> list[str]:
    """Ids of every job that is ready, scheduled or claimed now."""
    return [job_id for state in State if not state.terminal for _, job_id in view.entries(folder, state)]


def wait(
    folder: QueueFolder, job_ids: Iterable[str], timeout: float | None, progress: Progress | None = None
) -> dict[str, State]:
    """Block until every job is done or dead; return each id's final state.

    Raise WaitTimeout after `timeout` seconds, JobNotFound for an id that is in
    no state folder when the wait starts.
    """
    pending = list(dict.fromkeys(job_ids))
    for job_id in pending:
        view.locate(folder, job_id)  # an id that exists nowhere would be waited for forever
    deadline = None if timeout is None else time.monotonic() + timeout
    finished: dict[str, State] = {}
    delay = POLL_FIRST
    while True:
        pending = [job_id for job_id in pending if not _note_finished(folder, job_id, finished)]
        if progress is not None:
            progress(finished, len(pending))
        if not pending:
            return finished
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise WaitTimeout(f"{len(pending)} job(s) not finished after {timeout:g}s, e.g. {pending[0]}")
        time.sleep(delay if remaining is None else min(delay, remaining))
        delay = min(delay * 2, max(POLL_CEILING, len(pending) * POLL_PER_PENDING))


def _note_finished(folder: QueueFolder, job_id: str, finished: dict[str, State]) -> bool:
    state = finished_state(folder, job_id)
    if state is not None:
        finished[job_id] = state
    return state is not None
