"""Reading many jobs: every job of a state, or one page of it, in name order.

A page reads the folder's names once and keeps only the page's (`view.first_entries`),
so paging through a million done jobs never holds them all.
"""

from __future__ import annotations

from jobs import view
from jobs.folder import QueueFolder
from jobs.job import Job, State


def jobs(
    folder: QueueFolder, state: State | None, function: str | None, limit: int | None, after: str | None
) -> list[Job]:
    """Jobs in one state (or all), optionally of one function; with a `limit`, a page after
    the entry named `after` (one state only)."""
    if after is not None and state is None:
        raise ValueError("after= pages through one state: give state= too")
    found: list[Job] = []
    for current in [state] if state is not None else [*State]:
        if limit is None:
            found += _every(folder, current, function)
        else:
            found += _page(folder, current, function, limit - len(found), after)
            if len(found) >= limit:
                break
    return found


def _every(folder: QueueFolder, state: State, function: str | None) -> list[Job]:
    places = sorted(view.entries(folder, state), key=lambda entry: entry[0].name)
    read = (view.read_moving(folder, state, place) for place, _ in places)
    return [job for job in read if job is not None and (function is None or job.function == function)]


def _page(folder: QueueFolder, state: State, function: str | None, limit: int, after: str | None) -> list[Job]:
    """Up to `limit` jobs after the entry `after`, reading more names while a function
    filter leaves the page short (twice as many each time)."""
    found: list[Job] = []
    size = max(limit, 1)
    while True:
        chunk = view.first_entries(folder, state, after, size)
        for place, _ in chunk:
            after = place.name
            job = view.read_moving(folder, state, place)
            if job is not None and (function is None or job.function == function):
                found.append(job)
                if len(found) == limit:
                    return found
        if len(chunk) < size:
            return found  # the folder has no more
        size *= 2
