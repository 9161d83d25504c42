"""A job's effective policy (jobs/policy.py): resolved when claimed, in one order, whatever
path submitted the job; recorded in the run's folder; used by the sweeper; and jobs a
claimer cannot run are given back untouched, once."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tenacity

import jobs.files
from jobs import COMMAND, Backoff, Claim, Functions, Owner, Policy, Queue, Registry, Source, State
from jobs.job import ready_name
from jobs.policy import POLICY_FILE, resolve

from .conftest import Hand

REGISTRY = Registry()


@REGISTRY.job(name="work", max_attempts=6, timeout="2s", backoff="fixed 0.5s")
def work(seconds: float = 0.0) -> None:
    return None


@REGISTRY.job(name="plain")
def plain() -> None:
    return None


@REGISTRY.job(name="custom", backoff=tenacity.wait_chain(tenacity.wait_fixed(1), tenacity.wait_fixed(9)))
def custom() -> None:
    return None


FUNCTIONS = Functions(REGISTRY, commands=True)


def _claim(queue: Queue, owner: Owner, functions: Functions | None = FUNCTIONS) -> Claim:
    claim = queue.serving.claim(owner.name, functions=functions)
    assert claim is not None, "a job was ready"
    return claim


def _by_hand(hand: Hand, spec: dict[str, Any]) -> str:
    """As examples/submit.sh or another language writes a job: only what it says."""
    job_id, _ = hand.ready_job(spec)
    return job_id


SUBMISSIONS: dict[str, Callable[[Queue, Hand], str]] = {
    "function object": lambda queue, hand: queue.enqueue(work),
    "name": lambda queue, hand: queue.enqueue("work"),
    "hand-written job.json": lambda queue, hand: _by_hand(hand, {"function": "work"}),
    "batch": lambda queue, hand: queue.enqueue_many([jobs.Call("work")])[0],
}


@pytest.mark.parametrize("submit", SUBMISSIONS.values(), ids=SUBMISSIONS.keys())
def test_the_registration_applies_however_the_job_was_submitted(
    queue: Queue, owner: Owner, hand: Hand, submit: Callable[[Queue, Hand], str]
) -> None:
    queue.configure(max_attempts=9, timeout="1h", backoff="fixed 1m")  # below the function's level
    submit(queue, hand)
    policy = _claim(queue, owner).policy
    assert (policy.max_attempts, policy.timeout, policy.backoff) == (6, 2.0, "fixed 0.5s")
    assert policy.delay(1) == 0.5
    assert dict(policy.sources) == {
        "max_attempts": Source.FUNCTION,
        "timeout": Source.FUNCTION,
        "memory_limit": Source.DEFAULT,
        "output_limit": Source.DEFAULT,
        "backoff": Source.FUNCTION,
    }


@pytest.mark.parametrize("by_hand", [False, True], ids=["with_options", "hand-written job.json"])
def test_what_the_submitter_set_wins(queue: Queue, owner: Owner, hand: Hand, by_hand: bool) -> None:
    if by_hand:
        _by_hand(hand, {"function": "work", "max_attempts": 1, "timeout": 0, "backoff": "30s"})
    else:
        queue.with_options(max_attempts=1, timeout=0, backoff="30s").enqueue(work)
    policy = _claim(queue, owner).policy
    assert (policy.max_attempts, policy.timeout, policy.backoff) == (1, None, "fixed 30s"), "timeout 0: no limit"
    assert (policy.sources["max_attempts"], policy.sources["timeout"]) == (Source.JOB, Source.JOB)


def test_the_queue_applies_to_a_function_that_declares_nothing(queue: Queue, owner: Owner) -> None:
    queue.configure(max_attempts=4, timeout="5m", memory_limit="1G", output_limit="1M", backoff="exponential 2s 1m")
    queue.enqueue("plain")
    policy = _claim(queue, owner).policy
    assert (policy.max_attempts, policy.timeout, policy.memory_limit, policy.output_limit) == (
        4,
        300.0,
        1 << 30,
        1 << 20,
    )
    assert policy.backoff == "exponential 2s 1m"
    assert set(policy.sources.values()) == {Source.QUEUE}


def test_the_built_in_values_apply_when_nobody_says(queue: Queue, owner: Owner) -> None:
    queue.enqueue("plain")
    policy = _claim(queue, owner).policy
    assert (policy.max_attempts, policy.timeout, policy.memory_limit, policy.output_limit, policy.backoff) == (
        3,
        None,
        None,
        8 << 20,
        "exponential 1s 5m",
    )
    assert set(policy.sources.values()) == {Source.DEFAULT}


def test_a_queue_setting_changed_later_applies_to_jobs_already_queued(queue: Queue, owner: Owner) -> None:
    queue.enqueue("plain")
    Queue(queue.path, create=False).configure(max_attempts=8)  # an operator's `forkvisor config`
    assert queue.serving.reload_settings() is True
    assert _claim(queue, owner).policy.max_attempts == 8


def test_a_custom_tenacity_backoff_is_used_and_described(queue: Queue, owner: Owner) -> None:
    queue.enqueue("custom")
    policy = _claim(queue, owner).policy
    assert policy.backoff == "custom (wait_chain)"
    assert [policy.delay(n) for n in (1, 2, 3)] == [1.0, 9.0, 9.0]


def test_a_store_level_claim_without_functions_resolves_without_a_registration(queue: Queue, owner: Owner) -> None:
    queue.enqueue(work)
    policy = _claim(queue, owner, functions=None).policy
    assert (policy.max_attempts, policy.sources["max_attempts"]) == (3, Source.DEFAULT)


# -- recorded in the run's folder --------------------------------------------------------------


def test_the_claim_records_the_policy_in_the_run_folder(queue: Queue, owner: Owner) -> None:
    queue.enqueue("work")
    claim = _claim(queue, owner)
    recorded = json.loads((claim.run_path / POLICY_FILE).read_text())
    assert recorded == {
        "max_attempts": 6,
        "timeout": 2.0,
        "memory_limit": None,
        "output_limit": 8 << 20,
        "backoff": "fixed 0.5s",
        "sources": {
            "max_attempts": "function",
            "timeout": "function",
            "memory_limit": "default",
            "output_limit": "default",
            "backoff": "function",
        },
    }
    assert Policy.from_json((claim.run_path / POLICY_FILE).read_bytes()) == claim.policy
    assert "attempt 1/6 (run 1)" in (claim.path / "events").read_text()
    assert queue.job(claim.job_id).policy == claim.policy


def test_fail_counts_against_the_resolved_limit(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("work")
    for attempt in range(1, 7):
        claim = _claim(queue, owner)
        assert claim.attempt == attempt
        state = queue.serving.fail(claim, {"message": "boom"}, delay=0)
        assert state is (State.DEAD if attempt == 6 else State.READY)
    assert queue.job(job_id).error is not None
    assert queue.job(job_id).error["message"] == "boom"  # type: ignore[index]


def test_the_sweeper_buries_a_lost_last_attempt_by_the_recorded_limit(queue: Queue, owner: Owner, hand: Hand) -> None:
    """The run's claimer recorded max_attempts 6; a sweeper that knows no registration
    (functions=None) must still count against 6, not the built-in 3."""
    job_id = queue.enqueue("work")
    for _ in range(5):
        queue.serving.fail(_claim(queue, owner), {"message": "boom"}, delay=0)
    _claim(queue, owner)  # the sixth and last attempt; its manager dies
    assert queue.serving.sweep(now=hand.expired_now(owner), is_alive=lambda o: None)["reverted"] == 1
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert "attempt 6/6 was lost" in job.error["message"]  # type: ignore[index]


def test_without_a_recorded_policy_the_sweeper_resolves_one(queue: Queue, owner: Owner, hand: Hand) -> None:
    """A claimer killed between counting the attempt and writing policy.json: the sweeper
    resolves the policy from what it knows (its manager's functions, the queue)."""
    job_id = queue.enqueue("plain")
    queue.configure(max_attempts=1)
    claim = _claim(queue, owner)
    (claim.run_path / POLICY_FILE).unlink()
    assert (
        queue.serving.sweep(now=hand.expired_now(owner), is_alive=lambda o: None, functions=FUNCTIONS)["reverted"] == 1
    )
    assert queue.job(job_id).state is State.DEAD, "attempt 1 of 1 was lost"


@pytest.mark.parametrize(
    "content",
    [b"", b"[]", b'{"max_attempts": 0}', b"[" * 100_000, b'{"max_attempts": 2, "timeout": "soon"}'],
    ids=["empty", "array", "zero", "deep", "bad-timeout"],
)
def test_a_broken_policy_json_is_read_as_none(queue: Queue, owner: Owner, content: bytes) -> None:
    queue.enqueue("work")
    claim = _claim(queue, owner)
    (claim.run_path / POLICY_FILE).write_bytes(content)
    assert queue.job(claim.job_id).policy is None


# -- jobs a claimer cannot run ------------------------------------------------------------------


@pytest.fixture
def moves() -> Iterator[list[str]]:
    """Every claim's rename, counted at its checkpoint."""
    seen: list[str] = []
    jobs.files.checkpoint_hook = lambda name: seen.append(name) if name == "claim:moved" else None
    yield seen
    jobs.files.checkpoint_hook = None


def test_a_job_this_claimer_cannot_run_is_given_back_untouched(
    queue: Queue, owner: Owner, hand: Hand, moves: list[str]
) -> None:
    foreign = queue.with_options(priority=5).enqueue("deployed.tomorrow")
    mine = queue.enqueue("work")
    claim = _claim(queue, owner)
    assert claim.job_id == mine
    assert hand.names(State.READY) == [ready_name(foreign, 5)]
    job = queue.job(foreign)
    assert (job.attempts, job.history) == (0, ())
    assert (job.path / "events").read_text().split()[1:] == ["enqueued"], "no event per manager that passes it by"
    assert queue.serving.left_for_others == {"deployed.tomorrow": 1}
    assert len(moves) == 2


def test_a_head_of_foreign_jobs_is_looked_at_once(queue: Queue, owner: Owner, moves: list[str]) -> None:
    for n in range(200):
        queue.enqueue("deployed.tomorrow", n)
    looks = []
    for _ in range(10):
        assert queue.serving.claim(owner.name, functions=FUNCTIONS) is None
        looks.append(len(moves))
    assert looks[-1] == 200, "each foreign job was claimed and given back exactly once"
    assert looks[:4] == [64, 128, 192, 200], "at most 64 given back per call: a manager turn stays short"
    later = queue.enqueue("work")
    claim = queue.serving.claim(owner.name, functions=FUNCTIONS)
    assert claim is not None
    assert claim.job_id == later
    assert len(moves) == 201, "the foreign ones were not looked at again"


def test_a_claim_that_stops_at_its_budget_says_there_is_more(queue: Queue, owner: Owner) -> None:
    for n in range(70):
        queue.enqueue("deployed.tomorrow", n)
    assert queue.serving.claim(owner.name, functions=FUNCTIONS) is None
    assert queue.serving.more_to_examine is True
    assert queue.serving.claim(owner.name, functions=FUNCTIONS) is None
    assert queue.serving.more_to_examine is False


def test_a_manager_that_does_not_run_commands_leaves_them(queue: Queue, owner: Owner) -> None:
    command = queue.enqueue_command(["true"])
    assert queue.serving.claim(owner.name, functions=Functions(REGISTRY, commands=False)) is None
    assert queue.job(command).state is State.READY
    assert queue.serving.left_for_others == {COMMAND: 1}
    other = Queue(queue.path, create=False)
    claim = other.serving.claim(owner.name, functions=Functions(None, commands=True))
    assert claim is not None
    assert claim.job_id == command, "a manager that runs commands takes it"


def test_a_manager_with_no_registry_runs_commands_only(queue: Queue, owner: Owner) -> None:
    queue.enqueue("work")
    command = queue.enqueue_command(["true"])
    claim = queue.serving.claim(owner.name, functions=Functions())
    assert claim is not None
    assert claim.job_id == command
    assert queue.serving.claim(owner.name, functions=Functions()) is None
    assert queue.counts()["ready"] == 1


def test_given_back_names_are_forgotten_once_they_leave_ready(queue: Queue, owner: Owner) -> None:
    queue.enqueue("deployed.tomorrow")
    assert queue.serving.claim(owner.name, functions=FUNCTIONS) is None
    assert queue.serving.index.skipped == 1
    other = Queue(queue.path, create=False)
    taken = other.serving.claim(owner.name)  # a manager that runs it
    assert taken is not None
    queue.serving.index.rescan()
    assert queue.serving.index.skipped == 0


# -- resolution as a pure function ---------------------------------------------------------------


def test_resolve_is_the_first_level_that_sets_each_value() -> None:
    spec = jobs.JobSpec(id="20261124-000000-000000-00000000", function="work", timeout=7)
    policy = resolve(spec, REGISTRY.get("work"), {"max_attempts": 2, "memory_limit": 4096})
    assert (policy.max_attempts, policy.timeout, policy.memory_limit, policy.backoff) == (6, 7, 4096, "fixed 0.5s")
    assert [policy.sources[n] for n in ("max_attempts", "timeout", "memory_limit", "backoff")] == [
        Source.FUNCTION,
        Source.JOB,
        Source.QUEUE,
        Source.FUNCTION,
    ]


def test_zero_at_any_level_means_no_limit_there() -> None:
    spec = jobs.JobSpec(id="20261124-000000-000000-00000000", function="f")
    registered = jobs.Registered("f", plain, timeout=0, memory_limit=0)
    policy = resolve(spec, registered, {"timeout": 60.0, "memory_limit": 4096})
    assert (policy.timeout, policy.memory_limit) == (None, None)
    assert (policy.sources["timeout"], policy.sources["memory_limit"]) == (Source.FUNCTION, Source.FUNCTION)


@pytest.mark.parametrize(
    ("text", "first", "cap"),
    [("30s", 30, None), ("fixed 1m", 60, None), ("exponential 1s 5m", 1, 300), ("none", 0, None)],
)
def test_backoff_text(text: str, first: float, cap: float | None) -> None:
    backoff = Backoff.parse(text)
    assert (backoff.first, backoff.cap) == (first, cap)
    assert Backoff.parse(str(backoff)) == backoff


def test_a_backoff_whose_cap_is_below_its_first_delay_is_refused() -> None:
    with pytest.raises(jobs.InvalidJob, match="the cap must not be shorter than the first delay"):
        Backoff.parse("exponential 1m 1s")


def test_the_owner_folder_advertises_what_its_manager_runs(queue: Queue, hand: Hand) -> None:
    owner = Owner.new()
    queue.serving.register_owner(owner, FUNCTIONS)
    advertised = json.loads((hand.dir(State.CLAIMED) / owner.name / ".functions.json").read_text())
    assert advertised["functions"]["work"] == {"max_attempts": 6, "timeout": 2.0, "backoff": "fixed 0.5s"}
    assert advertised["functions"]["plain"] == {}
    assert advertised["functions"]["custom"] == {"backoff": "custom (wait_chain)"}
    assert COMMAND in advertised["functions"]
    queue.serving.retire_owner(owner.name)
    assert not (hand.dir(State.CLAIMED) / owner.name).exists(), "retiring removes the owner's own files too"


def test_a_failed_registration_leaves_nothing_behind(queue: Queue, hand: Hand) -> None:
    owner = Owner.new()
    (hand.dir(State.CLAIMED) / owner.name).mkdir()  # the publishing rename will fail
    with pytest.raises(jobs.MoveCollision):
        queue.serving.register_owner(owner, FUNCTIONS)
    assert os.listdir(queue.path / "tmp") == []
