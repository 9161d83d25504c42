"""A member of a shared queue gets the right to submit, and nothing more (issue 18, classes
"configuration written by members", "members acting on each other and on the fleet").

Real users (tests/security/conftest.py): fvowner owns the queue and runs its manager;
fvalice and fvbob are members of its group; fveve is not. Each attack is made as a user
would make it, with the real CLI or plain file operations, and must fail; after each,
every job is in exactly one place and none is lost."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jobs import Queue, State, new_job_id
from tests.jobs_processes import invariants
from tests.processes import APP, APP_PATH, FAST_CLI, Processes, wait_until
from tests.security.conftest import ALICE, BOB, EVE, OWNER, as_user, python_as, run_as

ENQUEUE = (
    "import sys; from jobs import Queue; print(Queue(sys.argv[1], create=False).enqueue(sys.argv[2], *sys.argv[3:]))"
)


def _submit(user: str, queue: Path, *args: str) -> str:
    done = python_as(user, ENQUEUE, queue, "sample.ok", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _manager(procs: Processes, queue: Path) -> subprocess.Popen[bytes]:
    return procs.forkvisor("run", str(queue), "--app", APP, *APP_PATH, *FAST_CLI, prefix=as_user(OWNER))


def _stop(procs: Processes, manager: subprocess.Popen[bytes]) -> None:
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 20, "the owner's manager") == 0, procs.log(manager)


def _state(queue: Path, job_id: str) -> State:
    return Queue(queue, create=False).job(job_id).state


def _folder(queue: Path, user: str) -> Path:
    """`user`'s own folder of incoming/, where their submissions go."""
    return queue / "incoming" / str(pwd.getpwnam(user).pw_uid)


def _as_shell(user: str, script: str) -> subprocess.CompletedProcess[str]:
    """A shell command as `user`: what a member can do with plain file operations."""
    return subprocess.run([*as_user(user), "sh", "-c", script], capture_output=True, text=True, timeout=30)


def test_a_member_submits_reads_results_and_is_recorded_as_the_submitter(procs: Processes, shared_queue: Path) -> None:
    job_id = _submit(ALICE, shared_queue, "from alice")
    assert os.listdir(shared_queue / "incoming") == [_folder(shared_queue, ALICE).name], "a member writes incoming/"
    assert os.listdir(_folder(shared_queue, ALICE)) == [f"{job_id}.json"], "only, into a folder of their own"
    assert _state(shared_queue, job_id) is State.INCOMING
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, job_id) is State.DONE, 20, "the owner's manager ran alice's job")
    _stop(procs, manager)
    shown = run_as(ALICE, "show", shared_queue, job_id, "--json")
    assert shown.returncode == 0, shown
    assert json.loads(shown.stdout)["result"]["value"] == "from alice", "a member reads results"
    spec = json.loads((shared_queue / "done" / job_id / "job.json").read_text())
    assert spec["submitted_by"]["uid"] == int(subprocess.check_output(["id", "-u", ALICE]))
    assert os.stat(shared_queue / "done" / job_id).st_uid == os.stat(shared_queue).st_uid, "the owner's folder"
    invariants.check_invariants(shared_queue, [job_id])


def test_a_member_cannot_claim_to_be_someone_else(procs: Processes, shared_queue: Path) -> None:
    forged = json.dumps({"function": "sample.ok", "args": ["forged"], "submitted_by": {"uid": 0, "user": "root"}})
    mine = _folder(shared_queue, BOB)
    job_id = new_job_id(time.time() + 5)  # dated ahead, as a member's ids are (jobs.incoming)
    script = f"mkdir -m 770 {mine} && printf '%s' '{forged}' > {mine}/.x.tmp && mv {mine}/.x.tmp {mine}/{job_id}.json"
    done = _as_shell(BOB, script)
    assert done.returncode == 0, done.stderr
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, job_id) is State.DONE, 20, "bob's job ran")
    _stop(procs, manager)
    spec = json.loads((shared_queue / "done" / job_id / "job.json").read_text())
    assert spec["submitted_by"]["uid"] == int(subprocess.check_output(["id", "-u", BOB])), (
        "the owner of the folder it was in, not its text"
    )


@pytest.mark.parametrize(
    ("attack", "script"),
    [
        ("widen queue.json", 'printf \'{"kind": "forkvisor-queue", "version": 1, "shared": false}\' > {q}/queue.json'),
        ("replace queue.json", "cp {q}/queue.json /tmp/fv-q.json && mv -f /tmp/fv-q.json {q}/queue.json"),
        ("drain the fleet", "touch {q}/drain"),
        ("pause the fleet", "printf '{\"all\": true}' > {q}/paused"),
        ("swap ready/ for a link", "mv {q}/ready {q}/ready.old && ln -s /root {q}/ready"),
        ("plant a job in ready/", "mkdir {q}/ready/100.20261124-000000-000000-00000000"),
        ("write the owner's tmp/", "mkdir {q}/tmp/x"),
    ],
)
def test_a_member_cannot_change_what_runs_nor_stop_the_fleet(shared_queue: Path, attack: str, script: str) -> None:
    before = (shared_queue / "queue.json").read_bytes()
    done = _as_shell(BOB, script.replace("{q}", str(shared_queue)))
    assert done.returncode != 0, f"{attack}: it worked"
    assert "Permission denied" in done.stderr or "Operation not permitted" in done.stderr, done.stderr
    assert (shared_queue / "queue.json").read_bytes() == before
    assert not (shared_queue / "drain").exists()
    assert not (shared_queue / "paused").exists()
    assert (shared_queue / "ready").is_dir()
    assert not (shared_queue / "ready").is_symlink()


def test_the_cli_refuses_a_member_what_only_the_owner_may(shared_queue: Path) -> None:
    for args in (("drain", shared_queue), ("pause", shared_queue), ("config", shared_queue, "max_attempts", "9")):
        done = run_as(BOB, *args)
        assert done.returncode == 111, done
        assert done.stderr.count("\n") == 1, done.stderr
        assert "permission denied" in done.stderr


def test_a_member_cannot_touch_another_members_job(procs: Processes, shared_queue: Path) -> None:
    alices = _submit(ALICE, shared_queue, "alice's")
    waiting = f"{_folder(shared_queue, ALICE)}/{alices}.json"
    for script in (f"rm -f {waiting}", f"mv {waiting} {waiting}.x", f"printf x >> {waiting}", f"cat {waiting}"):
        done = _as_shell(BOB, script)
        assert done.returncode != 0, f"bob could: {script}"
    manager = _manager(procs, shared_queue)
    later = _submit(ALICE, shared_queue, "later, delayed")  # another of alice's, for the claimed and done states
    wait_until(lambda: _state(shared_queue, alices) is State.DONE, 20, "alice's job ran")
    job_dir = Queue(shared_queue, create=False).job(alices).path
    for script in (
        f"printf x > {job_dir}/job.json",
        f"rm -rf {job_dir}",
        f"mv {job_dir} {shared_queue}/done/x",
        f"touch {job_dir}/cancel",
        f"ln -s /etc {job_dir}/attempt-9",
        f"rm -f {shared_queue}/claimed/*/.owner.json",
    ):
        done = _as_shell(BOB, script)
        assert done.returncode != 0, f"bob could: {script}"
    assert os.listdir(shared_queue / "claimed") != [], "the manager's owner folder is untouched"
    wait_until(lambda: _state(shared_queue, later) is State.DONE, 20, "alice's later job ran")
    _stop(procs, manager)
    assert Queue(shared_queue, create=False).job(alices).result == {
        "value": "alice's",
        "pid": pytest.approx(0, abs=1 << 30),
    }
    invariants.check_invariants(shared_queue, [alices, later])


def test_a_member_may_cancel_their_own_jobs_and_no_one_elses(procs: Processes, shared_queue: Path) -> None:
    code = (
        "import sys; from jobs import Queue; q = Queue(sys.argv[1], create=False); "
        "print(q.with_options(delay=3600).enqueue('sample.ok', sys.argv[2]))"
    )
    alices = python_as(ALICE, code, shared_queue, "alice's").stdout.strip()
    bobs = python_as(BOB, code, shared_queue, "bob's").stdout.strip()
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, alices) is State.SCHEDULED, 20, "alice's job was taken in")
    wait_until(lambda: _state(shared_queue, bobs) is State.SCHEDULED, 20, "bob's job was taken in")
    assert run_as(BOB, "cancel", shared_queue, alices).returncode == 0, "asking is allowed: refusing is the manager's"
    assert run_as(BOB, "cancel", shared_queue, bobs).returncode == 0
    wait_until(lambda: _state(shared_queue, bobs) is State.DEAD, 20, "bob's own job was cancelled")
    wait_until(lambda: any(n.endswith(".why") for n in os.listdir(shared_queue / "quarantine")), 20, "refused")
    _stop(procs, manager)
    assert _state(shared_queue, alices) is State.SCHEDULED, "bob cannot cancel alice's job"
    [why] = [n for n in os.listdir(shared_queue / "quarantine") if n.endswith(".why")]
    note = (shared_queue / "quarantine" / why).read_text()
    assert f"cancel of job {alices} by {BOB}" in note
    assert f"it was submitted by {ALICE}" in note
    invariants.check_invariants(shared_queue, [alices, bobs])


def test_a_member_s_queue_cancel_and_retry_in_python_ask_as_the_cli_does(procs: Processes, shared_queue: Path) -> None:
    """Queue.cancel and Queue.retry of a member write their request to incoming/ (a member may
    write nothing else): the same path as `forkvisor cancel`, not a PermissionError."""
    code = (
        "import sys; from jobs import Queue; q = Queue(sys.argv[1], create=False); "
        "print(q.cancel(sys.argv[2]).value) if sys.argv[3] == 'cancel' else q.retry(sys.argv[2])"
    )
    job_id = python_as(
        ALICE,
        "import sys; from jobs import Queue; print(Queue(sys.argv[1], create=False).with_options(delay=3600)"
        ".enqueue('sample.ok', 'x'))",
        shared_queue,
    ).stdout.strip()
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, job_id) is State.SCHEDULED, 20, "alice's job was taken in")
    cancelled = python_as(ALICE, code, shared_queue, job_id, "cancel")
    assert (cancelled.returncode, cancelled.stdout) == (0, "scheduled\n"), cancelled.stderr
    wait_until(lambda: _state(shared_queue, job_id) is State.DEAD, 20, "her own job was cancelled, as she asked")
    retried = python_as(ALICE, code, shared_queue, job_id, "retry")
    assert retried.returncode == 0, retried.stderr
    wait_until(lambda: _state(shared_queue, job_id) is State.DONE, 20, "and retried: ready again, and run")
    _stop(procs, manager)
    invariants.check_invariants(shared_queue, [job_id])


def test_an_outsider_cannot_even_read_a_shared_queue(shared_queue: Path) -> None:
    for args in (("status", shared_queue), ("list", shared_queue)):
        done = run_as(EVE, *args)
        assert done.returncode == 111, done
        assert "ermission denied" in done.stderr, done.stderr
    assert python_as(EVE, ENQUEUE, shared_queue, "sample.ok").returncode != 0


def test_a_manager_refuses_a_queue_its_group_may_write(procs: Processes, shared_queue: Path) -> None:
    """A shared queue made by an earlier forkvisor (mode 2770): any member could have swapped
    its folders or queue.json. The owner's manager refuses it until `init` tightens it."""
    os.chmod(shared_queue, 0o2770)
    os.chmod(shared_queue / "queue.json", 0o660)
    refused = run_as(OWNER, "run", shared_queue, "--burst")
    assert refused.returncode == 111, refused
    assert "the queue folder is writable by its group (mode 2770) (and 1 more)" in refused.stderr
    assert f"forkvisor init {shared_queue} --shared" in refused.stderr
    tightened = run_as(OWNER, "init", shared_queue, "--shared")
    assert tightened.returncode == 0, tightened
    assert "tightened queue: 2770 -> 2750" in tightened.stderr
    assert run_as(OWNER, "run", shared_queue, "--burst").returncode == 0


def test_a_member_submits_from_the_shell_with_the_example_script(procs: Processes, shared_queue: Path) -> None:
    script = Path(__file__).parents[2] / "examples" / "submit.sh"
    done = subprocess.run(
        [*as_user(ALICE), "sh", str(script), str(shared_queue), "sample.ok", '["from sh"]'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert os.listdir(_folder(shared_queue, ALICE)) == [f"{job_id}.json"]
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, job_id) is State.DONE, 20, "the owner's manager ran alice's job")
    _stop(procs, manager)
    assert Queue(shared_queue, create=False).job(job_id).result["value"] == "from sh"


KEYED = (  # a keyed job that naps: it is live for that long, whatever the load
    "import sys; from jobs import Queue; "
    "print(Queue(sys.argv[1], create=False).with_options(key=sys.argv[2]).enqueue('sample.nap', float(sys.argv[3])))"
)


def test_a_members_keyed_jobs_keep_one_live_job_per_key(procs: Processes, shared_queue: Path) -> None:
    """A member cannot write keys/: their submissions carry the key and a manager takes it
    at take-in. Two submitted before any take-in: the one taken in second (managers and
    sweepers take in concurrently) goes to dead/ naming the other, which runs. Once that
    one is done, the key is free again, for any member."""
    # (the winner naps 3 s: the other is taken in while it is live, even when a take-in turn
    # ends between the two and the winner is claimed first)
    submitted = [python_as(ALICE, KEYED, shared_queue, "nightly", seconds).stdout.strip() for seconds in ("3", "3")]
    assert submitted[0] != submitted[1]
    manager = _manager(procs, shared_queue)

    def one_dead_one_done() -> bool:
        return sorted(_state(shared_queue, job_id).value for job_id in submitted) == ["dead", "done"]

    try:
        wait_until(one_dead_one_done, 20, "both were taken in, one ran")
    except pytest.fail.Exception:  # say where each is, and what the manager said
        states = {job_id: _state(shared_queue, job_id).value for job_id in submitted}
        pytest.fail(f"not one dead and one done after 20 s: {states}\n{procs.log(manager)}")
    (loser,) = [job_id for job_id in submitted if _state(shared_queue, job_id) is State.DEAD]
    (winner,) = [job_id for job_id in submitted if job_id != loser]
    error = json.loads((shared_queue / "dead" / loser / "error.json").read_text())
    assert error["reason"] == "duplicate key"
    assert winner in error["message"]
    third = python_as(BOB, KEYED, shared_queue, "nightly", "0").stdout.strip()  # free again: a new job
    assert third not in submitted
    wait_until(lambda: _state(shared_queue, third) is State.DONE, 20, "the third ran")
    _stop(procs, manager)
    invariants.check_invariants(shared_queue, [*submitted, third])


def test_a_member_may_chain_jobs_but_not_add_a_schedule(procs: Processes, shared_queue: Path) -> None:
    """Schedules are the owner's: a member cannot make the managers enqueue at every tick.
    A member's jobs may depend on other jobs: taken in, they wait in waiting/."""
    refused = run_as(BOB, "schedule", "add", shared_queue, "mine", "--every", "1m", "--", "true")
    assert refused.returncode == 3, refused
    assert "only the queue's owner keeps its schedules" in refused.stderr
    assert os.listdir(shared_queue / "schedules") == []
    first = run_as(ALICE, "enqueue", shared_queue, "sample.ok").stdout.strip()
    second = run_as(ALICE, "enqueue", shared_queue, "sample.ok", "--after", first).stdout.strip()
    assert Queue(shared_queue, create=False).job(second).spec.depends_on == (first,)
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, second) is State.DONE, 20, "the dependent ran")
    _stop(procs, manager)
    runs = [
        json.loads((shared_queue / "done" / job / "attempt-1" / "outcome.json").read_text()) for job in (first, second)
    ]
    assert runs[1]["started"] > runs[0]["ended"], "the dependent started after its parent ended"
