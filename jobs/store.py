"""The queue: one object for everyone who acts on it, over modules cut by who acts.

    submitters      enqueue, with_options, enqueue_many   (jobs.submit, jobs.incoming)
    the owner's managers  register, claim, complete, fail, release   (jobs.claim)
    readers         job, jobs, counts, events, wait, result   (jobs.view, jobs.listing, jobs.waiting)
    operators       cancel, retry, drain, pause, configure, purge   (jobs.operator, jobs.pause)
    the sweeper     sweep, promote   (jobs.sweep)

Each transition is one rename of the job directory (see `jobs/__init__`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from jobs import (
    depends,
    files,
    incoming,
    listing,
    operator,
    owners,
    run_folder,
    stats,
    submissions,
    sweep,
    timetable,
    view,
    waiting,
)
from jobs import pause as pause_file
from jobs.claim import Claim, Claimer, ClaimState, Finished
from jobs.command import command_call
from jobs.config import TMP_AGE
from jobs.errors import (
    InvalidJob,
    JobFailed,
    JobsError,
    NotFinished,
    QueueReplaced,
)
from jobs.fate import RunEnd
from jobs.folder import (
    EVENTS_FILE,
    QueueFolder,
    filesystem_now,
)
from jobs.handles import Entry
from jobs.index import ReadyIndex
from jobs.job import (
    JobOptions,
    State,
    check_job_id,
    created_at,
    parse_scheduled_name,
    scheduled_name,
)
from jobs.job_view import Job
from jobs.lease import Liveness, Owner
from jobs.pause import NOT_PAUSED, Paused
from jobs.planner import Planner
from jobs.policy import Functions, Policy
from jobs.schedules import Schedule
from jobs.submit import Call, Publisher, Submitter
from jobs.timetable import ScheduleInfo
from jobs.view import OwnerFolder

log = logging.getLogger(__name__)


_T = TypeVar("_T")


class Queue:
    """A job queue living in a folder."""

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = True, durable: bool = True, shared: bool = False
    ) -> None:
        self.folder = QueueFolder(path, create=create, durable=durable, shared=shared)
        folder = self.folder  # captured alone, not `self`: no cycle keeps a dropped queue's handles open
        self._index = ReadyIndex(lambda: folder.at(State.READY).scandir())
        self._publisher = Publisher(folder, self._index.add)  # its own entries: not a watcher's news
        self._claimer = Claimer(folder, self._index)
        self._intake = incoming.Intake(folder)
        self.last_sweep_skips = sweep.Skips()  # what the last sweep of this object skipped

    @property
    def path(self) -> Path:
        return self.folder.path

    def state_path(self, state: State) -> Path:
        """A state folder's path, to show or to watch (every operation goes through handles)."""
        return self.folder.state_dir(state)

    @property
    def identity(self) -> tuple[int, int]:
        """The folder opened (device, inode): two paths to one queue (a link, `..`) have the same."""
        found = os.fstat(self.folder.root.fd)
        return found.st_dev, found.st_ino

    @property
    def shared(self) -> bool:
        """A queue whose group may submit (see docs/SECURITY.md)."""
        return self.folder.shared

    @property
    def durable(self) -> bool:
        return self.folder.durable

    def set_group(self, gid: int) -> None:
        """Give a shared queue to group `gid` (its owner only)."""
        self.folder.set_group(gid)

    def set_owner_group(self, gid: int) -> None:
        """Give a shared queue's `incoming/` the group `gid`, which only its owner may be in:
        members' submission folders inherit it, so that only the owner's managers may empty them."""
        self.folder.set_owner_group(gid)

    def tighten(self) -> list[str]:
        """Make the queue's modes what its kind needs (a queue made by an earlier forkvisor, or by
        hand); return what was changed, in words."""
        return self.folder.tighten()

    def problems(self) -> list[str]:
        """What lets others steer this queue (a folder or `queue.json` others may write, an owner
        not this process's user); empty when a manager may serve it (docs/SECURITY.md)."""
        return self.folder.problems()

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

    def check_folders(self) -> None:
        """Raise QueueReplaced if the queue's folder, or a state folder this object has open,
        no longer stands at its name (see `jobs.handles`): a manager stops rather than go on
        with folders nobody else sees."""
        why = self.folder.replaced()
        if why is not None:
            raise QueueReplaced(f"{why}; stopping rather than use a folder the queue no longer holds")

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

    def reload_settings(self) -> bool:
        """Read the settings again (another process may have changed them); whether they changed."""
        return self.folder.reload_settings()

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Check and store new settings (None unsets one); return them all. Durations
        and sizes may be text ("5m", "512M")."""
        self.folder.write_settings(changes)
        return self.settings

    # -- the owning manager's side (jobs.owners, jobs.claim) --------------------------

    def register_owner(self, owner: Owner, functions: Functions | None = None) -> None:
        """Create `claimed/OWNER/`, whose owner file's mtime is the heartbeat (see `jobs.claim`)."""
        owners.register(self.folder, owner, functions)

    def record_skipped(self, owner: str, source: str, skipped: Mapping[str, str], count: int | None = None) -> None:
        """Keep in `owner`'s folder what it skipped (`source`: "claims" or "sweep") for `status`."""
        owners.record_skipped(self.folder, owner, source, skipped, count)

    def heartbeat(self, owner: str) -> None:
        """Renew `owner`'s lease; raise ClaimLost if a sweeper has reaped it."""
        owners.heartbeat(self.folder, owner)

    def retire_owner(self, owner: str) -> None:
        """Remove an owner's empty folder when it stops; its remaining jobs stay for the sweeper."""
        owners.retire(self.folder, owner)

    def return_unheld(
        self, owner: str, held: set[str], now: float | None = None, functions: Functions | None = None
    ) -> int:
        """Return the jobs in `claimed/OWNER/` that the owner holds no run of (an error struck
        between their claim and their fork); how many moved."""
        cause = f"claimed by {owner} but never started (an error came between the claim and the fork)"
        owner_dir = self.folder.at(State.CLAIMED) / owner
        return sweep.return_unheld(self.folder, owner_dir, held, cause, _now(now), self._index.add, functions)

    def claim(
        self, owner: str, now: float | None = None, functions: Functions | None = None, paused: Paused = NOT_PAUSED
    ) -> Claim | None:
        """Claim the next ready job for `owner` and count its attempt; None if none is ready.

        With `functions`, only a job this claimer can run: any other is given back as it was
        (no attempt used) and not looked at again by this queue object; its policy comes from
        `functions`' registration. Without, every job is claimed and resolved without one.
        A job of a `paused` function is given back too, until `index.forget_skips()`.
        """
        return self._claimer.claim(owner, _now(now), functions, paused)

    def claim_state(self, claim: Claim) -> ClaimState:
        """Whether the claimed job is still where its claim put it, and whether an operator
        cancelled it or froze its run; OSError when it cannot be looked at now (not the
        same as gone)."""
        return self._claimer.state(claim)

    def finish(self, claim: Claim, end: RunEnd, now: float | None = None) -> Finished:
        """Finish a run from how it ended: write its `outcome.json`, then move its job on as
        the end's verdict says (done; back to ready/ if a drain stopped it before it returned;
        a retry after the policy's backoff; dead once its attempts are used, at once when
        the failure is permanent or an operator cancelled it). Where the job went, and for a
        retry in scheduled/ its name's parts (its manager may promote it by name)."""
        return self._claimer.finish(claim, end, _now(now))

    def record_outcome(self, claim: Claim, outcome: Mapping[str, Any], now: float | None = None) -> None:
        """Write how the run ended into its folder (exit status, rusage, error...)."""
        self._claimer.record_outcome(claim, outcome, _now(now))

    def complete(self, claim: Claim, now: float | None = None) -> None:
        """Move a claimed job to `done/`, with its run's result as `result.json`."""
        self._claimer.complete(claim, _now(now))

    def fail(
        self,
        claim: Claim,
        error: Mapping[str, Any],
        now: float | None = None,
        *,
        delay: float = 0.0,
        permanent: bool = False,
    ) -> State:
        """Record a failed attempt: schedule a retry after `delay`, or bury the job in
        `dead/` once its attempts are used up or at once when `permanent`."""
        return self._claimer.fail(claim, error, _now(now), delay, permanent)

    def release(self, claim: Claim, now: float | None = None, reason: str = "released") -> None:
        """Put a claimed job back in `ready/` without using an attempt (operator shutdown);
        a job an operator cancelled goes to `dead/` instead."""
        self._claimer.release(claim, _now(now), reason)

    def note_lost(self, claim: Claim, how: str = "stopped", now: float | None = None) -> None:
        """Log in the job's events that this run's claim was lost (wherever the job is now)."""
        self._claimer.note_lost(claim, how, _now(now))

    @property
    def index(self) -> ReadyIndex:
        """The claim index of this queue object: its `scans` and `skipped` say what claiming cost."""
        return self._index

    @property
    def left_for_others(self) -> dict[str, int]:
        """Functions this queue object's claims could not run, with how many jobs it gave back."""
        return self._claimer.left_for_others

    @property
    def unclaimable(self) -> dict[str, str]:
        """`ready/` entries its claims skip (they cannot be moved), with why (the first 100)."""
        return self._claimer.unclaimable

    @property
    def more_to_examine(self) -> bool:
        """The last claim stopped at its budget of entries: call again soon."""
        return self._claimer.more_to_examine

    def has_claimable(self) -> bool:
        """Whether `ready/` holds, now, a job this queue object has not given back (one scan)."""
        self._index.rescan()
        return self._index.holds_names

    def take_in(
        self, now: float | None = None, budget: int = 64, leftovers: bool = False, seconds: float | None = None
    ) -> int:
        """Take in members' submissions and requests from `incoming/` (see `jobs.incoming`),
        at most `budget` of them in at most `seconds`; return how many were handled. The
        queue's owner (its managers) does this; `leftovers`: also finish interrupted take-ins
        (the sweeper's chore)."""
        now = _now(now)
        return self._intake.take_in(now, self._take_in_actions(now), budget, seconds, leftovers)

    def _take_in_actions(self, now: float) -> incoming.Actions:
        return incoming.Actions(
            cancel=self.cancel,
            retry=self.retry,
            on_ready=self._index.add,
            publish_waiting=lambda staging, job_id, spec: self._publisher.publish_waiting(
                staging, job_id, spec.depends_on, now
            ),
        )

    def member_folders(self) -> list[Path]:
        """The members' submission folders of `incoming/` this process may look into (to watch)."""
        return [Path(place.path) for place in submissions.member_folders(self.folder)]

    def pending_requests(self) -> int:
        """How many members' requests (cancel, retry) wait to be taken in."""
        return submissions.pending_requests(self.folder)

    @property
    def more_to_take_in(self) -> bool:
        """The last take-in stopped at its budget or its time: call again soon."""
        return self._intake.more

    @property
    def intake_skipped(self) -> tuple[dict[str, str], int]:
        """What this queue object's take-ins set aside (folders and entries of incoming/ they
        cannot use), the first ones with why, and how many."""
        return dict(self._intake.skipped), self._intake.skipped_count

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

    def note_ready(self, name: str) -> None:
        """Tell the claim index about a new `ready/` entry (from inotify)."""
        self._index.note(name)

    def note_ready_missed(self) -> None:
        """Tell the claim index that the watcher lost events: it rescans `ready/` first."""
        self._index.forget_scan()

    def stats_file(self, role: str) -> stats.StatsFile:
        """The counters a manager or a sweeper (`role`) keeps for this queue (see `jobs.stats`)."""
        return stats.StatsFile(self.folder, role)

    # -- reading -----------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """The current view of one job; raise JobNotFound or InvalidJobId."""
        while True:  # a job that moves while we read it is looked for again (it always ends somewhere)
            state, place = view.locate(self.folder, job_id)
            job = view.read_moving(self.folder, state, place)
            if job is not None:
                return job

    def events(self, job_id: str, limit: int = 1 << 20) -> list[str]:
        """The lines of a job's `events` log (empty if it has none, or it cannot be read)."""
        state, place = view.locate(self.folder, job_id)
        if state is State.INCOMING:
            return []
        try:
            with place.open() as job:
                data = files.read_limited(EVENTS_FILE, limit, job.fd)
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()

    def open_output(self, job_id: str, run: int, name: str) -> BinaryIO | None:
        """Open a run's `stdout` or `stderr` for reading (None if the run wrote none). The file
        follows the job as it moves; it may not be a regular file (a job wrote something odd)."""
        if name not in ("stdout", "stderr"):
            raise InvalidJob(f"a run's output is stdout or stderr, not {name!r}")
        _, place = view.locate(self.folder, job_id)
        try:
            with place.dir.sub(f"{place.name}/attempt-{run}") as attempt:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=attempt.fd)
        except FileNotFoundError:
            return None
        return os.fdopen(fd, "rb")

    def owners(self) -> list[OwnerFolder]:
        """The folders of `claimed/`: the managers serving the queue (and those being reaped)."""
        return view.owner_folders(self.folder)

    def served_functions(self, owners: Iterable[OwnerFolder], now: float, is_alive: Liveness) -> dict[str, Any]:
        """The functions live managers among `owners` run, each with the policy one of them declares."""
        return view.served_functions(owners, now, is_alive)

    def head_functions(self, limit: int) -> tuple[int, dict[str, int]]:
        """The functions named by the first `limit` ready jobs in claim order: (jobs read, count per function)."""
        return view.head_functions(self.folder, limit)

    def effective_policy(self, job: Job, served: Mapping[str, Mapping[str, Any]]) -> Policy:
        """The policy to show for `job`: its newest run's, or what a live manager would resolve now."""
        return view.effective_policy(self.folder, job, served)

    def claimed_jobs(self, owner: OwnerFolder) -> Iterator[Job]:
        """The jobs in an owner's folder, each read whole (those that move as they are read are left out)."""
        for place, _ in view.entries_in(owner.place, State.CLAIMED):
            job = view.read_moving(self.folder, State.CLAIMED, place)
            if job is not None:
                yield job

    def run_pid(self, job: Job) -> tuple[int, float] | None:
        """The pid of the job's newest run's child, and when it started; None if unknown."""
        return self._newest_run(job, run_folder.read_pid)

    def run_progress(self, job: Job) -> dict[str, Any] | None:
        """What the job's newest run last said of its progress (`jobs.current().progress`)."""
        return self._newest_run(job, run_folder.read_progress)

    def _newest_run(self, job: Job, read: Callable[[int], _T | None]) -> _T | None:
        if not job.history:
            return None
        try:
            _, place = view.locate(self.folder, job.id)
            with place.dir.sub(f"{place.name}/attempt-{job.history[-1].number}") as run:
                return read(run.fd)
        except (OSError, JobsError):
            return None

    def oldest_ready_age(self, now: float) -> float | None:
        """Seconds since the longest-waiting ready job was enqueued; None if none is ready."""
        ready = view.entries_in(self.folder.at(State.READY), State.READY, check_dirs=False)
        oldest = min((job_id for _, job_id in ready), default=None)
        return None if oldest is None else max(0.0, now - created_at(oldest))

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

    def scheduled_after(self, when: float) -> int:
        """How many scheduled jobs are due after `when` (epoch seconds)."""
        names = self.folder.at(State.SCHEDULED).names()
        return sum(1 for parsed in map(parse_scheduled_name, names) if parsed and parsed[2] > when)

    # -- operator actions ------------------------------------------------------

    def request_drain(self, now: float | None = None) -> None:
        """Ask every manager of the queue to drain: a new `drain` file in the queue folder."""
        operator.request_drain(self.folder, _now(now))

    def drain_request(self) -> tuple[int, int] | None:
        """Which drain request stands now (its file's inode and mtime), None if none does: a
        manager drains when this changes after its start."""
        return operator.drain_request(self.folder)

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
        take_in = lambda when: self._intake.take_in_one(job_id, when, self._take_in_actions(when))  # noqa: E731
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
        operator.retry(self.folder, job_id, _now(now), self._index.add)

    # -- dependencies (jobs.depends) --------------------------------------------------

    def settle_dependents(self, job_id: str, now: float | None = None, budget: int | None = None) -> int:
        """Move on the jobs waiting for `job_id`, which ended: to ready/ once all they depend on
        are done, to dead/ if it died (and they do not allow failure); return how many were looked at."""
        return depends.settle_dependents(self.folder, job_id, _now(now), self._index.add, budget)

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

    def planner(self, declared: Iterable[Schedule] = ()) -> Planner:
        """The firer of this queue's schedules and `declared` ones (a sweeper's)."""
        return Planner(self.folder, declared, self._publisher)

    def _locate(self, job_id: str) -> tuple[State, Entry]:
        return view.locate(self.folder, job_id)

    # -- sweeping (called by the lease-sweeper) --------------------------------------

    def sweep(
        self,
        now: float,
        is_alive: Callable[[Owner], bool | None],
        tmp_age: float = TMP_AGE,
        functions: Functions | None = None,
        end_leftovers: sweep.EndLeftovers | None = None,
    ) -> dict[str, int]:
        """One sweep: revert dead or expired owners' claims (first ending, with `end_leftovers`,
        what their runs left on this host), promote due scheduled jobs, quarantine abandoned
        submissions. `now` is the file system's clock; `functions` resolve a lost run's
        policy when its claimer recorded none. Each chore runs even if another fails; the
        first failure is raised after all have run."""
        self.last_sweep_skips = skips = sweep.Skips()
        return sweep.sweep(self.folder, now, is_alive, self._index.add, tmp_age, functions, skips, end_leftovers)

    def promote_due(self, now: float | None = None) -> list[str]:
        """Move every due `scheduled/` job to `ready/` now; return their ids."""
        return sweep.promote_due(self.folder, _now(now), self._index.add)

    def promote(self, job_id: str, priority: int, due: float, now: float | None = None) -> bool:
        """Promote one scheduled job by the name its `fail` gave it, without listing
        `scheduled/` (a manager's own retries); False if it was no longer there."""
        return sweep.promote_one(self.folder, scheduled_name(job_id, priority, due), _now(now), self._index.add)

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

    def filesystem_now(self) -> float:
        """The file system's clock, for judging leases (see `jobs.lease`)."""
        return filesystem_now(self.folder.root, self.folder.file_mode)


def _after(call: Call, parents: list[str]) -> Call:
    """`call`, also depending on `parents`."""
    if not parents:
        return call
    options = call.options or JobOptions()
    return Call(call.fn, call.args, call.kwargs, replace(options, depends_on=(*(options.depends_on or ()), *parents)))


def _now(now: float | None) -> float:
    return time.time() if now is None else now


__all__ = ["Call", "Claim", "Queue", "Submitter"]
