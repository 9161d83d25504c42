"""The queue's owner at work: `queue.serving`.

What a queue's managers and its sweeper do to it, and what they read of each other:
leases (`jobs.owners`), claims and runs (`jobs.claim`), the take-in of members'
submissions (`jobs.incoming`), sweeps and promotions (`jobs.sweep`), schedules' firing
(`jobs.planner`) and dependencies' settling (`jobs.depends`). A submitter, a reader or
an operator never needs it: `Queue` is theirs. Each method forwards to the module that
says how; what it is for is said here, once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jobs import counter, depends, incoming, job_files, operator, owners, run_folder, stats, submissions, sweep, view
from jobs.claim import Claim, Claimer, ClaimState, Finished, begin_runs
from jobs.config import TMP_AGE
from jobs.errors import QueueReplaced
from jobs.fate import RunEnd
from jobs.folder import BELLS, QueueFolder, filesystem_now
from jobs.index import ReadyIndex
from jobs.job import State, created_at, parse_scheduled_name, scheduled_name
from jobs.job_view import Job
from jobs.lease import Liveness, Owner
from jobs.pause import NOT_PAUSED, Paused
from jobs.planner import Planner
from jobs.policy import Functions, Policy
from jobs.schedules import Schedule
from jobs.submit import Publisher
from jobs.view import OwnerFolder


class Identity(NamedTuple):
    """A queue's folder as opened: two paths to one queue (a link, `..`) have the same."""

    device: int
    inode: int


class IntakeAside(NamedTuple):
    """A copy of what take-ins set aside (`incoming.SetAside`): the first ones, with why, and
    how many in all."""

    first: dict[str, str]
    total: int


class Serving:
    """The side of a queue that only its owner's managers and sweeper use."""

    def __init__(self, folder: QueueFolder, index: ReadyIndex, publisher: Publisher) -> None:
        self.folder = folder
        self.index = index  # its `scans` and `skipped` say what claiming cost
        self._publisher = publisher
        self._claimer = Claimer(folder, self.index)
        self._intake = incoming.Intake(folder)
        self.last_sweep_skips = sweep.Skips()  # what the last sweep of this object skipped

    def check_folders(self) -> None:
        """Raise QueueReplaced if the queue's folder, or a state folder this object has open,
        no longer stands at its name (see `jobs.handles`): a manager stops rather than go on
        with folders nobody else sees."""
        why = self.folder.replaced()
        if why is not None:
            raise QueueReplaced(f"{why}; stopping rather than use a folder the queue no longer holds")

    def filesystem_now(self) -> float:
        """The file system's clock, for judging leases (see `jobs.lease`)."""
        return filesystem_now(self.folder.root, self.folder.file_mode)

    def stats_file(self, role: str) -> stats.StatsFile:
        """The counters a manager or a sweeper (`role`) keeps for this queue (see `jobs.stats`)."""
        return stats.StatsFile(self.folder, role)

    # -- keeping the queue's folder -----------------------------------------------------

    @property
    def identity(self) -> Identity:
        """The folder opened (device, inode): two paths to one queue (a link, `..`) have the same."""
        found = os.fstat(self.folder.root.fd)
        return Identity(found.st_dev, found.st_ino)

    def state_path(self, state: State) -> Path:
        """A state folder's path, to show or to watch (every operation goes through handles)."""
        return self.folder.state_dir(state)

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

    def reload_settings(self) -> bool:
        """Read the settings again (another process may have changed them); whether they changed."""
        return self.folder.reload_settings()

    # -- leases (jobs.owners) ----------------------------------------------------

    def register_owner(self, owner: Owner, functions: Functions | None = None) -> None:
        owners.register(self.folder, owner, functions)

    def record_skipped(self, owner: str, source: str, skipped: Mapping[str, str], count: int | None = None) -> None:
        """Keep in `owner`'s folder what it skipped (`source`: "claims" or "sweep") for `status`."""
        owners.record_skipped(self.folder, owner, source, skipped, count)

    def heartbeat(self, owner: str) -> None:
        owners.heartbeat(self.folder, owner)

    def retire_owner(self, owner: str) -> None:
        owners.retire(self.folder, owner)

    def return_unheld(
        self, owner: str, held: set[str], now: float | None = None, functions: Functions | None = None
    ) -> int:
        """Return the jobs in `claimed/OWNER/` that the owner holds no run of (an error struck
        between their claim and their fork); how many moved."""
        cause = f"claimed by {owner} but never started (an error came between the claim and the fork)"
        owner_dir = self.folder.at(State.CLAIMED) / owner
        return sweep.return_unheld(self.folder, owner_dir, held, cause, _now(now), self.index.add, functions)

    # -- claims and runs (jobs.claim) -------------------------------------------------

    def claim(
        self,
        owner: str,
        now: float | None = None,
        functions: Functions | None = None,
        paused: Paused = NOT_PAUSED,
        staged: bool = False,
    ) -> Claim | None:
        return self._claimer.claim(owner, _now(now), functions, paused, staged)

    def commit_counts(self, claims: Sequence[Claim]) -> list[OSError | None]:
        """Put the staged counts of `claims` (`claim(staged=True)`) in place, make their run
        folders, then put both on disk, the barriers shared (`counter.commit`, `claim.begin_runs`,
        `counter.make_durable`); for each claim, None, or why it cannot run (FileNotFoundError:
        a sweep took the job back first, so nothing of it may run)."""
        places = [claim.place for claim in claims]
        failed = counter.commit(places)
        begin_runs(claims, failed)
        counter.make_durable(places, failed)
        return failed

    def claim_state(self, claim: Claim) -> ClaimState:
        return self._claimer.state(claim)

    def finish(self, claim: Claim, end: RunEnd, now: float | None = None, run: int | None = None) -> Finished:
        return self._claimer.finish(claim, end, _now(now), run)

    def record_outcome(self, claim: Claim, outcome: Mapping[str, Any], now: float | None = None) -> None:
        self._claimer.record_outcome(claim, outcome, _now(now))

    def complete(self, claim: Claim, now: float | None = None) -> None:
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
        return self._claimer.fail(claim, error, _now(now), delay, permanent)

    def release(self, claim: Claim, now: float | None = None, reason: str = "released") -> None:
        self._claimer.release(claim, _now(now), reason)

    def note_lost(self, claim: Claim, how: str = "stopped", now: float | None = None) -> None:
        self._claimer.note_lost(claim, how, _now(now))

    @property
    def left_for_others(self) -> dict[str, int]:
        """Functions this object's claims could not run, with how many jobs it gave back."""
        return self._claimer.left_for_others

    @property
    def unclaimable(self) -> dict[str, str]:
        """`ready/` entries its claims skip (they cannot be moved), with why (the first 100)."""
        return self._claimer.unclaimable

    @property
    def races(self) -> int:
        """Claims this object lost: the entry was there when it looked, gone at its rename."""
        return self._claimer.races

    @property
    def gone(self) -> int:
        """Names its index gave that were gone when it looked (taken before: no rename tried)."""
        return self._claimer.gone

    @property
    def more_to_examine(self) -> bool:
        """The last claim stopped at its budget of entries: call again soon."""
        return self._claimer.more_to_examine

    def has_claimable(self) -> bool:
        """Whether `ready/` holds, now, a job this object has not given back (one scan)."""
        self.index.rescan()
        return self.index.holds_names

    def note_ready(self, name: str) -> None:
        """Tell the claim index about a new `ready/` entry (from inotify)."""
        self.index.note(name)

    def note_ready_missed(self) -> None:
        """Tell the claim index that the watcher lost events: it rescans `ready/` first."""
        self.index.forget_scan()

    # -- members' submissions (jobs.incoming) -------------------------------------------

    def take_in(
        self, now: float | None = None, budget: int = 64, leftovers: bool = False, seconds: float | None = None
    ) -> int:
        """Take in members' submissions and requests, at most `budget` of them in at most
        `seconds`; how many were handled. `leftovers`: also finish interrupted take-ins (the
        sweeper's chore)."""
        now = _now(now)
        return self._intake.take_in(now, self._take_in_actions(now), budget, seconds, leftovers)

    def take_in_one(self, job_id: str, now: float) -> None:
        self._intake.take_in_one(job_id, now, self._take_in_actions(now))

    def _take_in_actions(self, now: float) -> incoming.Actions:
        def cancel(job_id: str) -> State:
            return operator.cancel(self.folder, job_id, now, lambda when: self.take_in_one(job_id, when))

        return incoming.Actions(
            cancel=cancel,
            retry=lambda job_id: operator.retry(self.folder, job_id, now, self.index.add),
            on_ready=self.index.add,
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
    def intake_skipped(self) -> IntakeAside:
        """What this object's take-ins set aside (folders and entries of incoming/ they
        cannot use), the first ones with why, and how many."""
        return IntakeAside(dict(self._intake.aside.shown), self._intake.aside.count)

    # -- the sweeper's chores (jobs.sweep), schedules, dependencies --------------------

    def sweep(
        self,
        now: float,
        is_alive: Callable[[Owner], bool | None],
        tmp_age: float = TMP_AGE,
        functions: Functions | None = None,
        end_leftovers: sweep.EndLeftovers | None = None,
    ) -> dict[str, int]:
        self.last_sweep_skips = skips = sweep.Skips()
        return sweep.sweep(self.folder, now, is_alive, self.index.add, tmp_age, functions, skips, end_leftovers)

    def promote_due(self, now: float | None = None) -> list[str]:
        """The sweep's promotion of what is due (`now` by default), its jobs told to this
        claimer's index at once."""
        return sweep.promote_due(self.folder, _now(now), self.index.add, sweep.Skips())

    def promote(self, job_id: str, priority: int, due: float, now: float | None = None) -> bool:
        """Promote one scheduled job by the name its `fail` gave it, without listing
        `scheduled/` (a manager's own retries); False if it was no longer there."""
        return sweep.promote_one(self.folder, scheduled_name(job_id, priority, due), _now(now), self.index.add)

    def scheduled_after(self, when: float) -> int:
        """How many scheduled jobs are due after `when` (epoch seconds)."""
        names = self.folder.at(State.SCHEDULED).names()
        return sum(1 for parsed in map(parse_scheduled_name, names) if parsed and parsed[2] > when)

    def planner(self, declared: Iterable[Schedule] = ()) -> Planner:
        """The firer of this queue's schedules and `declared` ones (a sweeper's)."""
        return Planner(self.folder, declared, self._publisher)

    def settle_dependents(self, job_id: str, now: float | None = None, budget: int | None = None) -> int:
        return depends.settle_dependents(self.folder, job_id, _now(now), self.index.add, budget)

    def bells_fd(self) -> int:
        """A descriptor of the folder of each host's doorbell for the queue's managers
        (`supervisor.bell`), open as long as the queue is."""
        return self.folder.at(BELLS).fd

    def drain_request(self) -> operator.DrainRequest | None:
        return operator.drain_request(self.folder)

    # -- who serves the queue, and what they run (for `status` and the page) -----------

    def owners(self) -> list[OwnerFolder]:
        """The folders of `claimed/`: the managers serving the queue (and those being reaped)."""
        return view.owner_folders(self.folder)

    def served_functions(self, owners: Iterable[OwnerFolder], now: float, is_alive: Liveness) -> dict[str, Any]:
        return view.served_functions(owners, now, is_alive)

    def head_functions(self, limit: int) -> view.Head:
        return view.head_functions(self.folder, limit)

    def effective_policy(self, job: Job, served: Mapping[str, Mapping[str, Any]]) -> Policy:
        return view.effective_policy(self.folder, job, served)

    def claimed_jobs(self, owner: OwnerFolder) -> Iterator[Job]:
        """The jobs in an owner's folder, each read whole (those that move as they are read are left out)."""
        for place, _ in view.entries_in(owner.place, State.CLAIMED):
            job = view.read_moving(self.folder, State.CLAIMED, place)
            if job is not None:
                yield job

    def run_pid(self, job: Job) -> run_folder.ChildPid | None:
        """The pid of the job's newest run's child, and when it started; None if unknown."""
        return job_files.newest_run(self.folder, job, run_folder.read_pid)

    def run_progress(self, job: Job) -> dict[str, Any] | None:
        """What the job's newest run last said of its progress (`jobs.current().progress`)."""
        return job_files.newest_run(self.folder, job, run_folder.read_progress)

    def oldest_ready_age(self, now: float) -> float | None:
        """Seconds since the longest-waiting ready job was enqueued; None if none is ready."""
        ready = view.entries_in(self.folder.at(State.READY), State.READY, check_dirs=False)
        oldest = min((job_id for _, job_id in ready), default=None)
        return None if oldest is None else max(0.0, now - created_at(oldest))


def _now(now: float | None) -> float:
    return time.time() if now is None else now
