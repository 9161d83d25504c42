"""The manager: one process, one event loop, one forked child per job.

Each turn of the loop waits for something to happen (`wakeups`: a signal or a
child's exit, a new job, a drain request, or the next deadline of any part) and
then runs the same named steps:

    _on_signals     SIGTERM/SIGINT drain (a second one stops now), SIGUSR1 logs status,
                    SIGHUP reopens the log file
    _on_queue       new ready names to the claim index; at each poll, check the folders,
                    the drain request, the settings and the pause
    _take_in        members' submissions from incoming/
    _reap           wait4 every exited child; record its outcome, move the job on
                    (`outcomes`; a child killed from outside waits out the cancel window)
    enforce         timeouts, memory limits, the drain deadline (`children`)
    _keep_lease     heartbeat; return claims no child holds; stop children whose claim a
                    sweeper took back or an operator cancelled (`tenancy`)
    _keep_sweeper   restart the lease-sweeper child if it died (with back-off)
    _start_jobs     claim and fork while there are free slots (and the budget allows)
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
from enum import Enum

from jobs import NOT_PAUSED, Claim, ClaimLost, Functions, JobsError, Owner, Queue, QueueReplaced, Registry
from supervisor import forking, logfiles, sweeper
from supervisor.budget import Budget
from supervisor.children import Children
from supervisor.errors import Stalled
from supervisor.health import StoreHealth
from supervisor.launch import Launcher, check_root
from supervisor.leftovers import Leftovers
from supervisor.notify import Notifier
from supervisor.outcomes import Outcomes
from supervisor.running import Running
from supervisor.settings import Settings
from supervisor.tenancy import Tenancy
from supervisor.titles import Role, set_title
from supervisor.wakeups import Wakeup, Wakeups

log = logging.getLogger(__name__)
TAKE_IN_PER_TURN = 64
TITLE_EVERY = 1.0  # seconds between two updates of the busy count in the title

__all__ = ["Manager", "Phase", "Settings"]


class Phase(Enum):
    """Where a manager is in its life; it only moves forward."""

    NEW = "new"  # made, not started
    SERVING = "serving"  # claims and runs jobs
    DRAINING = "draining"  # claims nothing more; running jobs may finish until the drain timeout
    STOPPING = "stopping"  # its jobs were killed and go back; it exits once they are reaped
    CLOSED = "closed"  # its sweeper is stopped, its owner folder retired


class Manager:
    """Claims jobs from a queue and runs each in a forked child."""

    def __init__(
        self, queue: Queue | str | os.PathLike[str], registry: Registry | None = None, **settings: object
    ) -> None:
        """`settings` are the fields of `Settings`. Unless given, `lease` and `retention` come
        from the queue's settings, and `commands` is on for a private queue and off for a
        shared one (a command job runs anything its manager's user may). Without a
        registry the manager runs command jobs only."""
        self.queue = queue if isinstance(queue, Queue) else Queue(queue, create=False)
        self.registry = registry if registry is not None else Registry()
        stored = self.queue.settings
        settings = {"lease": stored["lease"], "retention": stored["retention"], **settings}
        # A command job runs anything its user may: on a shared queue, only as its submitter.
        settings.setdefault("commands", not self.queue.shared or bool(settings.get("run_as_submitter")))
        self.settings = options = Settings(**settings)  # type: ignore[arg-type]  # checked by Settings itself
        check_root(options.run_as_submitter)
        self.functions = Functions(self.registry, commands=options.commands)
        self.phase = Phase.NEW
        self.health = StoreHealth()
        self.children = Children(options.concurrency, options.kill_grace, options.memory_poll)
        self.tenancy = Tenancy(self.queue, self.functions, options.lease, self.health)
        self.outcomes = Outcomes(self.queue, self.health)
        self.wakeups = Wakeups(self.queue, options.poll_interval)
        self.launcher = Launcher(self.queue, self.registry, options.commands, options.run_as_submitter)
        self.sweeper = sweeper.SweeperChild(
            self.queue, self.functions, options.sweep_interval, options.tmp_age, options.retention, self._owner_name
        )
        self.leftovers = Leftovers(self.queue, self.functions, options.horizon, self.health)
        self.notifier = Notifier()  # systemd's Type=notify, when it asked
        self.budget = Budget(options.max_jobs, options.max_runtime)
        self.paused = NOT_PAUSED  # `forkvisor pause`: read at each poll and when the file changes
        self._take_in_due = True  # members' submissions may wait in incoming/
        self._replaced: QueueReplaced | None = None  # the queue's folders changed under us: drain, then fail
        self._title = ""
        self._title_state = ""
        self._next_title = 0.0
        self._title_prefix = f"forkvisor: manager {self.queue.path}"

    @property
    def running(self) -> dict[int, Running]:
        return self.children.running

    @property
    def owner(self) -> Owner:
        if self.tenancy.owner is None:
            raise RuntimeError("the manager registers as an owner when it starts")
        return self.tenancy.owner

    @property
    def draining(self) -> bool:
        """Claiming nothing more: draining or stopping."""
        return self.phase in (Phase.DRAINING, Phase.STOPPING)

    @property
    def sweeper_pid(self) -> int | None:
        return self.sweeper.pid

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        """Install signal handling, register as an owner, start watching and the sweeper."""
        self.wakeups.open_signals()  # first: a SIGTERM from now on drains instead of killing
        try:
            self.tenancy.register_at_start()
            self.wakeups.open_watch()
        except BaseException:
            self.wakeups.close()
            raise
        forking.become_subreaper()
        self.phase = Phase.SERVING
        self.budget.start(time.monotonic())
        self.sweeper.keep(time.monotonic(), self.wakeups.fds)
        self._set_title()
        self.notifier.ready(self._status_text())
        concurrency = self.settings.concurrency
        log.info("manager %s serving %s with concurrency %d", self.tenancy.name, self.queue.path, concurrency)

    def run(self, burst: bool = False) -> int:
        """Serve the queue until drained (or, with `burst`, until nothing is left); return 0."""
        self.start()
        try:
            while not self.finished(burst):
                self.step(timeout=None)
        finally:
            self.close()
        if self._replaced is not None:
            raise self._replaced
        if burst and self.health.stalled(self.settings.stall_timeout):
            raise Stalled(
                f"gave up on {self.queue.path} after {self.settings.stall_timeout:g}s in which every change to it "
                f"failed: {self.health.last_failure}; jobs not finished stay where they are for the next manager"
            )
        if burst:
            self.leftovers.say_what_is_left(self.paused)
        return 0

    def finished(self, burst: bool) -> bool:
        if self.running or self.outcomes.holding:
            return False
        if self.phase is not Phase.SERVING:
            return True
        return burst and (self.health.stalled(self.settings.stall_timeout) or self.leftovers.nothing_left(self.paused))

    def close(self) -> None:
        """Stop the sweeper, release what is still running, retire the owner folder."""
        if self.phase in (Phase.NEW, Phase.CLOSED):
            return
        try:
            self.outcomes.release_held()  # a manager that closes holding one is being cancelled too
            self._kill_all_and_reap()
            self.sweeper.stop(self.settings.kill_grace)
            self.tenancy.retire()
        except (OSError, JobsError) as exc:  # the sweepers of other managers deal with what is left
            log.error("cannot retire owner %s cleanly: %s", self.tenancy.name, exc)
        finally:
            self.wakeups.close()
            self.phase = Phase.CLOSED
        log.info("manager %s stopped", self.tenancy.name)

    def request_drain(self, why: str) -> None:
        """Claim nothing more; let running jobs finish up to the drain timeout."""
        if self.phase is not Phase.SERVING:
            return  # a repeated request neither restarts nor extends the drain
        log.info("draining (%s): %d job(s) running, claiming no more", why, len(self.running))
        self.phase = Phase.DRAINING
        self.children.drain(time.monotonic(), self.settings.drain_timeout)
        self.outcomes.release_held()  # children killed just before: the same cancel
        self._set_title()
        self.notifier.stopping(self._status_text())

    def stop_now(self, why: str) -> None:
        """Stop every running job at once and put it back in the queue."""
        log.warning("stopping now (%s): releasing %d running job(s)", why, len(self.running))
        self.phase = Phase.STOPPING
        self.outcomes.release_held()
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
        self._on_signals(woken)
        self._on_queue(woken)
        self._take_in()
        self._reap()
        self.outcomes.judge_held(now)
        self.outcomes.retry_stranded()
        self.outcomes.promote_retries()
        self.children.enforce(now)
        self._keep_lease(now)
        self._keep_sweeper(now)
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
            self.tenancy.next_heartbeat,
            self.children.next_deadline(now),
            self.outcomes.next_deadline(now),
            self.budget.ends_at if self.phase is Phase.SERVING else float("inf"),
        )
        if self.notifier.enabled:
            soonest = min(soonest, self.notifier.next_deadline())
        if self.sweeper.pid is None and self.phase is not Phase.STOPPING:
            soonest = min(soonest, self.sweeper.restart_at)
        if (self.queue.more_to_examine and self._can_start_more(now)) or (self._take_in_due and not self.draining):
            soonest = now  # the last claim or take-in stopped at its budget
        wait = max(0.0, soonest - now)
        return wait if timeout is None else min(wait, timeout)

    def _on_signals(self, woken: Wakeup) -> None:
        for signum in woken.signals:
            if signum in (signal.SIGTERM, signal.SIGINT):
                if self.draining:
                    self.stop_now(f"second {signum.name}")
                else:
                    self.request_drain(signum.name)
            elif signum == signal.SIGUSR1:
                log.info("status: %s", self.status_line())
            elif signum == signal.SIGHUP:
                log.info("SIGHUP: reopened %d log file(s); nothing else reloads (see docs)", logfiles.reopen())

    def _on_queue(self, woken: Wakeup) -> None:
        for name in woken.ready:
            self.queue.note_ready(name)
        if woken.missed:
            self.queue.note_ready_missed()
        self._take_in_due = self._take_in_due or woken.incoming
        if woken.poll:
            self._check_folders()
            self._reload_settings()
        if woken.poll or woken.pause:
            self._check_pause()
        if woken.drain:
            self.request_drain("drain file in the queue")

    def _take_in(self) -> None:
        """Take in what members submitted to incoming/ (a bounded number per turn)."""
        if not self._take_in_due or self.draining:
            return
        try:
            handled = self.queue.take_in(budget=TAKE_IN_PER_TURN)
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            log.error("cannot take in the submissions of %s: %s", self.queue.path, exc)
            handled = 0
        self._take_in_due = handled >= TAKE_IN_PER_TURN  # more may wait: again next turn, at once

    def _reload_settings(self) -> None:
        """Take a changed queue setting (`forkvisor config`) into the next claims' policies."""
        try:
            if self.queue.reload_settings():
                log.info("queue settings changed: %s", self.queue.stored_settings)
        except (OSError, JobsError) as exc:
            log.error("cannot read the settings of %s: %s; keeping the ones read before", self.queue.path, exc)

    def _check_pause(self) -> None:
        """Take in `forkvisor pause` and `resume`: what is paused is not claimed (running jobs go on)."""
        try:
            paused = self.queue.paused()
        except OSError as exc:  # keep what was known; the next poll looks again
            log.error("cannot read the pause state of %s: %s", self.queue.path, exc)
            return
        if paused == self.paused:
            return
        if any(not paused.covers(f) for f in self.paused.functions) or (self.paused.all and not paused.all):
            self.queue.index.forget_skips()  # what was resumed is claimable again
        log.info("paused: %s", paused.describe() if paused else "nothing (resumed)")
        self.paused = paused

    def _reap(self) -> None:
        for running, status in self.children.reaped():
            if running is not None:
                self.outcomes.harvest(running, status, self.draining)
            elif status.pid == self.sweeper.pid:
                self.sweeper.died(status, time.monotonic())

    def _keep_lease(self, now: float) -> None:
        if not self.tenancy.heartbeat_due(now):
            return
        self._check_folders()
        if not self.tenancy.registered:
            self.tenancy.register()
        elif not self.tenancy.renew(self.children.held() | self.outcomes.held()):
            self._recover_from_reaping()
        else:
            self.children.check_claims(self.queue.claim_state, now)

    def _recover_from_reaping(self) -> None:
        """A sweeper judged us dead: our claims are void; start over as a new owner."""
        count = len(self.running)
        log.warning("owner %s was reaped by a sweeper; stopping %d job(s), registering anew", self.tenancy.name, count)
        for running in self.running.values():
            self.children.kill_lost(running)
        if self._replaced is None:  # a queue replaced under us is left, not served anew
            self.tenancy.register()

    def _check_folders(self) -> None:
        """A queue folder replaced under us (moved, or a link put in its place) is one nobody
        else sees: finish what runs, through the handles opened at the start, and stop."""
        if self._replaced is not None:
            return
        try:
            self.queue.check_folders()
        except QueueReplaced as exc:
            log.error("%s", exc)
            self._replaced = exc
            self.request_drain("the queue's folders were replaced")

    def _keep_sweeper(self, now: float) -> None:
        if self.phase is not Phase.STOPPING:
            self.sweeper.keep(now, self.wakeups.fds)

    def _owner_name(self) -> str:
        """The owner name when the sweeper starts (it changes when the manager registers anew)."""
        return self.tenancy.name

    # -- starting jobs -------------------------------------------------------------

    def _can_start_more(self, now: float) -> bool:
        if self.phase is not Phase.SERVING or self.outcomes.holding or self.paused.all:
            return False  # (holding: a cancel may be under way)
        return self.tenancy.registered and self.children.has_room(now) and self.budget.allows_another()

    def _start_jobs(self) -> None:
        while self._can_start_more(time.monotonic()):
            claim = self._claim_next()
            if claim is None:
                return
            self.launcher.launch(claim, self.children, self.outcomes, self.wakeups.fds)
            self.budget.started_one()

    def _claim_next(self) -> Claim | None:
        try:
            claim = self.queue.claim(self.tenancy.name, functions=self.functions, paused=self.paused)
            if claim is not None:
                self.health.worked()
            return claim
        except ClaimLost:
            self._recover_from_reaping()
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            log.error("cannot claim from %s: %s", self.queue.path, exc)
        finally:
            self.leftovers.note_given_back()
            self.tenancy.record_skips(self.queue.unclaimable)
        return None

    # -- status ---------------------------------------------------------------------

    def status_line(self) -> str:
        jobs = ", ".join(f"{r.claim.job_id} pid {r.pid}" for r in self.running.values()) or "none"
        return f"{len(self.running)}/{self.settings.concurrency} busy, {self.phase.value}, running: {jobs}"

    def _set_title(self, now: float | None = None) -> None:
        """Show in `ps` how busy the manager is. A change of state (draining, paused) shows at
        once; the busy count at most once a second, at the turn of the loop `now` is: setting
        a title writes a page the jobs' children share (a copy-on-write fault each time)."""
        state = " draining" if self.draining else " paused" if self.paused else ""
        if state == self._title_state and now is not None and now < self._next_title:
            return
        title = f"{self._title_prefix} {len(self.running)}/{self.settings.concurrency} busy{state}"
        if title != self._title:
            set_title(Role.MANAGER, title)
            self._title, self._title_state = title, state
            self._next_title = (now or time.monotonic()) + TITLE_EVERY
            self.notifier.status_changed(self._status_text)

    def _status_text(self) -> str:
        """What `systemctl status` shows: how busy, and the queue's counts."""
        busy = f"{len(self.running)}/{self.settings.concurrency} busy{', draining' if self.draining else ''}"
        try:
            counts = self.queue.counts()
        except (OSError, JobsError) as exc:
            return f"{busy}; cannot count the queue: {exc}"
        return (
            busy + "; " + ", ".join(f"{state} {counts[state]}" for state in ("ready", "scheduled", "claimed", "dead"))
        )
