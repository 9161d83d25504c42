"""One queue a manager serves, and everything the manager keeps for it.

A manager may serve several queues (`forkvisor run high default low`). Each has
its own owner folder and lease (`tenancy`), sweeper child, recorded outcomes,
pause, settings (a queue's lease, retention and rule on command jobs are its
own) and an optional cap on how many of the manager's children run its jobs.
What is the process's stays in the manager: signals, the children and their
one concurrency cap, the budget, the life cycle. The manager runs the steps
below for each queue at every turn of its loop, in the order the queues were
given, which is also the order in which they are claimed from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from jobs import NOT_PAUSED, Claim, ClaimLost, Functions, JobsError, Owner, Queue, QueueReplaced, Registry
from supervisor import forking, sweeper
from supervisor.children import Children
from supervisor.containment import Containment, ProcessContainment
from supervisor.errors import InternalError, Stalled
from supervisor.health import StoreHealth
from supervisor.launch import Launcher
from supervisor.leftovers import Leftovers
from supervisor.outcomes import Outcomes
from supervisor.running import Running, Stop
from supervisor.settings import Settings, for_queue
from supervisor.spawner import Spawner
from supervisor.tenancy import Tenancy
from supervisor.wakeups import News

log = logging.getLogger(__name__)
TAKE_IN_PER_TURN = 64
TAKE_IN_SECONDS = 0.05  # a turn's take-in stops after this: the children, signals and heartbeat come first
STATS_EVERY = 5.0  # seconds between two writes of the counters (when they changed)


def serve(
    queues: Sequence[Queue],
    registry: Registry,
    given: Mapping[str, object],
    caps: Mapping[int, int],
    request_drain: Callable[[str], None],
    containment: Containment,
) -> ServedQueues:
    """A `Served` for each queue, in the manager's order: with its own settings (`given`,
    else the queue's: `settings.for_queue`) and its cap (`caps`, by index)."""
    own = [for_queue(queue, given) for queue in queues]
    spawner = Spawner.find() if any(each.commands for each in own) else None
    several = len(queues) > 1  # then log lines say which queue a job came from
    return ServedQueues(
        Served(
            index,
            queue,
            registry,
            own[index],
            caps.get(index),
            request_drain,
            label=str(queue.path) if several else "",
            spawner=spawner,
            containment=containment,
        )
        for index, queue in enumerate(queues)
    )


class Served:
    """A queue the manager serves: its `index` in the manager's order, its own parts."""

    def __init__(
        self,
        index: int,
        queue: Queue,
        registry: Registry,
        settings: Settings,
        cap: int | None,
        request_drain: Callable[[str], None],
        label: str = "",
        spawner: Spawner | None = None,
        containment: Containment | None = None,
    ) -> None:
        """`settings` are the manager's with this queue's own filled in (`settings.for_queue`);
        `cap`, if given, bounds the manager's children running this queue's jobs;
        `request_drain` drains the whole manager (a drain file, a replaced folder); `label`
        names the queue in the log lines about its jobs (where the manager serves several);
        `spawner`, if given, starts its command jobs without a fork."""
        self.index = index
        self.queue = queue
        self.settings = settings
        self.cap = cap
        self.functions = Functions(registry, commands=settings.commands)
        self.health = StoreHealth()
        share = settings.concurrency if cap is None else min(cap, settings.concurrency)
        self.stats = queue.serving.stats_file("manager")  # what `forkvisor metrics` and the web page count
        self.outcomes = Outcomes(queue, self.health, self.stats.tally, label)
        self.containment = containment or ProcessContainment("none given")
        self.tenancy = Tenancy(queue, self.functions, settings.lease, self.health, share, self.containment)
        self.launcher = Launcher(queue, registry, settings, index, label, spawner, self.containment)
        self.sweeper = sweeper.SweeperChild(
            queue, self.functions, settings.sweep_interval, settings.tmp_age, settings.retention, self._owner_name
        )
        self.leftovers = Leftovers(queue, self.functions, settings.horizon, self.health)
        self.paused = NOT_PAUSED  # `forkvisor pause`: read at each poll and when the file changes
        self.take_in_due = True  # members' submissions may wait in incoming/
        self.replaced: QueueReplaced | None = None  # its folders changed under us: the manager drains, then fails
        self._request_drain = request_drain
        self._stats_due = 0.0
        self._marked: set[str] = set()  # running jobs whose folder gained (or lost) an operator's mark
        self._stats_written = 0  # `tally.changes` when the counters were last written
        self._tries_counted = (0, 0)  # the claimer's races and gone names already in the tally

    def register_at_start(self) -> None:
        """Register as an owner (or raise: the manager does not start), and take up the
        counters of a manager that is gone."""
        self.tenancy.register_at_start()
        try:
            self.stats.start(self.tenancy.name)
        except (OSError, JobsError) as exc:  # counting from zero is no reason not to serve
            log.error("cannot read the stats of %s: %s; counting from zero", self.queue.path, exc)

    def _owner_name(self) -> str:
        """The owner name when the sweeper starts (it changes when the manager registers anew)."""
        return self.tenancy.name

    # -- what the wait found -----------------------------------------------------------

    def on_news(self, news: News) -> None:
        """New ready names to the claim index; at each poll, check the folders, the settings
        and the pause; a drain request drains the manager."""
        queue = self.queue
        if news.ready or news.rung:
            self.stats.tally.wakeups += 1
            self.stats.tally.changes += 1
        for name in news.ready:
            queue.serving.note_ready(name)
        if news.missed or news.rung:  # (rung: another manager saw new names, this one rescans)
            queue.serving.note_ready_missed()
        self.take_in_due = self.take_in_due or news.incoming
        if news.marked:
            self._marked.update(news.marked)
        if news.poll:
            self.check_folders()
            self._reload_settings()
        if news.poll or news.pause:
            self._check_pause()
        if news.drain:
            self._request_drain(f"drain file in {queue.path}")

    def take_in(self, draining: bool) -> None:
        """Take in what members submitted to incoming/ (a bounded number per turn)."""
        if not self.take_in_due or draining:
            return
        try:
            self.queue.serving.take_in(budget=TAKE_IN_PER_TURN, seconds=TAKE_IN_SECONDS)
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            log.error("cannot take in the submissions of %s: %s", self.queue.path, exc)
        self.take_in_due = self.queue.serving.more_to_take_in  # more may wait: again next turn, at once
        skipped, count = self.queue.serving.intake_skipped
        self.tenancy.record_skips(skipped, "take-in", count)

    def _reload_settings(self) -> None:
        """Take a changed queue setting (`forkvisor config`) into the next claims' policies."""
        try:
            if self.queue.serving.reload_settings():
                log.info("settings of %s changed: %s", self.queue.path, self.queue.stored_settings)
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
            self.queue.serving.index.forget_skips()  # what was resumed is claimable again
        log.info("%s paused: %s", self.queue.path, paused.describe() if paused else "nothing (resumed)")
        self.paused = paused

    def check_folders(self) -> None:
        """A queue folder replaced under us (moved, or a link put in its place) is one nobody
        else sees: finish what runs, through the handles opened at the start, and stop."""
        if self.replaced is not None:
            return
        try:
            self.queue.serving.check_folders()
        except QueueReplaced as exc:
            log.error("%s", exc)
            self.replaced = exc
            self._request_drain(f"the folders of {self.queue.path} were replaced")

    # -- the owner's lease and the sweeper ---------------------------------------------------

    def keep_lease(self, now: float, children: Children) -> None:
        """Heartbeat; give back claims no child holds; stop the children whose claim a sweeper
        took back or an operator cancelled, freeze those an operator froze; register anew if
        a sweeper reaped us. Write the counters when they changed, at most every
        `STATS_EVERY` seconds."""
        if now >= self._stats_due:
            self.write_stats(now)
        if self._marked:  # an operator marked them (inotify): act now, not at the heartbeat
            children.check_claims(self.index, self.queue.serving.claim_state, now, only=self._marked)
            self._marked = set()
        if not self.tenancy.heartbeat_due(now):
            return
        self.check_folders()
        if not self.tenancy.registered:
            self.tenancy.register()
        elif not self.tenancy.renew(children.job_ids(self.index) | self.outcomes.unrecorded()):
            self.recover_from_reaping(children)
        else:
            children.check_claims(self.index, self.queue.serving.claim_state, now)

    def write_stats(self, now: float) -> None:
        """Write the counters if they changed since the last write (else nothing)."""
        self._count_tries()
        runs = self.stats.tally.changes
        if runs == self._stats_written:
            return
        self._stats_due = now + STATS_EVERY
        try:
            self.stats.write(self.tenancy.name)
            self._stats_written = runs
        except (OSError, JobsError) as exc:
            log.warning("cannot write the stats of %s: %s; trying again in %gs", self.queue.path, exc, STATS_EVERY)

    def _count_tries(self) -> None:
        """Into the tally, the claims lost and the names found gone since it last looked (read
        here, at each write, rather than at every claim)."""
        serving, tally = self.queue.serving, self.stats.tally
        if (serving.races, serving.gone) != self._tries_counted:
            tally.races += serving.races - self._tries_counted[0]
            tally.gone += serving.gone - self._tries_counted[1]
            tally.changes += 1  # (a manager that only lost races has counts to write too)
            self._tries_counted = (serving.races, serving.gone)

    def recover_from_reaping(self, children: Children) -> None:
        """A sweeper judged us dead: our claims are void; start over as a new owner."""
        lost = list(children.of(self.index))
        log.warning(
            "owner %s was reaped by a sweeper of %s; stopping %d job(s), registering anew",
            self.tenancy.name,
            self.queue.path,
            len(lost),
        )
        for running in lost:
            children.kill_lost(running)
        if self.replaced is None:  # a queue replaced under us is left, not served anew
            self.tenancy.register()

    def sweeper_died(self, status: forking.ExitStatus, now: float) -> bool:
        """Whether `status` is this queue's sweeper's (then it restarts after its back-off)."""
        if status.pid != self.sweeper.pid:
            return False
        self.sweeper.died(status, now)
        return True

    def next_deadline(self, now: float, sweeper_wanted: bool) -> float:
        """When this queue next has something to do: a heartbeat, a retry, a suspended child, a
        sweeper to restart."""
        soonest = min(self.tenancy.next_heartbeat, self.outcomes.next_deadline(now))
        if self.stats.tally.changes != self._stats_written:
            soonest = min(soonest, self._stats_due)
        if sweeper_wanted and self.sweeper.pid is None:
            soonest = min(soonest, self.sweeper.restart_at)
        return soonest

    # -- claiming ---------------------------------------------------------------------------

    def may_claim(self, children: Children) -> bool:
        """Registered, not paused as a whole, under its cap, no cancel possibly under way."""
        if not self.tenancy.registered or self.paused.all or self.outcomes.awaiting_cancel:
            return False
        return self.cap is None or sum(1 for _ in children.of(self.index)) < self.cap

    def start_next(self, children: Children, close_fds: list[int]) -> bool:
        """Claim this queue's next job and fork its child; False if there was none to claim."""
        claim = self._claim_next(children)
        if claim is None:
            return False
        self.launcher.launch(claim, children, self.outcomes, close_fds)
        return True

    def _claim_next(self, children: Children) -> Claim | None:
        try:
            # Staged: the count goes on disk in `open_gates`, for every claim of this turn at once.
            serving = self.queue.serving
            claim = serving.claim(self.tenancy.name, functions=self.functions, paused=self.paused, staged=True)
            if claim is not None:
                self.health.worked()
            return claim
        except ClaimLost:
            self.recover_from_reaping(children)
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            log.error("cannot claim from %s: %s", self.queue.path, exc)
        finally:
            self.leftovers.note_given_back()
            self.tenancy.record_skips(self.queue.serving.unclaimable)
        return None

    def open_gates(self, waiting: Sequence[tuple[Running, forking.Gate]]) -> None:
        """Put the counts of the runs started this turn on disk (their barriers shared), then let
        each child in; a child whose count is not on disk is let go without running anything:
        its claim was lost (a sweep took the job back first), or the disk failed (the job goes
        back, its attempt not counted, as after a drain)."""
        failed = self.queue.serving.commit_counts([running.claim for running, _ in waiting])
        for (running, gate), why in zip(waiting, failed, strict=True):
            if why is None:
                gate.open()
                continue
            gate.shut()
            running.shut_out = True
            if running.lost:
                continue  # killed already: its owner was reaped meanwhile (`recover_from_reaping`)
            if isinstance(why, FileNotFoundError):
                log.warning("job %s: its claim was taken back before it started; not run", running.claim.job_id)
                running.lose()
            else:
                log.error("cannot count the run of job %s: %s; putting it back", running.claim.job_id, why)
                running.kill(Stop.DRAIN)

    # -- the end ------------------------------------------------------------------------------

    def finished_burst(self, stall_timeout: float) -> bool:
        """For --burst: this queue has nothing left for the manager (or its store stalled)."""
        return self.health.stalled(stall_timeout) or self.leftovers.nothing_left(self.paused)

    def close(self, kill_grace: float) -> None:
        """Stop the sweeper and retire the owner folder (the children are the manager's to end)."""
        self.write_stats(float("inf"))  # before the owner folder goes: then the file may be adopted
        try:
            self.sweeper.stop(kill_grace)
            self.tenancy.retire()
        except (OSError, JobsError) as exc:  # the sweepers of other managers deal with what is left
            log.error("cannot retire owner %s of %s cleanly: %s", self.tenancy.name, self.queue.path, exc)

    def counts_text(self) -> str:
        """The queue's counts, for systemd's STATUS line."""
        try:
            counts = self.queue.counts()
        except (OSError, JobsError) as exc:
            return f"cannot count {self.queue.path}: {exc}"
        return ", ".join(f"{state} {counts[state]}" for state in ("ready", "scheduled", "claimed", "dead"))


class ServedQueues(tuple[Served, ...]):
    """The queues one manager serves, in its order: what the manager does to all of them."""

    def register(self, kill_grace: float, then: Callable[[], None]) -> None:
        """Register as an owner of each queue, then call `then`; if anything fails, the
        queues registered already are left clean."""
        registered: list[Served] = []
        try:
            for served in self:
                served.register_at_start()
                registered.append(served)
            then()
        except BaseException:
            for served in registered:
                served.close(kill_grace)
            raise

    def owner(self) -> Owner:
        """The manager as an owner of its first queue."""
        owner = self[0].tenancy.owner
        if owner is None:
            raise InternalError("the manager registers as an owner when it starts")
        return owner

    def described(self) -> str:
        return ", ".join(
            f"{served.queue.path} (as owner {served.tenancy.name}"
            f"{f', at most {served.cap} of its jobs at once' if served.cap else ''})"
            for served in self
        )

    def sweeper_pids(self) -> set[int]:
        return {served.sweeper.pid for served in self if served.sweeper.pid is not None}

    @property
    def awaiting_cancel(self) -> bool:
        """A child killed from outside waits to be judged: a cancel may be under way."""
        return any(served.outcomes.awaiting_cancel for served in self)

    def release_suspended(self) -> None:
        """The children killed from outside and waiting to be judged go back (the manager
        drains, stops or closes: the same cancel)."""
        for served in self:
            served.outcomes.release_suspended()

    def on_news(self, news: Sequence[News], draining: bool) -> None:
        for served, each in zip(self, news, strict=True):
            served.on_news(each)
            served.take_in(draining)

    def on_exit(self, running: Running | None, status: forking.ExitStatus, draining: bool, now: float) -> None:
        """A child was reaped: a job's is harvested; a sweeper's, its queue restarts it."""
        if running is not None:
            self[running.queue].outcomes.harvest(running, status, draining)
            return
        for served in self:
            if served.sweeper_died(status, now):
                break

    def after_reaping(self, now: float) -> None:
        for served in self:
            served.outcomes.judge_suspended(now)
            served.outcomes.retry_stranded()
            served.outcomes.promote_retries()

    def room(self, children: Children, may_start: bool) -> list[int]:
        """How many more jobs of each queue the manager could start now (its doorbells' due)."""
        room = children.concurrency - len(children.running) if may_start else 0
        return [room if room and served.may_claim(children) else 0 for served in self]

    def open_gates(self, children: Children) -> None:
        """Let in the children started this turn, each queue's counts committed together."""
        if not children.at_gates:
            return  # (every turn: nothing made)
        waiting, children.at_gates = children.at_gates, []
        for served in self:
            mine = [entry for entry in waiting if entry[0].queue == served.index]
            if mine:
                served.open_gates(mine)

    def start_sweepers(self, now: float, fds: list[int]) -> None:
        for served in self:
            served.sweeper.keep(now, fds)

    def keep(self, now: float, children: Children, fds: list[int], sweepers: bool) -> None:
        """Each queue's lease; and its sweeper, restarted if it died (unless the manager stops)."""
        for served in self:
            served.keep_lease(now, children)
            if sweepers:
                served.sweeper.keep(now, fds)

    def soonest(self, now: float, sweepers: bool, draining: bool, may_start: Callable[[Served], bool]) -> float:
        """When the first queue next has something to do (`now`: a take-in or a claim that
        stopped at its budget goes on at once)."""
        soonest = float("inf")
        for served in self:
            soonest = min(soonest, served.next_deadline(now, sweepers))
            if served.take_in_due and not draining:
                return now
            if served.queue.serving.more_to_examine and may_start(served):
                return now
        return soonest

    def finished_burst(self, stall_timeout: float) -> bool:
        return all(served.finished_burst(stall_timeout) for served in self)

    def after_run(self, burst: bool, stall_timeout: float) -> None:
        """Raise why the run ended early (a queue replaced; with `burst`, a store that stalled);
        else, for a burst, say what is left in each queue."""
        for served in self:
            if served.replaced is not None:
                raise served.replaced
        if not burst:
            return
        for served in self:
            if served.health.stalled(stall_timeout):
                raise Stalled(
                    f"gave up on {served.queue.path} after {stall_timeout:g}s in which every change to it "
                    f"failed: {served.health.last_failure}; jobs not finished stay where they are for the "
                    "next manager"
                )
        for served in self:
            served.leftovers.say_what_is_left(served.paused)

    def close(self, kill_grace: float) -> None:
        for served in self:
            served.close(kill_grace)
