"""The harvest's decision, as a function of a run's end (`RunEnd`, frozen, as a manager
decodes it from a child's exit): where `queue.serving.finish` sends the job, for every way a run
can end, and what its `outcome.json` says. A run stopped for a limit or a cancel that
catches SIGTERM and exits 0 has failed; a drain's stop releases a run unless it returned
first; a cancel marker wins over attempts left."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from jobs import CANCEL_FILE, DRAIN, Owner, Queue, RunEnd, State, Verdict

from .conftest import Hand
from .test_transitions import claim_one

LIMIT_STOPS = ["timeout", "memory", "cancelled"]


def end(
    exited_ok: bool = True, stop: str | None = None, has_result: bool = False, cannot_complete: bool = False
) -> RunEnd:
    error: dict[str, Any] = {} if exited_ok and stop is None else {"type": "Crashed", "message": "it ended so"}
    outcome = {"run": 1, "released": None, "succeeded": None, "wall_time": 0.01}
    return RunEnd(exited_ok, stop, has_result, cannot_complete, error, outcome)


@pytest.mark.parametrize(
    ("run_end", "verdict"),
    [
        (end(), Verdict.DONE),
        (end(exited_ok=False), Verdict.FAILED),
        *[(end(stop=stop), Verdict.FAILED) for stop in LIMIT_STOPS],  # caught SIGTERM, exited 0
        *[(end(stop=stop, has_result=True), Verdict.FAILED) for stop in LIMIT_STOPS],
        (end(stop=DRAIN), Verdict.RELEASED),  # exited 0 on the drain's SIGTERM, no value returned
        (end(stop=DRAIN, has_result=True), Verdict.DONE),  # it returned before the drain reached it
        (end(exited_ok=False, stop=DRAIN), Verdict.RELEASED),
        (end(exited_ok=False, stop=DRAIN, has_result=True), Verdict.RELEASED),
    ],
)
def test_the_verdict_of_every_way_a_run_ends(run_end: RunEnd, verdict: Verdict) -> None:
    assert run_end.verdict is verdict
    record = run_end.record()
    assert (record["succeeded"], record["released"]) == (verdict is Verdict.DONE, verdict is Verdict.RELEASED)
    assert list(record) == ["run", "released", "succeeded", "wall_time"]  # outcome.json's order, as decoded


def test_only_the_job_s_word_or_a_cancel_makes_a_failure_permanent() -> None:
    assert end(exited_ok=False, cannot_complete=True).permanent
    assert end(stop="cancelled").permanent
    assert not end(exited_ok=False).permanent
    assert not any(end(stop=stop).permanent for stop in ("timeout", "memory", DRAIN))


@pytest.mark.parametrize("stop", LIMIT_STOPS)
def test_a_run_stopped_for_a_limit_that_exits_0_is_not_done(queue: Queue, owner: Owner, stop: str) -> None:
    job_id = queue.with_options(max_attempts=3).enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.run_path / "result.json").write_text("1\n")  # even with a value
    finished = queue.serving.finish(claim, end(stop=stop, has_result=True))
    assert finished.verdict is Verdict.FAILED
    expected = State.DEAD if stop == "cancelled" else State.SCHEDULED
    assert finished.state is expected is queue.job(job_id).state
    assert queue.job(job_id).history[0].outcome["succeeded"] is False


def test_a_drain_s_stop_without_a_value_goes_back_uncounted(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    finished = queue.serving.finish(claim_one(queue, owner), end(stop=DRAIN))
    assert (finished.state, finished.verdict, finished.retry) == (State.READY, Verdict.RELEASED, None)
    job = queue.job(job_id)
    assert job.attempts == 0  # given back
    assert job.history[0].outcome["released"] is True


def test_a_drain_s_stop_after_the_value_was_returned_is_done(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.run_path / "result.json").write_text('"value"\n')
    assert queue.serving.finish(claim, end(stop=DRAIN, has_result=True)).state is State.DONE
    assert queue.job(job_id).result == "value"


def test_the_first_retry_waits_the_policy_s_first_step(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(max_attempts=3, backoff="exponential 10s 1h").enqueue("sample.echo")
    claim = claim_one(queue, owner)
    now = time.time()
    finished = queue.serving.finish(claim, end(exited_ok=False), now=now)
    assert finished.retry is not None
    assert finished.state is State.SCHEDULED
    assert 10.0 <= finished.retry.due - now < 20.0  # the first step and its jitter (the second: 20 s and up)
    assert hand.names(State.SCHEDULED) == [f"{math.ceil(finished.retry.due * 1000):013d}.100.{job_id}"]


def test_a_cancel_marked_job_that_fails_with_attempts_left_is_dead(queue: Queue, owner: Owner) -> None:
    job_id = queue.with_options(max_attempts=5).enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.path / CANCEL_FILE).write_text("cancelled\n")
    finished = queue.serving.finish(claim, end(exited_ok=False))
    assert (finished.state, finished.verdict) == (State.DEAD, Verdict.FAILED)
    assert json.loads((queue.path / "dead" / job_id / "error.json").read_text())["reason"] == "cancelled"


def test_a_job_that_said_it_cannot_be_completed_is_dead_at_once(queue: Queue, owner: Owner) -> None:
    job_id = queue.with_options(max_attempts=5).enqueue("sample.echo")
    finished = queue.serving.finish(claim_one(queue, owner), end(exited_ok=False, cannot_complete=True))
    assert finished.state is State.DEAD
    assert queue.job(job_id).error["reason"] == "cannot be completed"
