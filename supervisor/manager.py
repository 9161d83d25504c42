"""The manager: one process, one event loop, one forked child per job, one or
several queues (`Manager(["high", "low"])`: claimed from in that order, under one
concurrency cap, each queue optionally under its own; see `served`).

Each turn of the loop waits for something to happen (`wakeups`: a signal or a
child's exit, a new job, a drain request, or the next deadline of any part) and
then runs the same named steps:

    _on_signals     SIGTERM/SIGINT drain (a second one stops now), SIGUSR1 logs status,
                    SIGHUP reopens the log file
    on_news         per queue: new ready names to the claim index; at each poll, check
                    the folders, the drain request, the settings and the pause
    take_in         per queue: members' submissions from incoming/
    _reap           wait4 every exited child; record its outcome, move the job on
                    (`outcomes`; a child killed from outside waits out the cancel window)
    enforce         timeouts, memory limits, the drain deadline (`children`)
    keep_lease      per queue: heartbeat; return claims no child holds; stop children
                    whose claim a sweeper took back or an operator cancelled (`tenancy`)
    sweeper.keep    per queue: restart the lease-sweeper child if it died (with back-off)
    _start_jobs     claim and fork while there are free slots (and the budget allows),
                    from the first queue that has a job to give
    open_gates      a durable queue's counts of this turn's runs on disk together, then
                    each waiting child let in (`served`, `forking.Gate`)
    title, notify   what `ps` and systemd show

Each part owns its state and says when it next has something to do; the wait
lasts until the earliest. `step()` runs one turn, so a test can drive the manager
tick by tick. The manager stays single-threaded: forking a threaded process is unsafe.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from enum import Enum

from jobs import Owner, Queue, Registry
from supervisor import containment, forking, logfiles, privileges, titles
from supervisor.budget import Budget
from supervisor.children import Children
from supervisor.display import Display
from supervisor.launch import check_root
from supervisor.queue_list import QueueLike, open_queues, queue_caps
from supervisor.running import Running
from supervisor.served import serve
from supervisor.settings import Settings
from supervisor.wakeups import Wakeups

log = logging.getLogger(__name__)

__all__ = ["Manager", "Phase", "Settings"]


_SERVING = "manager serving %s with concurrency %d; runs contained by %s"


class Phase(Enum):
    """Where a manager is in its life; it only moves forward."""

    NEW = "new"  # made, not started
    SERVING = "serving"  # claims and runs jobs
    DRAINING = "draining"  # claims nothing more; running jobs may finish until the drain timeout
    STOPPING = "stopping"  # its jobs were killed and go back; it exits once they are reaped
    CLOSED = "closed"  # its sweepers are stopped, its owner folders retired


class Manager:
    """Claims jobs from one or several queues and runs each in a forked child."""

    def __init__(
        self,
        queues: QueueLike | Sequence[QueueLike],
        registry: Registry | None = None,
        *,
        queue_concurrency: Mapping[QueueLike, int] | None = None,
        **settings: object,
    ) -> None:
        """`queues`: one queue, or several to claim from in that order (the first that has a
        job gives it). `queue_concurrency` caps how many of the children run one queue's
        jobs (all of them together stay within `concurrency`). `settings` are the fields
        of `Settings`; unless given, each queue's `lease` and `retention` come from its own
        settings, and `commands` is on for a private queue and off for a shared one (a
        command job runs anything its manager's user may). Without a registry the manager
        runs command jobs only."""
        opened = open_queues(queues)
        self.registry = registry if registry is not None else Registry()
        self.settings = options = Settings(**settings)  # type: ignore[arg-type]  # what was given, checked
        check_root(options.run_as_submitter, options.members_as_root, opened)
        titles.prepare()  # before the environment changes (below), or no title would ever show
        privileges.forget_own_variables(os.environ)  # read by now; no job inherits them
        self.containment = containment.detect(options.containment)
        self.containment.clear_dead_owners()  # before any claim: no retry beside an earlier run
        caps = queue_caps(opened, queue_concurrency or {})
        self.served = serve(opened, self.registry, settings, caps, self.request_drain, self.containment)
        self.phase = Phase.NEW
        self.children = Children(options.concurrency, options.kill_grace, options.memory_poll)
        self.children.strays = self.containment.mode == "processes"  # orphans found by their mark
        self.children.others = self.served.sweeper_pids  # children that are not orphans: not looked at
        self.wakeups = Wakeups(opened, options.poll_interval, self.children.started_since)
        self.children.on_start, self.children.on_end = self.wakeups.follow_job, self.wakeups.forget_job
        self.budget = Budget(options.max_jobs, options.max_runtime)
        self.display = Display(self.served, options.concurrency)

    @property
    def queue(self) -> Queue:
        """The (first, if several) queue served."""
        return self.served[0].queue

    @property
    def running(self) -> dict[int, Running]:
        return self.children.running

    @property
    def owner(self) -> Owner:
        """This manager as an owner of its (first) queue; `served[i].tenancy.owner` for the others."""
        return self.served.owner()

    @property
    def draining(self) -> bool:
        """Claiming nothing more: draining or stopping."""
        return self.phase in (Phase.DRAINING, Phase.STOPPING)

    @property
    def sweeper_pid(self) -> int | None:
        """The pid of the (first) queue's sweeper."""
        return self.served[0].sweeper.pid

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        """Install signal handling, register as an owner of each queue, start watching and the sweepers."""
        self.wakeups.open_signals()  # first: a SIGTERM from now on drains instead of killing
        try:
            self.served.register(self.settings.kill_grace, then=self.wakeups.open_watch)
        except BaseException:
            self.wakeups.close()
            raise
        forking.become_subreaper()
        self.phase = Phase.SERVING
        now = time.monotonic()
        self.budget.start(now)
        self.served.start_sweepers(now, self.wakeups.fds)
        self.display.ready(len(self.running), self.draining)
        log.info(_SERVING, self.served.described(), self.settings.concurrency, self.containment.describe())

    def run(self, burst: bool = False) -> int:
        """Serve the queues until drained (or, with `burst`, until nothing is left); return 0."""
        self.start()
        try:
            while not self.finished(burst):
                self.step(timeout=None)
        finally:
            self.close()
        self.served.after_run(burst, self.settings.stall_timeout)
        return 0

    def finished(self, burst: bool) -> bool:
        if self.running or self.served.awaiting_cancel:
            return False
        if self.phase is not Phase.SERVING:
            return True
        return burst and self.served.finished_burst(self.settings.stall_timeout)

    def close(self) -> None:
        """Stop the sweepers, release what is still running, retire the owner folders."""
        if self.phase in (Phase.NEW, Phase.CLOSED):
            return
        try:
            self.served.release_suspended()  # a manager that closes holding one is being cancelled too
            self.children.kill_all_and_reap(self._on_exit)
            self.children.end_leftovers(self.settings.kill_grace)
            self.served.close(self.settings.kill_grace)
        finally:
            self.wakeups.close()
            self.phase = Phase.CLOSED
        log.info("manager stopped")

    def request_drain(self, why: str) -> None:
        """Claim nothing more; let running jobs finish up to the drain timeout."""
        if self.phase is not Phase.SERVING:
            return  # a repeated request neither restarts nor extends the drain
        log.info("draining (%s): %d job(s) running, claiming no more", why, len(self.running))
        self.phase = Phase.DRAINING
        self.children.drain(time.monotonic(), self.settings.drain_timeout)
        self.served.release_suspended()  # children killed just before: the same cancel
        self.display.stopping(len(self.running), self.draining)

    def stop_now(self, why: str) -> None:
        """Stop every running job at once and put it back in its queue."""
        log.warning("stopping now (%s): releasing %d running job(s)", why, len(self.running))
        self.phase = Phase.STOPPING
        self.served.release_suspended()
        self.children.kill_all_and_reap(self._on_exit)

    # -- one turn of the loop ------------------------------------------------------------

    def step(self, timeout: float | None = 0.0) -> None:
        """Wait for an event (at most `timeout` seconds, None: until the next deadline), then act."""
        woken = self.wakeups.wait(self._wait_time(time.monotonic(), timeout))
        now = time.monotonic()
        self._on_signals(woken.signals)
        self.served.on_news(woken.queues, self.draining)
        self._reap()
        self.served.after_reaping(now)
        self.children.enforce(now)
        self.served.keep(now, self.children, self.wakeups.fds, sweepers=self.phase is not Phase.STOPPING)
        self._start_jobs()
        self.served.open_gates(self.children)
        self.wakeups.after_claims(self.served.room(self.children, self._can_start_more(time.monotonic())))
        if self.budget.limited and (spent := self.budget.spent(time.monotonic())) is not None:
            self.request_drain(spent)
        self.display.refresh(len(self.running), self.draining, now)
        if self.display.notifier.enabled:  # (checked here: every call on the loop's path costs, see PERFORMANCE.md)
            self.display.notifier.tick(now)

    def _wait_time(self, now: float, timeout: float | None) -> float:
        """Until the earliest deadline of any part (`timeout` at most)."""
        soonest = min(
            self.wakeups.next_poll,
            self.children.next_deadline(now),
            self.budget.ends_at if self.phase is Phase.SERVING else float("inf"),
            self.display.next_deadline(),
        )
        may_start = lambda served: self._can_start_more(now) and served.may_claim(self.children)  # noqa: E731
        soonest = min(soonest, self.served.soonest(now, self.phase is not Phase.STOPPING, self.draining, may_start))
        wait = max(0.0, soonest - now)
        return wait if timeout is None else min(wait, timeout)

    def _on_signals(self, signals: Sequence[signal.Signals]) -> None:
        for signum in signals:
            if signum in (signal.SIGTERM, signal.SIGINT):
                if self.draining:
                    self.stop_now(f"second {signum.name}")
                else:
                    self.request_drain(signum.name)
            elif signum == signal.SIGUSR1:
                log.info("status: %s", self.status_line())
            elif signum == signal.SIGHUP:
                log.info("SIGHUP: reopened %d log file(s); nothing else reloads (see docs)", logfiles.reopen())

    def _reap(self) -> None:
        for running, status in self.children.reaped():
            self._on_exit(running, status)

    def _on_exit(self, running: Running | None, status: forking.ExitStatus) -> None:
        self.served.on_exit(running, status, self.draining, time.monotonic())

    # -- starting jobs -------------------------------------------------------------

    def _can_start_more(self, now: float) -> bool:
        if self.phase is not Phase.SERVING or self.served.awaiting_cancel:
            return False  # (holding: a cancel may be under way)
        return self.children.has_room(now) and self.budget.allows_another()

    def _start_jobs(self) -> None:
        """Fill the free slots, each from the first queue (in the order served) that has a job."""
        fds = self.wakeups.fds
        while self._can_start_more(time.monotonic()):
            if not any(s.may_claim(self.children) and s.start_next(self.children, fds) for s in self.served):
                return  # no queue had a job to give
            self.budget.started_one()

    # -- status ---------------------------------------------------------------------

    def status_line(self) -> str:
        return self.display.line(self.running, self.phase.value)
