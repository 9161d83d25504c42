"""The lease-sweeper: a child of the manager that keeps the queue moving.

Each sweep, judged by the file system's clock: return the claims of dead or
expired owners, promote due scheduled jobs, quarantine abandoned submissions,
and purge done jobs past the retention if one is set. Between sweeps, at each
schedule's tick (by the host's clock), enqueue its job (`jobs.planner`). Several sweepers (one
per manager, on any host) may sweep one queue: every move is a rename that
only one of them can win.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

from jobs import Functions, JobsError, Owner, Planner, Queue, State, StatsFile
from supervisor import containment, forking, liveness, signals
from supervisor.pacing import Backoff
from supervisor.titles import Role, set_title

log = logging.getLogger(__name__)
BACKOFF_MIN, BACKOFF_MAX = 1.0, 60.0
HEALTHY_RUN = 60.0  # a sweeper that ran this long before dying was not crash-looping
TREE_BUDGET = 2_000  # entries of one purged job removed per sweep; later sweeps finish a bigger one
PURGE_EVERY_MAX = 300.0
TICK_SLACK = 0.05  # the shortest sleep: a tick found due again at once is not a busy loop
TAKE_IN_PER_SWEEP = 1000  # applying the retention lists and stats all of done/: not at every sweep


def run(
    path: Path,
    functions: Functions,
    durable: bool,
    interval: float,
    tmp_age: float,
    retention: float | None,
    owner: str | None = None,
) -> int:
    """Sweep `path` every `interval` seconds until killed (it dies with its manager). What a
    sweep skips is kept in the folder of `owner`, its manager, for `forkvisor status`."""
    set_title(Role.SWEEPER, f"forkvisor: sweeper {path}")
    try:
        queue = Queue(path, create=False, durable=durable)
    except JobsError as exc:  # removed or replaced under its manager, which sees it too and stops
        log.error("the sweeper cannot open its queue: %s", exc)
        return forking.EXIT_FAILED
    every = purge_interval(retention, interval)
    planner = queue.serving.planner(functions.registry.schedules)
    next_purge = next_sweep = 0.0
    recorded: dict[str, str] = {}
    stats = _counters(queue, owner)
    while True:
        # The manager's stop (SIGTERM) waits for the step at hand: stopped half-way, a step would
        # leave what it was writing half-written (a quarantine note was found empty). After the
        # manager's grace, SIGKILL still ends a sweeper anywhere, as a crash would.
        with signals.blocked():
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + interval
                purge_now = now >= next_purge
                done = sweep_once(queue, functions, tmp_age, retention if purge_now else None)
                if done is not None and purge_now:
                    next_purge = now + every  # a failed sweep purges again at the next one
                if owner is not None:
                    recorded = _record_skips(queue, owner, recorded)
                    if stats is not None and done and (done.get("reverted") or done.get("expired")):
                        _count(stats, owner, done)
            next_tick = fire_due(queue, planner)
        wait = next_sweep - time.monotonic()
        if next_tick is not None:
            wait = min(wait, next_tick - time.time())
        time.sleep(max(wait, TICK_SLACK))  # periodic chores, not on the path from enqueue to start


def fire_due(queue: Queue, planner: Planner) -> float | None:
    """Enqueue the jobs of the schedules' due ticks; when the next tick is due (wall clock)."""
    try:
        return planner.fire(time.time(), time.monotonic())[1]  # each job enqueued is logged
    except (OSError, JobsError) as exc:
        log.error("cannot fire the schedules of %s: %s", queue.path, exc)
        return None


def _counters(queue: Queue, owner: str | None) -> StatsFile | None:
    """The sweeper's counters (claims it took back), going on from its predecessor's."""
    if owner is None:
        return None
    stats = queue.serving.stats_file("sweeper")
    try:
        stats.start(owner)
    except (OSError, JobsError) as exc:
        log.warning("cannot read the sweeper's stats: %s; counting from zero", exc)
    return stats


def _count(stats: StatsFile, owner: str, done: dict[str, int]) -> None:
    stats.tally.reverts += done.get("reverted", 0)
    stats.tally.expiries += done.get("expired", 0)
    try:
        stats.write(owner)
    except (OSError, JobsError) as exc:
        log.warning("cannot write the sweeper's stats: %s", exc)


def _record_skips(queue: Queue, owner: str, recorded: dict[str, str]) -> dict[str, str]:
    """Write what the last sweep skipped to the manager's folder when it changed; return what is there."""
    skips = queue.serving.last_sweep_skips
    if skips.found == recorded:
        return recorded
    try:
        queue.serving.record_skipped(owner, "sweep", skips.found, skips.count)
    except (OSError, JobsError) as exc:
        log.warning("cannot record the entries this sweep skipped: %s", exc)
        return recorded
    return dict(skips.found)


def purge_interval(retention: float | None, interval: float) -> float:
    """How often to apply the retention: every twentieth of it, so a done job outlives it by
    at most 5%, but no more often than the sweeps and at least every five minutes. With a
    million done jobs one pass takes seconds, which every sweep could not afford."""
    if retention is None:
        return float("inf")
    return min(max(retention / 20, interval), PURGE_EVERY_MAX)


def sweep_once(queue: Queue, functions: Functions, tmp_age: float, retention: float | None) -> dict[str, int] | None:
    """One sweep, and a retention purge unless `retention` is None; what it did, None if it failed."""
    try:
        queue.serving.check_folders()  # a replaced state folder is not swept through the old handle
        now = queue.serving.filesystem_now()
        queue.serving.reload_settings()  # a lost run's attempt limit may come from them
        done = queue.serving.sweep(now, liveness.is_alive, tmp_age, functions, _end_leftovers)
        # For managers that do not watch it, and the leftovers of take-ins whose manager died:
        done["taken in"] = queue.serving.take_in(now, budget=TAKE_IN_PER_SWEEP, leftovers=True)
        if retention is not None:
            done["purged"] = len(queue.purge(State.DONE, retention, now, budget=TREE_BUDGET))
    except (OSError, JobsError) as exc:
        log.error("sweep of %s failed: %s", queue.path, exc)
        return None
    if any(done.values()):
        log.info("sweep of %s: %s", queue.path, ", ".join(f"{key} {value}" for key, value in done.items()))
    return done


def _end_leftovers(owner: Owner) -> bool:
    """What the runs of an owner being reaped left on this host goes before its jobs go back:
    a dead owner's, or a stopped one's whose lease ran out (its runs are no longer its).
    Elsewhere its lease, and the fencing rename, are all there is (docs/ARCHITECTURE.md)."""
    if liveness.is_alive(owner) is None:
        return True  # another host's: nothing here to end
    return containment.end_leftovers(owner.runs, owner.name)


class SweeperChild:
    """The manager's side of its sweeper: start it, restart it with back-off, stop it."""

    def __init__(
        self,
        queue: Queue,
        functions: Functions,
        interval: float,
        tmp_age: float,
        retention: float | None,
        owner: Callable[[], str] | None = None,
    ) -> None:
        """`owner` names the manager's owner folder when the sweeper starts (it may change)."""
        self._body = lambda: run(
            queue.path, functions, queue.durable, interval, tmp_age, retention, owner() if owner else None
        )
        self.pid: int | None = None
        self._restarts = Backoff(BACKOFF_MIN, BACKOFF_MAX)
        self._started = 0.0

    @property
    def restart_at(self) -> float:
        """When a dead sweeper may start again (monotonic)."""
        return self._restarts.next_try

    def keep(self, now: float, close_fds: list[int]) -> None:
        """Start the sweeper if it is not running and its back-off is over."""
        if self.pid is not None or not self._restarts.due(now):
            return
        try:
            self.pid = forking.start_child(self._body, close_fds)
            self._started = now
        except OSError as exc:  # out of processes or memory: try again later, never die of it
            log.error("cannot start the sweeper: %s; retrying in %.0fs", exc, self._restarts.failed(now))

    def died(self, status: forking.ExitStatus, now: float) -> None:
        if now - self._started > HEALTHY_RUN:
            self._restarts.succeeded()  # it ran fine for a while: not a crash loop
        wait = self._restarts.failed(now)
        log.warning("sweeper pid %d %s; restarting it in %.0fs", status.pid, status.describe(), wait)
        self.pid = None

    def stop(self, grace: float) -> None:
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        forking.signal_tree(pid, signal.SIGTERM)
        forking.wait_for(pid, timeout=grace)
