"""The counters behind the metrics (`jobs.stats`): each process's file, adoption of a gone
manager's file, no double count when a file is adopted under a living manager, and the
reader skipping what is not a stats file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs import InvalidJob, Owner, Queue, Tally
from jobs.stats import BUCKETS


def _tally(succeeded: int = 0, dead: int = 0, function: str = "f") -> Tally:
    tally = Tally()
    for _ in range(succeeded):
        tally.run_ended(function, "succeeded", 0.02)
    for _ in range(dead):
        tally.run_ended(function, "dead", 2.0)
    return tally


def _register(queue: Queue) -> str:
    owner = Owner.new()
    queue.serving.register_owner(owner)
    return owner.name


def test_a_tally_survives_its_json_and_counts_durations_in_buckets() -> None:
    tally = _tally(succeeded=3, dead=1)
    tally.reverts, tally.expiries, tally.races, tally.wakeups = 4, 1, 7, 9
    again = Tally.from_json(tally.to_json())
    assert again == tally
    assert again.runs == {("f", "succeeded"): 3, ("f", "dead"): 1}
    buckets = again.durations["f"].buckets
    assert buckets[BUCKETS.index(0.05)] == 3  # 0.02 s falls in the bucket up to 0.05
    assert buckets[BUCKETS.index(5.0)] == 1
    assert again.durations["f"].count == 4
    assert again.durations["f"].total == pytest.approx(2.06)


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"kind": "other"},
        {"kind": "forkvisor-stats", "runs": [["f", "exploded", 1]]},
        {"kind": "forkvisor-stats", "runs": [["f", "dead", -1]]},
        {"kind": "forkvisor-stats", "runs": [["f", "dead", True]]},
        {"kind": "forkvisor-stats", "durations": {"f": {"buckets": [1], "sum": 1}}},
        {"kind": "forkvisor-stats", "reverts": "many"},
        {"kind": "forkvisor-stats", "races": -1},
        {"kind": "forkvisor-stats", "wakeups": 1.5},
    ],
)
def test_a_document_that_is_not_a_tally_is_refused(document: object) -> None:
    with pytest.raises(InvalidJob):
        Tally.from_json(document)


def test_a_manager_writes_its_file_and_readers_sum_every_file(queue: Queue) -> None:
    first, second = queue.serving.stats_file("manager"), queue.serving.stats_file("manager")
    first.start(_register(queue))
    second.start(_register(queue))
    first.tally.add(_tally(succeeded=2))
    second.tally.add(_tally(dead=1, function="g"))
    first.write("unused")
    second.write("unused")
    assert queue.stats().runs == {("f", "succeeded"): 2, ("g", "dead"): 1}
    assert len(os.listdir(queue.path / "stats")) == 2


def test_a_new_manager_adopts_a_gone_managers_file_and_counts_on(queue: Queue) -> None:
    gone = queue.serving.stats_file("manager")
    owner = _register(queue)
    gone.start(owner)
    gone.tally.add(_tally(succeeded=5))
    gone.write(owner)
    queue.serving.retire_owner(owner)  # it stopped: its owner folder went
    successor = queue.serving.stats_file("manager")
    successor.start(_register(queue))
    assert successor.tally.runs == {("f", "succeeded"): 5}
    successor.tally.add(_tally(succeeded=1))
    successor.write("unused")
    assert queue.stats().runs == {("f", "succeeded"): 6}  # the sum only grew
    assert len(os.listdir(queue.path / "stats")) == 1  # one file per manager running at once


def test_the_file_of_a_living_manager_is_not_adopted(queue: Queue) -> None:
    living = queue.serving.stats_file("manager")
    owner = _register(queue)
    living.start(owner)
    living.tally.add(_tally(succeeded=2))
    living.write(owner)
    newcomer = queue.serving.stats_file("manager")
    newcomer.start(_register(queue))
    assert newcomer.tally.runs == {}
    assert queue.stats().runs == {("f", "succeeded"): 2}


def test_a_manager_whose_file_was_adopted_while_it_lived_counts_nothing_twice(queue: Queue) -> None:
    """A stalled manager reaped by a sweeper lives on: a newcomer may adopt its file. Its
    next write sees the file gone and starts a new one with only what came since."""
    stalled = queue.serving.stats_file("manager")
    owner = _register(queue)
    stalled.start(owner)
    stalled.tally.add(_tally(succeeded=3))
    stalled.write(owner)
    queue.serving.retire_owner(owner)  # what a reap leaves: no owner folder
    newcomer = queue.serving.stats_file("manager")
    newcomer.start(_register(queue))
    assert newcomer.tally.runs == {("f", "succeeded"): 3}
    newcomer.write("unused")
    stalled.tally.add(_tally(succeeded=1))  # it ran one more before it noticed
    stalled.write(_register(queue))  # registered anew under a new owner name
    assert queue.stats().runs == {("f", "succeeded"): 4}


def test_a_restarted_sweeper_goes_on_from_its_own_file(queue: Queue) -> None:
    owner = _register(queue)
    first = queue.serving.stats_file("sweeper")
    first.start(owner)
    first.tally.reverts = 2
    first.write(owner)
    restarted = queue.serving.stats_file("sweeper")
    restarted.start(owner)
    restarted.tally.reverts += 1
    restarted.write(owner)
    assert queue.stats().reverts == 3


def test_what_is_not_a_stats_file_is_skipped(queue: Queue, tmp_path: Path) -> None:
    own = queue.serving.stats_file("manager")
    owner = _register(queue)
    own.start(owner)
    own.tally.add(_tally(succeeded=1))
    own.write(owner)
    stats = queue.path / "stats"
    secret = tmp_path / "secret.json"
    secret.write_text('{"kind": "forkvisor-stats", "version": 1, "reverts": 1000}')
    os.symlink(secret, stats / "manager.linked.json")
    os.mkfifo(stats / "manager.fifo.json")
    (stats / "manager.junk.json").write_text("[" * 100_000)
    (stats / "manager.big.json").write_bytes(b" " * (2 << 20))
    (stats / "notes.txt").write_text("hello")
    assert queue.stats().runs == {("f", "succeeded"): 1}
    assert queue.stats().reverts == 0


def test_a_queue_made_before_stats_gets_the_folder_from_its_owner(tmp_path: Path) -> None:
    Queue(tmp_path / "q").close()
    os.rmdir(tmp_path / "q" / "stats")  # a queue made by an older forkvisor
    reopened = Queue(tmp_path / "q")
    assert reopened.stats() == Tally()
    assert (tmp_path / "q" / "stats").is_dir()


def test_a_name_another_owner_took_first_is_counted_gone_not_raced(tmp_path: Path) -> None:
    """Two managers' claimers hold the same name; the second finds it gone when it looks,
    and tries no rename (a race is a rename that fails after a look that saw the entry)."""
    first, second = Queue(tmp_path / "queue"), Queue(tmp_path / "queue", create=False)
    owners = [_register(first), _register(second)]
    job_id = first.enqueue("f")
    assert first.serving.has_claimable()
    assert second.serving.has_claimable()
    claim = second.serving.claim(owners[1])
    assert claim is not None
    assert claim.job_id == job_id
    assert first.serving.claim(owners[0]) is None
    assert (first.serving.gone, first.serving.races, second.serving.races) == (1, 0, 0)  # gone before it looked
