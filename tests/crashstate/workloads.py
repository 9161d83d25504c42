"""The workloads whose every crash state is checked. Each is a script run under strace in
a fresh folder: `python -m tests.crashstate.workloads NAME FOLDER MARKS`. What a workload
is told by forkvisor (an id returned: the job is acknowledged) it writes to MARKS, one
`ACK WHAT ID [MORE]` line each, at once, so that the trace orders it among the calls.

- submit: a durable submitter: single, keyed, batched, delayed, command and dependent jobs
- harvest: a manager in --burst mode over jobs that succeed, fail then succeed (a retry),
  fail every attempt (buried), and refuse (CannotComplete): claim, harvest (done, retry,
  dead), dependents settled, the sweeper's promotion
- operate: an operator's cancel and retry, a purge of done jobs (a part at a time, as the
  sweeper's retention does), a schedule's tick fired, a sweep that promotes a due job and
  finishes the purge
- reap: a manager SIGKILLed while its job ran (before the trace), then a successor in
  --burst mode that reaps its claim and runs the job again
- drain: a manager drained (SIGTERM) while its job runs: the run is released, uncounted
- takein: a manager of a shared queue (root's, --run-as-submitter) takes in a member's
  submissions (plain, keyed, dependent) and their cancel of a job taken in before, and
  runs them
- member: a member's first submission to a shared queue, its folder `incoming/UID/` made
  as it submits (a member cannot fsync `incoming/`: the folder is synced through the file
  system before the submission is told)
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from jobs import Call, Queue, Schedule, State, Timing, unknown_liveness
from jobs.incoming import STALE_TAKING
from tests.users import ALICE, TEAM, as_user

APP = "tests.crashstate.app:registry"
MEMBERS_BURST = ("--run-as-submitter",)  # root's manager of a shared queue runs members' jobs as them
ROOT = Path(__file__).resolve().parent.parent.parent
WAIT = 30.0  # seconds a workload waits for its manager to start a job


class Marks:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def ack(self, what: str, job_id: str, *more: str) -> str:
        os.write(self.fd, (" ".join(["ACK", what, job_id, *more]) + "\n").encode())
        return job_id


def submit(queue_path: Path, marks: Marks) -> None:
    queue = Queue(queue_path, create=True)
    marks.ack("enqueue", queue.enqueue("crash.add", 1, 2))
    marks.ack("keyed", queue.with_options(key="k1").enqueue("crash.add", 2, 3), "k1")
    for job_id in queue.enqueue_many([Call("crash.add", (3, 4)), Call("crash.add", (5, 6))]):
        marks.ack("batch", job_id)
    marks.ack("delayed", queue.with_options(delay=3600).enqueue("crash.add", 7, 8))
    marks.ack("command", queue.enqueue_command(["true"]))
    parent = marks.ack("enqueue", queue.enqueue("crash.add", 9, 10))
    marks.ack("dependent", queue.with_options(depends_on=[parent]).enqueue("crash.add", 0, 0), parent)


def prepare(name: str, queue_path: Path, marks: Marks) -> None:
    """What a workload's queue holds before its trace starts (all of it durable)."""
    PREPARE[name](queue_path, marks)


def _jobs_to_harvest(queue_path: Path, marks: Marks) -> None:
    queue = Queue(queue_path, create=True)
    for function in ("crash.add", "crash.flaky", "crash.broken", "crash.refuse"):
        marks.ack("enqueue", queue.enqueue(function, 1, 2) if function == "crash.add" else queue.enqueue(function))
    parent = marks.ack("enqueue", queue.enqueue("crash.add", 3, 4))
    marks.ack("dependent", queue.with_options(depends_on=[parent]).enqueue("crash.add", 5, 6), parent)


def _jobs_to_operate(queue_path: Path, marks: Marks) -> None:
    queue = Queue(queue_path, create=True)
    marks.ack("enqueue", queue.enqueue("crash.broken"))  # dead after the burst below: retried
    marks.ack("enqueue", queue.enqueue("crash.add", 1, 1))  # done: purged
    _burst(queue.path)
    marks.ack("enqueue", queue.enqueue("crash.add", 2, 2))  # ready: cancelled
    marks.ack("delayed", queue.with_options(delay=0.2).enqueue("crash.add", 3, 3))  # due by the sweep
    tick = Schedule("tick", Timing("every 1s"), "crash.add", (4, 4), missed="once", created=time.time() - 5)
    queue.add_schedule(tick)


def _job_to_interrupt(kill: bool) -> Callable[[Path, Marks], None]:
    def prepare_it(queue_path: Path, marks: Marks) -> None:
        queue = Queue(queue_path, create=True)
        job_id = marks.ack("enqueue", queue.enqueue("crash.sleeper"))
        marks.ack("enqueue", queue.enqueue("crash.add", 5, 5))
        if kill:  # its manager dies while the job runs: the trace is its successor's
            manager = _start_manager(queue.path)
            _wait_for_run(queue.path, job_id)
            manager.send_signal(signal.SIGKILL)
            manager.wait()

    return prepare_it


def _members_submissions(queue_path: Path, marks: Marks) -> None:
    """A shared queue of root's (group fvteam) and, in incoming/, a member's submissions, one
    of them the cancel of a job of theirs taken in before."""
    _cli("init", str(queue_path), "--shared", "--group", TEAM)
    with _reachable_by_members(queue_path):
        (delayed,) = _as_member("delayed", queue_path, marks)
        _burst(queue_path, *MEMBERS_BURST)  # takes it in: scheduled, an hour ahead
        _as_member("submit", queue_path, marks, delayed)


def _shared_queue(queue_path: Path, marks: Marks) -> None:
    _cli("init", str(queue_path), "--shared", "--group", TEAM)


def member(queue_path: Path, marks: Marks) -> None:
    with _reachable_by_members(queue_path):
        _as_member("first", queue_path, marks)


def _as_member(mode: str, queue_path: Path, marks: Marks, *args: str) -> list[str]:
    """Run `tests.crashstate.member` as a member of the queue's group; the ids it was told."""
    argv = [*as_user(ALICE), sys.executable, "-m", "tests.crashstate.member", mode, str(queue_path), *args]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the member's submission failed: {done.stderr[-2000:]}")
    return [marks.ack(*line.split()) for line in done.stdout.splitlines()]


@contextlib.contextmanager
def _reachable_by_members(path: Path) -> Iterator[None]:
    """Let others pass through the folders above `path` (a test's are root's own, 0700)
    while members submit; put their modes back after."""
    changed = [(folder, folder.stat().st_mode) for folder in path.parents if not folder.stat().st_mode & 0o001]
    for folder, mode in changed:
        folder.chmod(stat.S_IMODE(mode) | 0o001)
    try:
        yield
    finally:
        for folder, mode in changed:
            folder.chmod(stat.S_IMODE(mode))


def _cli(*args: str) -> None:
    from supervisor.cli.program import main

    with contextlib.redirect_stdout(io.StringIO()):  # (what it says is not the workload's output)
        code = main(list(args))
    if code != 0:
        raise SystemExit(f"forkvisor {args[0]} exited {code}")


PREPARE: dict[str, Callable[[Path, Marks], None]] = {
    "harvest": _jobs_to_harvest,
    "operate": _jobs_to_operate,
    "reap": _job_to_interrupt(kill=True),
    "drain": _job_to_interrupt(kill=False),
    "takein": _members_submissions,
    "member": _shared_queue,
}


def _start_manager(queue_path: Path) -> subprocess.Popen[bytes]:
    """A manager whose drain stops its jobs at once (they are released, not counted)."""
    options = ["--app", APP, "--log-level", "WARNING", "--drain-timeout", "0.1"]
    return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", *options, str(queue_path)])


def _wait_for_run(queue_path: Path, job_id: str) -> None:
    """Until the job's first run has started (its pid file is there)."""
    deadline = time.monotonic() + WAIT
    while not list(queue_path.glob(f"claimed/*/{job_id}/attempt-1/pid")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not start within {WAIT}s")
        time.sleep(0.01)  # a bounded wait for our own manager


def _burst(queue_path: Path, *options: str) -> None:
    _cli("run", "--burst", "--app", APP, "--concurrency", "2", "--log-level", "WARNING", *options, str(queue_path))


def harvest(queue_path: Path, marks: Marks) -> None:
    _burst(queue_path)


def operate(queue_path: Path, marks: Marks) -> None:
    queue = Queue(queue_path)
    jobs = {job.spec.function + str(job.spec.args): job for state in State for job in queue.jobs(state)}
    marks.ack("cancel", jobs["crash.add(2, 2)"].id, str(queue.cancel(jobs["crash.add(2, 2)"].id).value))
    marks.ack("reset", jobs["crash.broken()"].id)  # its counter starts again from 0 (an operator's retry)
    queue.retry(jobs["crash.broken()"].id)
    for job_id in queue.purge(State.DONE, older_than=0, budget=1):  # as retention does: sweeps finish it
        marks.ack("purged", job_id)
    queue.serving.planner().fire(time.time(), time.monotonic())
    marks.ack("tick", queue.schedule("tick").last_job or "-")
    queue.serving.sweep(time.time(), unknown_liveness)


def reap(queue_path: Path, marks: Marks) -> None:
    _burst(queue_path)


def takein(queue_path: Path, marks: Marks) -> None:
    _burst(queue_path, *MEMBERS_BURST)


def drain(queue_path: Path, marks: Marks) -> None:
    manager = _start_manager(queue_path)
    sleeper = next(job for job in Queue(queue_path).jobs(State.READY) if job.spec.function == "crash.sleeper")
    _wait_for_run(queue_path, sleeper.id)
    manager.send_signal(signal.SIGTERM)
    if manager.wait(WAIT) != 0:
        raise SystemExit(f"the drained manager exited {manager.returncode}")


@dataclass(frozen=True)
class Recovery:
    """How a workload's crash states are recovered: the manager's `options` (as its own
    manager had them), once the states are `aged` seconds old."""

    options: tuple[str, ...] = ()
    aged: float = 0.0


# A take-in interrupted mid-way is finished once its `.taking.` file is STALE_TAKING old, by
# its change time, which a copy of a state renews (a real disk keeps it): the states are
# recovered that much later, as a host that comes back from a power cut finds them.
RECOVERY = {"takein": Recovery(MEMBERS_BURST, aged=STALE_TAKING + 1), "member": Recovery(MEMBERS_BURST)}
WORKLOADS = {
    "submit": submit,
    "harvest": harvest,
    "operate": operate,
    "reap": reap,
    "drain": drain,
    "takein": takein,
    "member": member,
}

if __name__ == "__main__":
    name, folder, marks_path = sys.argv[1:4]
    WORKLOADS[name](Path(folder), Marks(marks_path))
