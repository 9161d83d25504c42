"""Every transition of a job, as renames between the state folders, and the
operator's views and actions (job, list, counts, cancel, retry, purge)."""

from __future__ import annotations

import json
import math
import os
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import jobs.index
from jobs import (
    Claim,
    ClaimLost,
    InvalidJobId,
    JobNotFound,
    Owner,
    Queue,
    State,
    WrongState,
    incoming,
    unknown_liveness,
)

from .conftest import Hand

STATES = list(State)


def where(hand: Hand, job_id: str) -> list[str]:
    """Every entry standing for `job_id` in the state folders, as "state/name" (or
    "claimed/OWNER/ID"); conservation says there is exactly one."""
    found = []
    for state in STATES:
        folder = hand.dir(state)
        if state is State.CLAIMED:
            found += [
                f"claimed/{owner}/{name}"
                for owner in os.listdir(folder)
                for name in os.listdir(folder / owner)
                if job_id in name
            ]
        else:
            found += [f"{state.value}/{name}" for name in os.listdir(folder) if job_id in name]
    return found


def attempts_file(path: Path) -> str | None:
    try:
        return (path / "attempts").read_text()
    except FileNotFoundError:
        return None


def last_event(path: Path) -> str:
    return (path / "events").read_text().splitlines()[-1].split(" ", 1)[1]


def claim_one(queue: Queue, owner: Owner, now: float | None = None) -> Claim:
    claim = queue.serving.claim(owner.name, now=now)
    assert claim is not None, "a ready job should have been claimed"
    return claim


def bring_to(queue: Queue, owner: Owner, state: State, **options: Any) -> str:
    """Enqueue a job and move it to `state` through the public transitions (INCOMING: as a
    member of a shared queue submits it, a file in its folder of incoming/)."""
    if state is State.INCOMING:
        data = json.dumps({"function": "sample.echo"}).encode()
        return incoming.submit(queue.folder, lambda job_id: data, durable=False)
    if state is State.SCHEDULED:
        return queue.with_options(delay=3600, **options).enqueue("sample.echo")
    if state is State.WAITING:  # for a job that waits an hour
        parent = queue.with_options(delay=3600).enqueue("sample.echo")
        return queue.with_options(depends_on=[parent], **options).enqueue("sample.echo")
    job_id = queue.with_options(**options).enqueue("sample.echo")
    if state is State.READY:
        return job_id
    claim = claim_one(queue, owner)
    assert claim.job_id == job_id
    if state is State.DONE:
        (claim.run_path / "result.json").write_text('{"value": 42}\n')
        queue.serving.complete(claim)
    elif state is State.DEAD:
        queue.serving.fail(claim, {"message": "boom"}, permanent=True)
    return job_id


# -- the transition table ----------------------------------------------------------------


class Held:
    """A job brought to a start state; `claim` is set when it starts claimed."""

    def __init__(self, queue: Queue, owner: Owner, state: State, max_attempts: int) -> None:
        self.claim: Claim | None = None
        if state is State.CLAIMED:
            self.job_id = queue.with_options(max_attempts=max_attempts).enqueue("sample.echo")
            self.claim = claim_one(queue, owner)
            assert self.claim.job_id == self.job_id
        else:
            self.job_id = bring_to(queue, owner, state, max_attempts=max_attempts)

    @property
    def held(self) -> Claim:
        assert self.claim is not None
        return self.claim


Action = Callable[[Queue, Owner, Held], None]


def _claim(queue: Queue, owner: Owner, job: Held) -> None:
    assert claim_one(queue, owner).job_id == job.job_id


def _complete(queue: Queue, owner: Owner, job: Held) -> None:
    queue.serving.complete(job.held)


def _fail_later(queue: Queue, owner: Owner, job: Held) -> None:
    assert queue.serving.fail(job.held, {"message": "try again"}, delay=30) is State.SCHEDULED


def _fail_now(queue: Queue, owner: Owner, job: Held) -> None:
    assert queue.serving.fail(job.held, {"message": "try again"}) is State.READY


def _fail_last(queue: Queue, owner: Owner, job: Held) -> None:
    assert queue.serving.fail(job.held, {"message": "no more"}, delay=30) is State.DEAD


def _fail_permanent(queue: Queue, owner: Owner, job: Held) -> None:
    assert queue.serving.fail(job.held, {"message": "never"}, permanent=True) is State.DEAD


def _release(queue: Queue, owner: Owner, job: Held) -> None:
    queue.serving.release(job.held)


def _reap(queue: Queue, owner: Owner, job: Held) -> None:
    assert queue.serving.sweep(now=time.time(), is_alive=lambda _: False)["reverted"] == 1


def _promote(queue: Queue, owner: Owner, job: Held) -> None:
    assert queue.serving.sweep(now=time.time() + 3601, is_alive=unknown_liveness)["promoted"] == 1


def _cancel(queue: Queue, owner: Owner, job: Held) -> None:
    assert queue.cancel(job.job_id) is State.DEAD


def _retry(queue: Queue, owner: Owner, job: Held) -> None:
    queue.retry(job.job_id)


READY, SCHEDULED, CLAIMED, DONE, DEAD = State.READY, State.SCHEDULED, State.CLAIMED, State.DONE, State.DEAD

# one row per transition of docs/FORMAT.md: id, from, max_attempts, action, to, entry name ("*" any due),
# the `attempts` file after it, and the start of the last line of `events`
TRANSITIONS: list[tuple[str, State, int, Action, State, str, str | None, str]] = [
    ("claim", READY, 3, _claim, CLAIMED, "{owner}/{id}", "1\n", "claimed by {owner}: attempt 1/3 (run 1)"),
    ("complete", CLAIMED, 3, _complete, DONE, "{id}", "1\n", "done: attempt 1 (run 1) succeeded"),
    ("fail-retry-later", CLAIMED, 3, _fail_later, SCHEDULED, "*.100.{id}", "1\n", "failed: attempt 1/3, retry in 30"),
    ("fail-retry-now", CLAIMED, 3, _fail_now, READY, "100.{id}", "1\n", "failed: attempt 1/3, ready"),
    ("fail-last-attempt", CLAIMED, 1, _fail_last, DEAD, "{id}", "1\n", "dead: attempts exhausted"),
    ("fail-permanent", CLAIMED, 3, _fail_permanent, DEAD, "{id}", "1\n", "dead: cannot be completed"),
    ("release", CLAIMED, 3, _release, READY, "100.{id}", "0\n", "released: run 1 stopped, attempt not counted"),
    ("reap", CLAIMED, 3, _reap, READY, "100.{id}", "1\n", "ready: claim reverted, owner {owner} (pid"),
    ("reap-last-attempt", CLAIMED, 1, _reap, DEAD, "{id}", "1\n", "dead: attempts exhausted: attempt 1/1 was lost"),
    ("promote", SCHEDULED, 3, _promote, READY, "100.{id}", None, "enqueued"),
    ("cancel-ready", READY, 3, _cancel, DEAD, "{id}", None, "dead: cancelled: cancelled by an operator"),
    ("cancel-scheduled", SCHEDULED, 3, _cancel, DEAD, "{id}", None, "dead: cancelled: cancelled by an operator"),
    ("retry", DEAD, 3, _retry, READY, "100.{id}", "0\n", "ready: retried by an operator, attempts reset"),
]


@pytest.mark.parametrize(
    ("start", "max_attempts", "action", "end", "entry", "attempts", "event"),
    [pytest.param(*row[1:], id=row[0]) for row in TRANSITIONS],
)
def test_transition_moves_the_job_to_exactly_one_place(
    queue: Queue,
    owner: Owner,
    hand: Hand,
    start: State,
    max_attempts: int,
    action: Action,
    end: State,
    entry: str,
    attempts: str | None,
    event: str,
) -> None:
    job = Held(queue, owner, start, max_attempts)
    job_id = job.job_id
    before = where(hand, job_id)
    assert len(before) == 1
    assert before[0].split("/")[0] == start.value

    action(queue, owner, job)

    found = where(hand, job_id)
    assert len(found) == 1, found
    state_name, name = found[0].split("/", 1)
    assert state_name == end.value
    expected = entry.format(owner=owner.name, id=job_id)
    if expected.startswith("*"):
        assert name.endswith(expected[1:]), name
        assert len(name.split(".")[0]) == 13, name
    else:
        assert name == expected
    viewed = queue.job(job_id)
    assert viewed.state is end
    assert attempts_file(viewed.path) == attempts
    assert last_event(viewed.path).startswith(event.format(owner=owner.name))
    assert hand.names("tmp") == []
    assert hand.names("quarantine") == []


# -- claim order -------------------------------------------------------------------------


@pytest.mark.usefixtures("frozen_index_clock")
def test_claim_takes_higher_priority_first_then_oldest(queue: Queue, owner: Owner) -> None:
    low = queue.with_options(priority=-5).enqueue("sample.echo")
    first = queue.enqueue("sample.echo")
    high = queue.with_options(priority=5).enqueue("sample.echo")
    second = queue.enqueue("sample.echo")
    top = queue.with_options(priority=100).enqueue("sample.echo")
    claimed = [claim_one(queue, owner).job_id for _ in range(5)]
    assert claimed == [top, high, first, second, low]
    assert queue.serving.claim(owner.name) is None


@pytest.mark.usefixtures("frozen_index_clock")
def test_claim_order_includes_jobs_added_after_the_index_was_filled(queue: Queue, owner: Owner) -> None:
    first = queue.enqueue("sample.echo")
    second = queue.enqueue("sample.echo")
    third = queue.enqueue("sample.echo")
    assert claim_one(queue, owner).job_id == first  # the index now holds second and third
    urgent = queue.with_options(priority=10).enqueue("sample.echo")
    fourth = queue.enqueue("sample.echo")
    assert claim_one(queue, owner).job_id == urgent
    assert claim_one(queue, owner).job_id == second
    other = Queue(queue.path, create=False)  # another submitter: this queue learns of it as from inotify
    urgent_elsewhere = other.with_options(priority=20).enqueue("sample.echo")
    queue.serving.note_ready(f"080.{urgent_elsewhere}")
    assert [claim_one(queue, owner).job_id for _ in range(3)] == [urgent_elsewhere, third, fourth]
    assert queue.serving.claim(owner.name) is None


@pytest.mark.usefixtures("frozen_index_clock")
def test_claim_finds_jobs_another_submitter_added_once_the_index_runs_dry(queue: Queue, owner: Owner) -> None:
    first = queue.enqueue("sample.echo")
    assert claim_one(queue, owner).job_id == first
    other = Queue(queue.path, create=False)
    late = other.enqueue("sample.echo")
    assert claim_one(queue, owner).job_id == late


@pytest.mark.usefixtures("frozen_index_clock")
def test_claim_order_with_an_index_smaller_than_ready(
    queue_path: Path, owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs.index, "DEFAULT_LIMIT", 2)
    queue = Queue(queue_path)  # the owner is registered in its folder already
    ids = [queue.enqueue("sample.echo") for _ in range(5)]
    assert claim_one(queue, owner).job_id == ids[0]  # the index holds ids[0:2] only
    urgent = queue.with_options(priority=1).enqueue("sample.echo")
    late = queue.enqueue("sample.echo")  # sorts after the index's bound: found by the next scan
    claimed = [claim_one(queue, owner).job_id for _ in range(6)]
    assert claimed == [urgent, *ids[1:], late]


def _back_by_release(queue: Queue, hand: Hand, claim: Claim) -> None:
    queue.serving.release(claim)


def _back_by_retry(queue: Queue, hand: Hand, claim: Claim) -> None:
    queue.serving.fail(claim, {"message": "x"}, permanent=True)
    queue.retry(claim.job_id)


def _back_by_promote(queue: Queue, hand: Hand, claim: Claim) -> None:
    now = time.time()
    queue.serving.fail(claim, {"message": "x"}, now=now, delay=10)
    assert queue.serving.sweep(now=now + 11, is_alive=unknown_liveness)["promoted"] == 1


def _back_by_fail(queue: Queue, hand: Hand, claim: Claim) -> None:
    assert queue.serving.fail(claim, {"message": "x"}, delay=0) is State.READY


def _back_by_reap(queue: Queue, hand: Hand, claim: Claim) -> None:
    reaped = queue.serving.sweep(now=time.time(), is_alive=lambda candidate: candidate.name != claim.owner)
    assert reaped["reverted"] == 1


@pytest.mark.parametrize(
    "back",
    [
        pytest.param(_back_by_release, id="release"),
        pytest.param(_back_by_retry, id="retry"),
        pytest.param(_back_by_promote, id="promote"),
        pytest.param(
            _back_by_fail,
            id="fail-delay-0",
        ),
        pytest.param(
            _back_by_reap,
            id="reap",
        ),
    ],
)
@pytest.mark.usefixtures("frozen_index_clock")
def test_a_job_back_in_ready_keeps_its_place_in_claim_order(
    queue: Queue, owner: Owner, hand: Hand, back: Callable[[Queue, Hand, Claim], None]
) -> None:
    high = queue.with_options(priority=5).enqueue("sample.echo")
    low = [queue.enqueue("sample.echo") for _ in range(2)]
    first = claim_one(queue, hand.owner())  # the index now holds the two low-priority jobs
    assert first.job_id == high
    back(queue, hand, first)
    assert queue.job(high).state is State.READY
    again = [claim_one(queue, owner).job_id for _ in range(3)]
    assert again[0] == high
    assert sorted(again[1:]) == sorted(low)  # (two owners: each tries its share of a priority first)


def test_claim_of_an_empty_queue_is_none(queue: Queue, owner: Owner) -> None:
    assert queue.serving.claim(owner.name) is None


def test_claim_skips_a_job_cancelled_after_the_index_saw_it(queue: Queue, owner: Owner) -> None:
    first = queue.enqueue("sample.echo")
    second = queue.enqueue("sample.echo")
    third = queue.enqueue("sample.echo")
    assert claim_one(queue, owner).job_id == first
    assert queue.cancel(second) is State.DEAD
    assert claim_one(queue, owner).job_id == third
    assert queue.serving.claim(owner.name) is None


# -- claim, complete, fail, release -------------------------------------------------------------


def test_claim_counts_the_attempt_and_makes_its_folder(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(max_attempts=4).enqueue("sample.echo", 1)
    claim = claim_one(queue, owner)
    assert claim.job_id == job_id
    assert claim.owner == owner.name
    assert claim.path == queue.path / "claimed" / owner.name / job_id
    assert claim.run == 1
    assert claim.attempt == 1
    assert claim.run_path == claim.path / "attempt-1"
    assert claim.spec.args == (1,)
    assert claim.spec.max_attempts == 4
    assert attempts_file(claim.path) == "1\n"
    assert claim.run_path.is_dir()
    assert sorted(os.listdir(claim.path)) == ["attempt-1", "attempts", "events", "job.json"]
    job = queue.job(job_id)
    assert (job.state, job.owner, job.attempts) == (State.CLAIMED, owner.name, 1)
    assert [attempt.number for attempt in job.history] == [1]
    assert hand.names(State.READY) == []


def test_each_claim_adds_an_attempt_and_never_reuses_a_run_folder(queue: Queue, owner: Owner) -> None:
    job_id = queue.with_options(max_attempts=3).enqueue("sample.echo")
    for number in (1, 2, 3):
        claim = claim_one(queue, owner)
        assert (claim.run, claim.attempt) == (number, number)
        (claim.run_path / "stdout").write_text(f"run {number}\n")
        queue.serving.fail(claim, {"message": f"run {number} failed"})
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert job.attempts == 3
    assert [(job.path / f"attempt-{n}" / "stdout").read_text() for n in (1, 2, 3)] == ["run 1\n", "run 2\n", "run 3\n"]
    assert job.error == {"reason": "attempts exhausted", "attempt": 3, "run": 3, "message": "run 3 failed"}


def test_complete_links_the_attempts_result(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.run_path / "result.json").write_text('{"thumbnail": "a@320.png"}\n')
    queue.serving.record_outcome(claim, {"exit_code": 0})
    queue.serving.complete(claim)
    done = queue.path / "done" / job_id
    assert hand.names(State.DONE) == [job_id]
    assert os.listdir(queue.path / "claimed" / owner.name) == [".owner.json"]
    assert os.path.samefile(done / "result.json", done / "attempt-1" / "result.json")
    assert os.stat(done / "result.json").st_nlink == 2
    assert not any(name.startswith(".") for name in os.listdir(done))
    job = queue.job(job_id)
    assert job.state is State.DONE
    assert job.result == {"thumbnail": "a@320.png"}
    assert job.history[0].outcome == {"exit_code": 0}
    assert job.error is None


def test_complete_without_a_result(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    queue.serving.complete(claim_one(queue, owner))
    job = queue.job(job_id)
    assert job.state is State.DONE
    assert job.result is None
    assert not (job.path / "result.json").exists()


def test_fail_with_a_delay_schedules_the_retry(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(priority=-3).enqueue("sample.echo")
    claim = claim_one(queue, owner)
    now = time.time()
    assert queue.serving.fail(claim, {"message": "busy"}, now=now, delay=42.5) is State.SCHEDULED
    assert hand.names(State.SCHEDULED) == [f"{math.ceil((now + 42.5) * 1000):013d}.103.{job_id}"]
    assert hand.names(State.READY) == []
    job = queue.job(job_id)
    assert job.state is State.SCHEDULED
    assert job.attempts == 1
    assert last_event(job.path) == "failed: attempt 1/3, retry in 42.5s"


@pytest.mark.parametrize("delay", [0.0, -10.0])
def test_fail_without_a_delay_goes_back_to_ready(queue: Queue, owner: Owner, hand: Hand, delay: float) -> None:
    job_id = queue.with_options(priority=2).enqueue("sample.echo")
    assert queue.serving.fail(claim_one(queue, owner), {"message": "x"}, delay=delay) is State.READY
    assert hand.names(State.READY) == [f"098.{job_id}"]
    assert hand.names(State.SCHEDULED) == []
    claim = claim_one(queue, owner)
    assert (claim.job_id, claim.run, claim.attempt) == (job_id, 2, 2)


@pytest.mark.parametrize(
    ("max_attempts", "permanent", "reason"),
    [
        pytest.param(1, False, "attempts exhausted", id="last-attempt"),
        pytest.param(3, True, "cannot be completed", id="permanent"),
    ],
)
def test_fail_buries_with_the_cause(
    queue: Queue, owner: Owner, hand: Hand, max_attempts: int, permanent: bool, reason: str
) -> None:
    job_id = queue.with_options(max_attempts=max_attempts).enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.path / "result.json").write_text("1\n")  # a stale result never stands for a dead job
    state = queue.serving.fail(claim, {"message": "disk full", "type": "OSError"}, delay=60, permanent=permanent)
    assert state is State.DEAD
    assert hand.names(State.DEAD) == [job_id]
    assert hand.names(State.SCHEDULED) == []
    assert hand.error(job_id) == {
        "reason": reason,
        "attempt": 1,
        "run": 1,
        "message": "disk full",
        "type": "OSError",
    }
    job = queue.job(job_id)
    assert job.error == hand.error(job_id)
    assert not (job.path / "result.json").exists()


def test_release_gives_the_attempt_back(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(priority=1).enqueue("sample.echo")
    queue.serving.fail(claim_one(queue, owner), {"message": "first run failed"})
    claim = claim_one(queue, owner)
    assert (claim.run, claim.attempt) == (2, 2)
    queue.serving.record_outcome(claim, {"released": True})
    queue.serving.release(claim, reason="drain")
    assert hand.names(State.READY) == [f"099.{job_id}"]
    job = queue.job(job_id)
    assert job.attempts == 1
    assert [attempt.number for attempt in job.history] == [1, 2]
    assert [attempt.counted for attempt in job.history] == [True, False]
    assert last_event(job.path) == "drain: run 2 stopped, attempt not counted"
    again = claim_one(queue, owner)
    assert (again.run, again.attempt) == (3, 2)


def test_release_of_a_first_attempt_goes_back_to_zero(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    queue.serving.release(claim_one(queue, owner))
    job = queue.job(job_id)
    assert (job.state, job.attempts) == (State.READY, 0)
    assert (job.path / "attempt-1").is_dir()


# -- a stale owner ------------------------------------------------------------------------


STALE_ACTIONS: dict[str, Callable[[Queue, Claim], object]] = {
    "complete": lambda queue, claim: queue.serving.complete(claim),
    "fail-retry": lambda queue, claim: queue.serving.fail(claim, {"message": "x"}, delay=5),
    "fail-now": lambda queue, claim: queue.serving.fail(claim, {"message": "x"}),
    "fail-permanent": lambda queue, claim: queue.serving.fail(claim, {"message": "x"}, permanent=True),
    "release": lambda queue, claim: queue.serving.release(claim),
    "record_outcome": lambda queue, claim: queue.serving.record_outcome(claim, {"exit_code": 0}),
}


def _reaped(queue: Queue, hand: Hand, owner: Owner) -> None:
    assert queue.serving.sweep(now=hand.expired_now(owner), is_alive=unknown_liveness)["reverted"] == 1


def _fenced(queue: Queue, hand: Hand, owner: Owner) -> None:
    """A sweeper that renamed the owner's folder and stopped there."""
    claimed = hand.dir(State.CLAIMED)
    os.rename(claimed / owner.name, claimed / f"reaping.{owner.name}")


@pytest.mark.parametrize("taken", [_reaped, _fenced], ids=["reaped", "fenced"])
@pytest.mark.parametrize("action", list(STALE_ACTIONS.values()), ids=list(STALE_ACTIONS))
def test_stale_owner_gets_claim_lost(
    queue: Queue,
    owner: Owner,
    hand: Hand,
    action: Callable[[Queue, Claim], object],
    taken: Callable[[Queue, Hand, Owner], None],
) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.run_path / "result.json").write_text('"stale"\n')
    taken(queue, hand, owner)
    before = where(hand, job_id)
    with pytest.raises(ClaimLost, match=rf"job {job_id} .*no longer in claimed/{owner.name}/"):
        action(queue, claim)
    assert where(hand, job_id) == before
    assert hand.names(State.DONE) == []
    assert hand.names(State.DEAD) == []


def test_stale_owner_cannot_complete_a_job_another_owner_now_holds(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    stale = claim_one(queue, owner)
    _reaped(queue, hand, owner)
    successor = hand.owner()
    current = claim_one(queue, successor)
    assert (current.job_id, current.run, current.attempt) == (job_id, 2, 2)
    with pytest.raises(ClaimLost):
        queue.serving.complete(stale)
    with pytest.raises(ClaimLost):
        queue.serving.fail(stale, {"message": "x"}, permanent=True)
    assert where(hand, job_id) == [f"claimed/{successor.name}/{job_id}"]
    queue.serving.complete(current)
    assert queue.job(job_id).state is State.DONE


def test_stale_owner_cannot_claim(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    _fenced(queue, hand, owner)
    with pytest.raises(ClaimLost, match=rf"claimed/{owner.name} is gone"):
        queue.serving.claim(owner.name)
    assert where(hand, job_id) == [f"ready/100.{job_id}"]


# -- cancel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [State.READY, State.SCHEDULED])
def test_cancel_a_waiting_job(queue: Queue, owner: Owner, hand: Hand, state: State) -> None:
    job_id = bring_to(queue, owner, state)
    assert queue.cancel(job_id) is State.DEAD
    assert where(hand, job_id) == [f"dead/{job_id}"]
    assert hand.error(job_id) == {"reason": "cancelled", "message": "cancelled by an operator"}
    assert queue.job(job_id).error == {"reason": "cancelled", "message": "cancelled by an operator"}


def test_cancel_a_claimed_job_marks_it_and_the_sweep_buries_it(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    assert queue.cancel(job_id, now=1234.5) is State.CLAIMED
    assert (claim.path / "cancel").read_text() == "cancelled at 1234.5\n"
    assert where(hand, job_id) == [f"claimed/{owner.name}/{job_id}"]
    assert last_event(claim.path) == "cancel requested"
    queue.serving.sweep(now=hand.expired_now(owner), is_alive=unknown_liveness)
    assert where(hand, job_id) == [f"dead/{job_id}"]
    error = hand.error(job_id)
    assert error["reason"] == "cancelled"
    assert error["message"].startswith("cancelled by an operator; owner ")


@pytest.mark.parametrize("state", [State.DONE, State.DEAD])
def test_cancel_a_finished_job_is_wrong_state(queue: Queue, owner: Owner, hand: Hand, state: State) -> None:
    job_id = bring_to(queue, owner, state)
    with pytest.raises(WrongState, match=rf"cannot cancel job {job_id}: it is already {state.value}"):
        queue.cancel(job_id)
    assert where(hand, job_id) == [f"{state.value}/{job_id}"]


def test_cancel_an_unknown_job(queue: Queue) -> None:
    with pytest.raises(JobNotFound):
        queue.cancel("20200101-000000-000000-00000000")


# -- retry ----------------------------------------------------------------------------------


def test_retry_of_a_dead_job_resets_its_attempts(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(max_attempts=2, priority=3).enqueue("sample.echo")
    queue.serving.fail(claim_one(queue, owner), {"message": "1"})
    queue.serving.fail(claim_one(queue, owner), {"message": "2"})
    assert queue.job(job_id).state is State.DEAD
    queue.retry(job_id)
    assert where(hand, job_id) == [f"ready/097.{job_id}"]
    assert queue.job(job_id).attempts == 0
    claim = claim_one(queue, owner)
    assert (claim.job_id, claim.run, claim.attempt) == (job_id, 3, 1)
    runs = ["attempt-1", "attempt-2", "attempt-3"]
    assert sorted(os.listdir(claim.path)) == [*runs, "attempts", "error.json", "events", "job.json"]


def test_retry_of_a_cancelled_claimed_job_drops_the_cancel_mark(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    queue.cancel(job_id)
    queue.serving.sweep(now=hand.expired_now(owner), is_alive=unknown_liveness)
    queue.retry(job_id)
    job = queue.job(job_id)
    assert job.state is State.READY
    assert not (job.path / "cancel").exists()


@pytest.mark.parametrize("state", [State.READY, State.SCHEDULED, State.CLAIMED, State.DONE])
def test_retry_of_a_job_that_is_not_dead_is_wrong_state(queue: Queue, owner: Owner, hand: Hand, state: State) -> None:
    job_id = bring_to(queue, owner, state)
    before = where(hand, job_id)
    with pytest.raises(WrongState, match=rf"it is {state.value}, and only dead jobs can be retried"):
        queue.retry(job_id)
    assert where(hand, job_id) == before


# -- purge --------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [State.DONE, State.DEAD])
def test_purge_deletes_old_terminal_jobs_and_logs_them(queue: Queue, owner: Owner, hand: Hand, state: State) -> None:
    now = time.time()
    old = [bring_to(queue, owner, state) for _ in range(2)]
    fresh = bring_to(queue, owner, state)
    for job_id in old:
        hand.age(hand.dir(state) / job_id / "events", 7200, now)
    assert queue.purge(state, older_than=3600, now=now, dry_run=True) == sorted(old)
    assert hand.names(state) == sorted([*old, fresh])
    assert not (queue.path / "purged.log").exists()

    assert queue.purge(state.value, older_than=3600, now=now) == sorted(old)
    assert hand.names(state) == [fresh]
    assert hand.names("tmp") == []
    lines = (queue.path / "purged.log").read_text().splitlines()
    assert sorted(line.split(" ", 1)[1] for line in lines) == sorted(f"purged {state.value} {j}" for j in old)
    for job_id in old:
        with pytest.raises(JobNotFound):
            queue.job(job_id)
    assert queue.purge(state, older_than=3600, now=now) == []


@pytest.mark.parametrize("state", [State.READY, State.SCHEDULED, State.CLAIMED])
def test_purge_of_live_states_is_refused(queue: Queue, owner: Owner, state: State) -> None:
    job_id = bring_to(queue, owner, state)
    with pytest.raises(WrongState, match=r"only done and dead jobs can be purged"):
        queue.purge(state, older_than=0, now=time.time() + 1e6)
    assert queue.job(job_id).state is state


# -- reading: job, list, counts ----------------------------------------------------------------


@pytest.mark.parametrize("state", STATES)
def test_job_view_in_every_state(queue: Queue, owner: Owner, state: State) -> None:
    job_id = bring_to(queue, owner, state)
    job = queue.job(job_id)
    assert job.id == job_id
    assert job.state is state
    assert job.function == "sample.echo"
    assert job.owner == (owner.name if state is State.CLAIMED else None)
    assert job.result == ({"value": 42} if state is State.DONE else None)
    assert job.error == (
        {"reason": "cannot be completed", "attempt": 1, "run": 1, "message": "boom"} if state is State.DEAD else None
    )
    expected_attempts = 0 if state in (State.INCOMING, State.READY, State.SCHEDULED, State.WAITING) else 1
    assert job.attempts == expected_attempts
    assert len(job.history) == expected_attempts


def test_job_view_of_a_prioritised_ready_job(queue: Queue) -> None:
    job_id = queue.with_options(priority=-7).enqueue("sample.echo")
    job = queue.job(job_id)
    assert (job.state, job.path.name) == (State.READY, f"107.{job_id}")


def test_unknown_job_is_not_found(queue: Queue) -> None:
    with pytest.raises(JobNotFound, match=r"no job 20200101-000000-000000-0000abcd in queue"):
        queue.job("20200101-000000-000000-0000abcd")


@pytest.mark.parametrize(
    "text",
    ["", "nope", "../../etc", "100.20200101-000000-000000-0000abcd", "20200101-000000-000000-0000ABCD", "a/b"],
)
def test_malformed_job_id_is_refused(queue: Queue, text: str) -> None:
    with pytest.raises(InvalidJobId, match=r"is not a job id: ids look like"):
        queue.job(text)
    with pytest.raises(ValueError, match=r"is not a job id"):
        queue.cancel(text)


def test_list_filters_by_state_function_and_limit(queue: Queue, owner: Owner, samples: types.SimpleNamespace) -> None:
    adds = [queue.enqueue(samples.add, n, 1) for n in range(3)]
    echoes = [queue.enqueue("sample.echo", n) for n in range(2)]
    scheduled = queue.with_options(delay=3600).enqueue("sample.echo")
    add_name = f"{samples.add.__module__}.add"
    claim = claim_one(queue, owner)
    assert claim.job_id == adds[0]

    assert [job.id for job in queue.jobs(State.READY)] == [*adds[1:], *echoes]
    assert [job.id for job in queue.jobs("ready", function="sample.echo")] == echoes
    assert [job.id for job in queue.jobs(State.READY, function=add_name)] == adds[1:]
    assert [job.id for job in queue.jobs(State.READY, limit=2)] == adds[1:3]
    assert [job.id for job in queue.jobs(State.SCHEDULED)] == [scheduled]
    assert [(job.id, job.owner) for job in queue.jobs(State.CLAIMED)] == [(adds[0], owner.name)]
    assert queue.jobs(State.DONE) == []
    everything = queue.jobs()
    assert sorted(job.id for job in everything) == sorted([*adds, *echoes, scheduled])
    assert [job.state for job in everything] == [State.READY] * 4 + [State.SCHEDULED, State.CLAIMED]
    assert [job.id for job in queue.jobs(function="sample.echo", limit=3)] == [*echoes, scheduled]
    assert queue.jobs(limit=0) == []


def test_list_of_an_unknown_state_is_refused(queue: Queue) -> None:
    with pytest.raises(ValueError, match=r"'blocked' is not a valid State"):
        queue.jobs("blocked")


def test_counts_every_state(queue: Queue, owner: Owner) -> None:
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 0,
        "dead": 0,
    }
    for state, number in [(State.DONE, 2), (State.DEAD, 1), (State.CLAIMED, 1), (State.SCHEDULED, 3)]:
        for _ in range(number):
            bring_to(queue, owner, state)
    for _ in range(4):
        bring_to(queue, owner, State.READY)
    other = Owner.new()
    queue.serving.register_owner(other)
    queue.with_options(priority=50).enqueue("sample.echo")
    claim_one(queue, other)
    counts = queue.counts()
    bring_to(queue, owner, State.WAITING)  # and its parent, scheduled
    counts = queue.counts()
    assert counts == {"incoming": 0, "ready": 4, "scheduled": 4, "waiting": 1, "claimed": 2, "done": 2, "dead": 1}
    assert list(counts) == ["incoming", "ready", "scheduled", "waiting", "claimed", "done", "dead"]
    assert counts == {state.value: len(queue.jobs(state)) for state in State}


def test_events_tell_the_story(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    queue.serving.fail(claim_one(queue, owner, now=1_700_000_000.0), {"message": "x"}, now=1_700_000_001.0)
    queue.serving.complete(claim_one(queue, owner, now=1_700_000_002.0), now=1_700_000_003.5)
    lines = (queue.job(job_id).path / "events").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        "enqueued",
        f"claimed by {owner.name}: attempt 1/3 (run 1)",
        "failed: attempt 1/3, ready",
        f"claimed by {owner.name}: attempt 2/3 (run 2)",
        "done: attempt 2 (run 2) succeeded",
    ]
    assert [line.split(" ", 1)[0] for line in lines[1:]] == [
        "2023-11-14T22:13:20.000000Z",
        "2023-11-14T22:13:21.000000Z",
        "2023-11-14T22:13:22.000000Z",
        "2023-11-14T22:13:23.500000Z",
    ]


def test_state_compares_equal_to_its_folder_name(queue: Queue) -> None:
    job_id = queue.enqueue("sample.echo")
    assert queue.job(job_id).state == "ready"
    assert queue.jobs(state="ready")[0].id == job_id
