"""Edges found in review: a missing quarantine/, duplicate ids, claims no run holds,
due times given in milliseconds. Each once left a job stuck, lost or looping."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from jobs import ClaimLost, InvalidJob, Owner, Queue, State, unknown_liveness
from jobs import files as job_files


def test_junk_in_ready_is_quarantined_even_after_quarantine_was_removed(queue: Queue, owner: Owner) -> None:
    shutil.rmtree(queue.path / "quarantine")
    (queue.path / "ready" / "README").write_text("not a job")
    started = time.monotonic()
    assert queue.serving.claim(owner.name) is None  # returns, rather than rescanning the junk forever
    assert time.monotonic() - started < 5
    assert sorted(p.name.endswith(".why") for p in (queue.path / "quarantine").iterdir()) == [False, True]
    assert list((queue.path / "ready").iterdir()) == []


def test_a_copy_of_a_dead_job_put_back_in_ready_is_quarantined_not_stranded(queue: Queue, owner: Owner) -> None:
    job_id = queue.with_options(max_attempts=1).enqueue("sample.echo")
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    queue.serving.fail(claim, {"message": "boom"})
    shutil.copytree(queue.path / "dead" / job_id, queue.path / "ready" / f"100.{job_id}")
    (queue.path / "ready" / f"100.{job_id}" / "attempts").write_text("0\n")
    copy = queue.serving.claim(owner.name)
    assert copy is not None
    with pytest.raises(ClaimLost, match="already holds a job with this id"):
        queue.serving.fail(copy, {"message": "boom again"})  # dead/ID exists: the copy cannot replace it
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 0,
        "dead": 1,
    }
    notes = [p.read_text() for p in (queue.path / "quarantine").glob("*.why")]
    assert len(notes) == 1
    assert "already holds a job with this id" in notes[0]


def test_a_duplicate_in_a_reaped_owner_folder_does_not_stop_the_sweep(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    later = queue.with_options(delay=1).enqueue("sample.echo")
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    shutil.copytree(claim.path, queue.path / "dead" / job_id)  # a copy standing where a revert could go
    (claim.path / "attempts").write_text("3\n")  # its lost attempt was the last: it goes to dead/
    result = queue.serving.sweep(time.time() + 3600, unknown_liveness)
    assert result["promoted"] == 1, "the sweep stopped before promoting"
    assert queue.job(later).state is State.READY
    assert [p.name for p in (queue.path / "claimed").iterdir()] == []


def test_claims_that_no_run_holds_go_back_to_the_queue(queue: Queue, owner: Owner) -> None:
    held_id = queue.enqueue("sample.echo")
    stray_id = queue.enqueue("sample.echo")
    held = queue.serving.claim(owner.name)
    stray = queue.serving.claim(owner.name)  # as if the fork never happened for this one
    assert held is not None
    assert stray is not None
    assert (held.job_id, stray.job_id) == (held_id, stray_id)
    assert queue.serving.return_unheld(owner.name, {held_id}) == 1
    assert queue.job(held_id).state is State.CLAIMED
    assert queue.job(stray_id).state is State.READY
    assert "never started" in (queue.job(stray_id).path / "events").read_text()


@pytest.mark.parametrize(
    ("options", "message"),
    [({"run_at": time.time() * 1000}, "epoch seconds, not milliseconds"), ({"delay": 1e13}, "delay of .* is too long")],
)
def test_a_due_time_in_milliseconds_is_refused(queue: Queue, options: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        queue.with_options(**options).enqueue("sample.echo")
    assert queue.counts()["scheduled"] == 0


def test_promote_by_name_moves_that_retry_only(queue: Queue, owner: Owner) -> None:
    first, second = queue.enqueue("sample.echo"), queue.enqueue("sample.echo")
    now = time.time()
    for _ in range(2):
        claim = queue.serving.claim(owner.name, now)
        assert claim is not None
        assert queue.serving.fail(claim, {"message": "boom"}, now, delay=5.0) is State.SCHEDULED
    assert queue.serving.promote(first, 0, now + 5.0, now + 5.0) is True
    assert queue.serving.promote(first, 0, now + 5.0, now + 5.0) is False  # already moved
    assert (queue.job(first).state, queue.job(second).state) == (State.READY, State.SCHEDULED)


@pytest.mark.parametrize("point", ["claim:counted", "claim:attempt-created"])
def test_a_claim_reaped_while_its_claimer_stood_still_starts_no_run(queue: Queue, point: str) -> None:
    """A manager stopped (SIGSTOP) in the middle of a claim is reaped by a sweep; resumed, it
    must not make or run an attempt in the job, which is no longer its own (found by the
    chaos run: a done job gained a run after its completion). Stopped before the run's
    folder was made, the folder it makes is taken back; after, the sweep marked it lost."""
    job_id = queue.with_options(max_attempts=1).enqueue("sample.echo")
    owner = Owner.new(lease=1.0)
    queue.serving.register_owner(owner)

    def reap_mid_claim(name: str) -> None:
        if name == point:
            job_files.checkpoint_hook = None
            Queue(queue.path, create=False).serving.sweep(time.time() + 60, lambda found: False)  # the owner is dead

    job_files.checkpoint_hook = reap_mid_claim
    try:
        assert queue.serving.claim(owner.name) is None, "a claim the sweep took back is not run"
    finally:
        job_files.checkpoint_hook = None
    dead = queue.job(job_id)
    assert dead.state is State.DEAD, "the sweep buried it: its one attempt was counted and lost"
    runs = sorted(path.name for path in dead.path.glob("attempt-*"))
    if point == "claim:counted":
        assert runs == [], "the run folder made after the reap was taken back"
    else:
        assert runs == ["attempt-1"]
        assert json.loads((dead.path / "attempt-1" / "outcome.json").read_text())["lost"] is True
    assert "claimed by" not in "".join(queue.events(job_id)), "no claim is told for a job it no longer held"


def test_a_claimer_reaped_before_it_counted_counts_nothing_in_the_job(queue: Queue) -> None:
    """Stopped after reading the job (its counter said 0) and before counting, then reaped:
    the job went back to ready/ and was run and counted by another manager; the resumed
    claimer's count (1), written through the folder it holds, must not land over that one
    (found by the chaos run: a dead job's counter read 2 after 3 counted runs)."""
    job_id = queue.enqueue("sample.echo")
    stalled = Owner.new(lease=1.0)
    queue.serving.register_owner(stalled)
    other = Owner.new()

    def reaped_and_run_elsewhere(name: str) -> None:
        if name == "claim:judged":
            job_files.checkpoint_hook = None
            elsewhere = Queue(queue.path, create=False)
            elsewhere.serving.sweep(time.time() + 60, lambda found: found.name == other.name)  # the stalled one is dead
            elsewhere.serving.register_owner(other)
            for _ in range(2):  # two attempts counted by the other manager
                claim = elsewhere.serving.claim(other.name)
                assert claim is not None
                elsewhere.serving.fail(claim, {"message": "x"}, delay=0)

    job_files.checkpoint_hook = reaped_and_run_elsewhere
    try:
        assert queue.serving.claim(stalled.name) is None
    finally:
        job_files.checkpoint_hook = None
    job = queue.job(job_id)
    assert job.attempts == 2, "the stalled claimer's count (1) did not replace the other's (2)"
    assert [name for name in os.listdir(job.path) if name.endswith(".tmp")] == [], "its staging file was taken back"


def test_a_run_whose_claim_was_lost_while_it_ran_gets_an_outcome(queue: Queue, owner: Owner) -> None:
    """The manager learns at the harvest that a sweep took its claim back after the run
    began; the run's folder gets an outcome saying so if the sweep wrote none."""
    queue.enqueue("sample.echo")
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    run = claim.path / f"attempt-{claim.run}"
    queue.serving.note_lost(claim, "exited 0")
    assert json.loads((run / "outcome.json").read_text())["lost"] is True
    assert "exited 0 after its claim was lost" in "".join(queue.events(claim.job_id))
