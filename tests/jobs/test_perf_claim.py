"""The next run number is always the newest `attempt-N` + 1, whatever the counter
says (lost, behind, ahead) and whatever gaps a hand-edited job folder has."""

from __future__ import annotations

import os
from pathlib import Path

from jobs import Owner, Queue, State


def _ready_job(queue: Queue) -> Path:
    queue.enqueue("sample.echo")
    (path,) = (queue.path / State.READY.value).iterdir()
    return path


def _attempt_folders(job_dir: Path) -> list[str]:
    return sorted(name for name in os.listdir(job_dir) if name.startswith("attempt-"))


def test_first_claim_makes_attempt_1(queue: Queue, owner: Owner) -> None:
    _ready_job(queue)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert (claim.run, claim.attempt) == (1, 1)
    assert _attempt_folders(claim.path) == ["attempt-1"]


def test_a_lost_counter_write_does_not_reuse_a_run_folder(queue: Queue, owner: Owner) -> None:
    job_dir = _ready_job(queue)
    for number in (1, 2):
        os.mkdir(job_dir / f"attempt-{number}")  # runs whose counter writes were lost
    claim = queue.serving.claim(owner.name)  # the counter says 0: the guess attempt-1 exists
    assert claim is not None
    assert (claim.run, claim.attempt) == (3, 1)


def test_a_counter_ahead_of_the_folders_leaves_no_gap(queue: Queue, owner: Owner) -> None:
    # A claim counted run 2 and died before its mkdir: attempt-1 exists, the counter says 2.
    job_dir = _ready_job(queue)
    os.mkdir(job_dir / "attempt-1")
    (job_dir / "attempts").write_text("2\n")
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert (claim.run, claim.attempt) == (2, 3)
    assert _attempt_folders(claim.path) == ["attempt-1", "attempt-2"]


def test_run_numbers_grow_after_claims_that_died_counted_and_a_retry(queue: Queue, owner: Owner) -> None:
    # Two runs, then two claims that counted their attempt and died before their mkdir:
    # attempt-1, attempt-2, counter 4. Guessing from the counter alone would make attempt-5,
    # leaving a gap that a retry (counter 0 again) would later fill with a lower number.
    queue.configure(max_attempts=10)
    job_dir = _ready_job(queue)
    for number in (1, 2):
        os.mkdir(job_dir / f"attempt-{number}")
    (job_dir / "attempts").write_text("4\n")
    runs = []
    for _ in range(2):
        claim = queue.serving.claim(owner.name)
        assert claim is not None
        runs.append(claim.run)
        queue.serving.fail(claim, {"message": "again"}, permanent=True)
        queue.retry(claim.job_id)
    for _ in range(3):
        claim = queue.serving.claim(owner.name)
        assert claim is not None
        runs.append(claim.run)
        queue.serving.fail(claim, {"message": "again"}, delay=0)
    assert runs == [3, 4, 5, 6, 7]
    assert _attempt_folders(job_dir.parent.parent / "ready" / job_dir.name) == [f"attempt-{n}" for n in range(1, 8)]


def test_a_file_named_as_the_previous_run_is_not_taken_for_one(queue: Queue, owner: Owner) -> None:
    job_dir = _ready_job(queue)
    os.mkdir(job_dir / "attempt-1")
    os.mkdir(job_dir / "attempt-3")
    (job_dir / "attempt-2").write_text("not a run\n")
    (job_dir / "attempts").write_text("2\n")  # the guess 3 exists; attempt-2 is a file
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert claim.run == 4


def test_released_and_retried_runs_keep_counting_up(queue: Queue, owner: Owner) -> None:
    _ready_job(queue)
    first = queue.serving.claim(owner.name)
    assert first is not None
    queue.serving.release(first)  # gives the attempt back: the counter is 0 again, attempt-1 stays
    second = queue.serving.claim(owner.name)
    assert second is not None
    assert (second.run, second.attempt) == (2, 1)
    queue.serving.fail(second, {"message": "no"}, permanent=True)
    queue.retry(second.job_id)  # the counter is reset to 0
    third = queue.serving.claim(owner.name)
    assert third is not None
    assert (third.run, third.attempt) == (3, 1)
    assert _attempt_folders(third.path) == ["attempt-1", "attempt-2", "attempt-3"]


def test_a_gap_left_by_hand_does_not_give_a_lower_run_number(queue: Queue, owner: Owner) -> None:
    # An operator removed attempt-2..4 of a job; its counter says 1 (a retry reset it, then one run).
    job_dir = _ready_job(queue)
    for number in (1, 5):
        os.mkdir(job_dir / f"attempt-{number}")
    (job_dir / "attempts").write_text("1\n")
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert (claim.run, claim.attempt) == (6, 2)
