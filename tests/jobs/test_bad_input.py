"""Entries written into the queue by hand, by another language, or by mistake.

Claiming and sweeping never raise on them. What is not a job (a file, a
symlink, a bad name) goes to `quarantine/` with a `.why` note and is never
followed; a well-named job directory whose `job.json` is wrong goes to `dead/`
with an `error.json` saying what was wrong. Nothing outside the queue is read,
listed, moved or written (the `outside` fixture checks atimes and mtimes).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobs import Claim, InvalidJob, Owner, Queue, State, new_job_id, unknown_liveness
from jobs.job import MAX_SPEC_BYTES, ready_name, scheduled_name

from .conftest import Hand

GOOD_SPEC = {"function": "sample.echo", "args": ["good"]}


def claim_all(queue: Queue, owner: Owner) -> list[Claim]:
    """Claim until nothing is ready; never raises on a bad entry."""
    claims = []
    while (claim := queue.serving.claim(owner.name)) is not None or queue.serving.more_to_examine:
        if claim is not None:
            claims.append(claim)
    return claims


def expire(queue: Queue, hand: Hand, owner: Owner) -> dict[str, int]:
    return queue.serving.sweep(now=hand.expired_now(owner), is_alive=unknown_liveness)


def one_note(hand: Hand) -> tuple[str, str]:
    quarantined = hand.quarantined()
    assert len(quarantined) == 1, quarantined
    [(name, note)] = quarantined.items()
    return name, note


# -- entries that are not jobs -----------------------------------------------------------

JOB_ID = "20261123-103300-123456-a1b2c3d4"

BAD_READY_NAMES: list[Any] = [
    pytest.param("...", id="dots"),
    pytest.param("..100", id="dotdot-prefix"),
    pytest.param(f".100.{JOB_ID}", id="hidden"),
    pytest.param(JOB_ID, id="no-rank"),
    pytest.param(f"99.{JOB_ID}", id="short-rank"),
    pytest.param(f"201.{JOB_ID}", id="rank-out-of-range"),
    pytest.param(f"100.{JOB_ID}.old", id="suffix"),
    pytest.param(f"100.{JOB_ID.upper()}", id="uppercase-id"),
    pytest.param(f"100.{JOB_ID[:-1]}\n", id="newline"),
    pytest.param(f"100.\x1b[31m{JOB_ID[5:]}", id="escape-sequence"),
    pytest.param("100.\x01\x7f", id="control-characters"),
    pytest.param(b"100.\xff\xfe" + JOB_ID.encode()[2:], id="non-utf8"),
    pytest.param("100.20261123-103300-123456-a1b2c3d\u0664", id="unicode-digit"),
]


@pytest.mark.parametrize("name", BAD_READY_NAMES)
def test_badly_named_directory_in_ready_is_quarantined(
    queue: Queue, owner: Owner, hand: Hand, name: str | bytes
) -> None:
    hand.job_dir(hand.dir(State.READY), name, {"function": "sample.echo", "args": ["bad"]})
    good = queue.enqueue("sample.echo", "good")
    assert [claim.job_id for claim in claim_all(queue, owner)] == [good]
    assert hand.names(State.READY) == []
    entry, note = one_note(hand)
    assert entry.startswith("ready.")
    shown = repr(os.fsdecode(name))
    assert note.splitlines()[0] == f"from: ready/{shown}"
    assert note.splitlines()[2] == "why: its name is not RRR.ID (see docs/FORMAT.md)"
    assert json.loads((hand.dir("quarantine") / entry / "job.json").read_text())["args"] == ["bad"]
    assert hand.names(State.DEAD) == []


@pytest.mark.parametrize("valid_name", [True, False], ids=["job-name", "bad-name"])
def test_plain_file_in_ready_is_quarantined(queue: Queue, owner: Owner, hand: Hand, valid_name: bool) -> None:
    name = ready_name(new_job_id(), 0) if valid_name else "notes.txt"
    (hand.dir(State.READY) / name).write_text(json.dumps(GOOD_SPEC))
    assert claim_all(queue, owner) == []
    entry, note = one_note(hand)
    why = "not a directory: a job is a directory holding job.json" if valid_name else "its name is not RRR.ID"
    assert why in note
    assert (hand.dir("quarantine") / entry).read_text() == json.dumps(GOOD_SPEC)


def test_fifo_in_ready_is_quarantined(queue: Queue, owner: Owner, hand: Hand) -> None:
    os.mkfifo(hand.dir(State.READY) / ready_name(new_job_id(), 0))
    assert claim_all(queue, owner) == []
    _, note = one_note(hand)
    assert "why: not a directory" in note


@pytest.mark.parametrize("valid_name", [True, False], ids=["job-name", "bad-name"])
def test_symlink_in_ready_to_a_folder_outside_is_quarantined_unfollowed(
    queue: Queue, owner: Owner, hand: Hand, outside: Path, valid_name: bool
) -> None:
    name = ready_name(new_job_id(), 50) if valid_name else "elsewhere"
    (hand.dir(State.READY) / name).symlink_to(outside, target_is_directory=True)
    good = queue.enqueue("sample.echo")
    assert [claim.job_id for claim in claim_all(queue, owner)] == [good]
    entry, note = one_note(hand)
    link = hand.dir("quarantine") / entry
    assert link.is_symlink()
    assert os.readlink(link) == str(outside)
    why = "a symlink: state folders hold job directories only, never links" if valid_name else "not RRR.ID"
    assert why in note
    assert hand.names(State.DEAD) == []


def test_symlink_in_scheduled_to_a_folder_outside_is_quarantined_unfollowed(
    queue: Queue, hand: Hand, outside: Path
) -> None:
    name = scheduled_name(new_job_id(), 0, 1.0)
    (hand.dir(State.SCHEDULED) / name).symlink_to(outside, target_is_directory=True)
    assert queue.serving.sweep(now=time.time(), is_alive=unknown_liveness)["promoted"] == 0
    assert hand.names(State.SCHEDULED) == []
    assert hand.names(State.READY) == []
    entry, note = one_note(hand)
    assert (hand.dir("quarantine") / entry).is_symlink()
    assert "why: a symlink" in note


@pytest.mark.parametrize(
    ("name", "why"),
    [
        pytest.param("later", "its name is not DUE.RRR.ID", id="word"),
        pytest.param(f"1.100.{JOB_ID}", "its name is not DUE.RRR.ID", id="short-due"),
        pytest.param(f"0000000001000.100.{JOB_ID}.x", "its name is not DUE.RRR.ID", id="suffix"),
        pytest.param(b"0000000001000.\xff", "its name is not DUE.RRR.ID", id="non-utf8"),
    ],
)
def test_badly_named_entry_in_scheduled_is_quarantined(queue: Queue, hand: Hand, name: str | bytes, why: str) -> None:
    hand.job_dir(hand.dir(State.SCHEDULED), name, GOOD_SPEC)
    queue.serving.sweep(now=time.time(), is_alive=unknown_liveness)
    assert hand.names(State.SCHEDULED) == []
    assert hand.names(State.READY) == []
    entry, note = one_note(hand)
    assert entry.startswith("scheduled.")
    assert f"why: {why}" in note


def test_plain_file_in_scheduled_is_quarantined(queue: Queue, hand: Hand) -> None:
    (hand.dir(State.SCHEDULED) / scheduled_name(new_job_id(), 0, 1.0)).write_text("{}")
    queue.serving.sweep(now=time.time(), is_alive=unknown_liveness)
    _, note = one_note(hand)
    assert "why: not a directory" in note


def test_bad_entry_in_scheduled_is_quarantined_even_behind_a_future_job(queue: Queue, hand: Hand) -> None:
    now = time.time()
    later, _ = hand.scheduled_job(GOOD_SPEC, due=now + 3600)
    (hand.dir(State.SCHEDULED) / "zzz-not-a-job").write_text("x")
    queue.serving.sweep(now=now, is_alive=unknown_liveness)
    assert hand.names(State.SCHEDULED) == [scheduled_name(later, 0, now + 3600)]
    _, note = one_note(hand)
    assert "zzz-not-a-job" in note


def test_stale_symlink_and_file_in_tmp_are_quarantined_unfollowed(queue: Queue, hand: Hand, outside: Path) -> None:
    now = time.time()
    link = hand.dir("tmp") / new_job_id()
    link.symlink_to(outside, target_is_directory=True)
    stray = hand.dir("tmp") / "half-written"
    stray.write_text("{")
    hand.age(link, 7200, now)
    hand.age(stray, 7200, now)
    assert queue.serving.sweep(now=now, is_alive=unknown_liveness)["abandoned"] == 2
    assert hand.names("tmp") == []
    quarantined = hand.quarantined()
    assert len(quarantined) == 2
    assert sum((hand.dir("quarantine") / name).is_symlink() for name in quarantined) == 1


# -- entries left in an owner's folder ------------------------------------------------------


def _plant_file(folder: Path, outside: Path) -> tuple[str, str]:
    (folder / new_job_id()).write_text(json.dumps(GOOD_SPEC))
    return "claimed", "not a directory"


def _plant_symlink(folder: Path, outside: Path) -> tuple[str, str]:
    (folder / new_job_id()).symlink_to(outside, target_is_directory=True)
    return "claimed", "a symlink"


def _plant_bad_name(folder: Path, outside: Path) -> tuple[str, str]:
    (folder / "not-a-job").mkdir()
    return "claimed", "not a job id"


def _plant_dot_name(folder: Path, outside: Path) -> tuple[str, str]:
    (folder / "..x").mkdir()
    return "claimed", "not a job id"


def _plant_non_utf8(folder: Path, outside: Path) -> tuple[str, str]:
    os.mkdir(os.path.join(os.fsencode(folder), b"\xff\xfe\n"))
    return "claimed", "not a job id"


def _plant_ready_name(folder: Path, outside: Path) -> tuple[str, str]:
    (folder / ready_name(new_job_id(), 0)).mkdir()
    return "claimed", "not a job id"


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(_plant_file, id="file"),
        pytest.param(_plant_symlink, id="symlink-outside"),
        pytest.param(_plant_bad_name, id="bad-name"),
        pytest.param(_plant_non_utf8, id="non-utf8"),
        pytest.param(_plant_ready_name, id="ready-name"),
        pytest.param(
            _plant_dot_name,
            id="dot-name",
        ),
    ],
)
def test_bad_entry_in_an_owner_folder_is_quarantined_when_reaped(
    queue: Queue,
    owner: Owner,
    hand: Hand,
    outside: Path,
    plant: Callable[[Path, Path], tuple[str, str]],
) -> None:
    job_id = queue.enqueue("sample.echo")
    queue.serving.claim(owner.name)
    folder_name, why = plant(hand.dir(State.CLAIMED) / owner.name, outside)
    result = expire(queue, hand, owner)
    assert result["reverted"] == 1
    assert queue.job(job_id).state is State.READY
    assert hand.names(State.CLAIMED) == [], "the reaped owner's folder is gone once emptied"
    entry, note = one_note(hand)
    assert entry.startswith(f"reaping.{owner.name}.") or entry.startswith(f"{folder_name}.")
    assert f"why: {why}" in note


def test_healthy_owner_folder_is_not_searched(queue: Queue, owner: Owner, hand: Hand) -> None:
    (hand.dir(State.CLAIMED) / owner.name / "junk").write_text("x")
    queue.serving.sweep(now=hand.heartbeat_of(owner) + 1, is_alive=unknown_liveness)
    assert hand.names("quarantine") == []
    assert (hand.dir(State.CLAIMED) / owner.name / "junk").is_file()


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_file_or_symlink_in_claimed_is_quarantined(queue: Queue, hand: Hand, tmp_path: Path, kind: str) -> None:
    entry = hand.dir(State.CLAIMED) / "node7.4121.9f2c1a"
    if kind == "file":
        entry.write_text("{}")
    else:
        target = tmp_path / "elsewhere"
        target.mkdir()
        entry.symlink_to(target, target_is_directory=True)
    queue.serving.sweep(now=time.time(), is_alive=unknown_liveness)
    assert hand.names(State.CLAIMED) == []
    assert len(hand.quarantined()) == 1


# -- well-named job directories with a bad job.json --------------------------------------------


def _spec(document: Any) -> Callable[[Path, Path], None]:
    def write(job_dir: Path, outside: Path) -> None:
        data = document if isinstance(document, bytes) else json.dumps(document).encode()
        (job_dir / "job.json").write_bytes(data)

    return write


def _no_spec(job_dir: Path, outside: Path) -> None:
    pass


def _spec_symlink(job_dir: Path, outside: Path) -> None:
    (job_dir / "job.json").symlink_to(outside / "job.json")


def _spec_directory(job_dir: Path, outside: Path) -> None:
    (job_dir / "job.json").mkdir()


def _spec_fifo(job_dir: Path, outside: Path) -> None:
    os.mkfifo(job_dir / "job.json")


def _spec_huge(job_dir: Path, outside: Path) -> None:
    """A sparse job.json just over the limit: no disk blocks, so the test stays fast."""
    with open(job_dir / "job.json", "wb") as file:
        file.write(b'{"function": "sample.echo", "args": ["')
        file.truncate(MAX_SPEC_BYTES + 1)


BAD_SPECS: list[Any] = [
    pytest.param(_no_spec, r"job {id} has no job\.json; write it before publishing", id="missing"),
    pytest.param(_spec(b""), r"job\.json is not valid JSON", id="empty"),
    pytest.param(_spec(b'{"function": "sample.echo", '), r"job\.json is not valid JSON", id="truncated"),
    pytest.param(_spec(b"\xff\xfe\xfa\x00"), r"job\.json is not valid JSON", id="non-utf8"),
    pytest.param(_spec(["sample.echo"]), r"job\.json must hold a JSON object", id="array"),
    pytest.param(_spec({"args": [1]}), r'job\.json has no "function"', id="no-function"),
    pytest.param(_spec({"function": ""}), r'field "function" is empty', id="empty-function"),
    pytest.param(_spec({"function": 5}), r'field "function" must be str, got 5', id="function-int"),
    pytest.param(_spec({"function": "f", "args": {"a": 1}}), r'field "args" must be list', id="args-dict"),
    pytest.param(_spec({"function": "f", "kwargs": [1]}), r'field "kwargs" must be dict', id="kwargs-list"),
    pytest.param(_spec({"function": "f", "max_attempts": "3"}), r'"max_attempts" must be int', id="max-str"),
    pytest.param(_spec({"function": "f", "max_attempts": True}), r'"max_attempts" must be int', id="max-bool"),
    pytest.param(_spec({"function": "f", "max_attempts": 0}), r"max_attempts must be a whole number", id="max-0"),
    pytest.param(
        _spec({"function": "f", "timeout": -1}), r"timeout must be positive \(or 0 for no limit\)", id="timeout-neg"
    ),
    pytest.param(_spec({"function": "f", "backoff": "soon"}), r"backoff 'soon' is not one", id="backoff"),
    pytest.param(_spec({"function": "f", "backoff": 5}), r'field "backoff" must be str or null', id="backoff-int"),
    pytest.param(_spec(b'{"function": "f", "timeout": NaN}'), r"timeout is nan, and numbers must be finite", id="nan"),
    pytest.param(_spec({"function": "f", "priority": 500}), r"priority 500 is out of range", id="priority"),
    pytest.param(_spec({"function": "f", "metadata": [1]}), r'field "metadata" must be dict', id="metadata"),
    pytest.param(_spec({"function": "f", "created": "now"}), r'field "created" must be int or float', id="created"),
    pytest.param(
        _spec({"function": "f", "format": "2"}), r"job\.json has format '2'; this forkvisor reads", id="v-str"
    ),
    pytest.param(_spec({"function": "f", "id": JOB_ID}), rf"names id '{JOB_ID}' but sits in the folder of", id="id"),
    pytest.param(_spec_symlink, r"cannot read job\.json: Too many levels of symbolic links", id="symlink-outside"),
    pytest.param(_spec_directory, r"cannot read job\.json: not a regular file", id="directory"),
    pytest.param(_spec_fifo, r"cannot read job\.json: not a regular file", id="fifo"),
    pytest.param(_spec_huge, rf"cannot read job\.json: larger than {MAX_SPEC_BYTES} bytes", id="huge"),
]


def _via_claim(queue: Queue, hand: Hand, owner: Owner, write: Callable[[Path], None]) -> str:
    job_id = new_job_id()
    job_dir = hand.job_dir(hand.dir(State.READY), ready_name(job_id, 0), None)
    write(job_dir)
    good = queue.with_options(priority=-1).enqueue("sample.echo")
    assert [claim.job_id for claim in claim_all(queue, owner)] == [good]
    return job_id


def _via_promote_and_claim(queue: Queue, hand: Hand, owner: Owner, write: Callable[[Path], None]) -> str:
    job_id = new_job_id()
    job_dir = hand.job_dir(hand.dir(State.SCHEDULED), scheduled_name(job_id, 0, 1.0), None)
    write(job_dir)
    assert queue.serving.sweep(now=hand.heartbeat_of(owner), is_alive=unknown_liveness)["promoted"] == 1
    assert claim_all(queue, owner) == []
    return job_id


def _via_reap(queue: Queue, hand: Hand, owner: Owner, write: Callable[[Path], None]) -> str:
    job_id = new_job_id()
    job_dir = hand.job_dir(hand.dir(State.CLAIMED) / owner.name, job_id, None, attempts=1)
    (job_dir / "attempt-1").mkdir()
    write(job_dir)
    assert expire(queue, hand, owner)["reverted"] == 1
    return job_id


@pytest.mark.parametrize("route", [_via_claim, _via_promote_and_claim, _via_reap], ids=["claim", "promote", "reap"])
@pytest.mark.parametrize(("write", "message"), BAD_SPECS)
def test_job_with_a_bad_spec_goes_to_dead_saying_why(
    queue: Queue,
    owner: Owner,
    hand: Hand,
    outside: Path,
    route: Callable[[Queue, Hand, Owner, Callable[[Path], None]], str],
    write: Callable[[Path, Path], None],
    message: str,
) -> None:
    job_id = route(queue, hand, owner, lambda job_dir: write(job_dir, outside))
    assert hand.names(State.DEAD) == [job_id]
    assert hand.names(State.READY) == []
    assert hand.names(State.SCHEDULED) == []
    assert hand.names("quarantine") == [], "a well-named job is a job: dead, not quarantined"
    error = hand.error(job_id)
    assert error["reason"] == "invalid"
    assert re.search(message.format(id=job_id), error["message"]), error["message"]
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert job.error == error
    assert queue.counts()["dead"] == 1


@pytest.mark.parametrize("route", [_via_claim, _via_promote_and_claim, _via_reap], ids=["claim", "promote", "reap"])
def test_a_job_of_a_newer_format_is_left_for_a_newer_manager(
    queue: Queue, owner: Owner, hand: Hand, route: Callable[[Queue, Hand, Owner, Callable[[Path], None]], str]
) -> None:
    """A rolling upgrade enqueues jobs in a format older managers do not read: they must
    leave them in ready/ (no attempt used), never bury them."""
    newer = _spec({"function": "f", "format": 2})
    job_id = route(queue, hand, owner, lambda job_dir: newer(job_dir, job_dir))
    assert hand.names(State.READY) == [ready_name(job_id, 0)]
    assert hand.names(State.DEAD) == []
    assert hand.names("quarantine") == []
    assert queue.job(job_id).attempts <= 1, "no attempt was used by being left"
    fresh = Owner.new()
    queue.serving.register_owner(fresh)
    assert claim_all(queue, fresh) == [], "given back once, it is not looked at again by this queue"
    assert hand.names(State.READY) == [ready_name(job_id, 0)]


def test_claim_never_raises_on_a_folder_full_of_junk(queue: Queue, owner: Owner, hand: Hand, outside: Path) -> None:
    ready = hand.dir(State.READY)
    (ready / "notes.txt").write_text("x")
    (ready / ready_name(new_job_id(), 100)).symlink_to(outside, target_is_directory=True)
    hand.job_dir(ready, b"100.\xff\xfe", GOOD_SPEC)
    hand.job_dir(ready, "100.\n", GOOD_SPEC)
    dead = []
    for write, _ in [param.values for param in BAD_SPECS]:
        job_id = new_job_id()
        write(hand.job_dir(ready, ready_name(job_id, 50), None), outside)
        dead.append(job_id)
    good = [queue.enqueue("sample.echo", n) for n in range(2)]
    assert [claim.job_id for claim in claim_all(queue, owner)] == good
    assert hand.names(State.READY) == []
    assert hand.names(State.DEAD) == sorted(dead)
    assert len(hand.quarantined()) == 4
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 2,
        "done": 0,
        "dead": len(dead),
    }


def test_a_dead_invalid_job_can_be_fixed_and_retried(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id, _ = hand.ready_job(b"{oops")
    assert claim_all(queue, owner) == []
    assert queue.job(job_id).function == "?"
    with pytest.raises(InvalidJob, match=r"job\.json is not valid JSON"):
        queue.retry(job_id)
    assert hand.names(State.DEAD) == [job_id], "a job still invalid stays dead"
    (hand.dir(State.DEAD) / job_id / "job.json").write_text(json.dumps(GOOD_SPEC))
    queue.retry(job_id)
    [claim] = claim_all(queue, owner)
    assert (claim.job_id, claim.spec.args, claim.attempt) == (job_id, ("good",), 1)


# -- a bad attempts counter or owner file ------------------------------------------------------------


def _counter_symlink(job_dir: Path, outside: Path) -> None:
    (job_dir / "attempts").symlink_to(outside / "attempts")


def _counter_huge(job_dir: Path, outside: Path) -> None:
    (job_dir / "attempts").write_text("1" * 100)


def _counter_directory(job_dir: Path, outside: Path) -> None:
    (job_dir / "attempts").mkdir()


BAD_COUNTERS = pytest.mark.parametrize(
    "write", [_counter_symlink, _counter_huge, _counter_directory], ids=["symlink-outside", "too-long", "directory"]
)


@pytest.mark.parametrize("text", ["abc", "", "-4", "1.5"])
def test_unparsable_counter_buries_the_job_instead_of_granting_fresh_attempts(
    queue: Queue, owner: Owner, hand: Hand, text: str
) -> None:
    job_id, job_dir = hand.ready_job(GOOD_SPEC)
    (job_dir / "attempts").write_text(text)
    assert queue.job(job_id).attempts == 0  # a reader still shows the job
    assert claim_all(queue, owner) == []
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert job.error is not None
    assert job.error["reason"] == "invalid"
    assert "attempts counter" in job.error["message"]


@BAD_COUNTERS
def test_claim_of_a_job_with_a_bad_counter_buries_it(
    queue: Queue, owner: Owner, hand: Hand, outside: Path, write: Callable[[Path, Path], None]
) -> None:
    job_id, job_dir = hand.ready_job(GOOD_SPEC)
    write(job_dir, outside)
    assert claim_all(queue, owner) == []
    assert hand.names(State.DEAD) == [job_id]
    assert "attempts" in hand.error(job_id)["message"]


@BAD_COUNTERS
def test_sweep_of_a_job_with_a_bad_counter_buries_it(
    queue: Queue, owner: Owner, hand: Hand, outside: Path, write: Callable[[Path, Path], None]
) -> None:
    job_id = new_job_id()
    job_dir = hand.job_dir(hand.dir(State.CLAIMED) / owner.name, job_id, GOOD_SPEC)
    write(job_dir, outside)
    expire(queue, hand, owner)
    assert hand.names(State.CLAIMED) == []
    assert hand.names(State.DEAD) == [job_id]
    assert "attempts" in hand.error(job_id)["message"]


@BAD_COUNTERS
def test_views_of_a_job_with_a_bad_counter_do_not_raise(
    queue: Queue, hand: Hand, outside: Path, write: Callable[[Path, Path], None]
) -> None:
    job_id, job_dir = hand.ready_job(GOOD_SPEC)
    write(job_dir, outside)
    assert queue.job(job_id).state is State.READY
    assert [job.id for job in queue.jobs()] == [job_id]


@pytest.mark.parametrize("lease", ["60", None, [60]])
def test_owner_file_with_a_bad_lease_does_not_stop_the_sweep(queue: Queue, hand: Hand, lease: Any) -> None:
    name = "node7.4121.9f2c1a"
    folder = hand.dir(State.CLAIMED) / name
    folder.mkdir()
    (folder / ".owner.json").write_text(json.dumps({"name": name, "host": "node7", "pid": 4121, "lease": lease}))
    job_id = new_job_id()
    hand.job_dir(folder, job_id, GOOD_SPEC, attempts=1)
    now = time.time()
    hand.age(folder, 3600, now)
    hand.age(folder / ".owner.json", 3600, now)
    due, _ = hand.scheduled_job(GOOD_SPEC, due=now - 1)
    result = queue.serving.sweep(now=now, is_alive=unknown_liveness)
    assert result["promoted"] == 1, "the rest of the sweep still runs"
    assert queue.job(job_id).state is State.READY
    assert queue.job(due).state is State.READY


def test_owner_file_that_is_not_an_owner_counts_as_missing(queue: Queue, hand: Hand, outside: Path) -> None:
    name = "node7.4121.9f2c1a"
    folder = hand.dir(State.CLAIMED) / name
    folder.mkdir()
    (folder / ".owner.json").symlink_to(outside / "job.json")
    job_id = new_job_id()
    hand.job_dir(folder, job_id, GOOD_SPEC, attempts=1)
    now = time.time()
    assert queue.serving.sweep(now=now, is_alive=unknown_liveness)["reverted"] == 0
    hand.age(folder, 61, now)
    assert queue.serving.sweep(now=now, is_alive=unknown_liveness)["reverted"] == 1
    assert queue.job(job_id).state is State.READY


@pytest.mark.parametrize("route", ["planted-in-owner-folder", "submitted-by-hand"])
def test_reap_never_writes_through_a_symlinked_attempt_folder(
    queue: Queue, owner: Owner, hand: Hand, tmp_path: Path, route: str
) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    if route == "planted-in-owner-folder":
        job_dir = hand.job_dir(hand.dir(State.CLAIMED) / owner.name, new_job_id(), GOOD_SPEC, attempts=1)
        (job_dir / "attempt-1").symlink_to(target, target_is_directory=True)
    else:
        _, job_dir = hand.ready_job(GOOD_SPEC)
        (job_dir / "attempt-999999999").symlink_to(target, target_is_directory=True)
        assert len(claim_all(queue, owner)) == 1
    assert expire(queue, hand, owner)["reverted"] == 1
    assert os.listdir(target) == []


# -- submitting by hand, as docs/FORMAT.md says -------------------------------------------------


def test_job_submitted_by_hand_is_claimable(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-123456-" + os.urandom(4).hex()
    staging = queue.path / "tmp" / job_id
    os.mkdir(staging, 0o700)
    (staging / "job.json").write_text('{"function": "sample.echo", "args": [2, 3]}\n')
    os.rename(staging, queue.path / "ready" / f"100.{job_id}")
    [claim] = claim_all(queue, owner)
    assert claim.job_id == job_id
    assert claim.spec.function == "sample.echo"
    assert claim.spec.args == (2, 3)
    assert claim.spec.kwargs == {}
    assert (claim.policy.max_attempts, claim.policy.timeout, claim.spec.priority) == (3, None, 0)
    assert (claim.run, claim.attempt) == (1, 1)
    queue.serving.complete(claim)
    assert queue.job(job_id).state is State.DONE


def test_job_submitted_by_hand_takes_the_queue_defaults(queue: Queue, owner: Owner, hand: Hand) -> None:
    queue.configure(max_attempts=7, timeout=9.5)
    job_id, _ = hand.ready_job({"function": "sample.echo"})
    [claim] = claim_all(Queue(queue.path, create=False), owner)
    assert (claim.job_id, claim.policy.max_attempts, claim.policy.timeout) == (job_id, 7, 9.5)
    assert (claim.spec.max_attempts, claim.spec.timeout) == (None, None)


def test_the_documented_job_json_example(queue: Queue, owner: Owner, hand: Hand) -> None:
    example = {
        "format": 1,
        "function": "tasks.thumbnail",
        "args": ["a.png"],
        "kwargs": {"width": 320},
        "max_attempts": 5,
        "timeout": 60,
        "priority": 0,
        "memory_limit": None,
        "created": 1795430400.0,
        "metadata": {},
    }
    job_id, _ = hand.ready_job(example)
    [claim] = claim_all(queue, owner)
    spec = claim.spec
    assert spec.id == job_id
    assert (spec.function, spec.args, spec.kwargs) == ("tasks.thumbnail", ("a.png",), {"width": 320})
    assert (spec.max_attempts, spec.timeout, spec.memory_limit, spec.created) == (5, 60, None, 1795430400.0)


def test_job_scheduled_by_hand_is_promoted_when_due(queue: Queue, hand: Hand) -> None:
    now = time.time()
    job_id, _ = hand.scheduled_job({"function": "sample.echo", "priority": 5}, due=now + 10, priority=5)
    assert queue.serving.sweep(now=now, is_alive=unknown_liveness)["promoted"] == 0
    assert queue.serving.sweep(now=now + 10.001, is_alive=unknown_liveness)["promoted"] == 1  # DUE is rounded up to ms
    assert hand.names(State.READY) == [f"095.{job_id}"]
