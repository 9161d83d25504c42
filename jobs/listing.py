"""Reading many jobs: every job of a state, or one page of it, in name order.

A page reads the folder's names once and keeps only the page's (`view.first_entries`),
so paging through a million done jobs never holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs import view
from jobs.folder import QueueFolder
from jobs.job import State
from jobs.job_view import Job


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
            found += page(folder, current, limit - len(found), after, function, None).jobs
            if len(found) >= limit:
                break
    return found


def _every(folder: QueueFolder, state: State, function: str | None) -> list[Job]:
    places = sorted(view.entries(folder, state), key=lambda entry: entry[0].name)
    read = (view.read_moving(folder, state, place) for place, _ in places)
    return [job for job in read if job is not None and (function is None or job.function == function)]


@dataclass(frozen=True)
class Page:
    """Jobs of one state in name order, and where the next page starts (None: no more)."""

    jobs: list[Job]
    next: str | None


def page(
    folder: QueueFolder, state: State, limit: int, after: str | None, function: str | None, examine: int | None
) -> Page:
    """Up to `limit` jobs after the entry `after`, reading more names while a function
    filter leaves the page short (twice as many each time), but at most `examine` entries:
    a filter that matches rarely returns a short page and where to go on, not a scan of
    a million jobs."""
    found: list[Job] = []
    # a filter reads its whole budget of names in one pass (each pass lists the folder once)
    size, examined = (max(limit, examine, 1) if function and examine else max(limit, 1)), 0
    while True:
        wanted = size if examine is None else min(size, examine - examined)
        chunk = view.first_entries(folder, state, after, wanted)
        for place, _ in chunk:
            after = place.name
            examined += 1
            job = view.read_moving(folder, state, place)
            if job is not None and (function is None or job.function == function):
                found.append(job)
                if len(found) == limit:
                    return Page(found, after)
        if len(chunk) < wanted:
            return Page(found, None)  # the folder has no more
        if examine is not None and examined >= examine:
            return Page(found, after)
        size *= 2
