"""What members of a shared queue write is hostile input (issue 26): each class of the
review's attacks that got through, replayed with real users against the owner's real
manager, each followed by the conservation check (every job in exactly one place).

    numbers      non-finite and huge numbers in a submission, in a job's progress and result
    ids          a live job's id, a scheduled one's, a schedule's next tick's; a key taken first
    work         a thousand parents that do not exist; edges of a parent that never was;
                 1,100 folders the owner cannot open

(Identity: test_identity.py; the page: test_page.py; members' rights: test_members.py.)"""

from __future__ import annotations

import json
import os
import pty
import pwd
import select
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobs import TMP_AGE, JobNotFound, Queue, State, new_job_id
from jobs.lease import OWNER_FILE
from jobs.ticks import tick_job_id
from tests.jobs_processes import invariants
from tests.processes import APP, APP_PATH, FAST_CLI, Processes, forkvisor_command, wait_until
from tests.security.conftest import ALICE, BOB, OWNER, as_user, python_as, run_as

ENQUEUE = (
    "import sys; from jobs import Queue; print(Queue(sys.argv[1], create=False).enqueue(sys.argv[2], *sys.argv[3:]))"
)


def _manager(procs: Processes, queue: Path) -> subprocess.Popen[bytes]:
    return procs.forkvisor("run", str(queue), "--app", APP, *APP_PATH, *FAST_CLI, prefix=as_user(OWNER))


def _stop(procs: Processes, manager: subprocess.Popen[bytes]) -> str:
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 20, "the owner's manager") == 0, procs.log(manager)
    return procs.log(manager)


def _state(queue: Path, job_id: str) -> State | None:
    try:
        return Queue(queue, create=False).job(job_id).state
    except JobNotFound:  # not there at all: refused into quarantine
        return None


def _plant(user: str, queue: Path, document: bytes | str, job_id: str | None = None) -> str:
    """A submission written by hand into `user`'s own folder, as a hostile member would."""
    mine = queue / "incoming" / str(pwd.getpwnam(user).pw_uid)
    job_id = job_id or new_job_id(time.time() + 5)
    data = document if isinstance(document, str) else document.decode()
    script = f"mkdir -p -m 770 {mine} && cat > {mine}/.x.tmp && mv {mine}/.x.tmp {mine}/{job_id}.json"
    done = subprocess.run([*as_user(user), "sh", "-c", script], input=data, text=True, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return job_id


def _submit(user: str, queue: Path, *args: str) -> str:
    done = python_as(user, ENQUEUE, queue, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _notes(queue: Path) -> list[str]:
    folder = queue / "quarantine"
    return [(folder / name).read_text() for name in sorted(os.listdir(folder)) if name.endswith(".why")]


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=refuse)


NUMBERS = [
    (b'{"function": "sample.ok", "args": [NaN]}', "args[0] is nan"),
    (b'{"function": "sample.ok", "kwargs": {"value": Infinity}}', "kwargs.value is inf"),
    (b'{"function": "sample.ok", "metadata": {"n": -Infinity}}', "metadata.n is -inf"),
    (b'{"function": "sample.ok", "run_at": NaN}', "run_at is nan"),
    (b'{"function": "sample.ok", "created": 1e20}', 'field "created" must be epoch seconds'),
    (b'{"function": "sample.ok", "backoff": "fixed 99999999999999999999999d"}', "too long a duration"),
    (b'{"function": "sample.ok", "max_attempts": 1' + b"0" * 4000 + b"}", "max_attempts must be"),
]


def test_numbers_no_reader_survives_never_stop_the_manager(procs: Processes, shared_queue: Path) -> None:
    """Once: the manager exited 101 at each take-in (and at each restart), for every queue."""
    bad = [(_plant(BOB, shared_queue, document), words) for document, words in NUMBERS]
    good = _submit(ALICE, shared_queue, "sample.ok", "after the junk")
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, good) is State.DONE, 20, "alice's job ran after bob's junk")
    log = _stop(procs, manager)
    queue = Queue(shared_queue, create=False)
    for job_id, words in bad:
        dead = queue.job(job_id)
        assert dead.state is State.DEAD
        assert words in dead.error["message"], dead.error
    assert "Traceback" not in log
    invariants.check_invariants(shared_queue, [good, *(job_id for job_id, _ in bad)])


PLANT_RECORDS = """
cd "$FORKVISOR_ATTEMPT_DIR" || exit 9
printf '{"done": NaN, "total": Infinity, "message": "x", "at": 1e400}' > progress.json
printf '[NaN, Infinity, {"deep": -Infinity}]' > result.json
exec sleep 30
"""


@pytest.mark.slow  # (16 s: every reader, as root and as a member, a job still running)
def test_non_finite_records_of_a_members_job_never_break_the_readers(procs: Processes, roots_queue: Path) -> None:
    """A job run as its submitter owns its run's folder: what it writes there (NaN in
    progress.json and result.json) is shown as unreadable; `status`, `show`, `list` and
    `wait` (whose bar on a terminal reads the progress) neither crash nor print invalid
    JSON, as the owner and as the member."""
    command = (
        "import sys; from jobs import Queue; "
        "print(Queue(sys.argv[1], create=False).enqueue_command(sys.argv[2:], timeout=60, max_attempts=1))"
    )
    done = python_as(ALICE, command, roots_queue, "sh", "-c", PLANT_RECORDS)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    manager = procs.forkvisor("run", str(roots_queue), "--run-as-submitter", *FAST_CLI)
    try:
        queue = Queue(roots_queue, create=False)
        wait_until(lambda: _progress_written(queue, job_id), 20, "the job wrote its progress")
        for prefix in ([], as_user(ALICE)):
            for reader in (["status", "--json"], ["show", job_id, "--json"], ["list", "--json"]):
                shown = _read(prefix, reader[0], roots_queue, *reader[1:])
                assert shown.returncode == 0, shown.stderr
                for line in shown.stdout.splitlines():
                    _strict_json(line)
            code, printed, bar = _wait_on_a_terminal(prefix, roots_queue, job_id, "--timeout", "1", "--json")
            assert code == 124, (code, bar)  # still running: it gave up, saying so
            assert printed == "", printed
            assert "progress unreadable" in bar, bar
            assert "Traceback" not in bar, bar
        assert queue.job(job_id).state is State.CLAIMED, "every reader above saw it running"
        assert "unreadable" in json.dumps(queue.serving.run_progress(queue.job(job_id)))
        cancelled = _read([], "cancel", roots_queue, job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        for prefix in ([], as_user(ALICE)):
            waited = _read(prefix, "wait", roots_queue, job_id, "--timeout", "20", "--json")
            assert waited.returncode == 1, waited.stderr  # it ended dead
            assert "Traceback" not in waited.stderr, waited.stderr
            assert _strict_json(waited.stdout) == {job_id: "dead"}
    finally:
        _stop(procs, manager)
    invariants.check_invariants(roots_queue, [job_id])


def _read(prefix: list[str], command: str, queue: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`forkvisor COMMAND QUEUE ARGS...` behind `prefix` (a user's), to its end."""
    return subprocess.run(
        [*prefix, *forkvisor_command(), command, str(queue), *args], capture_output=True, text=True, timeout=30
    )


def _wait_on_a_terminal(prefix: list[str], queue: Path, job_id: str, *options: str) -> tuple[int, str, str]:
    """`forkvisor wait QUEUE JOB OPTIONS` with its stderr on a pseudo-terminal (so that it
    draws its bar, from the job's progress.json) and its stdout a pipe: its exit code,
    what it printed, what the terminal showed."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*prefix, *forkvisor_command(), "wait", str(queue), job_id, *options], stdout=subprocess.PIPE, stderr=terminal
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + 30
    try:
        while (left := deadline - time.monotonic()) > 0 and select.select([controller], [], [], left)[0]:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the terminal's other side closed: wait is done
                break
            if not chunk:
                break
            shown += chunk
        printed, _ = process.communicate(timeout=30)
    finally:
        os.close(controller)
        if process.poll() is None:  # it hung: end it (the assertions say so)
            process.kill()
            process.wait()
    return process.returncode, printed.decode(), shown.decode(errors="replace")


def _progress_written(queue: Queue, job_id: str) -> bool:
    job = queue.job(job_id)
    return bool(job.history) and (job.history[-1].path / "progress.json").exists()


def test_a_member_cannot_submit_under_a_live_jobs_id(procs: Processes, shared_queue: Path) -> None:
    """The id of a job in ready/, and of one in scheduled/ (where only a listing finds it),
    copied into a member's submission: refused; the owner's jobs run as theirs."""
    queue = Queue(shared_queue, create=False)
    ready = python_as(OWNER, ENQUEUE, shared_queue, "sample.ok", "the owner's").stdout.strip()
    later = python_as(
        OWNER,
        "import sys; from jobs import Queue; "
        "print(Queue(sys.argv[1], create=False).with_options(delay=3600).enqueue('sample.ok', 'later'))",
        shared_queue,
    ).stdout.strip()
    for job_id in (ready, later):
        _plant(BOB, shared_queue, json.dumps({"function": "sample.ok", "args": ["bob's"]}), job_id)
    manager = _manager(procs, shared_queue)
    wait_until(lambda: queue.job(ready).state is State.DONE, 20, "the owner's job ran")
    wait_until(lambda: len(_notes(shared_queue)) == 2, 20, "both copies were refused")
    _stop(procs, manager)
    assert queue.job(ready).result["value"] == "the owner's"
    assert queue.job(later).state is State.SCHEDULED
    assert all("is not dated ahead of its submission" in note for note in _notes(shared_queue))
    invariants.check_invariants(shared_queue, [ready, later])


@pytest.mark.slow  # (7 s: a schedule's ticks fired in real time)
def test_a_member_cannot_take_a_schedules_tick_first(procs: Processes, shared_queue: Path) -> None:
    """Tick ids were derived from the schedule's name alone: a member who submitted the next
    ones first held the schedule back. Then from the secret and the name: one tick's id (and
    members may read every job) told all the next ones'. Now they need the owner's secret."""
    added = run_as(OWNER, "schedule", "add", shared_queue, "beat", "--every", "1s", "--", "true")
    assert added.returncode == 0, added.stderr
    manager = procs.forkvisor("run", str(shared_queue), "--commands", *FAST_CLI, prefix=as_user(OWNER))
    queue = Queue(shared_queue, create=False)

    def ticks_ran() -> list[str]:
        return [job.id for job in queue.jobs(State.DONE) if job.spec.metadata.get("schedule") == "beat"]

    wait_until(ticks_ran, 20, "the schedule fired once")
    seen = ticks_ran()[0]  # what bob reads in done/
    soon = int(time.time()) + 3
    stamps = [datetime.fromtimestamp(soon + n, UTC).strftime("%Y%m%d-%H%M%S") for n in range(4)]
    guesses = [_plant(BOB, shared_queue, '{"function": "sample.ok"}', f"{stamp}{seen[15:]}") for stamp in stamps]
    guesses += [_plant(BOB, shared_queue, '{"function": "sample.ok"}', tick_job_id("beat", soon + n)) for n in range(4)]
    wait_until(lambda: {job_id[:15] for job_id in ticks_ran()} >= set(stamps), 20, "every tick bob guessed ran")
    _stop(procs, manager)
    assert not any(job.spec.metadata.get("schedule") == "beat" for job_id in guesses for job in [queue.job(job_id)])
    assert not any("already holds a job with this id" in note for note in _notes(shared_queue))
    invariants.check_invariants(shared_queue, [job.id for job in queue.jobs()])


KEYED = (
    "import sys; from jobs import Queue; q = Queue(sys.argv[1], create=False); "
    "print(q.with_options(key=sys.argv[2], run_at=float(sys.argv[3])).enqueue('sample.ok', sys.argv[4]))"
)


def test_a_key_a_member_took_first_is_theirs_alone(procs: Processes, shared_queue: Path) -> None:
    """bob takes "nightly" first, with a far-future run_at: once, everyone's submissions of
    "nightly" were handed bob's job, silently, for ever."""
    far = str(time.time() + 30 * 86400)
    bobs = python_as(BOB, KEYED, shared_queue, "nightly", far, "bob's").stdout.strip()
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, bobs) is State.SCHEDULED, 20, "bob's keyed job was taken in")
    now = str(time.time())
    owners = python_as(OWNER, KEYED, shared_queue, "nightly", now, "the owner's").stdout.strip()
    alices = python_as(ALICE, KEYED, shared_queue, "nightly", now, "alice's").stdout.strip()
    assert len({bobs, owners, alices}) == 3, "each submitter's key is their own"
    wait_until(lambda: _state(shared_queue, alices) is State.DONE, 20, "alice's keyed job ran")
    wait_until(lambda: _state(shared_queue, owners) is State.DONE, 20, "the owner's keyed job ran")
    again = python_as(BOB, KEYED, shared_queue, "nightly", now, "bob's again").stdout.strip()
    assert again == bobs, "bob's own key space: his live job holds it"
    _stop(procs, manager)
    invariants.check_invariants(shared_queue, [bobs, owners, alices])


def test_a_thousand_parents_that_do_not_exist_cost_the_manager_nothing_it_needs(
    procs: Processes, shared_queue: Path
) -> None:
    """Once: 110 s of the manager's loop, its heartbeat 249 s stale, its own sweeper reaping
    its claims, a SIGTERM not acted on. Now the job is dead naming the first missing parent,
    at once; meanwhile the owner's running job keeps its lease: the owner file's heartbeat
    never ages past it, and the job runs once, to its end."""
    ready, release = shared_queue.parent / "long-runs", shared_queue.parent / "long-may-end"
    manager = _manager(procs, shared_queue)
    long = _submit(OWNER, shared_queue, "sample.wait_release", str(ready), str(release))
    wait_until(ready.exists, 20, "the owner's long job runs")
    [owner] = os.listdir(shared_queue / "claimed")
    assert (shared_queue / "claimed" / owner / long).is_dir()
    owner_file = shared_queue / "claimed" / owner / OWNER_FILE
    lease = json.loads(owner_file.read_text())["lease"]
    ages: list[float] = []

    def heartbeat_then(condition: Callable[[], bool]) -> Callable[[], bool]:
        def look() -> bool:
            try:
                ages.append(time.time() - owner_file.stat().st_mtime)
            except FileNotFoundError:  # reaped: its sweeper judged its lease over
                ages.append(float("inf"))
            return condition()

        return look

    ghosts = [new_job_id(time.time() - 3600 + n) for n in range(1000)]
    bad = _plant(BOB, shared_queue, json.dumps({"function": "sample.ok", "depends_on": ghosts}))
    buried = heartbeat_then(lambda: _state(shared_queue, bad) is State.DEAD)
    wait_until(buried, 20, "bob's job was taken in and buried")
    good = _submit(ALICE, shared_queue, "sample.ok", "alice's")
    wait_until(heartbeat_then(lambda: _state(shared_queue, good) is State.DONE), 20, "alice's job ran")
    assert max(ages) < lease, f"the heartbeat aged {max(ages):.2f}s, past the lease of {lease}s"
    assert (shared_queue / "claimed" / owner / long).is_dir(), "the long job is still its owner's, not reaped"
    release.write_text("")
    wait_until(lambda: _state(shared_queue, long) is State.DONE, 20, "the owner's long job ended")
    _stop(procs, manager)
    queue = Queue(shared_queue, create=False)
    ended = queue.job(long)
    assert (ended.attempts, len(ended.history), ended.result) == (1, 1, "released"), "one run, never reaped"
    error = queue.job(bad).error
    assert f"there is no job {ghosts[0]}" in error["message"]
    assert os.listdir(shared_queue / "edges") == [], "no edge for a parent that is not a job"
    invariants.check_invariants(shared_queue, [bad, good, long])


def test_edges_for_a_parent_that_never_was_are_cleared_by_the_owners_sweep(
    procs: Processes, shared_queue: Path
) -> None:
    """bob leaves `.taking.GHOST.json` (a take-in in progress, to look at) and submits a job
    that depends on GHOST: it is taken in to wait, edges/GHOST/CHILD is written, and bob
    removes his file: the edges name a parent that never was a job, once kept for ever and
    walked by every sweep. Now, once they are TMP_AGE old, the owner's sweeper buries the
    child and clears them; the edges of a parent that is merely scheduled stay, however old."""
    later = "print(Queue(sys.argv[1], create=False).with_options(delay=3600).enqueue('sample.ok', 'later'))"
    live = python_as(OWNER, f"import sys; from jobs import Queue; {later}", shared_queue).stdout.strip()
    after = "print(Queue(sys.argv[1], create=False).with_options(depends_on=[sys.argv[2]]).enqueue('sample.ok'))"
    alices = python_as(ALICE, f"import sys; from jobs import Queue; {after}", shared_queue, live).stdout.strip()
    mine = shared_queue / "incoming" / str(pwd.getpwnam(BOB).pw_uid)
    ghost = new_job_id(time.time() + 5)
    seeming = f"mkdir -p -m 770 {mine} && echo '{{}}' > {mine}/.taking.{ghost}.json"
    assert subprocess.run([*as_user(BOB), "sh", "-c", seeming], timeout=30).returncode == 0
    child = _plant(BOB, shared_queue, json.dumps({"function": "sample.ok", "depends_on": [ghost]}))
    manager = _manager(procs, shared_queue)
    wait_until(lambda: _state(shared_queue, child) is State.WAITING, 20, "bob's child was taken in, to wait")
    wait_until(lambda: _state(shared_queue, alices) is State.WAITING, 20, "alice's job was taken in, to wait")
    gone = subprocess.run([*as_user(BOB), "rm", f"{mine}/.taking.{ghost}.json"], timeout=30)
    assert gone.returncode == 0
    edges = shared_queue / "edges"
    assert os.listdir(edges / ghost) == [child], "the attack: an edge for a parent that is nowhere"
    assert _state(shared_queue, ghost) is None
    long_ago = time.time() - TMP_AGE - 60
    for parent in (ghost, live):
        os.utime(edges / parent, (long_ago, long_ago))  # both made over an hour ago
    wait_until(lambda: _state(shared_queue, child) is State.DEAD, 20, "the sweep buried bob's child")
    wait_until(lambda: not (edges / ghost).exists(), 20, "the sweep cleared the ghost's edges")
    _stop(procs, manager)
    queue = Queue(shared_queue, create=False)
    assert ghost in queue.job(child).error["message"], queue.job(child).error
    assert os.listdir(edges) == [live]
    assert os.listdir(edges / live) == [alices]
    assert (_state(shared_queue, live), _state(shared_queue, alices)) == (State.SCHEDULED, State.WAITING)
    invariants.check_invariants(shared_queue, [live, alices, child])


def test_folders_the_owner_cannot_open_do_not_stop_the_take_in(procs: Processes, shared_queue: Path) -> None:
    """bob makes 1,100 folders of mode 0700 in incoming/ (named for no one's uid: renamed
    for his): each is set aside, said in a few lines; alice's submissions are taken in."""
    script = f"cd {shared_queue}/incoming && for n in $(seq 1100); do mkdir -m 700 0$n; done"
    made = subprocess.run([*as_user(BOB), "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    manager = _manager(procs, shared_queue)
    first = _submit(ALICE, shared_queue, "sample.ok", "alice's")
    wait_until(lambda: _state(shared_queue, first) is State.DONE, 20, "alice's job ran")
    second = _submit(ALICE, shared_queue, "sample.ok", "and again")
    wait_until(lambda: _state(shared_queue, second) is State.DONE, 20, "alice's second job ran")
    log = _stop(procs, manager)
    assert log.count("set aside ") + log.count("renamed incoming/") < 100, "said in a few lines, not 1,100"
    status = run_as(OWNER, "status", shared_queue)
    assert status.returncode == 0, status.stderr
    invariants.check_invariants(shared_queue, [first, second])


def test_folders_named_as_submissions_do_not_keep_a_burst_manager_running(procs: Processes, shared_queue: Path) -> None:
    """bob's folders named ID.json and ID.cancel: the owner cannot move them (they are bob's,
    and mode 0755), and a --burst manager counted them as work for ever. Now only files count."""
    mine = shared_queue / "incoming" / str(pwd.getpwnam(BOB).pw_uid)
    job_id = new_job_id(time.time() + 5)
    script = f"mkdir -p -m 770 {mine} && mkdir -m 755 {mine}/{job_id}.json {mine}/{job_id}.cancel"
    made = subprocess.run([*as_user(BOB), "sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    good = _submit(ALICE, shared_queue, "sample.ok", "alice's")
    burst = procs.forkvisor(
        "run", str(shared_queue), "--app", APP, *APP_PATH, *FAST_CLI, "--burst", prefix=as_user(OWNER)
    )
    assert procs.wait_exit(burst, 30, "the burst manager") == 0, procs.log(burst)
    assert _state(shared_queue, good) is State.DONE


def test_a_member_squatting_anothers_names_does_not_lock_them_out(procs: Processes, shared_queue: Path) -> None:
    """bob makes incoming/ALICE_UID and the nine names after it: alice could not submit at
    all. The owner's managers rename each for bob's uid; alice's next submit goes through."""
    alice = pwd.getpwnam(ALICE).pw_uid
    names = [str(alice), *(f"{alice}.{n}" for n in range(1, 10))]
    script = f"cd {shared_queue}/incoming && mkdir -m 770 {' '.join(names)}"
    made = subprocess.run([*as_user(BOB), "sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    locked = python_as(ALICE, ENQUEUE, shared_queue, "sample.ok")
    assert locked.returncode != 0
    assert "submit again in a moment" in locked.stderr
    manager = _manager(procs, shared_queue)
    wait_until(lambda: not any((shared_queue / "incoming" / name).exists() for name in names), 20, "squats renamed")
    good = _submit(ALICE, shared_queue, "sample.ok", "alice's")
    wait_until(lambda: _state(shared_queue, good) is State.DONE, 20, "alice's job ran")
    _stop(procs, manager)
    assert Queue(shared_queue, create=False).job(good).spec.submitted_by == alice


def test_thousands_of_folders_neither_exhaust_descriptors_nor_slow_the_take_in(
    procs: Processes, shared_queue: Path
) -> None:
    """bob makes 1,500 empty folders (each a valid member folder): every take-in opened them
    all, and under a limit of 1,024 descriptors no submission was taken in any more. Now
    folders are opened one at a time as their turn comes, a user's first 16 only."""
    script = f"cd {shared_queue}/incoming && for n in $(seq 1500); do mkdir -m 770 {pwd.getpwnam(BOB).pw_uid}.$n; done"
    made = subprocess.run([*as_user(BOB), "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    limited = ["prlimit", "--nofile=256:256", *as_user(OWNER)]
    manager = procs.forkvisor("run", str(shared_queue), "--app", APP, *APP_PATH, *FAST_CLI, prefix=limited)
    good = _submit(ALICE, shared_queue, "sample.ok", "alice's")
    wait_until(lambda: _state(shared_queue, good) is State.DONE, 20, "alice's job ran")
    log = _stop(procs, manager)
    assert "Too many open files" not in log
    assert log.count("set aside") < 50, "said in a few lines (the manager's, its sweeper's), not 1,484"
    status = run_as(OWNER, "status", shared_queue, "--json")
    assert status.returncode == 0, status.stderr
