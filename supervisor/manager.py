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
from supervisor.errors import InternalError, Stalled
from supervisor.launch import check_root
from supervisor.notify import Notifier
from supervisor.queue_list import QueueLike, open_queues, queue_caps
from supervisor.running import Running
from supervisor.served import Served
from supervisor.settings import Settings, for_queue
from supervisor.spawner import Spawner
from supervisor.titles import ManagerTitle
from supervisor.wakeups import Wakeups

log = logging.getLogger(__name__)

__all__ = ["Manager", "Phase", "Settings"]


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
        caps = queue_caps(opened, queue_concurrency or {})
        own = [for_queue(queue, settings) for queue in opened]  # each queue's settings
        spawner = Spawner.find() if any(each.commands for each in own) else None
        self.containment = containment.detect(options.containment)
        self.containment.prune()  # what dead managers of this host left empty
        several = len(opened) > 1  # then log lines say which queue a job came from
        self.served = tuple(
            Served(
                index,
                queue,
                self.registry,
                own[index],
                caps.get(index),
                self.request_drain,
                label=str(queue.path) if several else "",
                spawner=spawner,
                containment=self.containment,
            )
            for index, queue in enumerate(opened)
        )
        self.phase = Phase.NEW
        self.children = Children(options.concurrency, options.kill_grace, options.memory_poll)
        self.children.strays = self.containment.mode == "processes"  # orphans found by their mark
        self.children.others = self._sweeper_pids  # children that are not orphans: not looked at
        self.wakeups = Wakeups(opened, options.poll_interval)
        self.children.on_start = self.wakeups.follow_job  # an operator's cancel reaches a job at once
        self.children.on_end = self.wakeups.forget_job
        self.notifier = Notifier()  # systemd's Type=notify, when it asked
        self.budget = Budget(options.max_jobs, options.max_runtime)
        self.title = ManagerTitle(" ".join(str(queue.path) for queue in opened), options.concurrency)

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
        owner = self.served[0].tenancy.owner
        if owner is None:
            raise InternalError("the manager registers as an owner when it starts")
        return owner

    @property
    def draining(self) -> bool:
        """Claiming nothing more: draining or stopping."""
        return self.phase in (Phase.DRAINING, Phase.STOPPING)

    def _sweeper_pids(self) -> set[int]:
        return {served.sweeper.pid for served in self.served if served.sweeper.pid is not None}

    @property
    def sweeper_pid(self) -> int | None:
        """The pid of the (first) queue's sweeper."""
        return self.served[0].sweeper.pid

    @property
    def _awaiting_cancel(self) -> bool:
        """A child killed from outside waits to be judged: a cancel may be under way."""
        return any(served.outcomes.awaiting_cancel for served in self.served)

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        """Install signal handling, register as an owner of each queue, start watching and the sweepers."""
        self.wakeups.open_signals()  # first: a SIGTERM from now on drains instead of killing
        registered: list[Served] = []
        try:
            for served in self.served:
                served.register_at_start()
                registered.append(served)
            self.wakeups.open_watch()
        except BaseException:
            for served in registered:  # a queue refused: the ones registered already are left clean
                served.close(self.settings.kill_grace)
            self.wakeups.close()
            raise
        forking.become_subreaper()
        self.phase = Phase.SERVING
        now = time.monotonic()
        self.budget.start(now)
        for served in self.served:
            served.sweeper.keep(now, self.wakeups.fds)
        self._set_title()
        self.notifier.ready(self._status_text())
        log.info(
            "manager serving %s with concurrency %d; runs contained by %s",
            ", ".join(map(_described, self.served)),
            self.settings.concurrency,
            self.containment.describe(),
        )

    def run(self, burst: bool = False) -> int:
        """Serve the queues until drained (or, with `burst`, until nothing is left); return 0."""
        self.start()
        try:
            while not self.finished(burst):
                self.step(timeout=None)
        finally:
            self.close()
        for served in self.served:
            if served.replaced is not None:
                raise served.replaced
        if not burst:
            return 0
        timeout = self.settings.stall_timeout
        for served in self.served:
            if served.health.stalled(timeout):
                raise Stalled(
                    f"gave up on {served.queue.path} after {timeout:g}s in which every change to it failed: "
                    f"{served.health.last_failure}; jobs not finished stay where they are for the next manager"
                )
        for served in self.served:
            served.leftovers.say_what_is_left(served.paused)
        return 0

    def finished(self, burst: bool) -> bool:
        if self.running or self._awaiting_cancel:
            return False
        if self.phase is not Phase.SERVING:
            return True
        return burst and all(served.finished_burst(self.settings.stall_timeout) for served in self.served)

    def close(self) -> None:
        """Stop the sweepers, release what is still running, retire the owner folders."""
        if self.phase in (Phase.NEW, Phase.CLOSED):
            return
        try:
            for served in self.served:
                served.outcomes.release_suspended()  # a manager that closes holding one is being cancelled too
            self._kill_all_and_reap()
            self.children.end_leftovers(self.settings.kill_grace)
            for served in self.served:
                served.close(self.settings.kill_grace)
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
        for served in self.served:
            served.outcomes.release_suspended()  # children killed just before: the same cancel
        self._set_title()
        self.notifier.stopping(self._status_text())

    def stop_now(self, why: str) -> None:
        """Stop every running job at once and put it back in its queue."""
        log.warning("stopping now (%s): releasing %d running job(s)", why, len(self.running))
        self.phase = Phase.STOPPING
        for served in self.served:
            served.outcomes.release_suspended()
        self._kill_all_and_reap()

    def _kill_all_and_reap(self) -> None:
        self.children.kill_all()
        deadline = time.monotonic() + self.settings.kill_grace + 5
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)  # SIGKILLed: gone in a moment
            self._reap()

    # -- one turn of the loop ------------------------------------------------------------

    def step(self, timeout: float | None = 0.0) -> None:
        """Wait for an event (at most `timeout` seconds, None: until the next deadline), then act."""
        woken = self.wakeups.wait(self._wait_time(time.monotonic(), timeout))
        now = time.monotonic()
        self._on_signals(woken.signals)
        for served, news in zip(self.served, woken.queues, strict=True):
            served.on_news(news)
            served.take_in(self.draining)
        self._reap()
        for served in self.served:
            served.outcomes.judge_suspended(now)
            served.outcomes.retry_stranded()
            served.outcomes.promote_retries()
        self.children.enforce(now)
        for served in self.served:
            served.keep_lease(now, self.children)
            if self.phase is not Phase.STOPPING:
                served.sweeper.keep(now, self.wakeups.fds)
        self._start_jobs()
        if self.budget.limited and (spent := self.budget.spent(time.monotonic())) is not None:
            self.request_drain(spent)
        self._set_title(now)
        if self.notifier.enabled:  # (checked here: every call on the loop's path costs, see PERFORMANCE.md)
            self.notifier.tick(now)

    def _wait_time(self, now: float, timeout: float | None) -> float:
        """Until the earliest deadline of any part (`timeout` at most)."""
        soonest = min(
            self.wakeups.next_poll,
            self.children.next_deadline(now),
            self.budget.ends_at if self.phase is Phase.SERVING else float("inf"),
        )
        if self.notifier.enabled:
            soonest = min(soonest, self.notifier.next_deadline())
        sweepers_wanted = self.phase is not Phase.STOPPING
        for served in self.served:
            soonest = min(soonest, served.next_deadline(now, sweepers_wanted))
            if served.take_in_due and not self.draining:
                soonest = now  # the last take-in stopped at its budget
            elif served.queue.more_to_examine and self._can_start_more(now) and served.may_claim(self.children):
                soonest = now  # the last claim stopped at its budget
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
            if running is not None:
                self.served[running.queue].outcomes.harvest(running, status, self.draining)
            else:  # a sweeper: which queue's restarts it
                for served in self.served:
                    if served.sweeper_died(status, time.monotonic()):
                        break

    # -- starting jobs -------------------------------------------------------------

    def _can_start_more(self, now: float) -> bool:
        if self.phase is not Phase.SERVING or self._awaiting_cancel:
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
        jobs = ", ".join(f"{r.claim.job_id} pid {r.pid}" for r in self.running.values()) or "none"
        return f"{len(self.running)}/{self.settings.concurrency} busy, {self.phase.value}, running: {jobs}"

    def _set_title(self, now: float | None = None) -> None:
        """The title in `ps` (the busy count at most once a second unless `now` is None)."""
        state = " draining" if self.draining else " paused" if any(s.paused for s in self.served) else ""
        if self.title.show(len(self.running), state, now):
            self.notifier.status_changed(self._status_text)

    def _status_text(self) -> str:
        """What `systemctl status` shows: how busy, and each queue's counts."""
        busy = f"{len(self.running)}/{self.settings.concurrency} busy{', draining' if self.draining else ''}"
        if len(self.served) == 1:
            return f"{busy}; {self.served[0].counts_text()}"
        return busy + "".join(f"; {served.queue.path.name}: {served.counts_text()}" for served in self.served)


def _described(served: Served) -> str:
    cap = f", at most {served.cap} of its jobs at once" if served.cap else ""
    return f"{served.queue.path} (as owner {served.tenancy.name}{cap})"
