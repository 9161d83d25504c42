"""The lease-sweeper's work, as functions of a fake `now`: reaping gone owners,
finishing an interrupted reap, promoting due retries, clearing `tmp/`."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest

import jobs.lease
from jobs import (
    Call,
    Claim,
    ClaimLost,
    InvalidJob,
    JobOptions,
    Owner,
    Queue,
    State,
    files,
    new_job_id,
    unknown_liveness,
)
from jobs.job import scheduled_name
from jobs.sweep import Skips

from .conftest import Hand

NOBODY_KNOWS = unknown_liveness
GOOD = {"function": "sample.echo"}


def claim_one(queue: Queue, owner: Owner) -> Claim:
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    return claim


def outcome_of(path: Path) -> dict[str, object]:
    result: dict[str, object] = json.loads(path.read_text())
    return result


def swept(**expected: int) -> dict[str, int]:
    """What `sweep` returns when it did only `expected`."""
    return {"reverted": 0, "expired": 0, "promoted": 0, "abandoned": 0, "settled": 0, **expected}


# -- reaping owners ----------------------------------------------------------------------


def test_expired_owner_is_reaped_and_its_job_is_ready_again(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(priority=4).enqueue("sample.echo")
    claim = claim_one(queue, owner)
    heartbeat = hand.heartbeat_of(owner)
    result = queue.serving.sweep(now=heartbeat + owner.lease + 1, is_alive=NOBODY_KNOWS)
    assert result == swept(reverted=1, expired=1)
    assert hand.names(State.READY) == [f"096.{job_id}"]
    assert hand.names(State.CLAIMED) == [], "the owner folder (and its reaping. fence) are gone"
    job = queue.job(job_id)
    assert job.attempts == 1, "a lost attempt stays counted"
    outcome = outcome_of(job.path / "attempt-1" / "outcome.json")
    assert outcome["lost"] is True
    assert outcome["error"] == (
        f"the attempt was lost: owner {owner.name} stopped heartbeating {owner.lease + 1:.0f}s ago "
        f"(lease {owner.lease:g}s)"
    )
    assert job.history[0].outcome == outcome
    last_event = (job.path / "events").read_text().splitlines()[-1].split(" ", 1)[1]
    assert last_event.startswith(f"ready: claim reverted, owner {owner.name} stopped heartbeating")
    again = claim_one(hand.queue, hand.owner())
    assert (again.job_id, again.run, again.attempt) == (job_id, 2, 2)
    assert claim.path.exists() is False


@pytest.mark.parametrize(
    ("past_heartbeat", "reaped"),
    [(-5.0, False), (0.0, False), (30.0, False), (60.0, False), (60.001, True), (61.0, True), (1e6, True)],
)
def test_lease_boundary(queue: Queue, owner: Owner, hand: Hand, past_heartbeat: float, reaped: bool) -> None:
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    result = queue.serving.sweep(now=hand.heartbeat_of(owner) + past_heartbeat, is_alive=NOBODY_KNOWS)
    assert result["reverted"] == (1 if reaped else 0)
    assert queue.job(job_id).state is (State.READY if reaped else State.CLAIMED)


def test_owner_lease_comes_from_its_owner_file(queue: Queue, hand: Hand) -> None:
    short = hand.owner(Owner.new(lease=5.0))
    queue.enqueue("sample.echo")
    claim_one(queue, short)
    assert queue.serving.sweep(now=hand.heartbeat_of(short) + 5.5, is_alive=NOBODY_KNOWS)["reverted"] == 1


def test_expired_owner_on_its_last_attempt_buries_the_job(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(max_attempts=2).enqueue("sample.echo")
    queue.serving.fail(claim_one(queue, owner), {"message": "first"})
    claim = claim_one(queue, owner)
    assert claim.attempt == 2
    queue.serving.sweep(now=hand.expired_now(owner), is_alive=NOBODY_KNOWS)
    assert hand.names(State.DEAD) == [job_id]
    assert hand.names(State.READY) == []
    error = hand.error(job_id)
    assert error["reason"] == "attempts exhausted"
    assert error["attempt"] == 2
    assert error["message"].startswith(f"attempt 2/2 was lost: owner {owner.name} stopped heartbeating")
    outcome = outcome_of(hand.dir(State.DEAD) / job_id / "attempt-2" / "outcome.json")
    assert outcome["lost"] is True


def test_dead_owner_is_reaped_at_once_even_with_a_fresh_lease(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    seen: list[Owner] = []

    def dead(candidate: Owner) -> bool:
        seen.append(candidate)
        return False

    result = queue.serving.sweep(now=hand.heartbeat_of(owner), is_alive=dead)
    assert result["reverted"] == 1
    assert seen == [owner]
    assert hand.names(State.READY) == [f"100.{job_id}"]
    outcome = outcome_of(queue.job(job_id).path / "attempt-1" / "outcome.json")
    assert outcome == {
        "lost": True,
        "error": f"the attempt was lost: owner {owner.name} (pid {owner.pid} on {owner.host}) is dead",
    }


@pytest.mark.parametrize("alive", [None, True], ids=["unknown", "alive"])
def test_healthy_owner_is_left_alone(queue: Queue, owner: Owner, hand: Hand, alive: bool | None) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    result = queue.serving.sweep(now=hand.heartbeat_of(owner) + 1, is_alive=lambda _: alive)
    assert result == swept()
    assert queue.job(job_id).state is State.CLAIMED
    assert hand.names(State.CLAIMED) == [owner.name]
    assert not (claim.run_path / "outcome.json").exists()
    queue.serving.heartbeat(owner.name)
    queue.serving.complete(claim)
    assert queue.job(job_id).state is State.DONE


def test_alive_owner_whose_lease_expired_is_still_reaped(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    assert queue.serving.sweep(now=hand.expired_now(owner), is_alive=lambda _: True)["reverted"] == 1
    assert queue.job(job_id).state is State.READY


def test_only_the_gone_owner_is_reaped(queue: Queue, owner: Owner, hand: Hand) -> None:
    first = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    other = hand.owner()
    second = queue.enqueue("sample.echo")
    claim_one(queue, other)
    queue.serving.sweep(now=hand.heartbeat_of(other) + 1, is_alive=lambda candidate: candidate.name != owner.name)
    assert queue.job(first).state is State.READY
    assert queue.job(second).owner == other.name
    assert hand.names(State.CLAIMED) == [other.name]


def test_reaped_owner_without_jobs_is_removed(queue: Queue, owner: Owner, hand: Hand) -> None:
    assert queue.serving.sweep(now=hand.expired_now(owner), is_alive=NOBODY_KNOWS)["reverted"] == 0
    assert hand.names(State.CLAIMED) == []


def test_heartbeat_renews_the_lease(queue: Queue, owner: Owner, hand: Hand) -> None:
    owner_file = hand.dir(State.CLAIMED) / owner.name / ".owner.json"
    hand.age(owner_file, 3600, time.time())
    stale = hand.heartbeat_of(owner)
    queue.serving.heartbeat(owner.name)
    assert hand.heartbeat_of(owner) >= stale + 3599
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    assert queue.serving.sweep(now=stale + owner.lease + 1, is_alive=NOBODY_KNOWS)["reverted"] == 0
    assert queue.job(job_id).state is State.CLAIMED


def test_heartbeat_of_a_reaped_owner_is_claim_lost(queue: Queue, owner: Owner, hand: Hand) -> None:
    queue.serving.sweep(now=hand.expired_now(owner), is_alive=NOBODY_KNOWS)
    with pytest.raises(ClaimLost, match=rf"owner {owner.name} of queue .* was reaped"):
        queue.serving.heartbeat(owner.name)
    assert hand.names(State.CLAIMED) == [], "a heartbeat never brings a reaped owner back"


def test_owner_folder_without_owner_file(queue: Queue, hand: Hand) -> None:
    name = "node7.4121.9f2c1a"
    folder = hand.dir(State.CLAIMED) / name
    folder.mkdir()
    job_id = new_job_id()
    hand.job_dir(folder, job_id, {"function": "sample.echo"}, attempts=1)
    now = time.time()
    assert queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS)["reverted"] == 0, "maybe a registration in progress"
    assert hand.names(State.CLAIMED) == [name]
    hand.age(folder, 61, now)
    assert queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS)["reverted"] == 1
    assert hand.names(State.READY) == [f"100.{job_id}"]
    assert hand.names(State.CLAIMED) == []


def test_badly_named_owner_folder_is_quarantined(queue: Queue, hand: Hand) -> None:
    (hand.dir(State.CLAIMED) / "not an owner").mkdir()
    queue.serving.sweep(now=time.time(), is_alive=NOBODY_KNOWS)
    assert hand.names(State.CLAIMED) == []
    notes = list(hand.quarantined().values())
    assert len(notes) == 1
    assert "from: claimed/'not an owner'" in notes[0]
    assert "why: not an owner folder (HOST.PID.XXXXXX)" in notes[0]


def test_retire_owner(queue: Queue, owner: Owner, hand: Hand) -> None:
    queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    queue.serving.retire_owner(owner.name)
    assert hand.names(State.CLAIMED) == [owner.name], "an owner holding a job keeps its folder"
    queue.serving.complete(claim)
    queue.serving.retire_owner(owner.name)
    assert hand.names(State.CLAIMED) == []


# -- an interrupted reap ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "max_attempts", "state"),
    [pytest.param(1, 3, State.READY, id="attempts-left"), pytest.param(3, 3, State.DEAD, id="last-attempt")],
)
def test_half_done_reap_is_finished_by_the_next_sweep(
    queue: Queue, hand: Hand, used: int, max_attempts: int, state: State
) -> None:
    fence = hand.dir(State.CLAIMED) / "reaping.node7.4121.9f2c1a"
    fence.mkdir()
    (fence / ".owner.json").write_text(json.dumps({"name": "node7.4121.9f2c1a", "host": "node7", "pid": 4121}))
    job_id = new_job_id()
    job_dir = hand.job_dir(fence, job_id, {"function": "sample.echo", "max_attempts": max_attempts}, attempts=used)
    (job_dir / f"attempt-{used}").mkdir()
    other_id = new_job_id()
    hand.job_dir(fence, other_id, {"function": "sample.echo"}, attempts=1)
    result = queue.serving.sweep(now=time.time(), is_alive=lambda _: pytest.fail("a fenced owner is not asked about"))
    assert result["reverted"] == 2
    assert hand.names(State.CLAIMED) == []
    assert queue.job(job_id).state is state
    assert queue.job(other_id).state is State.READY
    outcome = outcome_of(queue.job(job_id).path / f"attempt-{used}" / "outcome.json")
    assert outcome == {"lost": True, "error": "the attempt was lost: owner node7.4121.9f2c1a was being reaped"}
    if state is State.DEAD:
        assert hand.error(job_id)["reason"] == "attempts exhausted"


def test_reaping_fence_left_by_a_crash_after_the_rename(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    claimed = hand.dir(State.CLAIMED)
    os.rename(claimed / owner.name, claimed / f"reaping.{owner.name}")
    assert queue.serving.sweep(now=hand.heartbeat_of(hand.owner()) + 1, is_alive=NOBODY_KNOWS)["reverted"] == 1
    assert queue.job(job_id).state is State.READY
    assert all(not name.startswith("reaping.") for name in hand.names(State.CLAIMED))


# -- promoting scheduled jobs ---------------------------------------------------------------


def test_promote_moves_due_jobs_only(queue: Queue, hand: Hand) -> None:
    now = 1_800_000_000.0
    overdue, _ = hand.scheduled_job({"function": "sample.echo"}, due=now - 3600, priority=-1)
    due, _ = hand.scheduled_job({"function": "sample.echo"}, due=now, priority=9)
    soon, _ = hand.scheduled_job({"function": "sample.echo"}, due=now + 0.001)
    later, _ = hand.scheduled_job({"function": "sample.echo"}, due=now + 3600, priority=100)
    result = queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS)
    assert result == swept(promoted=2)
    assert hand.names(State.READY) == [f"091.{due}", f"101.{overdue}"]
    assert hand.names(State.SCHEDULED) == [scheduled_name(soon, 0, now + 0.001), scheduled_name(later, 100, now + 3600)]
    owner = hand.owner()
    claims = [claim_one(queue, owner) for _ in range(2)]
    assert [claim.job_id for claim in claims] == [due, overdue]
    for claim in claims:
        queue.serving.complete(claim)
    assert queue.serving.sweep(now=now + 3600, is_alive=NOBODY_KNOWS) == swept(promoted=2, expired=1)
    late_owner = hand.owner()  # the sweep at now + 3600 reaped the first owner: its lease ran out
    assert [claim_one(queue, late_owner).job_id for _ in range(2)] == [later, soon]


def test_a_failed_job_is_promoted_when_its_retry_is_due(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    now = time.time()
    queue.serving.fail(claim_one(queue, owner), {"message": "x"}, now=now, delay=30)
    assert queue.serving.sweep(now=now + 29, is_alive=lambda _: True)["promoted"] == 0
    assert queue.serving.sweep(now=now + 30.001, is_alive=lambda _: True)["promoted"] == 1
    claim = claim_one(queue, owner)
    assert (claim.job_id, claim.run, claim.attempt) == (job_id, 2, 2)


def test_promote_does_not_replace_a_ready_job_with_the_same_id(queue: Queue, hand: Hand) -> None:
    job_id, _ = hand.ready_job({"function": "sample.echo", "args": ["ready"]})
    hand.job_dir(hand.dir(State.SCHEDULED), scheduled_name(job_id, 0, 1.0), {"function": "sample.echo"})
    queue.serving.sweep(now=time.time(), is_alive=NOBODY_KNOWS)
    assert hand.names(State.READY) == [f"100.{job_id}"]
    assert queue.job(job_id).spec.args == ("ready",)
    notes = list(hand.quarantined().values())
    assert len(notes) == 1
    assert f"why: job {job_id} is already ready (duplicate id)" in notes[0]


# -- clearing tmp/ --------------------------------------------------------------------------------


def test_stale_tmp_entry_is_quarantined_and_a_fresh_one_left_alone(queue: Queue, hand: Hand) -> None:
    now = time.time()
    stale = hand.job_dir(hand.dir("tmp"), new_job_id(), {"function": "sample.echo", "args": ["half"]})
    fresh = hand.job_dir(hand.dir("tmp"), new_job_id(), {"function": "sample.echo"})
    hand.age(stale, 3601, now)
    hand.age(fresh, 3599, now)
    result = queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS)
    assert result == swept(abandoned=1)
    assert hand.names("tmp") == [fresh.name]
    quarantined = hand.quarantined()
    assert len(quarantined) == 1
    [(name, note)] = quarantined.items()
    assert name.startswith("tmp.")
    assert f"from: tmp/'{stale.name}'" in note
    assert "why: abandoned in tmp/ for over 3600s (its submitter died)" in note
    kept = hand.dir("quarantine") / name / "job.json"
    assert json.loads(kept.read_text())["args"] == ["half"], "quarantine keeps what it moved"


def test_tmp_age_is_a_parameter(queue: Queue, hand: Hand) -> None:
    now = time.time()
    entry = hand.job_dir(hand.dir("tmp"), new_job_id(), None)
    hand.age(entry, 11, now)
    assert queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS, tmp_age=20)["abandoned"] == 0
    assert queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS, tmp_age=10)["abandoned"] == 1
    assert hand.names("tmp") == []


def test_stale_interrupted_purge_in_tmp_is_deleted(queue: Queue, hand: Hand) -> None:
    now = time.time()
    doomed = hand.job_dir(hand.dir("tmp"), f".purge.{new_job_id()}", {"function": "sample.echo"})
    hand.age(doomed, 7200, now)
    assert queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS)["abandoned"] == 1
    assert hand.names("tmp") == []
    assert hand.names("quarantine") == []


def test_filesystem_now_reads_the_file_system_clock(queue: Queue) -> None:
    before = time.time()
    now = queue.serving.filesystem_now()
    assert (queue.path / ".clock").is_file()
    assert before - 5 <= now <= time.time() + 5
    assert queue.serving.filesystem_now() >= now


# -- the manager's own helpers: promote_due, scheduled_after, note_lost -----------------------------


def test_queue_promote_due_moves_due_jobs_only(queue: Queue, hand: Hand) -> None:
    now = time.time()
    due, _ = hand.scheduled_job(GOOD, due=now - 1, priority=2)
    later, _ = hand.scheduled_job(GOOD, due=now + 60)
    assert queue.serving.promote_due(now=now) == [due]
    assert hand.names(State.READY) == [f"098.{due}"]
    assert hand.names(State.SCHEDULED) == [scheduled_name(later, 0, now + 60)]
    assert queue.serving.promote_due(now=now) == []
    assert queue.serving.promote_due(now=now + 61) == [later]


@pytest.mark.usefixtures("frozen_index_clock")
def test_promoted_jobs_are_claimed_in_priority_order(queue: Queue, owner: Owner) -> None:
    now = time.time()
    low = [queue.enqueue("sample.echo") for _ in range(2)]
    assert queue.serving.claim(owner.name, now=now) is not None  # the index now holds low[1]
    urgent = queue.submit(Call("sample.echo", options=JobOptions(priority=9, run_at=now + 5)), now=now)
    assert queue.serving.promote_due(now=now + 5.001) == [urgent]
    assert [claim_one(queue, owner).job_id for _ in range(2)] == [urgent, low[1]]


def test_scheduled_after_counts_jobs_due_later(queue: Queue, hand: Hand) -> None:
    now = time.time()
    for offset in (-10, 10, 20):
        hand.scheduled_job(GOOD, due=now + offset)
    assert queue.serving.scheduled_after(now) == 2
    assert queue.serving.scheduled_after(now + 15) == 1
    assert queue.serving.scheduled_after(now + 30) == 0
    assert queue.serving.scheduled_after(now - 60) == 3


def test_note_lost_logs_wherever_the_job_is_now(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    queue.serving.sweep(now=hand.expired_now(owner), is_alive=NOBODY_KNOWS)
    queue.serving.note_lost(claim, now=1_700_000_000.0)
    events = (queue.job(job_id).path / "events").read_text().splitlines()
    assert events[-1] == f"2023-11-14T22:13:20.000000Z run 1 by {owner.name} stopped after its claim was lost"
    assert queue.job(job_id).state is State.READY


def test_note_lost_of_a_purged_job_does_nothing(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    queue.serving.complete(claim)
    assert queue.purge(State.DONE, older_than=0, now=time.time() + 1) == [job_id]
    queue.serving.note_lost(claim)
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 0,
        "dead": 0,
    }


# -- what a sweep says it did, exactly, where it leaves an owner folder be ----------------


def _left_be(queue: Queue, hand: Hand, owner: Owner, situation: str) -> tuple[float, dict[str, object]]:
    """Set up `situation` in claimed/ beside `owner`'s claim; return the sweep's `now` and its
    other arguments."""
    claimed = hand.dir(State.CLAIMED)
    now = hand.heartbeat_of(owner) + 1  # the owner is alive unless the situation says otherwise
    if situation == "a file":
        (claimed / "stray.txt").write_text("not an owner folder\n")
    elif situation == "a folder not named for an owner":
        (claimed / "not-an-owner").mkdir()
    elif situation == "leftovers not ended yet":
        return hand.expired_now(owner), {"end_leftovers": lambda found: False}
    return now, {}


@pytest.mark.parametrize(
    ("situation", "claimed_after", "quarantined"),
    [
        ("a file", 1, 1),
        ("a folder not named for an owner", 1, 1),
        ("a live owner", 1, 0),
        ("leftovers not ended yet", 1, 0),
    ],
)
def test_a_sweep_that_leaves_an_owner_be_says_it_moved_nothing(
    queue: Queue, owner: Owner, hand: Hand, situation: str, claimed_after: int, quarantined: int
) -> None:
    """Every way a sweep can leave an owner folder where it is, the counts it returns say so
    exactly (the sweeper's stats and `status` add them up): nothing reverted, no owner expired."""
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    now, more = _left_be(queue, hand, owner, situation)
    result = queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS, **more)  # type: ignore[arg-type]
    assert result == swept()
    assert queue.job(job_id).state is State.CLAIMED
    assert queue.counts()["claimed"] == claimed_after
    assert len([name for name in hand.names("quarantine") if name.endswith(".why")]) == quarantined


def test_a_fence_left_by_a_dead_sweeper_is_finished_and_no_owner_counted_again(
    queue: Queue, owner: Owner, hand: Hand
) -> None:
    """A sweeper died after fencing an owner (`claimed/reaping.OWNER`): the next sweep sends
    its jobs back, counted as reverted, and counts no owner expired (the dead sweeper did)."""
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    claimed = hand.dir(State.CLAIMED)
    os.rename(claimed / owner.name, claimed / f"reaping.{owner.name}")
    assert queue.serving.sweep(now=time.time(), is_alive=NOBODY_KNOWS) == swept(reverted=1)
    assert queue.job(job_id).state is State.READY
    assert hand.names(State.CLAIMED) == []


def test_an_owner_reaped_by_another_sweeper_meanwhile_is_counted_once(queue: Queue, owner: Owner, hand: Hand) -> None:
    """Between this sweep's fence and its listing of the fenced folder, another sweeper
    finishes the reap: this one moved no job (it says 0) and the job is ready once."""
    job_id = queue.enqueue("sample.echo")
    claim_one(queue, owner)
    now = hand.expired_now(owner)
    other: list[dict[str, int]] = []

    def the_other_finishes(point: str) -> None:
        if point == "reap:fenced" and not other:
            other.append({})
            other[0] = Queue(queue.path).serving.sweep(now=now, is_alive=NOBODY_KNOWS)

    files.checkpoint_hook = the_other_finishes
    try:
        mine = queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS)
    finally:
        files.checkpoint_hook = None
    assert other == [swept(reverted=1)]
    assert mine == swept(expired=1)
    assert hand.names(State.READY) == [f"100.{job_id}"]


def test_an_owner_file_is_read_up_to_64_kib(queue: Queue, owner: Owner, hand: Hand) -> None:
    """An owner file past 64 KiB is not read (a member's or a corrupted one must not cost a
    sweep its memory): the owner is judged as one without a readable file, by its folder's age."""
    queue.enqueue("sample.echo")
    claim_one(queue, owner)
    path = hand.dir(State.CLAIMED) / owner.name / ".owner.json"
    padded = path.read_text().rstrip("\n") + " " * (1 << 16) + "\n"  # still valid JSON, the same owner
    path.write_text(padded)
    folder_age = os.stat(path.parent).st_mtime
    assert queue.serving.sweep(now=folder_age + 1, is_alive=lambda found: False) == swept()  # (dead, if read)
    assert queue.serving.sweep(now=folder_age + 3601, is_alive=NOBODY_KNOWS) == swept(reverted=1, expired=1)


def test_an_owner_folder_without_a_readable_file_is_given_until_the_default_lease(queue: Queue, hand: Hand) -> None:
    """A folder in claimed/ named as an owner but with no owner file may be a registration in
    progress: it is reaped once its folder is older than the default lease, not at it."""
    folder = hand.dir(State.CLAIMED) / Owner.new().name
    folder.mkdir()
    at = os.stat(folder).st_mtime + jobs.lease.DEFAULT_LEASE
    assert queue.serving.sweep(now=at, is_alive=NOBODY_KNOWS) == swept()
    assert queue.serving.sweep(now=at + 0.01, is_alive=NOBODY_KNOWS) == swept(expired=1)
    assert hand.names(State.CLAIMED) == []


# -- what a sweep skips, and what it does not -----------------------------------------------


def _fails(exc: BaseException) -> None:
    raise exc


@pytest.mark.parametrize(
    "exc", [PermissionError(errno.EACCES, "denied"), NotADirectoryError(errno.ENOTDIR, "no"), InvalidJob("bad")]
)
def test_an_entry_s_own_problem_is_skipped_and_kept_for_status(exc: BaseException) -> None:
    skips = Skips()
    assert skips.guarded("owner folder", "x", _fails, exc) is None
    assert (skips.count, skips.found) == (1, {"owner folder 'x'": str(exc)})


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO])
def test_a_store_wide_failure_is_not_an_entry_s_and_stops_the_chore(code: int) -> None:
    skips = Skips()
    with pytest.raises(OSError, match=os.strerror(code)) as raised:
        skips.guarded("owner folder", "x", _fails, OSError(code, os.strerror(code)))
    assert raised.value.errno == code
    assert (skips.count, skips.found) == (0, {})


def test_a_sweep_keeps_why_for_its_first_100_skips_and_counts_them_all() -> None:
    skips = Skips()
    for n in range(150):
        skips.guarded("tmp/ entry", str(n), _fails, InvalidJob(f"bad {n}"))
    assert skips.count == 150
    assert list(skips.found) == [f"tmp/ entry '{n}'" for n in range(100)]
    assert skips.guarded("tmp/ entry", "fine", lambda: 7) == 7


@pytest.mark.parametrize("left", ["a file", "a folder"])
def test_a_lost_completion_s_result_does_not_stand_for_the_job_sent_back(
    queue: Queue, owner: Owner, hand: Hand, left: str
) -> None:
    """A manager died in its completion, after linking the run's result into the job folder
    and before the move to done/: the job goes back to ready/ without it (the next run's
    result, or none, will stand); a folder in its place is kept aside in quarantine/."""
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    stale = claim.path / "result.json"
    if left == "a file":
        stale.write_text('"stale"\n')
    else:
        stale.mkdir()
    assert queue.serving.sweep(now=hand.expired_now(owner), is_alive=NOBODY_KNOWS) == swept(reverted=1, expired=1)
    assert not os.path.lexists(queue.job(job_id).path / "result.json")
    kept = [name for name in hand.names("quarantine") if not name.endswith(".why")]
    assert len(kept) == (1 if left == "a folder" else 0)


def test_a_tmp_entry_is_abandoned_only_once_older_than_the_age_given(queue: Queue, hand: Hand) -> None:
    now = 1_000_000.0  # whole seconds: the age is exact
    entry = hand.job_dir(hand.dir("tmp"), new_job_id(), None)
    hand.age(entry, 10, now)
    assert queue.serving.sweep(now=now, is_alive=NOBODY_KNOWS, tmp_age=10)["abandoned"] == 0
    assert queue.serving.sweep(now=now + 1, is_alive=NOBODY_KNOWS, tmp_age=10)["abandoned"] == 1


@pytest.mark.parametrize(("age", "purged"), [(59.0, False), (60.0, True)])
def test_a_purge_takes_jobs_whose_last_change_is_as_old_as_asked(
    queue: Queue, owner: Owner, hand: Hand, age: float, purged: bool
) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    queue.serving.complete(claim)
    changed = 1_000_000.0
    os.utime(hand.dir(State.DONE) / job_id / "events", (changed, changed))
    assert queue.purge(State.DONE, older_than=60.0, now=changed + age) == ([job_id] if purged else [])


def test_a_promotion_of_a_job_that_is_not_there_says_so(queue: Queue) -> None:
    """The manager promotes a retry when it is due; another manager's sweep may have done it."""
    job_id = queue.with_options(delay=30.0).enqueue("sample.echo")
    [name] = os.listdir(queue.path / "scheduled")
    due = int(name.split(".")[0]) / 1000  # the name holds milliseconds
    assert queue.serving.promote(job_id, 0, due, now=due + 1) is True
    assert queue.serving.promote(job_id, 0, due, now=due + 1) is False, "promoted already"


def test_a_fenced_folder_that_cannot_be_listed_costs_only_that_owner(
    queue: Queue, owner: Owner, hand: Hand, tmp_path: Path
) -> None:
    """The fenced owner folder is replaced under the sweep (here by a file): the sweep counts
    the owner expired and no job moved, goes on with its chores, and the next sweep puts the
    file aside."""
    queue.enqueue("sample.echo")
    claim_one(queue, owner)
    fenced = hand.dir(State.CLAIMED) / f"reaping.{owner.name}"

    def replaced(point: str) -> None:
        if point == "reap:fenced":
            os.rename(fenced, tmp_path / "aside")
            fenced.write_text("not a folder\n")

    files.checkpoint_hook = replaced
    try:
        assert queue.serving.sweep(now=hand.expired_now(owner), is_alive=NOBODY_KNOWS) == swept(expired=1)
    finally:
        files.checkpoint_hook = None
    queue.serving.sweep(now=time.time(), is_alive=NOBODY_KNOWS)
    assert hand.names(State.CLAIMED) == []
    assert len([name for name in hand.names("quarantine") if name.endswith(".why")]) == 1


def test_a_purge_cut_short_is_finished_a_budget_at_a_time(queue: Queue, hand: Hand) -> None:
    """A sweep removes at most 2,000 entries of a purge left in tmp/, as docs/FORMAT.md says
    (a deep tree must not hold a sweep up), and the next sweep goes on where it stopped."""
    doomed = hand.dir("tmp") / f".purge.{new_job_id()}"
    doomed.mkdir()
    for n in range(2_000):  # with the folder itself, one entry more than a sweep removes
        (doomed / str(n)).touch()
    assert queue.serving.sweep(now=time.time(), is_alive=NOBODY_KNOWS)["abandoned"] == 1
    assert doomed.exists()
    assert os.listdir(doomed) == []
    queue.serving.sweep(now=time.time(), is_alive=NOBODY_KNOWS)
    assert not doomed.exists()


def test_a_done_job_without_events_is_purged_by_its_folder_s_age(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    queue.serving.complete(claim_one(queue, owner))
    folder = hand.dir(State.DONE) / job_id
    (folder / "events").unlink()
    os.utime(folder, (1_000_000.0, 1_000_000.0))
    assert queue.purge(State.DONE, older_than=60.0, now=1_000_059.0) == []
    assert queue.purge(State.DONE, older_than=60.0, now=1_000_060.0) == [job_id]


def test_a_promotion_another_promoter_made_first_is_not_counted_twice(
    queue: Queue, hand: Hand, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two managers promote the same due retry: the one whose rename finds it gone says it
    promoted nothing (a retry is announced, and counted, once)."""
    job_id = queue.with_options(delay=30.0).enqueue("sample.echo")
    [name] = os.listdir(queue.path / "scheduled")
    due = int(name.split(".")[0]) / 1000
    other, real_move = Queue(queue.path), files.move
    first: list[bool] = []

    def the_other_first(src: str, dst: str, **handles: int | None) -> None:
        if not first:
            first.append(False)  # (its own move passes through here too)
            first[0] = other.serving.promote(job_id, 0, due, now=due + 1)
        real_move(src, dst, **handles)

    monkeypatch.setattr(files, "move", the_other_first)
    assert queue.serving.promote(job_id, 0, due, now=due + 1) is False
    assert first == [True]
    assert hand.names(State.READY) == [f"100.{job_id}"]


def test_a_due_job_whose_id_is_ready_already_is_put_aside_not_counted(queue: Queue, hand: Hand) -> None:
    job_id = queue.with_options(delay=30.0).enqueue("sample.echo")
    [name] = os.listdir(queue.path / "scheduled")
    due = int(name.split(".")[0]) / 1000
    shutil.copytree(queue.path / "scheduled" / name, queue.path / "ready" / f"100.{job_id}")  # a copy
    assert queue.serving.promote(job_id, 0, due, now=due + 1) is False
    assert hand.names(State.SCHEDULED) == []
    assert len([entry for entry in hand.names("quarantine") if entry.endswith(".why")]) == 1
