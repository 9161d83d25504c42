"""What the lease-sweeper does to a queue, as plain functions of `now`.

- `sweep`: one sweep, the three chores below, each run even if another fails.
- `reap_owners`: an owner that is dead (by the caller's liveness predicate) or
  whose lease expired is fenced with one rename, `claimed/OWNER` to
  `claimed/reaping.OWNER`, so its later claims and completions fail; then each
  of its jobs goes back to `ready/`, or to `dead/` when the lost attempt was
  its last. A sweep interrupted half way finishes the `reaping.` folder next time.
- `promote_due`: `scheduled/` entries whose time has come move to `ready/`.
- `clear_tmp`: submissions abandoned in `tmp/` are quarantined (never deleted).
- `purge`: terminal jobs past an age are deleted, one line each in `purged.log`.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from jobs import counter, depends, fate, files, moves, reserve, ticks, view
from jobs.errors import FULL, InvalidJob, JobsError, MoveCollision, UnsupportedFormat, WrongState
from jobs.folder import (
    EVENTS_FILE,
    OUTCOME_FILE,
    PURGED_LOG,
    RESULT_FILE,
    QueueFolder,
    cancel_requested,
    entry_problem,
)
from jobs.handles import Dir, Entry
from jobs.job import JobSpec, State, is_job_id, parse_scheduled_name, ready_name
from jobs.lease import (
    DEFAULT_LEASE,
    OWNER_FILE,
    OWNER_FILES,
    REAPING_PREFIX,
    Liveness,
    Owner,
    is_expired,
    is_owner_name,
)
from jobs.policy import Functions, resolve

log = logging.getLogger(__name__)
T = TypeVar("T")
PURGE_PREFIX = ".purge."
SETTLE_PER_SWEEP = 10_000  # waiting jobs a sweep settles for parents whose managers did not


STORE_WIDE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)  # not the entry's doing: the whole chore fails


class Skips:
    """The entries a sweep skipped, with why: one entry never stops a sweep, and what it
    skipped is logged and kept here for `forkvisor status` (the first `LIMIT` of them)."""

    LIMIT = 100

    def __init__(self) -> None:
        self.found: dict[str, str] = {}
        self.count = 0

    def guarded(self, what: str, name: str, action: Callable[..., T], *args: Any) -> T | None:
        """`action(*args)` on one entry; if the entry is the problem (it cannot be read, moved
        or parsed), log it, note it and go on with the next."""
        try:
            return action(*args)
        except (OSError, JobsError) as exc:
            if isinstance(exc, OSError) and exc.errno in STORE_WIDE:
                raise
            log.warning("skipping %s %r this sweep: %s", what, name, exc)
            self.count += 1
            if len(self.found) < self.LIMIT:
                self.found[f"{what} {name!r}"] = str(exc)
            return None


EndLeftovers = Callable[[Owner], bool]
"""Before a dead owner's claims go back: end what its runs left running on this host, and
say whether nothing is left (False: not yet; the owner is reaped at a later sweep). The
process side knows how (`supervisor.containment`); the store never kills a process."""


def sweep(
    folder: QueueFolder,
    now: float,
    is_alive: Liveness,
    on_ready: Callable[[str], None],
    tmp_age: float,
    functions: Functions | None,
    skips: Skips,
    end_leftovers: EndLeftovers | None = None,
) -> dict[str, int]:
    """Revert dead or expired owners' claims, promote due scheduled jobs, quarantine
    abandoned submissions; return how many entries each chore handled (and how many owners
    were found dead or expired: "expired"). Each chore runs even
    if another fails; the first failure is raised after all have run."""

    def reap() -> dict[str, int]:
        reverted, expired = reap_owners(folder, now, is_alive, on_ready, functions, skips, end_leftovers)
        return {"reverted": reverted, "expired": expired}

    chores: list[Callable[[], dict[str, int]]] = [
        reap,
        lambda: {"promoted": len(promote_due(folder, now, on_ready, skips))},
        lambda: {"abandoned": clear_tmp(folder, now, tmp_age, skips, on_ready)},
        lambda: {"settled": depends.repair(folder, now, on_ready, SETTLE_PER_SWEEP)},
        lambda: _keep_reserve(folder),
    ]
    done: dict[str, int] = {}
    failure: BaseException | None = None
    for chore in chores:
        try:
            done.update(chore())
        except (OSError, JobsError) as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return done


def reap_owners(
    folder: QueueFolder,
    now: float,
    is_alive: Liveness,
    on_ready: Callable[[str], None],
    functions: Functions | None,
    skips: Skips,
    end_leftovers: EndLeftovers | None,
) -> tuple[int, int]:
    """Return claims of dead or expired owners to the queue; return how many jobs moved and
    how many owners were found dead or expired (and fenced) by this sweep. Before an
    owner's claims go back, `end_leftovers` ends what its runs left on this host.
    A lost run's attempt limit is the one its claimer recorded (`attempt-N/policy.json`),
    else the one `functions` and the queue resolve."""
    revert = _Reverter(folder, on_ready, functions, skips)
    jobs = owners = 0
    for name in folder.at(State.CLAIMED).names():
        reaped = skips.guarded("owner folder", name, _reap, folder, revert, name, now, is_alive, end_leftovers)
        moved, fenced = reaped or (0, 0)
        jobs, owners = jobs + moved, owners + fenced
    return jobs, owners


def _reap(
    folder: QueueFolder,
    revert: _Reverter,
    name: str,
    now: float,
    is_alive: Liveness,
    end_leftovers: EndLeftovers | None,
) -> tuple[int, int] | None:
    """Reap the owner folder `name` if its owner is gone: (jobs moved, owners fenced);
    None where it is left be (a live owner, one whose runs' leftovers live on, junk quarantined)."""
    claimed = folder.at(State.CLAIMED)
    owner_dir = claimed / name
    problem = entry_problem(owner_dir)
    if problem:
        folder.quarantine(owner_dir, f"{problem} (claimed/ holds owner folders only)", now)
        return None
    if name.startswith(REAPING_PREFIX):
        return revert.all(owner_dir, f"owner {name[len(REAPING_PREFIX) :]} was being reaped", now), 0
    if not is_owner_name(name):
        folder.quarantine(owner_dir, "not an owner folder (HOST.PID.XXXXXX)", now)
        return None
    cause, owner = _why_gone(owner_dir, now, is_alive)
    if cause is None:
        return None
    if owner is not None and end_leftovers is not None and not end_leftovers(owner):
        log.warning("not reaping %s yet (%s): what its runs left on this host is not gone yet", name, cause)
        return None  # no run may overlap its retry on this host: the next sweep tries again
    files.checkpoint("reap:leftovers-ended")  # (a sweeper killed here: the next sweep ends nothing, then fences)
    fenced = claimed / f"{REAPING_PREFIX}{name}"
    try:
        moves.fence(claimed / name, fenced)
    except (FileNotFoundError, MoveCollision):
        return None  # another sweeper is reaping it
    files.checkpoint("reap:fenced")
    log.warning("reaping %s: %s", name, cause)
    return revert.all(fenced, cause, now), 1


def _why_gone(owner_dir: Entry, now: float, is_alive: Liveness) -> tuple[str | None, Owner | None]:
    """Why the owner no longer holds its claims, or None if it still does; and the owner,
    as its owner file says (None if it says nothing readable)."""
    try:
        with owner_dir.open() as opened:
            try:
                heartbeat = opened.lstat(OWNER_FILE).st_mtime
                owner = Owner.from_json(files.read_limited(OWNER_FILE, 1 << 16, opened.fd))
            except (OSError, InvalidJob):
                if now > os.fstat(opened.fd).st_mtime + DEFAULT_LEASE:
                    return f"owner folder {owner_dir.name} has no readable owner file", None
                return None, None  # may be a registration in progress
    except FileNotFoundError:
        return None, None  # retired or fenced by another sweeper meanwhile
    alive = is_alive(owner)
    if alive is False:
        return f"owner {owner.name} (pid {owner.pid} on {owner.host}) is dead", owner
    if is_expired(owner, heartbeat, now):
        return f"owner {owner.name} stopped heartbeating {now - heartbeat:.0f}s ago (lease {owner.lease:g}s)", owner
    return None, owner


def return_unheld(
    folder: QueueFolder,
    owner_dir: Entry,
    held: set[str],
    cause: str,
    now: float,
    on_ready: Callable[[str], None],
    functions: Functions | None = None,
) -> int:
    """Return the jobs in a live owner's folder that it does not hold (claimed, never started)."""
    revert = _Reverter(folder, on_ready, functions, Skips())
    return revert.jobs(owner_dir, cause, now, keep=held | set(OWNER_FILES))


class _Reverter:
    """Sends the jobs of an owner folder back: to `ready/`, or to `dead/` when the lost run
    was the last attempt its policy allowed."""

    def __init__(
        self, folder: QueueFolder, on_ready: Callable[[str], None], functions: Functions | None, skips: Skips
    ) -> None:
        self.folder = folder
        self.on_ready = on_ready
        self.functions = functions
        self.skips = skips

    def all(self, fenced: Entry, cause: str, now: float) -> int:
        reverted = self.jobs(fenced, cause, now, keep=set(OWNER_FILES))
        try:
            with fenced.open() as opened:
                for name in OWNER_FILES:
                    files.unlink_if_there(name, opened.fd)
            os.rmdir(fenced.name, dir_fd=fenced.dir.fd)
        except FileNotFoundError:
            pass  # another sweeper finished this reap
        except OSError as exc:
            log.warning("cannot remove %s yet: %s", fenced.path, exc)
        return reverted

    def jobs(self, parent: Entry, cause: str, now: float, keep: set[str]) -> int:
        reverted = 0
        try:
            with parent.open() as opened:
                names = opened.names()
        except FileNotFoundError:
            return 0  # another sweeper finished this reap
        except OSError as exc:  # one unreadable owner folder must not stop the rest of the sweep
            log.error("cannot list %s to return its jobs: %s; fix its permissions", parent.path, exc)
            return 0
        for name in names:
            if name not in keep:
                place = parent.dir / f"{parent.name}/{name}"
                moved: int | None = self.skips.guarded("claimed job", name, self.entry, place, cause, now)
                reverted += moved or 0
        return reverted

    def entry(self, place: Entry, cause: str, now: float) -> int | None:
        """Send back one entry of an owner folder; 1 if it was a job that moved, else None."""
        job_id = os.path.basename(place.name)
        problem = None if is_job_id(job_id) else "not a job id"
        problem = problem or entry_problem(place)
        if problem:
            self.folder.quarantine(place, problem, now)
            return None
        try:
            self.job(place, job_id, cause, now)
        except FileNotFoundError:
            return None  # another sweeper moved it first
        except MoveCollision:
            why = f"job {job_id} cannot go back: a job with this id is already in ready/ or dead/ (a copy?)"
            self.folder.quarantine(place, why, now)
            return None
        return 1

    def job(self, place: Entry, job_id: str, cause: str, now: float) -> None:
        folder = self.folder
        with place.open() as job:
            try:
                spec = folder.read_spec(job, job_id)
                used = counter.used(job)
            except UnsupportedFormat:
                spec, used = None, 0  # a newer forkvisor's job: back to ready/ for a manager that reads it
            except InvalidJob as exc:
                folder.bury(place, job_id, fate.invalid(str(exc)), now)
                return
            _mark_lost_attempt(folder, job, cause)
            folder.clear_the_way(job, RESULT_FILE, now)
            files.unlink_if_there(RESULT_FILE, job.fd)  # a lost completion's result never stands
            limit = None if spec is None else self._attempt_limit(job, spec)
            dead = fate.after_lost_run(cancel_requested(job), used, limit, cause)
            if dead is None:
                folder.log_event(job, f"ready: claim reverted, {cause}", now)  # before: ready/ is claimed at once
        if dead is not None:
            folder.bury(place, job_id, dead, now)
        else:
            priority = 0 if spec is None else spec.priority
            target = folder.at(State.READY) / ready_name(job_id, priority)
            moves.move_on(place, target, folder.durable)
            self.on_ready(target.name)

    def _attempt_limit(self, job: Dir, spec: JobSpec) -> int:
        """The attempt limit the lost run was started under."""
        recorded = view.recorded_policy(job, view.last_attempt(job))
        if recorded is not None:
            return recorded.max_attempts
        registered = self.functions.registration(spec.function) if self.functions is not None else None
        return resolve(spec, registered, self.folder.stored_settings).max_attempts


def _mark_lost_attempt(folder: QueueFolder, job: Dir, cause: str) -> None:
    """Give the attempt that was running an outcome saying it was lost, and why."""
    number = view.last_attempt(job)  # a real directory, never a planted link
    if number < 1:
        return
    with job.sub(f"attempt-{number}") as run:
        if not run.exists(OUTCOME_FILE):
            folder.write_json(run / OUTCOME_FILE, {"lost": True, "error": f"the attempt was lost: {cause}"})


def promote_due(folder: QueueFolder, now: float, on_ready: Callable[[str], None], skips: Skips) -> list[str]:
    """Move every due `scheduled/` job to `ready/`; return their ids."""
    scheduled = folder.at(State.SCHEDULED)
    promoted = []
    for name in sorted(scheduled.names()):
        parsed = parse_scheduled_name(name)
        if parsed is not None and parsed[2] > now:
            continue  # not yet (checked when due); keep going so that every malformed name is seen
        if parsed is None:
            why = "its name is not DUE.RRR.ID (see docs/FORMAT.md)"
            skips.guarded("scheduled entry", name, folder.quarantine, scheduled / name, why, now)
        elif skips.guarded("scheduled job", name, promote_one, folder, name, now, on_ready):
            promoted.append(parsed[0])
    return promoted


def promote_one(folder: QueueFolder, name: str, now: float, on_ready: Callable[[str], None]) -> bool:
    """Move the due `scheduled/` entry `name` to `ready/`; False if it is gone or not a job."""
    parsed = parse_scheduled_name(name)
    place = folder.at(State.SCHEDULED) / name
    problem = entry_problem(place)
    if parsed is None or problem:
        if problem:
            folder.quarantine(place, problem, now)
        return False
    job_id, priority, _ = parsed
    target = folder.at(State.READY) / ready_name(job_id, priority)
    try:
        moves.move_on(place, target, folder.durable)
    except FileNotFoundError:
        return False  # promoted by someone else, or never there
    except MoveCollision:
        folder.quarantine(place, f"job {job_id} is already ready (duplicate id)", now)
        return False
    on_ready(target.name)
    return True


def clear_tmp(
    folder: QueueFolder,
    now: float,
    max_age: float,
    skips: Skips,
    on_ready: Callable[[str], None],
) -> int:
    """Quarantine submissions left in `tmp/` longer than `max_age`; publish the jobs of
    ticks whose firer died after taking the tick; finish interrupted purges (a part of
    each per sweep: a tree may be deep)."""
    names = folder.tmp.names()
    return sum(skips.guarded("tmp/ entry", name, _clear, folder, name, now, max_age, on_ready) or 0 for name in names)


def _clear(folder: QueueFolder, name: str, now: float, max_age: float, on_ready: Callable[[str], None]) -> int:
    tmp = folder.tmp
    if name.startswith(PURGE_PREFIX):
        # A purge died, or stopped at its budget, after its rename (the job is recorded as
        # purged): go on with it whatever its age. Removing one part each sweep renews its
        # time, and two removers of one tree only ever remove within it.
        files.remove_quietly(name, TREE_BUDGET, tmp.fd)
        return 1
    if ticks.publish_abandoned(folder, name, now, on_ready):
        return 1
    if _age(tmp / name, now) <= max_age:
        return 0
    folder.quarantine(tmp / name, f"abandoned in tmp/ for over {max_age:g}s (its submitter died)", now)
    return 1


def _record_purge(folder: QueueFolder, job_id: str, state: str, now: float) -> None:
    """The purge's record, on disk before the job goes (a power cut must not take a job unrecorded)."""
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
    line = f"{stamp} purged {state} {job_id}"
    files.append_line(PURGED_LOG, line, folder.file_mode, folder.root.fd, durable=folder.durable)


def _age(place: Entry, now: float) -> float:
    try:
        return now - place.lstat().st_mtime
    except FileNotFoundError:
        return 0.0  # published or removed while we looked


def _keep_reserve(folder: QueueFolder) -> dict[str, int]:
    reserve.keep(folder.root, folder.file_mode)  # (made again after a purge on a full disk used it)
    return {}


def purge(
    folder: QueueFolder, state: State, older_than: float, now: float, dry_run: bool, budget: int | None = None
) -> list[str]:
    """Delete `state`'s jobs whose last transition is over `older_than` seconds old. With a
    `budget`, each job's tree is removed only that far; sweeps finish the rest."""
    if not state.terminal:
        raise WrongState(f"cannot purge {state.value} jobs: only done and dead jobs can be purged")
    victims = [
        (place, job_id)
        for place, job_id in view.entries(folder, state)
        if (changed := _last_change(place)) is not None and now - changed >= older_than
    ]
    if dry_run:
        return sorted(job_id for _, job_id in victims)
    purged = []
    for place, job_id in victims:
        doomed = folder.tmp / f"{PURGE_PREFIX}{job_id}"
        # The record first: a job never vanishes unrecorded. On a full disk its line may need a
        # block that only deleting can free: the room kept for purges, or the job's own output.
        _when_full_make_room(folder, place, functools.partial(_record_purge, folder, job_id, state.value, now))
        try:
            _when_full_make_room(folder, place, functools.partial(moves.move_on, place, doomed, folder.durable))
        except FileNotFoundError:
            continue
        files.remove_quietly(doomed.name, budget, doomed.dir.fd)
        purged.append(job_id)
    if purged:
        reserve.keep(folder.root, folder.file_mode)  # (if this purge used it)
    return sorted(purged)


TREE_BUDGET = 2_000  # entries of one purged tree a sweep removes, at most (about 0.2 s)


def _when_full_make_room(folder: QueueFolder, place: Entry, step: Callable[[], None]) -> None:
    """Run `step`; while the disk is full, make room and run it again: delete the room kept
    for purges (`jobs.reserve`), then the output files of the job at `place` (it is going)."""
    remedies: list[Callable[[], object]] = [
        functools.partial(reserve.release, folder.root),
        functools.partial(_free_output, place),
    ]
    while True:
        try:
            return step()
        except OSError as exc:
            if exc.errno not in FULL or not remedies:
                raise
        log.warning("the disk holding %s is full: making room to purge %s", place.dir.path, place.name)
        remedies.pop(0)()


def _free_output(place: Entry) -> None:
    """Delete what takes room in a job being purged: its runs' stdout, stderr and results
    (regular files only; links and anything planted are left to the tree's removal)."""
    with place.open() as job:
        for name in view.attempt_names(job):
            with job.sub(name) as run:
                for output in ("stdout", "stderr", RESULT_FILE):
                    files.unlink_regular(output, run.fd)
        files.unlink_regular(RESULT_FILE, job.fd)


def _last_change(place: Entry) -> float | None:
    """When the job at `place` last changed (its last event); None if it moved meanwhile."""
    try:
        with place.open() as job:
            try:
                return job.lstat(EVENTS_FILE).st_mtime
            except FileNotFoundError:
                return os.fstat(job.fd).st_mtime
    except FileNotFoundError:
        return None
