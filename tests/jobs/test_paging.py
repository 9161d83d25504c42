"""`Queue.jobs(state, limit=N, after=ENTRY)` pages through a state in name order: pages
join into the whole listing, with nothing twice and nothing skipped, with or without a
function filter (`forkvisor list --after`)."""

from __future__ import annotations

import pytest

from jobs import Queue, State
from tests.jobs.conftest import add, echo


def pages(queue: Queue, state: State, size: int, function: str | None = None) -> list[list[str]]:
    found: list[list[str]] = []
    after = None
    for _ in range(100):  # a cursor that does not move would loop for ever
        page = queue.jobs(state, function=function, limit=size, after=after)
        if not page:
            return found
        found.append([job.id for job in page])
        after = page[-1].path.name
    raise AssertionError(f"still paging after 100 pages: {found[-3:]}")


def test_pages_join_into_the_whole_state(queue: Queue) -> None:
    for n in range(25):
        queue.with_options(priority=n % 3).enqueue(add, n, n)
    whole = [job.id for job in queue.jobs(State.READY)]
    paged = pages(queue, State.READY, 10)
    assert [len(page) for page in paged] == [10, 10, 5]
    assert [job_id for page in paged for job_id in page] == whole  # claim order: priority, then age


def test_a_function_filter_fills_each_page(queue: Queue) -> None:
    ids = [queue.enqueue(add if n % 4 else echo, n, n) for n in range(40)]
    wanted = [job_id for n, job_id in enumerate(ids) if n % 4 == 0]
    function = queue.job(wanted[0]).function
    paged = pages(queue, State.READY, 3, function=function)
    assert [len(page) for page in paged] == [3, 3, 3, 1]
    assert [job_id for page in paged for job_id in page] == wanted


def test_after_needs_a_state(queue: Queue) -> None:
    with pytest.raises(ValueError, match="one state"):
        queue.jobs(limit=5, after="x")


def test_a_rare_function_is_paged_through_without_reading_everything(queue: Queue) -> None:
    """`Queue.page(..., examine=N)` reads at most N entries a page: a filter that matches
    rarely gives short pages and where to go on, and the pages still join into the whole."""
    ids = [queue.enqueue(add if n % 10 else echo, n, n) for n in range(50)]
    wanted = [job_id for n, job_id in enumerate(ids) if n % 10 == 0]
    function = queue.job(wanted[0]).function
    found, after, sizes = [], None, []
    for _ in range(100):
        page = queue.page(State.READY, 3, after, function, examine=12)
        found += [job.id for job in page.jobs]
        sizes.append(len(page.jobs))
        if page.next is None:
            break
        after = page.next
    assert found == wanted
    assert max(sizes) <= 2  # never more than 12 entries read, so at most 2 of every 10
    assert len(sizes) >= 50 // 12  # each page stopped at its budget


def test_a_page_says_there_is_no_more(queue: Queue) -> None:
    for n in range(5):
        queue.enqueue(add, n, n)
    assert queue.page(State.READY, 10).next is None
    first = queue.page(State.READY, 3)
    assert [job.path.name for job in first.jobs][-1] == first.next
    assert len(queue.page(State.READY, 3, first.next).jobs) == 2
