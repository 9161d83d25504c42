"""Submissions through incoming/ (jobs/incoming.py), taken in by the queue's owner: each
step, each refusal, and each way a take-in can be interrupted. (As other users, with real
accounts: tests/security/test_members.py.)"""

from __future__ import annotations

import json
import os
import time

import pytest

from jobs import Queue, State, new_job_id
from jobs import incoming as submissions
from jobs.job import ready_name

from .conftest import Hand


def _submit(queue: Queue, document: object, job_id: str | None = None) -> str:
    job_id = job_id or new_job_id()
    data = document if isinstance(document, bytes) else json.dumps(document).encode()
    submissions.submit(queue.folder, job_id, data, durable=False)
    return job_id


def test_a_submission_is_taken_in_as_the_owners_job(queue: Queue, hand: Hand) -> None:
    job_id = _submit(queue, {"function": "sample.echo", "args": [1], "priority": 5})
    assert queue.job(job_id).state is State.INCOMING
    assert queue.counts()["incoming"] == 1
    assert queue.take_in() == 1
    assert hand.names(State.READY) == [ready_name(job_id, 5)]
    assert os.listdir(queue.path / "incoming") == []
    spec = json.loads((queue.path / "ready" / ready_name(job_id, 5) / "job.json").read_text())
    assert spec["submitted_by"]["uid"] == os.getuid()
    events = (queue.path / "ready" / ready_name(job_id, 5) / "events").read_text()
    assert "enqueued" in events
    assert "taken in from incoming/, submitted by" in events


def test_a_delayed_submission_is_scheduled(queue: Queue, hand: Hand) -> None:
    job_id = _submit(queue, {"function": "sample.echo", "run_at": time.time() + 3600})
    queue.take_in()
    assert queue.job(job_id).state is State.SCHEDULED


def test_a_malformed_submission_becomes_a_dead_job_saying_why(queue: Queue) -> None:
    job_id = _submit(queue, b'{"function": ')
    queue.take_in()
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert job.error is not None
    assert "job.json is not valid JSON" in job.error["message"]


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("old id", "was not made when it was submitted"),
        ("done id", "exists already (in done/)"),
    ],
)
def test_an_id_that_is_not_fresh_or_is_taken_is_refused(queue: Queue, how: str, words: str) -> None:
    if how == "old id":
        job_id = new_job_id(time.time() - 7200)  # an id two hours older than its file
    else:
        job_id = queue.enqueue("sample.echo")
        os.rename(queue.path / "ready" / ready_name(job_id, 0), queue.path / "done" / job_id)
    _submit(queue, {"function": "sample.echo"}, job_id)
    queue.take_in()
    notes = [n for n in os.listdir(queue.path / "quarantine") if n.endswith(".why")]
    assert len(notes) == 1
    assert words in (queue.path / "quarantine" / notes[0]).read_text()


def test_what_is_not_a_submission_is_quarantined(queue: Queue) -> None:
    (queue.path / "incoming" / "notes.txt").write_text("hello")
    (queue.path / "incoming" / "20261124-000000-000000-zzzzzzzz.json").write_text("{}")
    assert queue.take_in() == 2
    assert os.listdir(queue.path / "incoming") == []
    assert len([n for n in os.listdir(queue.path / "quarantine") if n.endswith(".why")]) == 2


def test_staging_files_never_slow_a_take_in(queue: Queue) -> None:
    for n in range(5000):
        (queue.path / "incoming" / f".half-written.{n}.tmp").write_text("")
    job_id = _submit(queue, {"function": "sample.echo"})
    assert queue.take_in(budget=1) == 1, "the submission, not the staging files, is what a take-in handles"
    assert queue.job(job_id).state is State.READY
    assert len(os.listdir(queue.path / "incoming")) == 5000, "young staging files are left to their writers"
    later = time.time() + 7200
    assert queue.take_in(later, budget=10_000, leftovers=True) == 5000, "a sweep drops them once abandoned"


def test_take_in_goes_oldest_first_and_keeps_to_its_budget(queue: Queue) -> None:
    ids = [_submit(queue, {"function": "sample.echo"}) for _ in range(5)]
    assert queue.take_in(budget=2) == 2
    assert [queue.job(job_id).state for job_id in ids] == [State.READY] * 2 + [State.INCOMING] * 3


@pytest.mark.parametrize("published", [False, True], ids=["before-publishing", "after-publishing"])
@pytest.mark.parametrize("priority", [0, 7])
def test_an_interrupted_take_in_is_finished_by_a_sweep(
    queue: Queue, hand: Hand, published: bool, priority: int
) -> None:
    """A manager died holding incoming/.taking.ID.json: a later sweep takes it in again, or,
    if the job was published already, only removes the file. Nothing twice, nothing lost."""
    document = {"function": "sample.echo", "priority": priority}
    job_id = _submit(queue, document)
    taking = queue.path / "incoming" / f".taking.{job_id}.json"
    if published:
        assert queue.take_in() == 1
        taking.write_text(json.dumps(document))  # as if its removal never happened
    else:
        os.rename(queue.path / "incoming" / f"{job_id}.json", taking)
    assert queue.take_in(leftovers=True) == 0, "a fresh .taking may belong to a manager at work"
    queue.take_in(time.time() + 120, leftovers=True)
    queue.take_in(time.time() + 120)
    assert os.listdir(queue.path / "incoming") == []
    assert hand.names(State.READY) == [ready_name(job_id, priority)], "the job is in ready/ exactly once"
    assert os.listdir(queue.path / "quarantine") == []


def test_the_owner_cancels_a_job_not_taken_in_yet(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo"})
    assert queue.cancel(job_id) is State.DEAD
    assert queue.job(job_id).state is State.DEAD


def test_a_leftover_of_a_job_that_moved_on_is_only_removed(queue: Queue, hand: Hand) -> None:
    """Published, then claimed by a manager, and the take-in's file still there: finishing it
    must not publish the job a second time beside its claim."""
    document = {"function": "sample.echo", "priority": 3}
    job_id = _submit(queue, document)
    queue.take_in()
    owner = hand.owner()
    claim = queue.claim(owner.name)
    assert claim is not None
    (queue.path / "incoming" / f".taking.{job_id}.json").write_text(json.dumps(document))
    queue.take_in(time.time() + 120, leftovers=True)
    assert os.listdir(queue.path / "incoming") == []
    assert hand.names(State.READY) == []
    assert queue.job(job_id).state is State.CLAIMED
