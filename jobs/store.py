"""The queue: the user's API, over modules cut by who acts.

    submitters      enqueue, with_options, enqueue_many, chain   (jobs.submit, jobs.incoming)
    readers         job, jobs, page, counts, events, wait, result   (jobs.view, jobs.listing, jobs.waiting)
    operators       cancel, retry, drain, pause, configure, purge   (jobs.operator, jobs.pause, jobs.sweep)
    its owner's managers and sweeper   `queue.serving`   (jobs.serving)

Each transition is one rename of the job directory (see `jobs/__init__`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from jobs import (
    incoming,
    job_files,
    listing,
    operator,
    stats,
    sweep,
    timetable,
    view,
    waiting,
)
from jobs import pause as pause_file
from jobs.claim import Claim
from jobs.command import command_call
from jobs.errors import (
    InvalidJob,
    JobFailed,
    NotFinished,
)
from jobs.folder import (
    QueueFolder,
)
from jobs.handles import Entry
from jobs.index import ReadyIndex
from jobs.job import (
    JobOptions,
    State,
    check_job_id,
)
from jobs.job_view import Job
from jobs.pause import Paused
from jobs.schedules import Schedule
from jobs.serving import Serving
from jobs.submit import Call, Publisher, Submitter
from jobs.timetable import ScheduleInfo

log = logging.getLogger(__name__)


_T = TypeVar("_T")


class Queue:
    """A job queue living in a folder."""

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = True, durable: bool = True, shared: bool = False
    ) -> None:
        self.folder = QueueFolder(path, create=create, durable=durable, shared=shared)
        folder = self.folder  # captured alone, not `self`: no cycle keeps a dropped queue's handles open
        index = ReadyIndex(lambda: folder.at(State.READY).scandir())
        self._publisher = Publisher(folder, index.add)  # its own entries: not a watcher's news
        self.serving = Serving(folder, index, self._publisher)  # its owner's managers' and sweeper's side

    @property
    def path(self) -> Path:
        return self.folder.path

    @property
    def shared(self) -> bool:
        """A queue whose group may submit (see docs/SECURITY.md)."""
        return self.folder.shared

    @property
    def durable(self) -> bool:
        return self.folder.durable

    @property
    def file_mode(self) -> int:
        """The mode of the files written in it (0640 shared, 0600 private)."""
        return self.folder.file_mode

    def __repr__(self) -> str:
        return f"Queue({str(self.path)!r})"

    def close(self) -> None:
        """Close the queue's folder handles (they are also closed when the object is collected)."""
        self.folder.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submitting ----------------------------------------------------------

    def enqueue(self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> str:
        """Publish a job that calls `fn(*args, **kwargs)`; return its id."""
        return self.submit(Call(fn, args, kwargs))

    def with_options(self, **options: Any) -> Submitter:
        """Per-job options that cannot collide with the function's own keywords:
        `queue.with_options(priority=5, delay=60).enqueue(fn, x, y=1)`."""
        return Submitter(self._publisher, JobOptions(**options))

    def submit(self, call: Call, now: float | None = None) -> str:
        """Publish one job; once this returns, the job is on disk (and durable when asked)."""
        return self._publisher.submit(call, _now(now))

    def enqueue_many(self, calls: Iterable[Call], now: float | None = None) -> list[str]:
        """Publish a batch with one durability barrier; return the ids in order.

        Every spec is checked before anything is written. Publishing is not atomic
        as a whole: if it fails part way, the jobs already published stay published.
        """
        return self._publisher.submit_many(calls, _now(now))

    def enqueue_command(
        self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None, **options: Any
    ) -> str:
        """Publish a command job that execs `argv` (see `jobs.command`); `options` as for
        `with_options`. `cwd` is where it runs (default: the manager's folder)."""
        return self.submit(command_call(argv, cwd=cwd, env=env, options=JobOptions(**options)))

    # -- settings ------------------------------------------------------------------

    @property
    def settings(self) -> dict[str, Any]:
        """Every setting of this queue, as it applies (see `jobs.config`)."""
        return dict(self.folder.settings)

    @property
    def stored_settings(self) -> dict[str, Any]:
        """The settings `queue.json` sets (the others take their built-in values)."""
        return dict(self.folder.stored_settings)

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Check and store new settings (None unsets one); return them all. Durations
        and sizes may be text ("5m", "512M")."""
        self.folder.write_settings(changes)
        return self.settings

    # -- a member's requests, and who owns the queue ---------------------------------

    def ask(self, job_id: str, action: str, why: str = "") -> None:
        """As a member of a shared queue, ask its managers to `cancel` or `retry` one of your
        jobs (a member may write only incoming/); they do it if you submitted it."""
        if action not in ("cancel", "retry"):
            raise InvalidJob(f"a member may ask for cancel or retry, not {action!r}")
        self._ask_for(job_id, action, why)

    def _ask_for(self, job_id: str, action: str, why: str = "") -> State:
        state, _ = view.locate(self.folder, check_job_id(job_id))  # JobNotFound now, not silently later
        incoming.request(self.folder, job_id, action, why or f"{action} asked at {time.time()}")
        return state

    @property
    def owner_uid(self) -> int:
        """The uid of the queue's owner (the owner of its folder)."""
        return os.fstat(self.folder.root.fd).st_uid

    @property
    def owned(self) -> bool:
        """Whether this process owns the queue (else it submits and asks through incoming/)."""
        return self.folder.owned()

    # -- reading -----------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """The current view of one job; raise JobNotFound or InvalidJobId."""
        return job_files.job(self.folder, job_id)

    def events(self, job_id: str, limit: int = 1 << 20) -> list[str]:
        """The lines of a job's `events` log (empty if it has none, or it cannot be read)."""
        return job_files.events(self.folder, job_id, limit)

    def open_output(self, job_id: str, run: int, name: str) -> BinaryIO | None:
        """Open a run's `stdout` or `stderr` for reading (None if the run wrote none). The file
        follows the job as it moves; it may not be a regular file (a job wrote something odd)."""
        return job_files.open_output(self.folder, job_id, run, name)

    def stats(self) -> stats.Tally:
        """What every manager and sweeper of the queue counted, summed (see `jobs.stats`)."""
        return stats.read_all(self.folder)

    def counts(self) -> dict[str, int]:
        """Number of jobs per state name: incoming, ready, scheduled, waiting, claimed, done, dead."""
        return view.count(self.folder)

    def jobs(
        self,
        state: State | str | None = None,
        function: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[Job]:
        """Jobs in one state (or all), optionally of one function, in name order (claim order
        in ready/ and scheduled/). With a `limit`, a page: the first `limit` jobs from the
        entry named after `after` (the last page's last `job.path.name`; one state only).
        A page reads the folder's names once and holds only the page's, so paging through
        a million done jobs never lists them all at once."""
        return listing.jobs(self.folder, None if state is None else State(state), function, limit, after)

    def page(
        self,
        state: State | str,
        limit: int,
        after: str | None = None,
        function: str | None = None,
        examine: int | None = None,
    ) -> listing.Page:
        """A page of one state: up to `limit` jobs after the entry `after` (of one
        `function`, if given), reading at most `examine` entries; `.next` is the `after`
        of the next page (None: there is no more)."""
        return listing.page(self.folder, State(state), limit, after, function, examine)

    def wait(
        self,
        job_ids: Iterable[str] | None = None,
        timeout: float | None = None,
        progress: waiting.Progress | None = None,
    ) -> dict[str, State]:
        """Block until the jobs are done or dead and return each one's state. With no ids,
        wait for every job unfinished now (not those enqueued later). Raise WaitTimeout
        after `timeout` seconds, JobNotFound for an unknown id."""
        if isinstance(job_ids, str):
            job_ids = [job_ids]  # one id, not its characters
        ids = waiting.unfinished_ids(self.folder) if job_ids is None else list(job_ids)
        return waiting.wait(self.folder, ids, timeout, progress)

    def result(self, job_id: str, wait: bool = True, timeout: float | None = None) -> Any:
        """The value the job returned. Raise JobFailed (with `.error`, the last cause) if it
        is dead; NotFinished if `wait` is false and it has not finished; WaitTimeout."""
        if wait:
            self.wait([job_id], timeout)
        job = self.job(job_id)
        if job.state is State.DONE:
            return job.result
        if job.state is State.DEAD:
            raise JobFailed(job_id, dict(job.error or {"message": "no error.json was recorded"}))
        raise NotFinished(f"job {job_id} has not finished: it is {job.state.value}; pass wait=True to wait for it")

    # -- operator actions ------------------------------------------------------

    def request_drain(self, now: float | None = None) -> None:
        """Ask every manager of the queue to drain: a new `drain` file in the queue folder."""
        operator.request_drain(self.folder, _now(now))

    def pause(self, functions: Iterable[str] | None = None) -> Paused:
        """Stop every manager of the queue from starting its jobs (those of `functions`, or
        all); running jobs finish. Return what is paused now."""
        paused = pause_file.paused_more(self.paused(), functions)
        pause_file.write(self.folder.root, paused, self.folder.file_mode)
        return paused

    def resume(self, functions: Iterable[str] | None = None) -> Paused:
        """Undo `pause` (for `functions`, or all); return what stays paused."""
        paused = pause_file.paused_less(self.paused(), functions)
        pause_file.write(self.folder.root, paused, self.folder.file_mode)
        return paused

    def paused(self) -> Paused:
        """What is paused now (see `jobs.pause`)."""
        return pause_file.read(self.folder.root)

    def cancel(self, job_id: str, now: float | None = None) -> State:
        """Cancel a job: ready or scheduled goes to `dead/` at once; a claimed one is
        marked, and its manager stops it. Return the job's state after the call. A member
        of a shared queue asks its managers instead (`ask`): the state is the job's as asked."""
        if not self.owned:
            return self._ask_for(job_id, "cancel")
        take_in = lambda when: self.serving.take_in_one(job_id, when)  # noqa: E731
        return operator.cancel(self.folder, job_id, _now(now), take_in)

    def freeze(self, job_id: str, frozen: bool = True, now: float | None = None) -> int:
        """Freeze (or thaw) the run of a running job: its manager stops (or continues) every
        process of the run at once; its timeout does not run while it is frozen. The run's number."""
        return operator.freeze(self.folder, job_id, frozen, _now(now))

    def retry(self, job_id: str, now: float | None = None) -> None:
        """Send a dead job back to `ready/` with a fresh set of attempts (a member of a
        shared queue asks its managers to: `ask`)."""
        if not self.owned:
            self._ask_for(job_id, "retry")
            return
        operator.retry(self.folder, job_id, _now(now), self.serving.index.add)

    # -- dependencies (jobs.depends) --------------------------------------------------

    def chain(self, calls: Iterable[Call]) -> list[str]:
        """Enqueue each call to run after the one before it is done; return their ids."""
        ids: list[str] = []
        for call in calls:
            ids.append(self.submit(_after(call, ids[-1:])))
        return ids

    def fan_in(self, calls: Iterable[Call], then: Call) -> tuple[list[str], str]:
        """Enqueue `calls` (run in any order, at once), and `then` to run after all of them are
        done; return their ids and `then`'s."""
        ids = [self.submit(call) for call in calls]
        return ids, self.submit(_after(then, ids))

    # -- schedules (jobs.schedules, jobs.timetable) -----------------------------------

    def add_schedule(self, schedule: Schedule, *, replace: bool = False) -> None:
        """Keep `schedule` in the queue folder: every manager of the queue fires it."""
        timetable.add(self.folder, schedule, replace=replace)

    def remove_schedule(self, name: str) -> None:
        timetable.remove(self.folder, name)

    def pause_schedule(self, name: str, paused: bool = True) -> None:
        """Pause (or with `paused=False` resume) a schedule: the ticks passing while it is paused are skipped."""
        timetable.set_paused(self.folder, name, paused)

    def schedules(self, now: float | None = None) -> list[ScheduleInfo]:
        """Every schedule of the queue (added here or declared in Python), with its next
        tick and the job of its last one."""
        return timetable.every(self.folder, _now(now), self._locate)

    def schedule(self, name: str, now: float | None = None) -> ScheduleInfo:
        return timetable.info(self.folder, name, _now(now), self._locate)

    def _locate(self, job_id: str) -> tuple[State, Entry]:
        return view.locate(self.folder, job_id)

    # -- retention ---------------------------------------------------------------------

    def purge(
        self,
        state: State | str,
        older_than: float,
        now: float | None = None,
        dry_run: bool = False,
        budget: int | None = None,
    ) -> list[str]:
        """Delete terminal jobs whose last transition is older than `older_than` seconds; with a
        `budget`, each job's folder is only partly removed and sweeps finish it (the sweeper's)."""
        return sweep.purge(self.folder, State(state), older_than, _now(now), dry_run, budget)


def _after(call: Call, parents: list[str]) -> Call:
    """`call`, also depending on `parents`."""
    if not parents:
        return call
    options = call.options or JobOptions()
    return Call(call.fn, call.args, call.kwargs, replace(options, depends_on=(*(options.depends_on or ()), *parents)))


def _now(now: float | None) -> float:
    return time.time() if now is None else now


__all__ = ["Call", "Claim", "Queue", "Submitter"]
