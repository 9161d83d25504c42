"""Inside a running job: which job this is, its queue, and its progress.

    from jobs import current

    @registry.job()
    def resize(paths):
        job = current()
        for n, path in enumerate(paths):
            ...
            job.progress(n + 1, len(paths), f"resized {path}")
        job.queue.enqueue(publish, paths)       # follow-up work, into the job's own queue

The manager tells every job's process which run it is through the environment
(FORKVISOR_QUEUE, FORKVISOR_JOB_ID, FORKVISOR_ATTEMPT, FORKVISOR_ATTEMPT_DIR,
FORKVISOR_FUNCTION), so a registered function and a Python program run as a
command job see the same. `progress()` replaces `progress.json` in the run's
folder at most every `PROGRESS_EVERY` seconds, and at once when `done` reaches
`total`: in a tight loop a call costs a clock read. Progress only informs
(`forkvisor status`, `show`, `wait`): a record that cannot be written (a full
disk, a run folder a sweeper took back) is skipped, and the job goes on.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from jobs import run_folder
from jobs.errors import JobsError
from jobs.handles import OPEN_DIR
from jobs.store import Queue

PROGRESS_EVERY = 0.5  # seconds between two writes of progress.json
MAX_MESSAGE = run_folder.MAX_MESSAGE
_NAMES = ("FORKVISOR_QUEUE", "FORKVISOR_JOB_ID", "FORKVISOR_ATTEMPT", "FORKVISOR_ATTEMPT_DIR", "FORKVISOR_FUNCTION")


class NotInJob(JobsError):
    """`jobs.current()` was called outside a job that a forkvisor manager runs."""


@dataclass
class Current:
    """The running job, as its own process sees it."""

    job_id: str
    attempt: int
    function: str
    queue_path: Path
    run_path: Path  # the run's folder: QUEUE/claimed/OWNER/ID/attempt-N
    _next_write: float = field(default=0.0, init=False, repr=False)
    _run: int | None = field(default=None, init=False, repr=False)  # the run's folder, once opened
    _queue: Queue | None = field(default=None, init=False, repr=False)

    @property
    def queue(self) -> Queue:
        """The job's queue, to enqueue follow-up work (as its submitter may: a member of a
        shared queue submits through incoming/)."""
        if self._queue is None:
            self._queue = Queue(self.queue_path, create=False)
        return self._queue

    def progress(self, done: float, total: float | None = None, message: str = "") -> None:
        """Record how far the job is: `done` of `total` (None: no known end), and a message."""
        if isinstance(done, bool) or not isinstance(done, (int, float)) or done < 0:
            raise ValueError(f"progress: done must be a number, 0 or more, got {done!r}")
        if total is not None and (isinstance(total, bool) or not isinstance(total, (int, float)) or total <= 0):
            raise ValueError(f"progress: total must be a number above 0 or None, got {total!r}")
        now = time.monotonic()
        if now < self._next_write and (total is None or done < total):
            return  # written less than PROGRESS_EVERY ago; the last one is always written
        self._next_write = now + PROGRESS_EVERY
        record = {"done": done, "total": total, "message": str(message)[:MAX_MESSAGE], "at": time.time()}
        try:
            run_folder.write_progress(self._run_folder(), json.dumps(record, allow_nan=False).encode() + b"\n")
        except (OSError, ValueError):
            pass  # progress only informs: the job goes on (see the module's docstring)

    def _run_folder(self) -> int:
        """The run's folder, opened once (not through a link at its name)."""
        if self._run is None:
            self._run = os.open(self.run_path, OPEN_DIR)
        return self._run


_current: tuple[int, Current] | None = None  # (pid, what it found): a process the job forks finds its own


def current() -> Current:
    """The job this process runs; NotInJob outside a job that a manager started."""
    global _current
    if _current is not None and _current[0] == os.getpid():
        return _current[1]
    missing = [name for name in _NAMES if not os.environ.get(name)]
    if missing:
        raise NotInJob(
            f"jobs.current() works inside a job a forkvisor manager runs ({', '.join(missing)} not set here)"
        )
    try:
        attempt = int(os.environ["FORKVISOR_ATTEMPT"])
    except ValueError:
        raise NotInJob(f"FORKVISOR_ATTEMPT={os.environ['FORKVISOR_ATTEMPT']!r} is not a number") from None
    found = Current(
        job_id=os.environ["FORKVISOR_JOB_ID"],
        attempt=attempt,
        function=os.environ["FORKVISOR_FUNCTION"],
        queue_path=Path(os.environ["FORKVISOR_QUEUE"]),
        run_path=Path(os.environ["FORKVISOR_ATTEMPT_DIR"]),
    )
    _current = (os.getpid(), found)
    return found
