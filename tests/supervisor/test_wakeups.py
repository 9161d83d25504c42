"""The manager's eyes on a queue (`supervisor.wakeups`): what it tells the claim index."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs import Queue
from supervisor.wakeups import QueueWatch


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
