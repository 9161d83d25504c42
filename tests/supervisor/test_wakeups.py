"""The manager's eyes on a queue (`supervisor.wakeups`): what it tells the claim index."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import CANCEL_FILE, Queue
from supervisor.wakeups import FOLLOW_AFTER, QueueWatch


def test_a_manager_that_watches_ready_tells_its_index_so(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    assert queue.serving.index.watched is False
    watch = QueueWatch(queue, poll_interval=5.0)
    watch.open()
    try:
        if watch.watch is None:
            pytest.skip("no inotify here: the manager polls, and tells its index nothing")
        assert queue.serving.index.watched is True  # it rescans only as a safety net from now on
    finally:
        watch.close()


@pytest.fixture
def watching(tmp_path: Path) -> Iterator[tuple[QueueWatch, Path]]:
    queue = Queue(tmp_path / "q")
    watch = QueueWatch(queue, poll_interval=5.0)
    watch.open()
    if watch.watch is None:
        watch.close()
        pytest.skip("no inotify here: a running job's marks are found by the heartbeat")
    folder = tmp_path / "job"
    folder.mkdir()
    yield watch, folder
    watch.close()


def test_a_job_that_ends_before_its_folder_is_watched_costs_no_watch(watching: tuple[QueueWatch, Path]) -> None:
    watch, folder = watching
    assert watch.watch is not None
    before = watch.watch.watched
    watch.follow_job("a-job", str(folder), now=100.0)
    assert watch.next_follow == 100.0 + FOLLOW_AFTER
    watch.follow_due(100.0 + FOLLOW_AFTER / 2)
    watch.forget_job("a-job")
    assert watch.watch.watched == before, "a watch was added for a job that ended first"
    assert watch.next_follow == float("inf")


def test_a_job_that_runs_on_is_watched_and_looked_at_once_for_a_mark_made_before(
    watching: tuple[QueueWatch, Path],
) -> None:
    """A cancel made before the watch is up made no event: the job is looked at when it is."""
    watch, folder = watching
    assert watch.watch is not None
    before = watch.watch.watched
    watch.follow_job("a-job", str(folder), now=100.0)
    (folder / CANCEL_FILE).write_text("before the watch\n")
    watch.news.reset()
    watch.follow_due(100.0 + FOLLOW_AFTER)
    assert watch.watch.watched == before + 1
    assert list(watch.news.marked) == ["a-job"], "the job was not looked at once its watch was up"
    (folder / CANCEL_FILE).unlink()
    watch.read()  # (the mark's removal: the job is looked at again too)
    watch.news.reset()
    (folder / CANCEL_FILE).write_text("after\n")
    watch.read()
    assert list(watch.news.marked) == ["a-job"], "the watch saw no mark"
    watch.forget_job("a-job")
    assert watch.watch.watched == before
