"""The manager's tenancy of the queue: its owner folder `claimed/OWNER/` and the lease
its heartbeat keeps. A sweeper that finds the lease expired reaps the folder (returns
its jobs to the queue); the manager then learns that its claims are void, stops its
children and registers anew, as a new owner."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from jobs import ClaimLost, Functions, JobsError, Owner, Queue, QueueError, storage_error
from supervisor import liveness
from supervisor.containment import Containment, ProcessContainment
from supervisor.errors import InternalError
from supervisor.health import StoreHealth

log = logging.getLogger(__name__)


class Tenancy:
    """Register, heartbeat, give back claims no child holds, and say when the owner was reaped."""

    def __init__(
        self,
        queue: Queue,
        functions: Functions,
        lease: float,
        health: StoreHealth,
        concurrency: int | None = None,
        containment: Containment | None = None,
    ) -> None:
        self.queue = queue
        self.containment = containment or ProcessContainment("none given")
        self.functions = functions
        self.lease = lease
        self.concurrency = concurrency  # shown by `status` and the web page
        self.health = health
        self.owner: Owner | None = None
        self.registered = False
        self.next_heartbeat = 0.0
        self._skips_recorded: dict[str, dict[str, str]] = {}  # by source: what the owner folder lists

    @property
    def name(self) -> str:
        """The owner name, which changes when the manager registers anew."""
        if self.owner is None:
            raise InternalError("not registered yet")
        return self.owner.name

    def register_at_start(self) -> None:
        """Refuse a queue others could steer; register. At the start, failing is fatal: say
        why in words (a full disk is not a permission problem)."""
        self._refuse_if_unsafe()
        try:
            self._new_owner()
        except OSError as exc:
            raise storage_error(exc, "serve", self.queue.path) from None

    def _refuse_if_unsafe(self) -> None:
        """A queue that others may write is one they could steer: refuse it (docs/SECURITY.md)."""
        problems = self.queue.serving.problems()
        if not problems:
            return
        path = self.queue.path
        if any("belongs to" in problem for problem in problems):
            fix = "run the manager as the queue's owner (as root: --user NAME)"
        else:
            fix = f"tighten it as its owner with `forkvisor init {path}{' --shared' if self.queue.shared else ''}`"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise QueueError(f"cannot serve {path}: {problems[0]}{more}; {fix}")

    def register(self) -> None:
        """Register as a new owner; on failure claim nothing, and try again at the next heartbeat."""
        try:
            self._new_owner()
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            log.error("cannot register as an owner of %s: %s; claiming nothing until it works", self.queue.path, exc)
            self.registered = False

    def _new_owner(self) -> None:
        if self.owner is not None:  # reaped: its runs' place goes once the reaper emptied it
            self.containment.close_owner(self.owner.name)
        owner = liveness.this_owner(self.lease, self.queue.serving.filesystem_now(), self.concurrency)
        runs = self.containment.runs_folder(owner.name)  # where a reaper finds its runs
        self.owner = replace(owner, runs=runs, containment=self.containment.mode)
        self.containment.open_owner(owner.name)
        self.queue.serving.register_owner(self.owner, self.functions)
        self.registered = True
        self._skips_recorded = {}  # a new owner folder: what it skips is written there anew

    def heartbeat_due(self, now: float) -> bool:
        if now < self.next_heartbeat:
            return False
        self.next_heartbeat = now + self.lease / 3
        return True

    def renew(self, held: set[str]) -> bool:
        """Heartbeat, and give back the claims no child holds (an error came between claim and
        fork); False if a sweeper has reaped this owner: its claims are void."""
        try:
            self.queue.serving.heartbeat(self.name)
            self.queue.serving.return_unheld(self.name, held, functions=self.functions)
        except ClaimLost:
            return False
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            log.error("cannot renew the lease of %s: %s", self.name, exc)
        return True

    def record_skips(self, skipped: Mapping[str, str], source: str = "claims", count: int | None = None) -> None:
        """Keep what this manager skips where `status` reads it: ready/ entries it cannot claim
        ("claims"), folders and entries of incoming/ it cannot take in ("take-in")."""
        if skipped == self._skips_recorded.get(source, {}) or not self.registered:
            return
        try:
            self.queue.serving.record_skipped(self.name, source, skipped, count)
            self._skips_recorded[source] = dict(skipped)
        except (OSError, JobsError) as exc:
            log.warning("cannot record the entries this manager skips: %s", exc)

    def retire(self) -> None:
        """Remove the owner folder (its leftovers stay for the sweepers)."""
        if self.owner is not None:
            self.queue.serving.retire_owner(self.owner.name)
            self.containment.close_owner(self.owner.name)
