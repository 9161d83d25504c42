"""The queue: enqueue, claim, complete, fail, release, and operator actions.

Each transition is one rename of the job directory (see `jobs/__init__`).
Ownership is location: a job in `claimed/OWNER/` is held by OWNER, so a stale
owner's complete or fail finds its source gone and raises ClaimLost instead
of recording anything.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from jobs import files, incoming, sweep, view, waiting
from jobs.command import command_call
from jobs.errors import (
    ClaimLost,
    InternalError,
    InvalidJob,
    JobFailed,
    JobsError,
    MoveCollision,
    NotFinished,
    QueueReplaced,
    UnsupportedFormat,
    WrongState,
)
from jobs.folder import (
    CANCEL_FILE,
    DRAIN_FILE,
    EVENTS_FILE,
    OUTCOME_FILE,
    RESULT_FILE,
    QueueFolder,
    entry_problem,
    filesystem_now,
    indented_json,
)
from jobs.handles import Dir, Entry
from jobs.index import ReadyIndex
from jobs.job import (
    Job,
    JobOptions,
    JobSpec,
    State,
    check_job_id,
    parse_ready_name,
    parse_scheduled_name,
    ready_name,
    scheduled_name,
)
from jobs.lease import FUNCTIONS_FILE, OWNER_FILE, OWNER_FILES, SKIPPED_FILES, Owner
from jobs.policy import POLICY_FILE, Functions, Policy, PolicyMemo
from jobs.submit import Call, Publisher, Submitter

log = logging.getLogger(__name__)


NOT_A_FOLDER = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # what opening a folder that is gone, a file or a link raises
EXAMINED_PER_CLAIM = 64  # entries one claim() call looks at: short whatever junk or foreign jobs ready/ holds
EXAMINE_SECONDS = 0.05  # and for no longer than this, however slow the disk is


@dataclass(frozen=True)
class Claim:
    """A job this owner holds, with the attempt it is about to run and the policy it runs under.
    `place` is where the job is, reached through the queue's handles; `path` shows it."""

    job_id: str
    owner: str
    path: Path
    spec: JobSpec
    attempt: int
    attempts: int
    policy: Policy
    place: Entry = field(compare=False, repr=False)

    @property
    def attempt_path(self) -> Path:
        return self.path / f"attempt-{self.attempt}"

    @property
    def run_place(self) -> Entry:
        """Where the folder of this claim's run is."""
        return Entry(self.place.dir, f"{self.place.name}/attempt-{self.attempt}")


class Queue:
    """A job queue living in a folder."""

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = True, durable: bool = True, shared: bool = False
    ) -> None:
        self.folder = QueueFolder(path, create=create, durable=durable, shared=shared)
        folder = self.folder  # captured alone, not `self`: no cycle keeps a dropped queue's handles open
        self._index = ReadyIndex(lambda: folder.at(State.READY).scandir())
        self._publisher = Publisher(folder, self._index.add)  # its own entries: not a watcher's news
        self.left_for_others: dict[str, int] = {}  # functions this claimer cannot run: jobs given back
        self.unclaimable: dict[str, str] = {}  # ready/ entries skipped: why (the first Skips.LIMIT)
        self.last_sweep_skips = sweep.Skips()  # what the last sweep of this object skipped
        self.more_to_examine = False  # the last claim() stopped at its budget of jobs given back
        self._policies = PolicyMemo()

    @property
    def path(self) -> Path:
        return self.folder.path

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
        return Submitter(self, JobOptions(**options))

    def submit(self, call: Call, now: float | None = None) -> str:
        """Publish one job; once this returns, the job is on disk (and durable when asked)."""
        return self._publisher.submit(call, time.time() if now is None else now)

    def enqueue_many(self, calls: Iterable[Call], now: float | None = None) -> builtins.list[str]:
        """Publish a batch with one durability barrier; return the ids in order.

        Every spec is checked before anything is written. Publishing is not atomic
        as a whole: if it fails part way, the jobs already published stay published.
        """
        return self._publisher.submit_many(calls, time.time() if now is None else now)

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

    # -- claiming and finishing -------------------------------------------------

    def register_owner(self, owner: Owner, functions: Functions | None = None) -> None:
        """Create `claimed/OWNER/` with its owner file (its mtime is the heartbeat) and, given
        `functions`, the list of what it runs. A failed registration leaves nothing behind."""
        staging = self.folder.tmp / f".owner.{owner.name}"
        try:
            self.folder.make_dir(staging)
            with staging.open() as made:
                self.folder.write_new(made / OWNER_FILE, owner.to_json())
                if functions is not None:
                    advertised = indented_json({"functions": functions.advertised()})
                    self.folder.write_new(made / FUNCTIONS_FILE, advertised)
            self.folder.move(staging, self.folder.at(State.CLAIMED) / owner.name)
        except BaseException:
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)  # our own fresh folder (disk full, say)
            raise

    def record_skipped(self, owner: str, source: str, skipped: Mapping[str, str], count: int | None = None) -> None:
        """Keep in `owner`'s folder what it skipped (`source`: "claims" or "sweep"), for
        `forkvisor status`; an owner folder gone meanwhile is no error (nothing to report)."""
        document = {"count": len(skipped) if count is None else count, "skipped": dict(skipped)}
        try:
            with self.folder.at(State.CLAIMED).sub(owner) as owner_dir:
                self.folder.write_json(owner_dir / SKIPPED_FILES[source], document)
        except FileNotFoundError:
            pass

    def heartbeat(self, owner: str) -> None:
        """Renew `owner`'s lease; raise ClaimLost if a sweeper has reaped it."""
        try:
            # By name under claimed/: a sweeper fences an owner by renaming its folder.
            os.utime(f"{owner}/{OWNER_FILE}", dir_fd=self.folder.at(State.CLAIMED).fd, follow_symlinks=False)
        except FileNotFoundError:
            raise ClaimLost(
                f"owner {owner} of queue {self.path} was reaped: a sweeper judged its lease expired "
                "and returned its jobs to the queue"
            ) from None

    def retire_owner(self, owner: str) -> None:
        """Remove an owner's empty folder when it stops; its remaining jobs stay for the sweeper."""
        claimed = self.folder.at(State.CLAIMED)
        try:
            with claimed.sub(owner) as owner_dir:
                if any(view.stray_names(owner_dir)):
                    return
                for name in OWNER_FILES:
                    files.unlink_if_there(name, owner_dir.fd)
        except FileNotFoundError:
            return  # a sweeper reaped it already
        try:
            os.rmdir(owner, dir_fd=claimed.fd)
        except OSError as exc:
            log.warning("cannot remove owner folder %s: %s", claimed / owner, exc)

    def return_unheld(
        self, owner: str, held: set[str], now: float | None = None, functions: Functions | None = None
    ) -> int:
        """Return to the queue the jobs in `claimed/OWNER/` that the owner holds no run of:
        an error struck between their claim and their fork. Return how many moved."""
        now = time.time() if now is None else now
        cause = f"claimed by {owner} but never started (an error came between the claim and the fork)"
        owner_dir = self.folder.at(State.CLAIMED) / owner
        return sweep.return_unheld(self.folder, owner_dir, held, cause, now, self._note_own_ready, functions)

    def has_claimable(self) -> bool:
        """Whether `ready/` holds, now, a job this queue object has not given back (one scan)."""
        self._index.rescan()
        return self._index.holds_names

    def take_in(self, now: float | None = None, budget: int = 64, leftovers: bool = False) -> int:
        """Take in members' submissions and requests from `incoming/` (see `jobs.incoming`);
        return how many entries were handled. The queue's owner (its managers) does this;
        `leftovers`: also finish interrupted take-ins (the sweeper's chore)."""
        now = time.time() if now is None else now
        actions = incoming.Actions(
            cancel=self.cancel,
            retry=self.retry,
            locate=lambda job_id: view.locate(self.folder, job_id),
            on_ready=self._index.add,
        )
        return incoming.take_in(self.folder, now, actions, budget, leftovers)

    def ask(self, job_id: str, action: str, why: str = "") -> None:
        """As a member of a shared queue, ask its managers to `cancel` or `retry` one of your
        jobs (a member may write only incoming/); they do it if you submitted it."""
        if action not in ("cancel", "retry"):
            raise InvalidJob(f"a member may ask for cancel or retry, not {action!r}")
        view.locate(self.folder, check_job_id(job_id))  # JobNotFound now, not silently later
        incoming.request(self.folder, job_id, action, why or f"{action} asked at {time.time()}")

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

    def _note_own_ready(self, name: str) -> None:
        """Tell the claim index about an entry this queue put in `ready/` itself (not a
        watcher's news: it must not make the index trust that it hears of every name)."""
        self._index.add(name)

    def claim(self, owner: str, now: float | None = None, functions: Functions | None = None) -> Claim | None:
        """Claim the next ready job for `owner` and count its attempt; None if none is ready.

        With `functions`, only a job this claimer can run: any other is given back as it was
        (no attempt used) and not looked at again by this queue object; its policy comes from
        `functions`' registration. Without, every job is claimed and resolved without one.
        """
        now = time.time() if now is None else now
        scans = self._index.scans
        left, stop_at = EXAMINED_PER_CLAIM, time.monotonic() + EXAMINE_SECONDS
        self.more_to_examine = False
        # At most one scan per call, and a bounded number of entries: entries that cannot be
        # claimed (junk, other managers' jobs, folders it may not move) must not keep it looping.
        try:
            while (name := self._index.pop(rescan=self._index.scans == scans)) is not None:
                claim = self._claim_entry(owner, name, now, functions)
                if isinstance(claim, Claim):
                    return claim
                if (left := left - 1) == 0 or time.monotonic() > stop_at:
                    self.more_to_examine = True  # the caller comes back at once, after its other chores
                    return None
            return None
        finally:
            if self.unclaimable and self._index.scans != scans:  # entries fixed or removed since are forgotten
                self.unclaimable = {name: why for name, why in self.unclaimable.items() if self._index.is_skipped(name)}

    def _claim_entry(self, owner: str, name: str, now: float, functions: Functions | None) -> Claim | object:
        """Claim one entry of `ready/`; quarantine it, bury it or give it back if it cannot
        be claimed, and skip it from now on if even that fails: one entry never stops claims."""
        try:
            return self._try_entry(owner, name, now, functions)
        except PermissionError as exc:  # an entry this manager may not move, or a file in it it may not write
            # (a full or read-only disk is not the entry's doing: that propagates, and the claim is tried again)
            self._index.skip(name)
            if len(self.unclaimable) < sweep.Skips.LIMIT:
                self.unclaimable[name] = f"{exc.strerror or exc} ({os.path.basename(exc.filename or name)})"
            log.warning("cannot claim ready/%r: %s; skipping it (see `forkvisor status`)", name, exc)
            self._return_if_held(owner, name)
            return None

    def _return_if_held(self, owner: str, name: str) -> None:
        """Put back an entry a failed claim moved into this owner's folder."""
        parsed = parse_ready_name(name)
        if parsed is None:
            return
        try:
            self.folder.move(self.folder.at(State.CLAIMED) / f"{owner}/{parsed[0]}", self.folder.at(State.READY) / name)
        except (OSError, MoveCollision):
            pass  # not moved, or it cannot go back: this owner's heartbeat returns it

    def _try_entry(self, owner: str, name: str, now: float, functions: Functions | None) -> Claim | object:
        ready, claimed = self.folder.at(State.READY), self.folder.at(State.CLAIMED)
        parsed = parse_ready_name(name)
        problem = entry_problem(ready / name) if parsed else "its name is not RRR.ID (see docs/FORMAT.md)"
        if problem:
            self.folder.quarantine(ready / name, problem, now)
            return None
        if parsed is None:
            raise InternalError(f"ready entry {name!r} has no problem but no parsed name: a bug in forkvisor")
        # By name under claimed/, not through a handle of the owner's folder: a sweeper fences
        # an owner by renaming its folder, and a claim after that must fail.
        target = claimed / f"{owner}/{parsed[0]}"
        try:
            # No fsync: a claim lost to power failure is just ready again.
            files.move(name, target.name, src_dir_fd=ready.fd, dst_dir_fd=claimed.fd)
        except FileNotFoundError:
            if not claimed.is_dir(owner):
                raise ClaimLost(
                    f"cannot claim for owner {owner} in {self.path}: its folder claimed/{owner} is gone"
                ) from None
            return None  # another owner claimed it first
        except MoveCollision:
            why = f"job {parsed[0]} is already in claimed/{owner}/ (duplicate id)"
            self.folder.quarantine(ready / name, why, now)
            return None
        files.checkpoint("claim:moved")
        try:
            return self._begin_attempt(owner, target, parsed[0], name, now, functions)
        except FileNotFoundError:
            return None  # a sweeper reaped this owner mid-claim; the job is back in the queue

    def _begin_attempt(
        self, owner: str, place: Entry, job_id: str, name: str, now: float, functions: Functions | None
    ) -> Claim | object:
        with place.open() as job:
            try:
                spec = self.folder.read_spec(job, job_id)
            except UnsupportedFormat as exc:
                return self._give_back(place, name, f"job.json format ({exc})")
            except InvalidJob as exc:
                self._bury(place, job_id, {"reason": "invalid", "message": str(exc)}, now)
                return None
            if functions is not None and not functions.knows(spec.function):
                return self._give_back(place, name, spec.function)
            try:
                used = self.folder.read_counter(job)
            except InvalidJob as exc:
                self._bury(place, job_id, {"reason": "invalid", "message": str(exc)}, now)
                return None
            policy, record = self._policies.resolve(spec, functions, self.folder.stored_settings)
            if job.exists(CANCEL_FILE):  # cancelled while it ran: no further attempt
                self._bury(place, job_id, {"reason": "cancelled", "message": "cancelled by an operator"}, now)
                return None
            if used >= policy.max_attempts:
                message = (
                    f"all {policy.max_attempts} attempts were used (the last one's owner died before recording it)"
                )
                self._bury(place, job_id, {"reason": "attempts exhausted", "message": message}, now)
                return None
            self.folder.write_counter(job, used + 1)  # counted before the fork
            files.checkpoint("claim:counted")
            attempt = self._new_attempt_dir(job)
            files.checkpoint("claim:attempt-created")
            # Not fsynced: after a power loss the sweeper resolves the policy again from the same sources.
            with job.sub(f"attempt-{attempt}") as run:
                files.write_new(POLICY_FILE, record, durable=False, mode=self.folder.file_mode, dir_fd=run.fd)
            self.folder.log_event(
                job, f"claimed by {owner}: attempt {used + 1}/{policy.max_attempts} (run {attempt})", now
            )
        return Claim(job_id, owner, Path(place.path), spec, attempt, used + 1, policy, place)

    def _give_back(self, place: Entry, name: str, function: str) -> object:
        """Put a job this claimer cannot run back in `ready/` as it was: no attempt used, no
        event (every manager that cannot run it passes it once), and never looked at again here."""
        self._index.skip(name)  # first: the watcher will report the name coming back
        ready = self.folder.at(State.READY)
        try:
            files.move(place.name, name, src_dir_fd=place.dir.fd, dst_dir_fd=ready.fd)
        except FileNotFoundError:
            return _GIVEN_BACK  # reaped meanwhile: the sweeper returned it
        except MoveCollision:
            self.folder.quarantine(place, f"{name} is in ready/ twice (a copy?)", time.time())
        self.left_for_others[function] = self.left_for_others.get(function, 0) + 1
        return _GIVEN_BACK

    def _new_attempt_dir(self, job: Dir) -> int:
        """Create the folder of the next run, `attempt-(newest + 1)`; return its number.
        It lists the job folder rather than trusting the counter: an operator's `retry`
        resets the counter, and a hand-edited job may have gaps, but run numbers only grow."""
        number = view.last_attempt(job) + 1
        while True:
            try:
                self.folder.make_dir(job / f"attempt-{number}")
                return number
            except FileExistsError:
                number += 1

    def _open(self, claim: Claim, verb: str) -> Dir:
        """The claimed job's folder, opened; ClaimLost if it is no longer where the claim put it."""
        try:
            return claim.place.open()
        except FileNotFoundError:
            raise self._lost(claim, verb) from None

    def claim_state(self, claim: Claim) -> tuple[bool, bool]:
        """Whether the claimed job is still where its claim put it, and whether an operator
        cancelled it; OSError when it cannot be looked at now (not the same as gone)."""
        try:
            with claim.place.open() as job:
                return True, job.exists(CANCEL_FILE)
        except OSError as exc:
            if exc.errno in NOT_A_FOLDER:  # gone, or not a folder any more
                return False, False
            raise

    def record_outcome(self, claim: Claim, outcome: Mapping[str, Any], now: float | None = None) -> None:
        """Write how the attempt ended into its folder (exit status, rusage, error...)."""
        now = time.time() if now is None else now
        with self._open(claim, "record the outcome of") as job, self._run_folder(job, claim, now) as run:
            self.folder.write_json(run / OUTCOME_FILE, dict(outcome))

    def _run_folder(self, job: Dir, claim: Claim, now: float) -> Dir:
        """The claim's run folder, opened without following a link. One the job removed, or put
        a link or a file in the place of, is quarantined and made again: the manager's record
        goes into a folder of its own, never where a link points."""
        name = f"attempt-{claim.attempt}"
        try:
            return job.sub(name)
        except OSError as exc:
            if exc.errno not in NOT_A_FOLDER:
                raise
        if job.exists(name):
            self.folder.quarantine(job / name, f"the folder of run {claim.attempt} was replaced while it ran", now)
        log.warning(
            "job %s: the folder of run %d was gone or replaced; recording in a new one", claim.job_id, claim.attempt
        )
        try:
            self.folder.make_dir(job / name)
        except FileExistsError:
            pass  # put back meanwhile: it is opened (or refused) below
        return job.sub(name)

    def complete(self, claim: Claim, now: float | None = None) -> None:
        """Move a claimed job to `done/`, with its attempt's result as `result.json`."""
        now = time.time() if now is None else now
        with self._open(claim, "complete") as job:
            self._link_result(job, claim, now)
            files.checkpoint("complete:result-linked")
            # Logged first: a kill right after the move must not leave the story without its end.
            self.folder.log_event(job, f"done: attempt {claim.attempts} (run {claim.attempt}) succeeded", now)
        self._move_claimed(claim, self.folder.at(State.DONE) / claim.job_id, "complete")

    def _link_result(self, job: Dir, claim: Claim, now: float) -> None:
        """Make `result.json` the completing run's result, or remove one a lost run left.
        Only a regular file is linked: whatever else the run left there is not its result."""
        staging = f".{RESULT_FILE}.link"
        for name in (RESULT_FILE, staging):
            self.folder.clear_the_way(job, name, now)
        files.unlink_if_there(staging, job.fd)
        linked = False
        try:
            with job.sub(f"attempt-{claim.attempt}") as run:
                if stat.S_ISREG(run.lstat(RESULT_FILE).st_mode):
                    os.link(RESULT_FILE, staging, src_dir_fd=run.fd, dst_dir_fd=job.fd, follow_symlinks=False)
                    linked = True
        except OSError as exc:
            if exc.errno not in NOT_A_FOLDER:
                raise
        if not linked:
            files.unlink_if_there(RESULT_FILE, job.fd)  # no result of this run (none, or its folder is gone)
            return
        os.replace(staging, RESULT_FILE, src_dir_fd=job.fd, dst_dir_fd=job.fd)

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
        now = time.time() if now is None else now
        if self._cancelled(claim, now):
            return State.DEAD
        if permanent or claim.attempts >= claim.policy.max_attempts:
            reason = "cannot be completed" if permanent else "attempts exhausted"
            cause = {"reason": reason, "attempt": claim.attempts, "run": claim.attempt, **error}
            self._bury(claim.place, claim.job_id, cause, now, claim=claim)
            return State.DEAD
        due = now + max(0.0, delay)
        state, target = self._waiting_place(claim.spec, due, now)
        what = "ready" if state is State.READY else f"retry in {delay:.1f}s"
        with self._open(claim, "fail") as job:
            # Logged before the move: once in ready/, another manager may claim the job at once.
            self.folder.log_event(job, f"failed: attempt {claim.attempts}/{claim.policy.max_attempts}, {what}", now)
        self._move_claimed(claim, target, "fail")
        if state is State.READY:
            self._index.add(target.name)
        return state

    def release(self, claim: Claim, now: float | None = None, reason: str = "released") -> None:
        """Put a claimed job back in `ready/` without using an attempt (operator shutdown);
        a job an operator cancelled goes to `dead/` instead."""
        now = time.time() if now is None else now
        if self._cancelled(claim, now):
            return
        with self._open(claim, "release") as job:
            self.folder.write_counter(job, max(0, claim.attempts - 1))
            files.checkpoint("release:uncounted")
            self.folder.log_event(job, f"{reason}: run {claim.attempt} stopped, attempt not counted", now)
        target = self.folder.at(State.READY) / ready_name(claim.job_id, claim.spec.priority)
        self._move_claimed(claim, target, "release")
        self._index.add(target.name)

    def _cancelled(self, claim: Claim, now: float) -> bool:
        """Bury a claimed job that an operator cancelled; a cancelled job never runs again."""
        try:
            with claim.place.open() as job:
                if not job.exists(CANCEL_FILE):
                    return False
        except FileNotFoundError:
            return False  # lost: the caller's next step says so
        self._bury(
            claim.place, claim.job_id, {"reason": "cancelled", "message": "cancelled by an operator"}, now, claim
        )
        return True

    def _waiting_place(self, spec: JobSpec, due: float, now: float) -> tuple[State, Entry]:
        if due <= now:
            return State.READY, self.folder.at(State.READY) / ready_name(spec.id, spec.priority)
        return State.SCHEDULED, self.folder.at(State.SCHEDULED) / scheduled_name(spec.id, spec.priority, due)

    def _move_claimed(self, claim: Claim, target: Entry, verb: str) -> None:
        try:
            self.folder.move(claim.place, target)
        except FileNotFoundError:
            raise self._lost(claim, verb) from None
        except MoveCollision:
            where = os.path.basename(target.dir.path)
            raise self._quarantine_copy(claim.place, where, verb, time.time()) from None

    def _quarantine_copy(self, place: Entry, where: str, verb: str, now: float) -> ClaimLost:
        """Quarantine a copy of a job whose id already stands in `where`; return the error to raise."""
        why = f"cannot {verb} job {os.path.basename(place.name)}: {where}/ already holds a job with this id (a copy?)"
        self.folder.quarantine(place, why, now)
        return ClaimLost(f"{why}; this copy was moved to quarantine/")

    def _lost(self, claim: Claim, verb: str) -> ClaimLost:
        return ClaimLost(
            f"cannot {verb} job {claim.job_id} in {self.path}: it is no longer in claimed/{claim.owner}/; "
            f"a sweeper took it back after owner {claim.owner} stopped heartbeating"
        )

    def _bury(
        self, place: Entry, job_id: str, cause: Mapping[str, Any], now: float, claim: Claim | None = None
    ) -> None:
        try:
            self.folder.bury(place, job_id, dict(cause), now)
        except FileNotFoundError:
            if claim is None:
                raise
            raise self._lost(claim, "fail") from None
        except MoveCollision:
            lost = self._quarantine_copy(place, State.DEAD.value, "bury", now)
            if claim is not None:
                raise lost from None

    # -- reading -----------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """The current view of one job; raise JobNotFound or InvalidJobId."""
        while True:  # a job that moves while we read it is looked for again (it always ends somewhere)
            state, place = view.locate(self.folder, job_id)
            job = view.read_moving(self.folder, state, place)
            if job is not None:
                return job

    def events(self, job_id: str, limit: int = 1 << 20) -> builtins.list[str]:
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

    def counts(self) -> dict[str, int]:
        """Number of jobs per state name: ready, scheduled, claimed, done, dead."""
        return view.count(self.folder)

    def list(
        self, state: State | str | None = None, function: str | None = None, limit: int | None = None
    ) -> builtins.list[Job]:
        """Jobs in one state (or all), optionally of one function, in name order."""
        states = [State(state)] if state is not None else list(State)
        found: builtins.list[Job] = []
        for current in states:
            for place, _ in sorted(view.entries(self.folder, current), key=lambda entry: entry[0].name):
                if limit is not None and len(found) >= limit:
                    return found
                job = view.read_moving(self.folder, current, place)
                if job is not None and (function is None or job.function == function):
                    found.append(job)
        return found

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
        now = time.time() if now is None else now
        # Renamed into place each time, so that watching managers see a change of file.
        data = f"drain requested at {now}\n".encode()
        files.replace_file(DRAIN_FILE, data, durable=False, mode=self.folder.file_mode, dir_fd=self.folder.root.fd)

    def drain_request(self) -> tuple[int, int] | None:
        """Which drain request stands now (its file's inode and mtime), None if none does: a
        manager drains when this changes after its start."""
        try:
            found = self.folder.root.lstat(DRAIN_FILE)
        except FileNotFoundError:
            return None
        return found.st_ino, found.st_mtime_ns

    def cancel(self, job_id: str, now: float | None = None) -> State:
        """Cancel a job: ready or scheduled goes to `dead/` at once; a claimed one is
        marked, and its manager stops it. Return the job's state after the call."""
        now = time.time() if now is None else now
        state, place = view.locate(self.folder, job_id)
        if state is State.INCOMING:  # a member's submission not taken in yet: take it in, then cancel
            self.take_in(now)
            state, place = view.locate(self.folder, job_id)
        if state.terminal:
            raise WrongState(f"cannot cancel job {job_id}: it is already {state.value}")
        if state is State.CLAIMED:
            try:
                with place.open() as job:
                    self.folder.mark(job / CANCEL_FILE, f"cancelled at {now}")
                    self.folder.log_event(job, "cancel requested", now)
            except FileNotFoundError:
                return self.cancel(job_id, now)  # it finished or went back meanwhile: look again
            return State.CLAIMED
        cause = {"reason": "cancelled", "message": "cancelled by an operator"}
        try:
            self.folder.bury(place, job_id, cause, now, even_if_full=True)
        except FileNotFoundError:
            return self.cancel(job_id, now)  # it moved meanwhile (claimed or promoted): look again
        return State.DEAD

    def retry(self, job_id: str, now: float | None = None) -> None:
        """Send a dead job back to `ready/` with a fresh set of attempts."""
        now = time.time() if now is None else now
        state, place = view.locate(self.folder, job_id)
        if state is not State.DEAD:
            raise WrongState(f"cannot retry job {job_id}: it is {state.value}, and only dead jobs can be retried")
        with place.open() as job:
            spec = self.folder.read_spec(job, job_id)
            self.folder.write_counter(job, 0)
            self.folder.clear_the_way(job, CANCEL_FILE, now)
            files.unlink_if_there(CANCEL_FILE, job.fd)
            self.folder.log_event(job, "ready: retried by an operator, attempts reset", now)
        target = self.folder.at(State.READY) / ready_name(job_id, spec.priority)
        self.folder.move(place, target)
        self._index.add(target.name)

    # -- sweeping (called by the lease-sweeper) --------------------------------------

    def sweep(
        self,
        now: float,
        is_alive: Callable[[Owner], bool | None],
        tmp_age: float = 3600.0,
        functions: Functions | None = None,
    ) -> dict[str, int]:
        """One sweep: revert dead or expired owners' claims, promote due scheduled jobs,
        quarantine abandoned submissions. `now` is the file system's clock; `functions`
        resolve a lost run's policy when its claimer recorded none. Each chore runs even if
        another fails; the first failure is raised after all have run."""
        skips = self.last_sweep_skips = sweep.Skips()
        chores: dict[str, Callable[[], int]] = {
            "reverted": lambda: sweep.reap_owners(self.folder, now, is_alive, self._index.add, functions, skips),
            "promoted": lambda: len(sweep.promote_due(self.folder, now, self._index.add, skips)),
            "abandoned": lambda: sweep.clear_tmp(self.folder, now, tmp_age, skips),
        }
        done: dict[str, int] = {}
        failure: BaseException | None = None
        for name, chore in chores.items():
            try:
                done[name] = chore()
            except (OSError, JobsError) as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return done

    def promote_due(self, now: float | None = None) -> builtins.list[str]:
        """Move every due `scheduled/` job to `ready/` now; return their ids."""
        now = time.time() if now is None else now
        return sweep.promote_due(self.folder, now, self._index.add)

    def promote(self, job_id: str, priority: int, due: float, now: float | None = None) -> bool:
        """Promote one scheduled job by the name its `fail` gave it, without listing
        `scheduled/` (a manager's own retries); False if it was no longer there."""
        now = time.time() if now is None else now
        return sweep.promote_one(self.folder, scheduled_name(job_id, priority, due), now, self._index.add)

    def note_lost(self, claim: Claim, how: str = "stopped", now: float | None = None) -> None:
        """Log in the job's events that this run's claim was lost (wherever the job is now)."""
        now = time.time() if now is None else now
        try:
            _, place = view.locate(self.folder, claim.job_id)
            with place.open() as job:
                self.folder.log_event(job, f"run {claim.attempt} by {claim.owner} {how} after its claim was lost", now)
        except (JobsError, FileNotFoundError):
            return

    def purge(
        self,
        state: State | str,
        older_than: float,
        now: float | None = None,
        dry_run: bool = False,
        budget: int | None = None,
    ) -> builtins.list[str]:
        """Delete terminal jobs whose last transition is older than `older_than` seconds; with a
        `budget`, each job's folder is only partly removed and sweeps finish it (the sweeper's)."""
        now = time.time() if now is None else now
        return sweep.purge(self.folder, State(state), older_than, now, dry_run, budget)

    def filesystem_now(self) -> float:
        """The file system's clock, for judging leases (see `jobs.lease`)."""
        return filesystem_now(self.folder.root, self.folder.file_mode)


_GIVEN_BACK = object()  # what _claim_entry returns for a job given back to ready/

__all__ = ["Call", "Claim", "Queue", "Submitter"]
