"""Decisions the mutation tool (`python -m tests.mutation.run`) found no test for: each is a
way to run a job once too often, or to lose one, and each is checked here through the
queue's own calls on a real folder.

- A claim looks at a ready job's cancel marker and its counter before it counts a run: a
  job cancelled while it waited, or whose attempts are all used (its last owner died
  after counting), is buried, not run; one attempt left still runs.
- A run released by a drain goes back uncounted, unless its job was cancelled meanwhile.
- An owner file is believed only with a positive lease (with a lease of 0 a live manager
  would be expired at once and its jobs run twice) and fields of the right types; an
  owner's name says its host, and fits the owner pattern whatever the host is called."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobs import (
    CANCEL_FILE,
    DRAIN,
    Cause,
    Claim,
    ClaimLost,
    Functions,
    InvalidJob,
    Owner,
    Paused,
    Queue,
    Reason,
    Registry,
    RunEnd,
    State,
    files,
    new_job_id,
    unknown_liveness,
)
from jobs.job import ready_name
from jobs.lease import _OWNER_RE as OWNER_NAME
from tests.processes import REPO
from tests.users import OWNER, as_user, why_no_users

from .conftest import Hand
from .test_transitions import claim_one


def _drained(exited_ok: bool = False) -> RunEnd:
    outcome = {"run": 1, "released": None, "succeeded": None, "wall_time": 0.01}
    return RunEnd(exited_ok, DRAIN, False, False, {"type": "Crashed", "message": "stopped"}, outcome)


def test_a_ready_job_cancelled_while_it_waited_is_buried_at_claim(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    (hand.dir(State.READY) / f"100.{job_id}" / CANCEL_FILE).write_text("cancelled\n")
    assert queue.serving.claim(owner.name) is None
    assert hand.error(job_id)["reason"] == "cancelled"
    assert hand.names(State.CLAIMED) == [owner.name]
    assert not (hand.dir(State.CLAIMED) / owner.name / job_id).exists(), "nothing of it ran"


@pytest.mark.parametrize(("used", "runs"), [(2, True), (3, False), (4, False)])
def test_a_claim_runs_a_job_only_while_it_has_attempts_left(
    queue: Queue, owner: Owner, hand: Hand, used: int, runs: bool
) -> None:
    job_id = queue.with_options(max_attempts=3).enqueue("sample.echo")
    (hand.dir(State.READY) / f"100.{job_id}" / "attempts").write_text(f"{used}\n")
    claim = queue.serving.claim(owner.name)
    assert (claim is not None) is runs
    if runs:
        assert claim is not None
        assert claim.attempt == used + 1 == queue.job(job_id).attempts
        return
    assert hand.error(job_id)["reason"] == "attempts exhausted"
    assert queue.job(job_id).attempts == used, "a job buried at claim is not counted once more"


def test_a_drained_run_of_a_job_cancelled_meanwhile_is_buried(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.with_options(max_attempts=3).enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.path / CANCEL_FILE).write_text("cancelled\n")
    finished = queue.serving.finish(claim, _drained())
    assert finished.state is State.DEAD is queue.job(job_id).state
    assert hand.error(job_id)["reason"] == "cancelled"


def test_a_drained_run_goes_back_uncounted(queue: Queue, owner: Owner) -> None:
    job_id = queue.with_options(max_attempts=3).enqueue("sample.echo")
    assert queue.serving.finish(claim_one(queue, owner), _drained()).state is State.READY
    assert queue.job(job_id).attempts == 0


def _owner_folder(hand: Hand, lease: float, beat_age: float, now: float) -> str:
    """An owner folder of a live-looking manager whose owner file says `lease`, its heartbeat
    `beat_age` seconds old; one claimed job in it. The job's id."""
    name = "node7.4121.9f2c1a"
    folder = hand.dir(State.CLAIMED) / name
    folder.mkdir()
    owner = {"name": name, "host": "node7", "pid": 4121, "lease": lease, "started": now - 10}
    (folder / ".owner.json").write_text(json.dumps(owner))
    job_id, _ = hand.ready_job({"function": "sample.echo"})
    (hand.dir(State.READY) / f"100.{job_id}").rename(folder / job_id)
    (folder / job_id / "attempts").write_text("1\n")
    hand.age(folder / ".owner.json", beat_age, now)
    return job_id


@pytest.mark.parametrize("lease", [0, -5])
def test_an_owner_file_without_a_positive_lease_does_not_expire_its_owner(
    queue: Queue, hand: Hand, lease: float
) -> None:
    now = time.time()
    job_id = _owner_folder(hand, lease, beat_age=1.0, now=now)
    assert queue.serving.sweep(now=now, is_alive=unknown_liveness)["reverted"] == 0
    assert queue.job(job_id).state is State.CLAIMED, "a fresh owner folder is a registration in progress"


def test_an_owner_file_with_a_lease_under_a_second_is_believed(queue: Queue, hand: Hand) -> None:
    now = time.time()
    job_id = _owner_folder(hand, 0.5, beat_age=5.0, now=now)
    assert queue.serving.sweep(now=now, is_alive=unknown_liveness)["reverted"] == 1, "its heartbeat is 10 leases old"
    assert queue.job(job_id).state is State.READY


@pytest.mark.parametrize(
    "field",
    [{"host": 7}, {"name": 7}, {"pid": 4121.0}, {"pid": True}, {"concurrency": 2.0}, {"concurrency": "2"}],
)
def test_an_owner_file_with_a_field_of_the_wrong_type_is_not_believed(field: dict[str, object]) -> None:
    document = {"name": "node7.4121.9f2c1a", "host": "node7", "pid": 4121, "lease": 30, "started": 1.0, **field}
    with pytest.raises(InvalidJob, match="wrong type"):
        Owner.from_json(json.dumps(document).encode())


def test_an_owner_file_is_written_as_docs_format_shows_it_byte_for_byte() -> None:
    """Other hosts' sweepers, older and newer, read it: its bytes are part of the format."""
    shown = (REPO / "docs" / "FORMAT.md").read_text().split("```json owner-file\n")[1].split("```")[0]
    owner = Owner(**json.loads(shown))
    assert owner.to_json().decode() == shown
    assert Owner.from_json(shown.encode()) == owner


def test_a_cause_and_a_run_s_end_are_values_no_holder_can_change() -> None:
    """The manager decodes a run's end once and the store decides from it; a cause is
    written as error.json and logged: neither may change on the way."""
    cause = Cause(Reason.INVALID, "bad job.json")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cause.message = "other"  # type: ignore[misc]
    end = _drained()
    with pytest.raises(dataclasses.FrozenInstanceError):
        end.stop = None  # type: ignore[misc]


def test_an_owner_is_a_value_no_holder_can_change() -> None:
    """The sweeper, the reaper and `status` share the owners they read: none may change one."""
    owner = Owner.new()
    with pytest.raises(dataclasses.FrozenInstanceError):
        owner.lease = 0.0  # type: ignore[misc]
    assert {owner, dataclasses.replace(owner)} == {owner}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
@pytest.mark.parametrize(("hostname", "start"), [("node_7.example", "node-7-example."), ("h" * 64, "h" * 64 + ".")])
def test_an_owner_s_name_says_its_host_and_fits_the_pattern(hostname: str, start: str) -> None:
    """In a UTS namespace of its own, with the host name set: the owner's folder name starts
    with the name, made safe and cut to 64 characters, and is a valid owner name."""
    code = "from jobs import Owner; print(Owner.new().name)"
    script = f'printf %s "$1" > /proc/sys/kernel/hostname && exec "$2" -c "{code}"'  # hostname(1) refuses "_"
    done = subprocess.run(
        ["unshare", "--uts", "sh", "-c", script, "-", hostname, sys.executable],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    name = done.stdout.strip()
    assert name.startswith(start), name
    assert OWNER_NAME.fullmatch(name), name


def test_a_submission_whose_key_is_held_is_buried_saying_by_whom(queue: Queue, hand: Hand) -> None:
    """Two submissions in incoming/ of one key: the first taken in holds it, the second is
    dead at once (`fate.duplicate`), its error naming the holder."""
    first = hand.submission({"function": "sample.echo", "key": "k"}, new_job_id(time.time() + 5))
    second = hand.submission({"function": "sample.echo", "key": "k"}, new_job_id(time.time() + 6))
    assert queue.serving.take_in() == 2
    assert queue.job(first).state is State.READY
    error = hand.error(second)
    assert error["reason"] == "duplicate key"
    assert f"is held by job {first}, which is not finished" in error["message"]


def test_a_manager_resumed_past_its_lease_puts_no_result_in_the_job_another_runs(queue: Queue, hand: Hand) -> None:
    """Stopped (SIGSTOP) past its lease, a manager resumes and completes its run: the job was
    reaped and claimed again meanwhile, so its completion is refused (ClaimLost), and the
    job the other manager runs gets no result.json from the stale run (the chaos run's find)."""
    first = hand.owner()
    job_id = queue.enqueue("sample.echo")
    stale = claim_one(queue, first)
    (stale.run_path / "result.json").write_text('"stale"\n')
    taken: list[Claim] = []

    def reaped_and_claimed_again(point: str) -> None:  # while the first stood still, its job folder open
        if point == "complete:opened" and not taken:
            queue.serving.sweep(now=hand.expired_now(first), is_alive=unknown_liveness)
            taken.append(claim_one(queue, hand.owner(Owner.new(pid=os.getpid() + 1))))

    files.checkpoint_hook = reaped_and_claimed_again
    try:
        with pytest.raises(ClaimLost):
            queue.serving.complete(stale)
    finally:
        files.checkpoint_hook = None
    assert taken, "the interleaving happened"
    assert not (taken[0].path / "result.json").exists(), "the stale run's result is not in the job"
    assert not (taken[0].path / ".result.json.link").exists(), "nor the link it staged"
    assert queue.job(job_id).state is State.CLAIMED


# -- a claim, as a value; what a claimer keeps of the entries it cannot claim ---------------


def test_a_claim_is_a_value_its_handle_aside(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "queue")
    assert queue.serving.more_to_examine is False  # a claimer that has not claimed has nothing left over
    queue.enqueue("tests.sample_jobs.add", 1, 2)
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        claim.run = 2  # type: ignore[misc]  # the manager, its child and its harvest share it
    with queue.serving.folder.at(State.CLAIMED).sub(owner.name) as owned:  # a handle of its own
        again = dataclasses.replace(claim, place=owned / claim.job_id)
        assert again == claim  # the same claim, however its folder was reached
    assert "place" not in repr(claim)


def _owners_queue(open_dir: Path, script: str) -> Path:
    """A folder of fvowner's holding its queue, made by `script` run as fvowner."""
    if (why := why_no_users()) is not None:
        pytest.skip(why)
    home = open_dir / "owner"
    home.mkdir()
    owner_ids = pwd.getpwnam(OWNER)
    os.chown(home, owner_ids.pw_uid, owner_ids.pw_gid)
    made = subprocess.run([*as_user(OWNER), sys.executable, "-c", script, home / "queue"], **RUN)
    assert made.returncode == 0, made.stderr
    return home


UNMOVABLE = 150  # folders of root's in the owner's ready/: moving a folder writes its `..`, which the owner may not


def test_a_claimer_keeps_why_for_100_entries_it_cannot_move_and_forgets_those_gone(open_dir: Path) -> None:
    home = _owners_queue(open_dir, MAKE)
    names = sorted(ready_name(new_job_id(), 0) for _ in range(UNMOVABLE))
    for name in names:
        (home / "queue/ready" / name).mkdir(mode=0o755)  # root's
    argv = [*as_user(OWNER), sys.executable, "-c", CLAIM_TWICE, str(home / "queue")]
    with subprocess.Popen(argv, **PIPES) as claimer:
        assert claimer.stdin is not None
        assert claimer.stdout is not None
        first = json.loads(claimer.stdout.readline())
        assert first == names[:100], "the first 100 entries it could not move, and no more, are kept with why"
        for name in names[:60]:
            (home / "queue/ready" / name).rmdir()
        claimer.stdin.write("go on\n")
        claimer.stdin.flush()
        second = json.loads(claimer.stdout.readline())
        assert second == names[60:100], "entries gone since its last scan are forgotten at its next"


RUN: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60, "cwd": REPO}
PIPES: dict[str, Any] = {
    "stdin": subprocess.PIPE,
    "stdout": subprocess.PIPE,
    "stderr": subprocess.DEVNULL,
    "text": True,
}
PIPES["cwd"] = REPO
MAKE = "import sys; from jobs import Queue; Queue(sys.argv[1])"
CLAIM_TWICE = """
import json, sys, time
from jobs import Owner, Queue
queue = Queue(sys.argv[1], create=False)
owner = Owner.new()
queue.serving.register_owner(owner)
def skipped():
    while queue.serving.claim(owner.name) is None and queue.serving.more_to_examine:
        pass
    return sorted(queue.serving.unclaimable)
print(json.dumps(skipped()), flush=True)
sys.stdin.readline()
deadline = time.monotonic() + 10  # its next scan comes once the last is old next to its cost
while len(kept := skipped()) == 100 and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps(kept), flush=True)
"""


def test_a_job_that_cannot_be_counted_after_its_move_goes_back_to_ready(open_dir: Path) -> None:
    """A PermissionError after the claim's move (here its counter, root's in a sticky folder
    of root's, cannot be replaced by the owner) puts the job back where it was."""
    home = _owners_queue(open_dir, ENQUEUE)
    (name,) = os.listdir(home / "queue/ready")
    job = home / "queue/ready" / name
    (job / "attempts").write_text("0\n")
    for path in job.iterdir():
        os.chown(path, 0, 0)
        path.chmod(0o644)  # readable: the job is valid, only its counter cannot be replaced
    os.chown(job, 0, 0)
    job.chmod(0o1777)  # the owner may move it and write in it, but not replace root's files there
    claimed = subprocess.run([*as_user(OWNER), sys.executable, "-c", CLAIM_ONE, home / "queue"], **RUN)
    assert claimed.returncode == 0, claimed.stderr
    assert json.loads(claimed.stdout) == {"claim": None, "unclaimable": [name]}
    assert os.listdir(home / "queue/ready") == [name], "the job is back where it was"
    assert [os.listdir(owner) for owner in (home / "queue/claimed").iterdir()] == [[".owner.json"]]


ENQUEUE = "import sys; from jobs import Queue; Queue(sys.argv[1]).enqueue('tests.sample_jobs.add', 1, 2)"
CLAIM_ONE = """
import json, sys
from jobs import Owner, Queue
queue = Queue(sys.argv[1], create=False)
owner = Owner.new()
queue.serving.register_owner(owner)
claim = queue.serving.claim(owner.name)
print(json.dumps({"claim": claim and claim.job_id, "unclaimable": sorted(queue.serving.unclaimable)}))
"""


# -- what a claim does besides running a job --------------------------------------------


def test_a_claim_is_held_until_a_sweeper_takes_it_back(queue: Queue, owner: Owner) -> None:
    queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    assert queue.serving.claim_state(claim) == (True, False, False)
    queue.cancel(claim.job_id)
    assert queue.serving.claim_state(claim) == (True, True, False)
    queue.serving.sweep(time.time() + 10_000, lambda found: False)  # its owner is dead
    assert queue.serving.claim_state(claim) == (False, False, False)


def test_a_job_of_a_paused_function_is_given_back_as_it_was(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id = queue.enqueue("sample.echo")
    assert queue.serving.claim(owner.name, paused=Paused(functions=frozenset({"sample.echo"}))) is None
    assert hand.names(State.READY) == [f"100.{job_id}"]
    assert os.listdir(hand.dir(State.CLAIMED) / owner.name) == [".owner.json"]
    assert queue.serving.left_for_others == {}  # paused here, not left for another manager


def test_a_job_written_into_ready_with_a_dead_dependency_is_buried_at_claim(
    queue: Queue, owner: Owner, hand: Hand
) -> None:
    parent = queue.enqueue("sample.echo")
    queue.cancel(parent)
    job_id, _ = hand.ready_job({"function": "sample.echo", "depends_on": [parent]})
    assert queue.serving.claim(owner.name) is None
    assert queue.job(job_id).state is State.DEAD
    assert parent in queue.job(job_id).error["message"]


def test_a_run_folder_s_number_passes_a_file_of_its_name(queue: Queue, owner: Owner, hand: Hand) -> None:
    job_id, path = hand.ready_job({"function": "sample.echo"})
    (path / "attempt-1").write_text("not a run folder")  # a file: not counted as a run, but in the way
    claim = claim_one(queue, owner)
    assert (claim.job_id, claim.run) == (job_id, 2)


def test_a_job_given_back_onto_a_copy_of_itself_is_quarantined_not_lost(
    queue: Queue, owner: Owner, hand: Hand, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = queue.enqueue("other.function")
    name = f"100.{job_id}"

    def copy_back(point: str) -> None:  # another copy of the job lands in ready/ while it is claimed
        if point == "claim:moved":
            shutil.copytree(hand.dir(State.CLAIMED) / owner.name / job_id, hand.dir(State.READY) / name)

    monkeypatch.setattr(files, "checkpoint_hook", copy_back)
    assert queue.serving.claim(owner.name, functions=Functions(Registry())) is None
    assert hand.names(State.READY) == [name]
    why = [entry for entry in hand.names("quarantine") if entry.endswith(".why")]
    assert len(why) == 1
    assert "twice" in (hand.dir("quarantine") / why[0]).read_text()


# -- what a job leaves where its manager records (the job may write its run folder) --------


def test_an_outcome_is_recorded_past_a_folder_the_job_made_in_its_place(queue: Queue, owner: Owner, hand: Hand) -> None:
    queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.run_path / "outcome.json").mkdir()
    queue.serving.record_outcome(claim, {"run": claim.run, "status": "exited 0"})
    assert json.loads((claim.run_path / "outcome.json").read_text())["status"] == "exited 0"
    assert any(name.endswith(".why") for name in hand.names("quarantine")), "the folder is kept aside, with why"


@pytest.mark.parametrize("replaced", ["removed", "a link", "a file"])
def test_an_outcome_is_recorded_in_a_fresh_folder_when_the_job_replaced_its_own(
    queue: Queue, owner: Owner, hand: Hand, tmp_path: Path, replaced: str
) -> None:
    queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    shutil.rmtree(claim.run_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if replaced == "a link":
        claim.run_path.symlink_to(elsewhere)
    elif replaced == "a file":
        claim.run_path.write_text("not a folder")
    queue.serving.record_outcome(claim, {"run": claim.run, "status": "exited 1"})
    assert claim.run_path.is_dir()
    assert not claim.run_path.is_symlink()
    assert json.loads((claim.run_path / "outcome.json").read_text())["status"] == "exited 1"
    assert os.listdir(elsewhere) == [], "nothing is written where a link points"
    kept = [name for name in hand.names("quarantine") if not name.endswith(".why")]
    assert len(kept) == (0 if replaced == "removed" else 1)


def test_a_done_job_s_result_is_its_last_run_s_past_a_folder_or_a_stale_file(
    queue: Queue, owner: Owner, hand: Hand
) -> None:
    first_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.path / "result.json").mkdir()  # in the way of the link
    (claim.run_path / "result.json").write_text('"first"\n')
    queue.serving.complete(claim)
    assert queue.job(first_id).result == "first"
    second_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.path / "result.json").write_text('"a lost run\'s"\n')  # what a lost run left; this run left none
    queue.serving.complete(claim)
    assert not (hand.dir(State.DONE) / second_id / "result.json").exists(), "no result but its own run's"


def test_a_completion_passes_the_staged_link_an_earlier_one_left(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    (claim.path / ".result.json.link").write_text('"a completion cut short"\n')
    (claim.run_path / "result.json").write_text('"this run"\n')
    queue.serving.complete(claim)
    assert queue.job(job_id).result == "this run"


def test_a_ready_job_already_in_its_claimer_s_folder_is_quarantined_not_claimed_twice(
    queue: Queue, owner: Owner, hand: Hand
) -> None:
    job_id, path = hand.ready_job({"function": "sample.echo"})
    shutil.copytree(path, hand.dir(State.CLAIMED) / owner.name / job_id)
    assert queue.serving.claim(owner.name) is None
    assert hand.names(State.READY) == []
    why = [name for name in hand.names("quarantine") if name.endswith(".why")]
    assert len(why) == 1
    assert "already in claimed" in (hand.dir("quarantine") / why[0]).read_text()


# -- what moves under a claim between its steps (another manager, a sweeper, the job) ---------


def test_a_job_whose_parent_ends_while_it_is_sent_to_wait_does_not_wait(
    queue: Queue, owner: Owner, hand: Hand, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job written into ready/ before its parent ended is sent to waiting/; the parent ends
    (done, its dependents settled, by another manager) after the edge is written and before
    the move: the parent's settler finds no one waiting, so the claim's own settle after the
    move must see the parent done and make the job ready, not leave it waiting for ever."""
    parent = queue.enqueue("sample.echo")
    other = Queue(queue.path)
    parent_claim = claim_one(other, hand.owner())
    job_id, _ = hand.ready_job({"function": "sample.echo", "depends_on": [parent]})

    def parent_ends(point: str) -> None:
        if point == "claim:edges-written":
            (parent_claim.run_path / "result.json").write_text('"parent"\n')
            other.serving.complete(parent_claim)
            other.serving.settle_dependents(parent)

    monkeypatch.setattr(files, "checkpoint_hook", parent_ends)
    claim = queue.serving.claim(owner.name)
    assert queue.job(parent).state is State.DONE
    assert claim is not None, f"the job waits: {queue.job(job_id).state}"
    assert claim.job_id == job_id


def test_a_job_buried_at_claim_after_a_sweeper_took_it_back_is_left_to_the_sweeper(
    queue: Queue, owner: Owner, hand: Hand, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claimer stands still between judging a cancelled job dead and burying it; a sweeper
    reaps the claimer meanwhile (its lease ran out) and buries the job itself. The claim
    finds the job gone: it claims nothing and raises nothing, and the job is dead once."""
    job_id = queue.enqueue("sample.echo")
    (hand.dir(State.READY) / f"100.{job_id}" / CANCEL_FILE).write_text("cancelled\n")
    real_move = files.move
    sweeps: list[dict[str, Any]] = []

    def reaped_before_the_bury(src: str, dst: str, **handles: int | None) -> None:
        folder = handles.get("dst_dir_fd")
        into = os.readlink(f"/proc/self/fd/{folder}") if folder is not None else os.path.dirname(dst)
        if os.path.basename(into) == State.DEAD.value and not sweeps:
            sweeps.append({})  # (the sweeper's own moves pass through here too)
            sweeps[0] = queue.serving.sweep(now=hand.expired_now(owner), is_alive=unknown_liveness)
        real_move(src, dst, **handles)

    monkeypatch.setattr(files, "move", reaped_before_the_bury)
    assert queue.serving.claim(owner.name) is None
    assert sweeps[0]["expired"] == 1, f"the sweeper reaped the claimer mid-bury: {sweeps}"
    assert queue.job(job_id).state is State.DEAD
    assert hand.error(job_id)["reason"] == "cancelled"


@pytest.mark.parametrize("swap", ["a link to a file of the manager", "a folder", "removed"])
def test_a_result_changed_between_its_check_and_its_link_is_not_taken(
    queue: Queue, owner: Owner, hand: Hand, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """The run's result.json is a regular file when the completion looks, and the job (or
    what it left running) replaces it before the link: by a link to a file only the manager
    may read (the result must not become that file), or by nothing. Either way the job is
    done without a result: the run left none that stayed a regular file."""
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    result = claim.run_path / "result.json"
    result.write_text('"mine"\n')
    secret = tmp_path / "secret.json"
    secret.write_text('"the manager\'s secret"\n')

    def swapped(point: str) -> None:
        if point == "complete:result-checked":
            result.unlink()
            if swap == "a folder":
                result.mkdir()
            elif swap != "removed":
                result.symlink_to(secret)

    monkeypatch.setattr(files, "checkpoint_hook", swapped)
    queue.serving.complete(claim)
    done = hand.dir(State.DONE) / job_id
    assert queue.job(job_id).state is State.DONE
    assert sorted(os.listdir(done)) == ["attempt-1", "attempts", "events", "job.json"], "no result, nor a link staged"
    assert queue.job(job_id).result is None


def test_a_claim_makes_durable_only_its_count(queue: Queue, owner: Owner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim's barriers: the run's count is on disk before the job runs; the claim's
    rename and the run's `policy.json` are not synced (after a power cut the job is ready
    again, or the sweeper resolves the policy anew). A barrier more is a cost on every job."""
    queue.enqueue("sample.echo")
    written: list[tuple[str, bool]] = []
    for name in ("write_new", "replace_file"):
        real = getattr(files, name)

        def spy(path: Any, data: bytes, *, durable: bool, real: Any = real, **rest: Any) -> Any:
            written.append((os.path.basename(os.fspath(path)), durable))
            return real(path, data, durable=durable, **rest)

        monkeypatch.setattr(files, name, spy)
    claim_one(queue, owner)
    files_named = [(name, durable) for name, durable in written if not name.startswith(".")]  # (not the staged)
    assert sorted(files_named) == [("attempts", True), ("policy.json", False)]


def test_a_claim_not_staged_is_counted_and_its_run_made_before_it_returns(queue: Queue, owner: Owner) -> None:
    """A claim that no gate waits on (a plain queue's, a spawned command's) is counted, and its
    run folder made, when it returns: only a staged claim leaves that to `commit_counts`,
    and a claim taken for staged would have its count looked for where none was staged."""
    job_id = queue.enqueue("sample.echo")
    claim = claim_one(queue, owner)
    assert claim.job_id == job_id
    assert claim.counted
    assert (claim.path / "attempts").read_text() == "1\n"
    assert claim.run_path.is_dir()


def test_a_lone_claimer_has_lost_no_race_and_found_no_name_gone(queue: Queue, owner: Owner) -> None:
    """What the stats add up per manager starts at nothing: a claimer alone on its queue
    loses no race and finds no name its index gave gone, however many it claims."""
    for n in range(3):
        queue.enqueue("sample.echo", n)
    for _ in range(3):
        claim_one(queue, owner)
    assert (queue.serving.races, queue.serving.gone) == (0, 0)


def test_a_name_taken_before_the_claimer_looked_is_counted_gone_not_a_race(queue: Queue, owner: Owner) -> None:
    """Its index gave a name another manager had claimed since the last scan: the claimer
    finds it gone when it looks, tries no rename, and counts it apart (`gone`) from a race
    lost between its look and its rename (`races`), as the many-managers figures read them."""
    first, second = queue.enqueue("sample.echo", 1), queue.enqueue("sample.echo", 2)
    assert claim_one(queue, owner).job_id == first  # (its index has both names now)
    other = Owner.new()
    queue.serving.register_owner(other)
    os.rename(queue.job(second).path, queue.path / "claimed" / other.name / second)  # another manager's claim
    assert queue.serving.claim(owner.name) is None
    assert (queue.serving.races, queue.serving.gone) == (0, 1)


def test_a_claim_lost_between_its_look_and_its_rename_is_one_race(
    queue: Queue, owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry was there when the claimer looked, gone at its rename (another manager's
    claim came between): one race lost, counted once, and no claim."""
    job_id = queue.enqueue("sample.echo")
    other = Owner.new()
    queue.serving.register_owner(other)
    real_move = files.move

    def taken_first(src: str, dst: str, **handles: int | None) -> None:
        if str(src).endswith(job_id) and not (queue.path / "claimed" / other.name / job_id).exists():
            os.rename(queue.job(job_id).path, queue.path / "claimed" / other.name / job_id)
        real_move(src, dst, **handles)

    monkeypatch.setattr(files, "move", taken_first)
    assert queue.serving.claim(owner.name) is None
    assert (queue.serving.races, queue.serving.gone) == (1, 0)


def test_a_staged_claim_leaves_its_counts_barrier_to_the_commit(
    queue: Queue, owner: Owner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable manager's claims of one turn share their barriers (group commit): each
    staged count is written without its fsync, and the commit syncs them all before any
    is put in place. A staged count synced at once is a barrier more per job."""
    queue.enqueue("sample.echo")
    written: list[bool] = []
    real_write = files.write_new

    def spy(path: Any, data: bytes, *, durable: bool, **rest: Any) -> Any:
        if "attempts" in os.fspath(path):
            written.append(durable)
        return real_write(path, data, durable=durable, **rest)

    monkeypatch.setattr(files, "write_new", spy)
    claim = queue.serving.claim(owner.name, staged=True)
    assert claim is not None
    assert not claim.counted
    assert written == [False], "the staged count is written once, unsynced"
    assert queue.serving.commit_counts([claim]) == [None]
    assert (claim.path / "attempts").read_text() == "1\n"
