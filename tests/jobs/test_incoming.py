"""Submissions through incoming/ (jobs/incoming.py), taken in by the queue's owner: each
step, each refusal, and each way a take-in can be interrupted. Here the submitter is the
test's own user, in its own folder incoming/UID/ (as other users, with real accounts:
tests/security/test_members.py and test_identity.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from jobs import Queue, State, new_job_id
from jobs import incoming as submissions
from jobs.job import ready_name
from tests.conftest import wait_until

from .conftest import Hand


def _submit(queue: Queue, document: object) -> str:
    data = document if isinstance(document, bytes) else json.dumps(document).encode()
    return submissions.submit(queue.folder, lambda job_id: data, durable=False)


def _mine(queue: Queue) -> Path:
    return queue.path / "incoming" / str(os.geteuid())


def _planted(queue: Queue, job_id: str, document: object) -> Path:
    """A submission written by hand (as another language, or an attacker, would)."""
    _mine(queue).mkdir(exist_ok=True)
    path = _mine(queue) / f"{job_id}.json"
    path.write_text(json.dumps(document))
    return path


def _notes(queue: Queue) -> list[str]:
    folder = queue.path / "quarantine"
    return [(folder / name).read_text() for name in sorted(os.listdir(folder)) if name.endswith(".why")]


def test_a_submission_is_taken_in_as_the_owners_job(queue: Queue, hand: Hand) -> None:
    job_id = _submit(queue, {"function": "sample.echo", "args": [1], "priority": 5})
    assert os.listdir(queue.path / "incoming") == [str(os.geteuid())], "the submitter's own folder"
    assert queue.job(job_id).state is State.INCOMING
    assert queue.counts()["incoming"] == 1
    assert queue.serving.take_in() == 1
    assert hand.names(State.READY) == [ready_name(job_id, 5)]
    assert os.listdir(_mine(queue)) == []
    spec = json.loads((queue.path / "ready" / ready_name(job_id, 5) / "job.json").read_text())
    assert spec["submitted_by"]["uid"] == os.getuid()
    events = (queue.path / "ready" / ready_name(job_id, 5) / "events").read_text()
    assert "enqueued" in events
    assert "taken in from incoming/, submitted by" in events
    assert os.listdir(queue.path / "taken") == [job_id], "the id is taken: no second submission may carry it"


def test_a_members_id_is_dated_ahead_of_its_file(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo"})
    changed = (_mine(queue) / f"{job_id}.json").stat().st_ctime
    ahead = submissions.created_at(job_id) - changed
    assert 0 < ahead <= submissions.AHEAD


def test_a_delayed_submission_is_scheduled(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo", "run_at": time.time() + 3600})
    queue.serving.take_in()
    assert queue.job(job_id).state is State.SCHEDULED


def test_a_malformed_submission_becomes_a_dead_job_saying_why(queue: Queue) -> None:
    job_id = _submit(queue, b'{"function": ')
    queue.serving.take_in()
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert job.error is not None
    assert "job.json is not valid JSON" in job.error["message"]


@pytest.mark.parametrize(
    ("document", "words"),
    [
        (b'{"function": "sample.echo", "args": [NaN]}', "args[0] is nan, and numbers must be finite"),
        (b'{"function": "sample.echo", "kwargs": {"x": Infinity}}', "kwargs.x is inf"),
        (b'{"function": "sample.echo", "metadata": {"m": [1e400]}}', "metadata.m[0] is inf"),
        (b'{"function": "sample.echo", "run_at": NaN}', "run_at is nan"),
        (b'{"function": "sample.echo", "created": 1e20}', 'field "created" must be epoch seconds'),
        (b'{"function": "sample.echo", "run_at": 1e20}', 'field "run_at" must be epoch seconds'),
        (b'{"function": "sample.echo", "run_at": "soon"}', 'field "run_at" must be epoch seconds'),
        (b'{"function": "sample.echo", "backoff": "fixed 99999999999999999999999d"}', "too long a duration"),
        (b'{"function": "sample.echo", "timeout": 1e300}', "too long"),
        (b'{"function": "sample.echo", "max_attempts": 1' + b"0" * 3000 + b"}", "max_attempts must be"),
        (b'{"function": "sample.echo", "memory_limit": 1' + b"0" * 30 + b"}", "memory_limit"),
    ],
)
def test_numbers_no_reader_survives_are_refused_naming_the_field(queue: Queue, document: bytes, words: str) -> None:
    """Such numbers once crashed every manager of the queue at each take-in, in a loop."""
    job_id = _submit(queue, document)
    assert queue.serving.take_in() == 1
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert job.error is not None
    assert words in job.error["message"]


@pytest.mark.parametrize("how", ["dated before its file", "dated too far ahead", "done id"])
def test_an_id_that_could_be_one_already_seen_is_refused(queue: Queue, how: str) -> None:
    if how == "dated before its file":
        job_id = new_job_id(time.time() - 5)  # an id made before its file: it may be one seen in the queue
    elif how == "dated too far ahead":
        job_id = new_job_id(time.time() + 2 * submissions.MOST_AHEAD)
    else:
        job_id = queue.enqueue("sample.echo")
        os.rename(queue.path / "ready" / ready_name(job_id, 0), queue.path / "done" / job_id)
    _planted(queue, job_id, {"function": "sample.echo"})
    queue.serving.take_in()
    [note] = _notes(queue)
    assert "is not dated ahead of its submission" in note


def test_an_id_is_taken_in_once_even_if_submitted_again(queue: Queue) -> None:
    """Copied from a job just taken in (or the member's own again): `taken/ID` refuses it."""
    job_id = _submit(queue, {"function": "sample.echo", "run_at": time.time() + 3600})
    queue.serving.take_in()
    assert queue.job(job_id).state is State.SCHEDULED, "where only a listing would find it"
    _planted(queue, job_id, {"function": "sample.echo"})
    queue.serving.take_in()
    [note] = _notes(queue)
    assert f"job {job_id} was submitted already" in note
    assert queue.counts()["ready"] == 0


def test_a_file_with_two_names_is_refused(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo"})
    os.link(_mine(queue) / f"{job_id}.json", queue.path / "elsewhere")
    queue.serving.take_in()
    [note] = _notes(queue)
    assert "has 2 names (a hard link)" in note


def test_what_is_not_a_submission_is_quarantined(queue: Queue) -> None:
    _mine(queue).mkdir()
    (_mine(queue) / "notes.txt").write_text("hello")
    (_mine(queue) / "20261124-000000-000000-zzzzzzzz.json").write_text("{}")
    (queue.path / "incoming" / "flat.json").write_text("{}")  # the layout before member folders
    assert queue.serving.take_in() == 2
    assert os.listdir(_mine(queue)) == []
    assert os.listdir(queue.path / "incoming") == [_mine(queue).name]
    notes = _notes(queue)
    assert len(notes) == 3
    assert any("cannot say who made it" in note for note in notes)


def test_staging_files_never_slow_a_take_in(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo"})
    for n in range(5000):
        (_mine(queue) / f".half-written.{n}.tmp").write_text("")
    assert queue.serving.take_in(budget=1) == 1, "the submission, not the staging files, is what a take-in handles"
    assert queue.job(job_id).state is State.READY
    assert len(os.listdir(_mine(queue))) == 5000, "young staging files are left to their writers"
    later = time.time() + 7200
    assert queue.serving.take_in(later, budget=10_000, leftovers=True) == 5000, "a sweep drops them once abandoned"


def test_take_in_goes_oldest_first_and_keeps_to_its_budget(queue: Queue) -> None:
    ids = [_submit(queue, {"function": "sample.echo"}) for _ in range(5)]
    assert queue.serving.take_in(budget=2) == 2
    assert queue.serving.more_to_take_in
    assert [queue.job(job_id).state for job_id in ids] == [State.READY] * 2 + [State.INCOMING] * 3


def test_take_in_keeps_to_its_time(queue: Queue) -> None:
    """A turn's take-in stops at its time, whatever the submissions cost (the manager's
    children and heartbeat come first); the rest are taken in by the next turns."""
    big = {"function": "sample.echo", "args": [list(range(50_000))]}
    ids = [_submit(queue, big) for _ in range(20)]
    handled = queue.serving.take_in(seconds=0.0)
    assert handled == 1, "one entry, then the time is up"
    assert queue.serving.more_to_take_in
    while queue.serving.more_to_take_in:
        queue.serving.take_in(seconds=0.0)
    assert {queue.job(job_id).state for job_id in ids} == {State.READY}


@pytest.mark.parametrize("published", [False, True], ids=["before-publishing", "after-publishing"])
@pytest.mark.parametrize("priority", [0, 7])
def test_an_interrupted_take_in_is_finished_by_a_sweep(
    queue: Queue, hand: Hand, published: bool, priority: int
) -> None:
    """A manager died holding incoming/UID/.taking.ID.json: a later sweep takes it in again,
    or, if the job was published already, only removes the file. Nothing twice, nothing lost."""
    document = {"function": "sample.echo", "priority": priority}
    job_id = _submit(queue, document)
    taking = _mine(queue) / f".taking.{job_id}.json"
    if published:
        assert queue.serving.take_in() == 1
        taking.write_text(json.dumps(document))  # as if its removal never happened
    else:
        os.rename(_mine(queue) / f"{job_id}.json", taking)
    assert queue.serving.take_in(leftovers=True) == 0, "a fresh .taking may belong to a manager at work"
    queue.serving.take_in(time.time() + 120, leftovers=True)
    queue.serving.take_in(time.time() + 120)
    assert os.listdir(_mine(queue)) == []
    assert hand.names(State.READY) == [ready_name(job_id, priority)], "the job is in ready/ exactly once"
    assert os.listdir(queue.path / "quarantine") == []


def test_a_take_in_interrupted_after_taking_the_id_takes_it_in_again(queue: Queue, hand: Hand) -> None:
    """`taken/ID` names the very file that took it: the same submission, taken in again after
    a crash, goes on; nothing is quarantined."""
    job_id = _submit(queue, {"function": "sample.echo"})
    inode = (_mine(queue) / f"{job_id}.json").stat().st_ino
    (queue.path / "taken" / job_id).write_text(f"{os.geteuid()} {inode}\n")
    queue.serving.take_in()
    assert hand.names(State.READY) == [ready_name(job_id, 0)]
    assert _notes(queue) == []


def test_a_take_in_interrupted_long_ago_is_finished_by_its_mark(queue: Queue, hand: Hand) -> None:
    """Once: the sweep renamed `.taking.ID.json` back to `ID.json` (renewing its change
    time) and forgot `taken/ID` in the same pass: the next take-in found the file not dated
    ahead of itself and quarantined it, a member's job lost. Now it is finished from there."""
    job_id = new_job_id(time.time() + 1)
    path = _planted(queue, job_id, {"function": "sample.echo"})
    (queue.path / "taken" / job_id).write_text(f"{os.geteuid()} {path.stat().st_ino}\n")
    os.rename(path, _mine(queue) / f".taking.{job_id}.json")  # where a take-in stopped
    wait_until(lambda: time.time() > submissions.created_at(job_id) + 0.01, 5, "the id's moment is past")
    later = time.time() + 120
    queue.serving.take_in(later, leftovers=True)
    queue.serving.take_in(later)
    assert hand.names(State.READY) == [ready_name(job_id, 0)]
    assert _notes(queue) == []


def test_a_file_held_back_past_its_mark_cannot_take_a_scheduled_jobs_id(queue: Queue) -> None:
    """A second file with the id of a job waiting in scheduled/, published before that id's
    moment and held back (its folder set aside) until `taken/ID` was forgotten: refused."""
    job_id = _submit(queue, {"function": "sample.echo", "run_at": time.time() + 7200})
    queue.serving.take_in()
    assert queue.job(job_id).state is State.SCHEDULED
    _planted(queue, job_id, {"function": "sample.echo", "args": ["the copy"]})  # before the id's moment
    later = submissions.created_at(job_id) + 120
    assert submissions.forget_taken(queue.folder, later) == 1
    queue.serving.take_in(later)
    assert queue.job(job_id).state is State.SCHEDULED
    assert queue.job(job_id).spec.args == ()
    assert any(f"job {job_id} exists already (in scheduled/)" in note for note in _notes(queue))


def test_taken_ids_are_forgotten_once_past(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo"})
    queue.serving.take_in()
    assert submissions.forget_taken(queue.folder, time.time()) == 0, "its time is still ahead"
    assert submissions.forget_taken(queue.folder, time.time() + 3600) == 1
    assert os.listdir(queue.path / "taken") == []
    assert queue.job(job_id).state is State.READY


def test_the_mark_of_a_take_in_stopped_half_way_is_kept(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo"})
    path = _mine(queue) / f"{job_id}.json"
    (queue.path / "taken" / job_id).write_text(f"{os.geteuid()} {path.stat().st_ino}\n")
    os.rename(path, _mine(queue) / f".taking.{job_id}.json")
    assert submissions.forget_taken(queue.folder, time.time() + 3600) == 0, "its take-in finishes by it"
    assert os.listdir(queue.path / "taken") == [job_id]


def test_a_folder_changed_again_and_again_is_said_once(
    queue: Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Once: each chmod made a new entry in the take-in's memory, and a warning: a member
    toggling a mode wrote 26,047 warnings in 10 s. Now one per folder and reason."""
    monkeypatch.setattr(submissions.Intake, "RELIST", 0.0)  # each take-in lists incoming/ afresh
    bad = queue.path / "incoming" / str(os.geteuid())
    bad.mkdir()
    for turn in range(20):
        bad.chmod(0o777 if turn % 2 else 0o757)  # writable by all, either way
        queue.serving.take_in()
    said = [record for record in caplog.records if "set aside incoming/" in record.getMessage()]
    assert len(said) == 1, [record.getMessage() for record in said]
    assert queue.serving.intake_skipped[1] == 1
    bad.rmdir()
    queue.serving.take_in()
    assert queue.serving.intake_skipped == ({}, 0), "forgotten once gone"


def test_a_cancel_takes_in_only_the_submission_it_cancels(queue: Queue) -> None:
    first, second, third = (_submit(queue, {"function": "sample.echo", "args": [n]}) for n in range(3))
    assert queue.cancel(second) is State.DEAD
    assert [queue.job(job_id).state for job_id in (first, third)] == [State.INCOMING, State.INCOMING]


def test_the_owner_cancels_a_job_not_taken_in_yet(queue: Queue) -> None:
    job_id = _submit(queue, {"function": "sample.echo"})
    assert queue.cancel(job_id) is State.DEAD
    assert queue.job(job_id).state is State.DEAD


def test_a_leftover_of_a_job_that_moved_on_is_only_removed(queue: Queue, hand: Hand) -> None:
    """Published, then claimed by a manager, and the take-in's file still there: finishing it
    must not publish the job a second time beside its claim."""
    document = {"function": "sample.echo", "priority": 3}
    job_id = _submit(queue, document)
    queue.serving.take_in()
    owner = hand.owner()
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    (_mine(queue) / f".taking.{job_id}.json").write_text(json.dumps(document))
    queue.serving.take_in(time.time() + 120, leftovers=True)
    assert os.listdir(_mine(queue)) == []
    assert hand.names(State.READY) == []
    assert queue.job(job_id).state is State.CLAIMED


def test_a_folder_the_owner_cannot_use_is_set_aside_once(queue: Queue) -> None:
    """A member's folder that others may write cannot say who submitted what in it: it is
    set aside, said once, and not looked at again until it changes; the others go on."""
    job_id = _submit(queue, {"function": "sample.echo"})
    bad = queue.path / "incoming" / "bad"
    bad.mkdir()
    bad.chmod(0o777)
    (bad / f"{new_job_id(time.time() + 5)}.json").write_text("{}")
    assert queue.serving.take_in() == 1
    assert queue.job(job_id).state is State.READY
    skipped, count = queue.serving.intake_skipped
    assert count == 1
    assert "every user may write it" in skipped["incoming/bad"]
    queue.serving.take_in()
    assert queue.serving.intake_skipped[1] == 1, "not looked at again"
