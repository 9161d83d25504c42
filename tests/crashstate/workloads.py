"""The workloads whose every crash state is checked. Each is a script run under strace in
a fresh folder: `python -m tests.crashstate.workloads NAME FOLDER MARKS`. What a workload
is told by forkvisor (an id returned: the job is acknowledged) it writes to MARKS, one
`ACK WHAT ID [MORE]` line each, at once, so that the trace orders it among the calls.

- submit: a durable submitter: single, keyed, batched, delayed, command and dependent jobs
- harvest: a manager in --burst mode over jobs that succeed, fail then succeed (a retry),
  fail every attempt (buried), and refuse (CannotComplete): claim, harvest (done, retry,
  dead), dependents settled, the sweeper's promotion
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jobs import Call, Queue

SETUP = {"harvest"}  # workloads whose queue is filled before the trace starts (`prepare`)


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
    queue = Queue(queue_path, create=True)
    marks.ack("enqueue", queue.enqueue("crash.add", 1, 2))
    marks.ack("enqueue", queue.enqueue("crash.flaky"))
    marks.ack("enqueue", queue.enqueue("crash.broken"))
    marks.ack("enqueue", queue.enqueue("crash.refuse"))
    parent = marks.ack("enqueue", queue.enqueue("crash.add", 3, 4))
    marks.ack("dependent", queue.with_options(depends_on=[parent]).enqueue("crash.add", 5, 6), parent)


def harvest(queue_path: Path, marks: Marks) -> None:
    from supervisor.cli.program import main

    code = main(["run", "--burst", "--app", "tests.crashstate.app:registry", "--concurrency", "2", str(queue_path)])
    if code != 0:
        raise SystemExit(code)


WORKLOADS = {"submit": submit, "harvest": harvest}

if __name__ == "__main__":
    name, folder, marks_path = sys.argv[1:4]
    WORKLOADS[name](Path(folder), Marks(marks_path))
