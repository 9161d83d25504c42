"""The jobs a manager leaves: those of functions it does not run (for other managers,
said once per function), those scheduled beyond the `--burst` horizon, and whether
a `--burst` manager has anything left to do at all."""

from __future__ import annotations

import logging
import time

from jobs import NOT_PAUSED, Functions, JobsError, Paused, Queue
from supervisor.health import StoreHealth

log = logging.getLogger(__name__)


class Leftovers:
    """What this manager leaves in the queue, and says so."""

    def __init__(self, queue: Queue, functions: Functions, horizon: float, health: StoreHealth) -> None:
        self.queue = queue
        self.functions = functions
        self.horizon = horizon
        self.health = health
        self.scheduled = 0  # jobs scheduled beyond the horizon, at the last look
        self._noted: set[str] = set()  # functions whose jobs were given back, already logged

    def note_given_back(self) -> None:
        """Say once per function that its jobs are left for other managers (a deploy that
        has not reached this manager yet, or a manager without --app)."""
        left = self.queue.serving.left_for_others
        if len(left) <= len(self._noted):
            return
        for function in sorted(set(left) - self._noted):
            self._noted.add(function)
            log.warning(
                "leaving jobs of %s to managers that run it: this one does not (it runs %s); "
                "`forkvisor status` counts the ready jobs no running manager can serve",
                function,
                ", ".join(self.functions) or "nothing: start it with --app",
            )

    def nothing_left(self, paused: Paused = NOT_PAUSED) -> bool:
        """For --burst: nothing claimed anywhere, nothing ready that this manager can run (a
        paused job is not: its claims gave it back, or nothing is claimed at all), nothing
        scheduled within the horizon. A queue it cannot look at counts as not empty. The
        counts are read state by state: a job a sweeper moves from claimed/ back to ready/
        between two reads is in neither, so an empty look is confirmed by a second one."""
        return self._looks_empty(paused) and self._looks_empty(paused)

    def _looks_empty(self, paused: Paused) -> bool:
        try:
            counts = self.queue.counts()
            claimable = counts["ready"] and not paused.all and self.queue.serving.has_claimable()
            if counts["claimed"] or counts["incoming"] or claimable or self.queue.serving.pending_requests():
                return False  # (members' submissions and requests are taken in first: they may be this one's)
            if not counts["scheduled"]:
                return True
            self.scheduled = self.queue.serving.scheduled_after(time.time() + self.horizon)
            return self.scheduled == counts["scheduled"]
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            log.error("cannot tell whether %s has work left: %s", self.queue.path, exc)
            return False

    def say_what_is_left(self, paused: Paused = NOT_PAUSED) -> None:
        """At the end of a burst."""
        if paused:
            log.info("left the paused jobs ready (paused: %s) in %s", paused.describe(), self.queue.path)
        if self.scheduled:
            log.info(
                "left %d job(s) scheduled beyond the %gs horizon in %s", self.scheduled, self.horizon, self.queue.path
            )
        if self.queue.serving.left_for_others:
            functions = ", ".join(
                f"{name} ({count})" for name, count in sorted(self.queue.serving.left_for_others.items())
            )
            log.warning("left ready the jobs this manager does not run: %s in %s", functions, self.queue.path)
