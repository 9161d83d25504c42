"""A ready index fed by a watcher (inotify, through `queue.serving.note_ready`) does not rescan
`ready/` to find new names; an unwatched one (the poll fallback) still does, soon."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import jobs.index
from jobs import Owner, Queue
from jobs.index import ReadyIndex

REPO = Path(__file__).resolve().parents[2]


class Clock:
    """The index's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    found = Clock()
    monkeypatch.setattr(jobs.index, "time", types.SimpleNamespace(monotonic=found.monotonic))
    return found


def _enqueue_elsewhere(queue_path: Path, priority: int) -> str:
    """Enqueue from another process, as another submitter would."""
    code = (
        "import sys; from jobs import Queue; "
        "print(Queue(sys.argv[1], create=False).with_options(priority=int(sys.argv[2])).enqueue('sample.echo'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(queue_path), str(priority)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return done.stdout.strip()


def _claimed_id(queue: Queue, owner: Owner) -> str:
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    return claim.job_id


def test_a_watched_index_does_not_rescan_to_find_names(queue: Queue, owner: Owner, clock: Clock) -> None:
    ids = [queue.enqueue("sample.echo") for _ in range(4)]
    assert _claimed_id(queue, owner) == ids[0]
    scans = queue.serving.index.scans
    elsewhere = _enqueue_elsewhere(queue.path, 50)
    queue.serving.note_ready(f"050.{elsewhere}")  # what the manager's inotify watch does
    clock.now += 0.5  # ten times the unwatched index's least age
    assert [_claimed_id(queue, owner) for _ in range(2)] == [elsewhere, ids[1]]
    assert queue.serving.index.scans == scans


def test_a_watched_index_rescans_at_once_when_the_watcher_lost_events(queue: Queue, owner: Owner, clock: Clock) -> None:
    ids = [queue.enqueue("sample.echo") for _ in range(3)]
    queue.serving.note_ready(f"100.{ids[2]}")
    assert _claimed_id(queue, owner) == ids[0]
    missed = _enqueue_elsewhere(queue.path, 60)  # its event was in the queue that overflowed
    queue.serving.note_ready_missed()  # what the manager does on IN_Q_OVERFLOW
    assert _claimed_id(queue, owner) == missed  # no clock moved: the rescan came at once


def test_a_watched_index_still_rescans_as_a_safety_net(queue: Queue, owner: Owner, clock: Clock) -> None:
    ids = [queue.enqueue("sample.echo") for _ in range(3)]
    queue.serving.note_ready(f"100.{ids[2]}")  # a watcher's news of a name it already holds
    assert _claimed_id(queue, owner) == ids[0]
    missed = _enqueue_elsewhere(queue.path, 60)  # an event the kernel dropped: never noted
    clock.now += 0.5
    assert _claimed_id(queue, owner) == ids[1]
    clock.now += jobs.index.WATCHED_MIN_AGE
    assert _claimed_id(queue, owner) == missed


def test_an_index_told_it_is_watched_rescans_once_then_only_as_a_safety_net(
    queue: Queue, owner: Owner, clock: Clock
) -> None:
    ids = [queue.enqueue("sample.echo") for _ in range(4)]
    assert _claimed_id(queue, owner) == ids[0]  # the backlog, scanned before any watch
    before_watch = _enqueue_elsewhere(queue.path, 60)  # arrived before the watcher was set up
    queue.serving.index.watching()  # what the manager does once its inotify watch of ready/ is up
    scans = queue.serving.index.scans
    assert _claimed_id(queue, owner) == before_watch  # one rescan at once: what came before the watch
    assert queue.serving.index.scans == scans + 1
    clock.now += 0.5  # ten times the unwatched index's least age: no rescan to find names now
    assert [_claimed_id(queue, owner) for _ in range(2)] == ids[1:3]
    assert queue.serving.index.scans == scans + 1
    unseen = _enqueue_elsewhere(queue.path, 70)  # an event the kernel dropped: never noted
    clock.now += jobs.index.WATCHED_MIN_AGE
    assert _claimed_id(queue, owner) == unseen  # the safety net still finds it


def test_an_unwatched_index_sees_another_process_s_job_soon(queue: Queue, owner: Owner, clock: Clock) -> None:
    ids = [queue.enqueue("sample.echo") for _ in range(3)]
    assert _claimed_id(queue, owner) == ids[0]
    urgent = _enqueue_elsewhere(queue.path, 70)  # no watcher: only a scan can find it
    clock.now += 2 * jobs.index.UNWATCHED_MIN_AGE
    assert [_claimed_id(queue, owner) for _ in range(3)] == [urgent, ids[1], ids[2]]


def test_a_watched_index_skips_names_another_manager_claimed(queue_path: Path, clock: Clock) -> None:
    queue, rival = Queue(queue_path), Queue(queue_path, create=False)
    me, them = Owner.new(), Owner.new()
    queue.serving.register_owner(me)
    rival.serving.register_owner(them)
    ids = [queue.enqueue("sample.echo") for _ in range(4)]
    queue.serving.note_ready(f"100.{ids[0]}")
    mine = _claimed_id(queue, me)  # (which one: each manager's share of the head, jobs.index.Share)
    theirs = [_claimed_id(rival, them) for _ in range(2)]
    scans = queue.serving.index.scans
    last = _claimed_id(queue, me)  # its heap still holds the rival's two: at most two failed renames, no scan
    assert queue.serving.index.scans == scans
    assert sorted([mine, *theirs, last]) == sorted(ids)
    assert queue.serving.gone + queue.serving.races <= 2
    late = _enqueue_elsewhere(queue_path, 0)
    queue.serving.note_ready(f"100.{late}")
    assert _claimed_id(queue, me) == late
    assert queue.serving.claim(me.name) is None  # dry: one scan, which finds nothing


def test_own_enqueues_do_not_make_an_index_watched(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    queue.enqueue("sample.echo")
    assert queue.serving.index.watched is False  # a claimer without a watcher keeps the short rescans
    index = ReadyIndex(lambda: os.scandir(tmp_path / "q" / "ready"))
    index.note("100.x")
    assert index.watched is True


def test_an_index_keeps_more_names_from_a_bigger_folder(tmp_path: Path, clock: Clock) -> None:
    # A scan costs in proportion to the folder: keeping a share of it (not a fixed number)
    # makes each scan serve proportionally more claims.
    ready = tmp_path / "ready"
    ready.mkdir()
    names = [f"100.job-{number:04d}" for number in range(320)]
    for name in names:
        (ready / name).mkdir()
    index = ReadyIndex(lambda: os.scandir(ready), limit=4)

    def claim_next() -> str | None:
        name = index.pop()
        if name is not None:
            (ready / name).rmdir()  # what a claim's rename does
        return name

    assert [claim_next() for _ in range(4)] == names[:4]  # the first scan keeps the limit
    assert index.scans == 1
    assert [claim_next() for _ in range(20)] == names[4:24]  # the next keeps 320 // 16
    assert index.scans == 2
    claim_next()
    assert index.scans == 3
