"""The owning manager's side of a queue: register, heartbeat, claim, and move each
claimed job on (record its run's outcome, complete, fail, release).

Ownership is location: a job in `claimed/OWNER/` is held by OWNER, so a stale
owner's complete or fail finds its source gone and raises ClaimLost instead of
recording anything. Owner folders are reached by name under the handle of
`claimed/`, never through a handle of the owner's folder: a sweeper fences an
owner by renaming its folder, and every step after that must fail.

Words (see `jobs.fate`): a *run* is one `attempt-N` folder, N its run number;
an *attempt* is a run that counts against `max_attempts`.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from jobs import counter, depends, fate, files, moves, view
from jobs.errors import ClaimLost, InternalError, InvalidJob, JobsError, MoveCollision, UnsupportedFormat
from jobs.fate import Cause, RunEnd, Verdict
from jobs.folder import (
    OUTCOME_FILE,
    RESULT_FILE,
    QueueFolder,
    cancel_requested,
    entry_problem,
    frozen_run,
)
from jobs.handles import Borrowed, Dir, Entry
from jobs.index import ReadyIndex, Shares
from jobs.job import JobSpec, State, parse_ready_name, ready_name, scheduled_name
from jobs.lease import is_owner_name
from jobs.pause import NOT_PAUSED, Paused
from jobs.policy import POLICY_FILE, Functions, Policy, PolicyMemo

log = logging.getLogger(__name__)

NOT_A_FOLDER = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # what opening a folder that is gone, a file or a link raises
EXAMINED_PER_CLAIM = 64  # entries one claim() call looks at: short whatever junk or foreign jobs ready/ holds
EXAMINE_SECONDS = 0.05  # and for no longer than this, however slow the disk is
READY_FORM = "RRR.ID (see docs/FORMAT.md)"
UNCLAIMABLE_KEPT = 100  # entries a claimer could not claim, kept with why for `forkvisor status`


class ClaimState(NamedTuple):
    """What a manager looks at in a running job's folder (`Claimer.state`)."""

    held: bool  # the job is where its claim put it (False: a sweeper took it back)
    cancelled: bool  # an operator cancelled it
    frozen: bool  # an operator froze this run (`forkvisor pause --job`)


@dataclass(frozen=True)
class Claim:
    """A job this owner holds, with the run it is about to start and the policy it runs under.
    `place` is where the job is, reached through the queue's handles; `path` shows it."""

    job_id: str
    owner: str
    path: Path
    spec: JobSpec
    run: int  # the number of its run folder, `attempt-N`
    attempt: int  # which attempt this run is, counted against `policy.max_attempts`
    policy: Policy
    place: Entry = field(compare=False, repr=False)
    counted: bool = True  # False: its count and run folder are staged, in place once `commit_counts` returns

    @property
    def run_path(self) -> Path:
        return self.path / f"attempt-{self.run}"


class Retry(NamedTuple):
    """A scheduled retry, by the name `fail` gave it: its manager promotes it when due."""

    due: float
    job_id: str
    priority: int


class Finished(NamedTuple):
    """Where a finished run's job went, and why (`queue.serving.finish`)."""

    state: State
    verdict: Verdict
    retry: Retry | None = None  # a retry in scheduled/


class Wants(NamedTuple):
    """What a claim asks for (`Claimer.claim`): the functions it runs (None: any), the
    pause it respects, whether its count is only staged."""

    functions: Functions | None
    paused: Paused
    staged: bool


class Claimer:
    """Claims jobs for the owners of one queue object and moves them on."""

    def __init__(self, folder: QueueFolder, index: ReadyIndex) -> None:
        self.folder = folder
        self._index = index
        self._policies = PolicyMemo()
        self.left_for_others: dict[str, int] = {}  # functions this claimer cannot run: jobs given back
        self.unclaimable: dict[str, str] = {}  # ready/ entries skipped: why (the first Skips.LIMIT)
        self.more_to_examine = False  # the last claim() stopped at its budget of entries
        self.races = 0  # entries there at its look, gone at its rename: another owner took them first
        self.gone = 0  # entries its index named that were gone when it looked (taken earlier)
        self._shares = Shares(lambda: [name for name in os.listdir(folder.at(State.CLAIMED).fd) if is_owner_name(name)])

    # -- claiming ------------------------------------------------------------------

    def claim(
        self, owner: str, now: float, functions: Functions | None, paused: Paused = NOT_PAUSED, staged: bool = False
    ) -> Claim | None:
        """Claim the next ready job for `owner` and count its attempt; None if none is ready.
        With `functions`, only a job they run: any other is given back as it was (no attempt
        used) and not looked at again by this claimer. `staged`: in a durable queue, the count
        is only staged (`Claim.counted` False): `commit_counts` puts it on disk, for several
        claims at once, while their children wait at their gates."""
        scans = self._index.scans
        share = self._shares.of(owner, self._index.scans)
        left, stop_at = EXAMINED_PER_CLAIM, time.monotonic() + EXAMINE_SECONDS
        self.more_to_examine = False
        # At most one scan per call, and a bounded number of entries: entries that cannot be
        # claimed (junk, other managers' jobs, folders it may not move) must not keep it looping.
        try:
            while (name := self._index.pop(rescan=self._index.scans == scans, share=share)) is not None:
                claim = self._claim_entry(owner, name, now, Wants(functions, paused, staged))
                if claim is not None:
                    return claim
                if (left := left - 1) == 0 or time.monotonic() > stop_at:
                    self.more_to_examine = True  # the caller comes back at once, after its other chores
                    return None
            return None
        finally:
            if self.unclaimable and self._index.scans != scans:  # entries fixed or removed since are forgotten
                self.unclaimable = {name: why for name, why in self.unclaimable.items() if self._index.is_skipped(name)}

    def _claim_entry(self, owner: str, name: str, now: float, wants: Wants) -> Claim | None:
        try:
            return self._try_entry(owner, name, now, wants)
        except PermissionError as exc:  # an entry this manager may not move, or a file in it it may not write
            # (a full or read-only disk is not the entry's doing: that propagates, and the claim is tried again)
            self._index.skip(name)
            if len(self.unclaimable) < UNCLAIMABLE_KEPT:
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
            moves.hand_over(self.folder.at(State.CLAIMED) / f"{owner}/{parsed[0]}", self.folder.at(State.READY) / name)
        except (OSError, MoveCollision):
            pass  # not moved, or it cannot go back: this owner's heartbeat returns it

    def _try_entry(self, owner: str, name: str, now: float, wants: Wants) -> Claim | None:
        ready, claimed = self.folder.at(State.READY), self.folder.at(State.CLAIMED)
        parsed = parse_ready_name(name)
        try:
            problem = entry_problem(ready / name, missing_ok=False) if parsed else f"its name is not {READY_FORM}"
        except FileNotFoundError:
            self.gone += 1  # taken before this claimer looked (its index learns of no claim): no race
            return None
        if problem:
            self.folder.quarantine(ready / name, problem, now)
            return None
        if parsed is None:
            raise InternalError(f"ready entry {name!r} has no problem but no parsed name: a bug in forkvisor")
        target = claimed / f"{owner}/{parsed[0]}"
        try:
            moves.hand_over(ready / name, target)  # no barrier: a claim lost to a power cut is just ready again
        except FileNotFoundError:
            if not claimed.is_dir(owner):
                raise ClaimLost(
                    f"cannot claim for owner {owner} in {self.folder.path}: its folder claimed/{owner} is gone"
                ) from None
            self.races += 1
            return None  # another owner claimed it first
        except MoveCollision:
            self.folder.quarantine(ready / name, f"job {parsed[0]} is already in claimed/{owner}/ (duplicate id)", now)
            return None
        files.checkpoint("claim:moved")
        try:
            return self._begin_run(owner, target, parsed[0], name, now, wants)
        except FileNotFoundError:
            return None  # a sweeper reaped this owner mid-claim; the job is back in the queue

    def _begin_run(self, owner: str, place: Entry, job_id: str, name: str, now: float, wants: Wants) -> Claim | None:
        functions = wants.functions
        with place.open() as job:
            try:
                spec = self.folder.read_spec(job, job_id)
            except UnsupportedFormat as exc:
                self._give_back(place, name, f"job.json format ({exc})")
                return None
            except InvalidJob as exc:
                _bury(self.folder, place, job_id, fate.invalid(str(exc)), now)
                return None
            if functions is not None and not functions.knows(spec.function):
                self._give_back(place, name, spec.function)
                return None
            if wants.paused.covers(spec.function):
                self._give_back(place, name, None)  # until resumed (see `pause`)
                return None
            if spec.depends_on and (found := depends.verdict(self.folder, spec)) is not depends.RUN:
                self._not_yet(place, job_id, spec, found, now)  # written into ready/ by hand, say
                return None
            try:
                count = counter.counted(job)
            except InvalidJob as exc:
                _bury(self.folder, place, job_id, fate.invalid(str(exc)), now)
                return None
            used, never_counted = count or 0, count is None
            policy, record = self._policies.resolve(spec, functions, self.folder.stored_settings)
            dead = fate.before_run(cancel_requested(job), used, policy.max_attempts)
            if dead is not None:
                _bury(self.folder, place, job_id, dead, now)
                return None
            files.checkpoint("claim:judged")
            staged = counter.count_run(self.folder, place, job, used, wants.staged)  # (staged: `Serving.commit_counts`)
            files.checkpoint("claim:counted")
            path = Path(place.path)
            if staged:  # its run folder is staged too, and put in place once its count is (`begin_runs`)
                run = _free_run(job, never_counted)
                claim = Claim(job_id, owner, path, spec, run, used + 1, policy, place, False)
                self.folder.make_dir(job / f".attempt-{claim.run}")
                _write_policy(self.folder, place, f".attempt-{claim.run}", record)
            else:
                run = _new_run_folder(self.folder, job, place, never_counted)
                claim = Claim(job_id, owner, path, spec, run, used + 1, policy, place)
                files.checkpoint("claim:attempt-created")
                _write_policy(self.folder, place, f"attempt-{claim.run}", record)
            attempt = f"attempt {claim.attempt}/{policy.max_attempts} (run {claim.run})"
            self.folder.log_event(job, f"claimed by {owner}: {attempt}", now)
        return claim

    def _not_yet(self, place: Entry, job_id: str, spec: JobSpec, found: depends.Readiness | Cause, now: float) -> None:
        """A job that depends on unfinished jobs waits for them; one whose dependency is dead is buried."""
        if isinstance(found, Cause):
            _bury(self.folder, place, job_id, found, now)
            return
        depends.write_edges(self.folder, job_id, spec.depends_on)
        files.checkpoint("claim:edges-written")
        moves.move_on(place, self.folder.at(State.WAITING) / job_id, self.folder.durable)
        files.checkpoint("claim:waiting")
        depends.settle(self.folder, job_id, now, self._index.add)  # one may have ended meanwhile

    def _give_back(self, place: Entry, name: str, function: str | None) -> None:
        """Put a job this claimer cannot run back in `ready/` as it was: no attempt used, no
        event (every manager that cannot run it passes it once), and never looked at again here."""
        self._index.skip(name)  # first: the watcher will report the name coming back
        try:
            moves.hand_over(place, self.folder.at(State.READY) / name)
        except FileNotFoundError:
            return  # reaped meanwhile: the sweeper returned it
        except MoveCollision:
            self.folder.quarantine(place, f"{name} is in ready/ twice (a copy?)", time.time())
        if function is not None:  # (None: paused, not left for other managers)
            self.left_for_others[function] = self.left_for_others.get(function, 0) + 1

    # -- a claimed job ---------------------------------------------------------------

    def state(self, claim: Claim) -> ClaimState:
        """Whether the claimed job is still where its claim put it, whether an operator
        cancelled it or froze its run; OSError when it cannot be looked at now (not the
        same as gone)."""
        try:
            with claim.place.open() as job:
                return ClaimState(True, cancel_requested(job), frozen_run(job) == claim.run)
        except OSError as exc:
            if exc.errno in NOT_A_FOLDER:  # gone, or not a folder any more
                return ClaimState(False, False, False)
            raise

    def finish(self, claim: Claim, end: RunEnd, now: float, run: int | None = None) -> Finished:
        """`queue.serving.finish`: the job folder and its run's opened once (`run`: the run's
        folder, opened already by the caller); the outcome written, then the move its verdict
        and `fate` choose."""
        verdict = end.verdict
        with _open(self.folder, claim, "record the outcome of") as job:
            with _run_folder(self.folder, job, claim, now, run) as folder:
                self._write_outcome(folder, end.record(), now)
                if verdict is Verdict.DONE:
                    self._complete(job, claim, now, folder)
            if verdict is Verdict.DONE:
                return Finished(State.DONE, verdict)
            if verdict is Verdict.RELEASED:
                return Finished(self._release(job, claim, now, "released by the manager's shutdown"), verdict)
            delay = claim.policy.delay(claim.attempt)
            state = self._fail(job, claim, end.error, now, delay, end.permanent)
        retry = Retry(now + delay, claim.job_id, claim.spec.priority) if state is State.SCHEDULED else None
        return Finished(state, verdict, retry)

    def record_outcome(self, claim: Claim, outcome: Mapping[str, Any], now: float) -> None:
        """`queue.serving.record_outcome`: `outcome.json` in the run folder, made anew if the job replaced it."""
        with (
            _open(self.folder, claim, "record the outcome of") as job,
            _run_folder(self.folder, job, claim, now) as run,
        ):
            self._write_outcome(run, outcome, now)

    def complete(self, claim: Claim, now: float) -> None:
        """`queue.serving.complete`: the result linked, the event logged and the folder made durable, then the move."""
        with _open(self.folder, claim, "complete") as job:
            self._complete(job, claim, now)

    def fail(self, claim: Claim, error: Mapping[str, Any], now: float, delay: float, permanent: bool) -> State:
        """`queue.serving.fail`: `fate` decides between a retry and `dead/`."""
        with _open(self.folder, claim, "fail") as job:
            return self._fail(job, claim, error, now, delay, permanent)

    def release(self, claim: Claim, now: float, reason: str) -> None:
        """`queue.serving.release`: `fate` decides; the counter goes back one before the move."""
        with _open(self.folder, claim, "release") as job:
            self._release(job, claim, now, reason)

    def _write_outcome(self, run: Dir, outcome: Mapping[str, Any], now: float) -> None:
        try:
            self.folder.write_json(run / OUTCOME_FILE, dict(outcome))
        except IsADirectoryError:  # the job made a folder there: moved aside, once
            self.folder.clear_the_way(run, OUTCOME_FILE, now)
            self.folder.write_json(run / OUTCOME_FILE, dict(outcome))

    def _complete(self, job: Dir, claim: Claim, now: float, run: Dir | None = None) -> None:
        files.checkpoint("complete:opened")
        _link_result(self.folder, job, claim, now, run)
        files.checkpoint("complete:result-linked")
        # Logged first: a kill right after the move must not leave the story without its end.
        self.folder.log_event(job, f"done: attempt {claim.attempt} (run {claim.run}) succeeded", now)
        if self.folder.durable:  # its result's link and its run folder, on disk before the move that ends it
            job.fsync()
        _move_claimed(self.folder, claim, self.folder.at(State.DONE) / claim.job_id, "complete")

    def _fail(
        self, job: Dir, claim: Claim, error: Mapping[str, Any], now: float, delay: float, permanent: bool
    ) -> State:
        limit = claim.policy.max_attempts
        dead = fate.after_failure(cancel_requested(job), claim.attempt, limit, claim.run, error, permanent)
        if dead is not None:
            _bury(self.folder, claim.place, claim.job_id, dead, now, claim)
            return State.DEAD
        due = now + max(0.0, delay)
        state, target = _waiting_place(self.folder, claim.spec, due, now)
        what = "ready" if state is State.READY else f"retry in {delay:.1f}s"
        # Logged before the move: once in ready/, another manager may claim the job at once.
        self.folder.log_event(job, f"failed: attempt {claim.attempt}/{limit}, {what}", now)
        _move_claimed(self.folder, claim, target, "fail")
        if state is State.READY:
            self._index.add(target.name)
        return state

    def _release(self, job: Dir, claim: Claim, now: float, reason: str) -> State:
        dead = fate.after_release(cancel_requested(job))
        if dead is not None:
            _bury(self.folder, claim.place, claim.job_id, dead, now, claim)
            return State.DEAD
        try:
            counter.give_back(self.folder, claim.place, job, claim.attempt)
        except FileNotFoundError:
            raise _lost(self.folder, claim, "release") from None
        files.checkpoint("release:uncounted")
        self.folder.log_event(job, f"{reason}: run {claim.run} stopped, attempt not counted", now)
        target = self.folder.at(State.READY) / ready_name(claim.job_id, claim.spec.priority)
        _move_claimed(self.folder, claim, target, "release")
        self._index.add(target.name)
        return State.READY

    def note_lost(self, claim: Claim, how: str, now: float) -> None:
        """`queue.serving.note_lost`: found wherever it went; its run gets a lost outcome if it has none."""
        try:
            _, place = view.locate(self.folder, claim.job_id)
            with place.open() as job:
                self.folder.log_event(job, f"run {claim.run} by {claim.owner} {how} after its claim was lost", now)
                # Its folder may have been made after a sweep reaped the claim (its owner was
                # stopped mid-claim): the sweep found no run to mark, so the story ends here.
                with job.sub(f"attempt-{claim.run}") as run:
                    if not run.exists(OUTCOME_FILE):
                        lost = {"run": claim.run, "lost": True, "error": f"the run's claim was lost; it {how}"}
                        self.folder.write_json(run / OUTCOME_FILE, lost)
        except (JobsError, OSError):
            return


# -- a claimed job's folder, for the claim and the finish alike ------------------------------------


def _open(folder: QueueFolder, claim: Claim, verb: str) -> Dir:
    """The claimed job's folder, opened; ClaimLost if it is no longer where the claim put it."""
    try:
        return claim.place.open()
    except FileNotFoundError:
        raise _lost(folder, claim, verb) from None


def _run_folder(folder: QueueFolder, job: Dir, claim: Claim, now: float, opened: int | None = None) -> Dir:
    """The claim's run folder (`opened`: its descriptor, the caller's to close), opened
    without following a link. One the job removed, or put a link or a file in the place
    of, is quarantined and made again: the manager's record goes into a folder of its
    own, never where a link points."""
    name = f"attempt-{claim.run}"
    if opened is not None:
        return Borrowed(opened, f"{job.path}/{name}")
    try:
        return job.sub(name)
    except OSError as exc:
        if exc.errno not in NOT_A_FOLDER:
            raise
    if job.exists(name):
        folder.quarantine(job / name, f"the folder of run {claim.run} was replaced while it ran", now)
    log.warning("job %s: the folder of run %d was gone or replaced; recording anew", claim.job_id, claim.run)
    try:
        folder.make_dir(job / name)
    except FileExistsError:
        pass  # put back meanwhile: it is opened (or refused) below
    return job.sub(name)


def _link_result(folder: QueueFolder, job: Dir, claim: Claim, now: float, run: Dir | None) -> None:
    """Make `result.json` the completing run's result, or remove one a lost run left.
    Only a regular file is linked: whatever else the run left there is not its result.
    What stands in the way (a folder, a staging name a killed manager left) is found by
    the call it stops, and cleared then: a run with no result costs two calls."""
    staging = f".{RESULT_FILE}.link"
    # The result goes in through the claim's path, not the handle: a manager stopped (SIGSTOP)
    # past its lease may resume after a sweep gave the job to another, and must not put its
    # run's result in the job the other now runs (the rename finds no place, the claim is lost).
    place = claim.place
    result = f"{place.name}/{RESULT_FILE}"
    staged = _stage_result(folder, job, claim.run, run, staging, now)
    try:
        if staged is None:
            _unlink_result(folder, job, result, place.dir, now)  # no result of this run
        else:
            _put_result(folder, job, f"{place.name}/{staged}", result, place.dir, now)
    except FileNotFoundError:
        files.unlink_if_there(staging, job.fd)  # ours, wherever the job is now
        raise _lost(folder, claim, "complete") from None


def _unlink_result(folder: QueueFolder, job: Dir, result: str, claimed: Dir, now: float) -> None:
    try:
        files.unlink_if_there(result, claimed.fd)
    except (IsADirectoryError, PermissionError):  # a folder (EISDIR, or EPERM): moved aside
        if not job.is_dir(RESULT_FILE):
            raise
        folder.clear_the_way(job, RESULT_FILE, now)


def _put_result(folder: QueueFolder, job: Dir, staged: str, result: str, claimed: Dir, now: float) -> None:
    try:
        _replace_within(claimed, staged, result)
    except IsADirectoryError:  # a folder stands there: moved aside, once
        folder.clear_the_way(job, RESULT_FILE, now)
        _replace_within(claimed, staged, result)


def _replace_within(folder: Dir, name: str, target: str) -> None:
    os.replace(name, target, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)


def _stage_result(folder: QueueFolder, job: Dir, number: int, run: Dir | None, staging: str, now: float) -> str | None:
    """Hard-link run `number`'s `result.json` (in `run`, if given, its folder) into the job's
    folder as `staging`; return that name, or None when the run left no regular file there.
    The run's folder is the job's to write, so the entry itself is linked
    (`follow_symlinks=False`: a link stays a link) and only then looked at, in the job's
    folder, where the job cannot replace it."""
    if run is not None:
        return _staged(folder, job, run, staging, now)
    try:
        opened = job.sub(f"attempt-{number}")
    except OSError as exc:
        if exc.errno not in NOT_A_FOLDER:
            raise
        return None
    with opened:
        return _staged(folder, job, opened, staging, now)


def _staged(folder: QueueFolder, job: Dir, run: Dir, staging: str, now: float) -> str | None:
    files.checkpoint("complete:result-checked")
    try:
        try:
            _link(run, job, staging)
        except FileExistsError:  # left by a manager killed here (or a folder): cleared, once
            folder.clear_the_way(job, staging, now)
            files.unlink_if_there(staging, job.fd)
            _link(run, job, staging)
    except OSError as exc:
        if exc.errno not in NOT_A_FOLDER and exc.errno != errno.EPERM:  # EPERM: a folder, never linked
            raise
        return None
    if stat.S_ISREG(job.lstat(staging).st_mode):
        return staging
    files.unlink_if_there(staging, job.fd)  # a link, a fifo or a device: not a result
    return None


def _link(run: Dir, job: Dir, staging: str) -> None:
    os.link(RESULT_FILE, staging, src_dir_fd=run.fd, dst_dir_fd=job.fd, follow_symlinks=False)


def _waiting_place(folder: QueueFolder, spec: JobSpec, due: float, now: float) -> tuple[State, Entry]:
    if due <= now:
        return State.READY, folder.at(State.READY) / ready_name(spec.id, spec.priority)
    return State.SCHEDULED, folder.at(State.SCHEDULED) / scheduled_name(spec.id, spec.priority, due)


def _move_claimed(folder: QueueFolder, claim: Claim, target: Entry, verb: str) -> None:
    try:
        moves.move_on(claim.place, target, folder.durable)
    except FileNotFoundError:
        raise _lost(folder, claim, verb) from None
    except MoveCollision:
        where = os.path.basename(target.dir.path)
        raise _quarantine_copy(folder, claim.place, where, verb, time.time()) from None


def _quarantine_copy(folder: QueueFolder, place: Entry, where: str, verb: str, now: float) -> ClaimLost:
    """Quarantine a copy of a job whose id already stands in `where`; return the error to raise."""
    why = f"cannot {verb} job {os.path.basename(place.name)}: {where}/ already holds a job with this id (a copy?)"
    folder.quarantine(place, why, now)
    return ClaimLost(f"{why}; this copy was moved to quarantine/")


def _lost(folder: QueueFolder, claim: Claim, verb: str) -> ClaimLost:
    return ClaimLost(
        f"cannot {verb} job {claim.job_id} in {folder.path}: it is no longer in claimed/{claim.owner}/; "
        f"a sweeper took it back after owner {claim.owner} stopped heartbeating"
    )


def _bury(folder: QueueFolder, place: Entry, job_id: str, cause: Cause, now: float, claim: Claim | None = None) -> None:
    """Bury a job this claimer holds; with its `claim`, ClaimLost if it is gone or a copy."""
    try:
        folder.bury(place, job_id, cause, now)
    except FileNotFoundError:
        if claim is None:
            raise
        raise _lost(folder, claim, "fail") from None
    except MoveCollision:
        lost = _quarantine_copy(folder, place, State.DEAD.value, "bury", now)
        if claim is not None:
            raise lost from None


def begin_runs(claims: Sequence[Claim], failed: list[OSError | None]) -> None:
    """The staged run folders (`.attempt-N`) of claims whose counts are now in place
    (`failed[i]` None), put in place; a claim whose folder cannot be gets why in `failed`.
    After the count and before the job folder's fsync (`counter.make_durable`): a run folder
    never stands without its count, even when the manager is killed in between. (A staged
    folder whose claim never got that far stays, hidden, and its number is not used again.)"""
    for index, claim in enumerate(claims):
        if failed[index] is None:
            try:
                where = claim.place
                files.move(
                    f"{where.name}/.attempt-{claim.run}",
                    f"{where.name}/attempt-{claim.run}",
                    src_dir_fd=where.dir.fd,
                    dst_dir_fd=where.dir.fd,
                )
                files.checkpoint("claim:attempt-created")
            except (OSError, MoveCollision) as exc:
                failed[index] = exc if isinstance(exc, OSError) else FileExistsError(str(exc))


def _next_run(job: Dir, never_counted: bool) -> int:
    """The number after the newest run's. A job never counted whose folder holds no folder
    is on its first: its link count (2: itself and its entry) says so, where the file system
    keeps it (ext4, XFS, tmpfs, NFS from those; btrfs and overlayfs say 1 and are listed),
    without the listing every claim once made."""
    if never_counted and os.fstat(job.fd).st_nlink == 2:
        return 1
    return view.last_attempt(job) + 1


def _new_run_folder(folder: QueueFolder, job: Dir, place: Entry, never_counted: bool) -> int:
    """Create the folder of the next run, `attempt-(newest + 1)`; return its number.
    It lists the job folder rather than trusting the counter: an operator's `retry`
    resets the counter, and a hand-edited job may have gaps, but run numbers only grow.
    Made through the claim's place: in a job reaped meanwhile (its owner stood still
    past its lease), none is made (FileNotFoundError: the claim is given up)."""
    number = _free_run(job, never_counted)
    while True:
        try:
            folder.make_dir(Entry(place.dir, f"{place.name}/attempt-{number}"))
            return number
        except FileExistsError:
            number += 1


def _free_run(job: Dir, never_counted: bool) -> int:
    """The number of the next run (its folder staged now, put in place by `begin_runs`):
    after the newest run, past any entry that stands in the way, staged or not (as
    `_new_run_folder` steps over one): no two claims of a job ever share a run number."""
    number = _next_run(job, never_counted)
    while job.exists(f"attempt-{number}") or job.exists(f".attempt-{number}"):
        number += 1
    return number


def _write_policy(folder: QueueFolder, place: Entry, run_folder: str, record: bytes) -> None:
    """Write the run's policy through the claim's place, like the run's folder: in a job
    reaped meanwhile, nothing is written (FileNotFoundError: the claim is given up, and no
    run of it is told in the job, which is no longer this claimer's)."""
    # Not fsynced: after a power loss the sweeper resolves the policy again from the same sources.
    path = f"{place.name}/{run_folder}/{POLICY_FILE}"
    files.write_new(path, record, durable=False, mode=folder.file_mode, dir_fd=place.dir.fd)
