"""The manager: one process, one event loop, one forked child per job.

Each turn of the loop waits for something to happen (a signal or a child's
exit on the wakeup pipe, a new job through inotify, or the next deadline)
and then runs the same named steps:

    _handle_signals  SIGTERM/SIGINT drain (a second one stops now), SIGUSR1 logs status
    _reap_children   wait4 every exited child, record its outcome, move the job on
    _enforce_limits  timeouts, memory limits, the drain deadline
    _keep_lease      heartbeat; return claims no child holds; stop children whose claim
                     a sweeper took back or an operator cancelled
    _keep_sweeper    restart the lease-sweeper child if it died (with back-off)
    _start_jobs      claim and fork while there are free slots

`step()` runs one turn, so a test can drive the manager tick by tick.
The manager stays single-threaded: forking a threaded process is unsafe.
"""

from __future__ import annotations

import heapq
import logging
import os
import selectors
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from setproctitle import setproctitle

from jobs import (
    COMMAND,
    DRAIN_FILE,
    Claim,
    ClaimLost,
    Command,
    Functions,
    JobsError,
    Queue,
    QueueError,
    QueueReplaced,
    Registry,
    State,
    UnknownCallable,
    storage_error,
)
from supervisor import forking, harvest, limits, liveness, privileges, sweeper
from supervisor.child import run_attempt, run_command
from supervisor.errors import ConfigError, NoSuchUser, Stalled
from supervisor.harvest import Running
from supervisor.signals import SignalPipe
from supervisor.watch import Watch, open_watch

log = logging.getLogger(__name__)
TAKE_IN_PER_TURN = 64
FORK_BACKOFF_MIN, FORK_BACKOFF_MAX = 0.1, 10.0


@dataclass(frozen=True)
class Settings:
    """How a manager runs; every field has a sensible default."""

    concurrency: int = os.cpu_count() or 2
    lease: float = 30.0  # an owner silent this long loses its claims
    sweep_interval: float = 0.0  # 0: a sixth of the lease, at most 5 s
    drain_timeout: float = 60.0  # how long running jobs may finish after a drain request
    kill_grace: float = 5.0  # between SIGTERM and SIGKILL
    poll_interval: float = 1.0  # safety-net rescan (NFS, missed events)
    memory_poll: float = 0.5
    horizon: float = 300.0  # --burst leaves jobs scheduled further ahead than this
    tmp_age: float = 3600.0  # a tmp/ entry older than this was abandoned
    retention: float | None = None  # purge done jobs older than this many seconds
    commands: bool = True  # run command jobs (see `jobs.command`)
    stall_timeout: float = 60.0  # --burst gives up when the store has failed this long without a success
    run_as_submitter: bool = False  # as root: run each job as the member who submitted it (privileges.py)

    def __post_init__(self) -> None:
        if not self.sweep_interval:
            object.__setattr__(self, "sweep_interval", min(5.0, self.lease / 6))
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {self.concurrency}")
        for name in ("lease", "sweep_interval", "kill_grace", "poll_interval", "memory_poll", "stall_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be greater than 0, got {getattr(self, name)}")
        if self.sweep_interval >= self.lease:
            raise ConfigError(f"sweep_interval ({self.sweep_interval}s) must be shorter than the lease ({self.lease}s)")


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
        settings.setdefault("commands", not self.queue.folder.shared or bool(settings.get("run_as_submitter")))
        self.settings = Settings(**settings)  # type: ignore[arg-type]  # checked by Settings itself
        if self.settings.run_as_submitter and os.geteuid() != 0:
            raise ConfigError(
                f"--run-as-submitter needs a manager started as root (this is uid {os.geteuid()}): "
                "only root can become each job's submitter"
            )
        self._identities = privileges.Identities()
        self.functions = Functions(self.registry, commands=self.settings.commands)
        self.running: dict[int, Running] = {}
        self.draining = False
        self.stopping_now = False
        self.left_scheduled = 0
        self._retries_due: list[harvest.Retry] = []
        self._stranded: list[tuple[Running, forking.ExitStatus, dict[str, Any]]] = []
        self._fork_retry_at = 0.0
        self._fork_backoff = FORK_BACKOFF_MIN
        self._drain_deadline: float | None = None
        self._next_heartbeat = 0.0
        self._next_poll = 0.0
        self._next_memory_check = 0.0
        self._started = False
        self._registered = False
        self._ready_fds: set[int] = set()  # what the last wait found readable
        self._left_noted: set[str] = set()  # functions of jobs given back, already logged
        self._skips_recorded: dict[str, str] = {}  # the unclaimable entries the owner folder lists
        self._take_in_due = True  # members' submissions may wait in incoming/
        self._failing_since: float | None = None  # the store has failed since then, with no success
        self._last_failure = ""
        self._replaced: QueueReplaced | None = None  # the queue's folders changed under us: drain, then fail
        self._title = ""
        self._title_prefix = f"forkvisor: manager {self.queue.path}"

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        """Install signal handling, register as an owner, start watching and the sweeper."""
        self._drain_at_start = self._drain_request()  # an older request is not for us
        self._signals = SignalPipe()  # first: a SIGTERM from now on drains instead of killing
        try:
            self._register_at_start()
        except BaseException:
            self._signals.close()
            raise
        forking.become_subreaper()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._signals.read_fd, selectors.EVENT_READ)
        self._watch: Watch | None = open_watch(
            [self.queue.folder.state_dir(State.READY), self.queue.path, self.queue.folder.state_dir(State.INCOMING)]
        )
        if self._watch is not None:
            self._selector.register(self._watch.fd, selectors.EVENT_READ)
        self._started = True
        settings = self.settings
        self._sweeper = sweeper.SweeperChild(
            self.queue, self.functions, settings.sweep_interval, settings.tmp_age, settings.retention, self._owner_name
        )
        self._sweeper.keep(time.monotonic(), self._manager_fds())
        self._set_title()
        log.info(
            "manager %s serving %s with concurrency %d", self.owner.name, self.queue.path, self.settings.concurrency
        )

    def _refuse_if_unsafe(self) -> None:
        """A queue that others may write is one they could steer: refuse it (docs/SECURITY.md)."""
        problems = self.queue.folder.problems()
        if not problems:
            return
        path = self.queue.path
        if any("belongs to" in problem for problem in problems):
            fix = "run the manager as the queue's owner (as root: --user NAME)"
        else:
            shared = " --shared" if self.queue.folder.shared else ""
            fix = f"tighten it as its owner with `forkvisor init {path}{shared}`"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise QueueError(f"cannot serve {path}: {problems[0]}{more}; {fix}")

    def _register_at_start(self) -> None:
        self._refuse_if_unsafe()
        try:  # at start, failing is fatal: say why in words (a full disk is not a permission problem)
            self.owner = liveness.this_owner(self.settings.lease, self.queue.filesystem_now())
            self.queue.register_owner(self.owner, self.functions)
        except OSError as exc:
            raise storage_error(exc, "serve", self.queue.path) from None
        self._registered = True

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
        if burst and self._stalled():
            raise Stalled(
                f"gave up on {self.queue.path} after {self.settings.stall_timeout:g}s in which every change to it "
                f"failed: {self._last_failure}; jobs not finished stay where they are for the next manager"
            )
        if burst and self.left_scheduled:
            log.info("left %d job(s) scheduled beyond the %gs horizon", self.left_scheduled, self.settings.horizon)
        if burst and self.queue.left_for_others:
            functions = ", ".join(f"{name} ({count})" for name, count in sorted(self.queue.left_for_others.items()))
            log.warning("left ready the jobs this manager does not run: %s", functions)
        return 0

    def finished(self, burst: bool) -> bool:
        if self.running:
            return False
        if self.draining or self.stopping_now:
            return True
        return burst and (self._stalled() or self._nothing_left())

    def _stalled(self) -> bool:
        since = self._failing_since
        return since is not None and time.monotonic() - since >= self.settings.stall_timeout

    def _store_worked(self) -> None:
        """A job moved forward (claimed, or its outcome recorded): the store works."""
        self._failing_since = None

    def _store_failed(self, exc: BaseException) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._last_failure = str(exc)

    def close(self) -> None:
        """Stop the sweeper, release what is still running, retire the owner folder."""
        if not self._started:
            return
        try:
            self._stop_everything(signal.SIGKILL)
            self._sweeper.stop(self.settings.kill_grace)
            self.queue.retire_owner(self.owner.name)
        except (OSError, JobsError) as exc:  # the sweepers of other managers deal with what is left
            log.error("cannot retire owner %s cleanly: %s", self.owner.name, exc)
        finally:
            self._selector.close()
            if self._watch is not None:
                self._watch.close()
            self._signals.close()
            self._started = False
        log.info("manager %s stopped", self.owner.name)

    def request_drain(self, why: str) -> None:
        """Claim nothing more; let running jobs finish up to the drain timeout."""
        if self.draining:
            return  # a repeated request neither restarts nor extends the drain
        log.info("draining (%s): %d job(s) running, claiming no more", why, len(self.running))
        self.draining = True
        self._drain_deadline = time.monotonic() + self.settings.drain_timeout
        self._set_title()

    def stop_now(self, why: str) -> None:
        """Stop every running job at once and put it back in the queue."""
        log.warning("stopping now (%s): releasing %d running job(s)", why, len(self.running))
        self.draining = self.stopping_now = True
        self._stop_everything(signal.SIGKILL)

    # -- one turn of the loop ------------------------------------------------------------

    def step(self, timeout: float | None = 0.0) -> None:
        """Wait for an event (at most `timeout` seconds, None: until the next deadline), then act."""
        now = time.monotonic()
        self._wait(self._wait_time(now, timeout))
        now = time.monotonic()
        self._handle_signals()
        self._read_watch(now)
        self._take_in()
        self._reap_children()
        self._retry_stranded()
        self._promote_own_retries()
        self._enforce_limits(now)
        self._keep_lease(now)
        self._keep_sweeper(now)
        self._start_jobs()
        self._set_title()

    def _wait_time(self, now: float, timeout: float | None) -> float:
        deadlines = [self._next_heartbeat, self._next_poll]
        if self._fork_retry_at > now:
            deadlines.append(self._fork_retry_at)
        deadlines += [r.kill_at for r in self.running.values() if r.kill_at is not None]
        unstopped = [r for r in self.running.values() if r.limit is None]  # a stopped job waits on kill_at
        deadlines += [limits.deadline_of(r) for r in unstopped if r.claim.policy.timeout]
        if any(r.claim.policy.memory_limit for r in unstopped):
            deadlines.append(self._next_memory_check)
        if (self.queue.more_to_examine and self._can_start_more()) or (self._take_in_due and not self.draining):
            deadlines.append(now)  # the last claim or take-in stopped at its budget
        if self._drain_deadline is not None:
            deadlines.append(self._drain_deadline)
        if self._sweeper.pid is None and not self.stopping_now:
            deadlines.append(self._sweeper.restart_at)
        wait = max(0.0, min(deadlines) - now)
        if self._retries_due:
            wait = min(wait, max(0.0, self._retries_due[0][0] - time.time()))
        return wait if timeout is None else min(wait, timeout)

    def _wait(self, timeout: float) -> None:
        self._ready_fds = {key.fd for key, _ in self._selector.select(timeout)}

    def _handle_signals(self) -> None:
        if self._signals.read_fd not in self._ready_fds:
            return  # nothing arrived: skip the read (every turn counts, see PERFORMANCE.md)
        for signum in self._signals.drain():
            if signum in (signal.SIGTERM, signal.SIGINT):
                if self.draining:
                    self.stop_now(f"second {signum.name}")
                else:
                    self.request_drain(signum.name)
            elif signum == signal.SIGUSR1:
                log.info("status: %s", self.status_line())
            elif signum == signal.SIGHUP:
                log.info("SIGHUP ignored: send SIGTERM to drain, or use `forkvisor drain`")

    def _read_watch(self, now: float) -> None:
        rescan = now >= self._next_poll
        if self._watch is not None and self._watch.fd in self._ready_fds:
            ready = self.queue.folder.state_dir(State.READY)
            incoming = self.queue.folder.state_dir(State.INCOMING)
            for folder, name in self._watch.read():
                if folder is None:  # the kernel dropped events: look at ready/ and the drain file now
                    rescan = True
                    self.queue.note_ready_missed()
                elif folder == ready:
                    self.queue.note_ready(name)
                elif folder == incoming:
                    self._take_in_due = True
                elif name == DRAIN_FILE:
                    self._check_drain_file()
        if rescan:
            self._next_poll = now + self.settings.poll_interval
            self._check_folders()
            self._check_drain_file()
            self._reload_settings()
            self._take_in_due = True

    def _take_in(self) -> None:
        """Take in what members submitted to incoming/ (a bounded number per turn)."""
        if not self._take_in_due or self.draining:
            return
        try:
            handled = self.queue.take_in(budget=TAKE_IN_PER_TURN)
        except (OSError, JobsError) as exc:
            self._store_failed(exc)
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

    def _check_drain_file(self) -> None:
        if not self.draining and self._drain_request() != self._drain_at_start:
            self.request_drain(f"{DRAIN_FILE} file in the queue")

    def _drain_request(self) -> tuple[int, int] | None:
        """Which drain file is there: `forkvisor drain` renames a new one into place each time,
        so a request is a change of file, whatever the clocks' granularity."""
        try:
            return self.queue.drain_request()
        except OSError as exc:  # the queue folder turned unreadable: no request can be seen
            log.error("cannot look for a drain request in %s: %s", self.queue.path, exc)
            return getattr(self, "_drain_at_start", None)  # as if unchanged (also while starting)

    def _promote_own_retries(self) -> None:
        """Promote the retries this manager scheduled once due, by name, rather than wait
        for a sweep (which would also find them, if this fails)."""
        now = time.time()
        while self._retries_due and self._retries_due[0][0] <= now:
            due, job_id, priority = heapq.heappop(self._retries_due)
            try:
                self.queue.promote(job_id, priority, due, now)
            except (OSError, JobsError) as exc:
                log.error("cannot promote the retry of job %s: %s; a sweep will", job_id, exc)

    # -- children ------------------------------------------------------------------

    def _start_jobs(self) -> None:
        while self._can_start_more():
            claim = self._claim_next()
            if claim is None:
                return
            self._launch(claim)

    def _can_start_more(self) -> bool:
        """A free slot, not draining, and no recent fork failure to wait out."""
        if self.draining or not self._registered or len(self.running) >= self.settings.concurrency:
            return False
        return time.monotonic() >= self._fork_retry_at

    def _claim_next(self) -> Claim | None:
        try:
            claim = self.queue.claim(self.owner.name, functions=self.functions)
            if claim is not None:
                self._store_worked()
            return claim
        except ClaimLost:
            self._recover_from_reaping()
        except (OSError, JobsError) as exc:
            self._store_failed(exc)
            log.error("cannot claim from %s: %s", self.queue.path, exc)
        finally:
            if len(self.queue.left_for_others) > len(self._left_noted):
                self._note_left_for_others()
            if self.queue.unclaimable != self._skips_recorded:
                self._record_skips()
        return None

    def _record_skips(self) -> None:
        """Keep what this manager skips (ready/ entries it cannot claim) where `status` reads it."""
        try:
            self.queue.record_skipped(self.owner.name, "claims", self.queue.unclaimable)
            self._skips_recorded = dict(self.queue.unclaimable)
        except (OSError, JobsError) as exc:
            log.warning("cannot record the entries this manager skips: %s", exc)

    def _note_left_for_others(self) -> None:
        """Say once per function that its jobs are left for other managers (a deploy that
        has not reached this manager yet, or a manager without --app)."""
        for function in sorted(set(self.queue.left_for_others) - self._left_noted):
            self._left_noted.add(function)
            log.warning(
                "leaving jobs of %s to managers that run it: this one does not (it runs %s); "
                "`forkvisor status` counts the ready jobs no running manager can serve",
                function,
                ", ".join(self.functions) or "nothing: start it with --app",
            )

    def _launch(self, claim: Claim) -> None:
        try:
            body = self._child_body(claim)
        except (JobsError, NoSuchUser) as exc:  # unknown function, malformed command, no such submitter
            self._finish_unstarted(claim, exc)
            return
        try:
            pid = forking.start_child(body, self._manager_fds())
        except OSError as exc:  # EAGAIN, ENOMEM: the job is fine, the host is not
            self._fork_failed(claim, exc)
            return
        self._fork_backoff = FORK_BACKOFF_MIN
        self.running[pid] = Running(pid, claim, time.monotonic(), time.time())
        if log.isEnabledFor(logging.INFO):  # per job: build the words only if they are wanted
            log.info("%s started as pid %d", _job(claim), pid)

    def _child_body(self, claim: Claim) -> Callable[[], int]:
        """What the job's child will run; raise JobsError (or NoSuchUser) if it cannot run here at all."""
        folder = self.queue.folder
        identity = self._identity(claim)
        if claim.spec.function == COMMAND:
            if not self.settings.commands:
                why = f"the queue {folder.path} is shared" if folder.shared else "it was told not to (--no-commands)"
                raise UnknownCallable(
                    f"this manager does not run command jobs ({why}); "
                    "start one with --commands to allow them, then `forkvisor retry` the job"
                )
            command = Command.of(claim.spec)
            return lambda: run_command(claim, command, folder.file_mode, identity)
        registered = self.registry.get(claim.spec.function)
        return lambda: run_attempt(claim, registered, folder.durable, folder.file_mode, identity)

    def _identity(self, claim: Claim) -> privileges.Identity | None:
        """Whom the job runs as with --run-as-submitter: the member who submitted it, or for
        the owner's own jobs the queue's owner (None: as this manager)."""
        if not self.settings.run_as_submitter:
            return None
        uid = claim.spec.submitted_by
        return self._identities.of(self.queue.owner_uid if uid is None else uid)

    def _fork_failed(self, claim: Claim, exc: OSError) -> None:
        """Put the job back and stop claiming for a growing while, so a host out of
        processes or memory is not hammered with claim-fork-release cycles."""
        log.error(
            "cannot fork for job %s: %s; putting it back, retrying in %.1fs", claim.job_id, exc, self._fork_backoff
        )
        self._fork_retry_at = time.monotonic() + self._fork_backoff
        self._fork_backoff = min(self._fork_backoff * 2, FORK_BACKOFF_MAX)
        error = {"type": "ForkFailed", "message": f"cannot fork: {exc}"}
        try:
            self.queue.record_outcome(claim, {"run": claim.run, "started": False, "released": True, "error": error})
        except (OSError, JobsError):
            pass  # the release below still gives the attempt back
        self._release_quietly(claim, f"fork failed: {exc}")

    def _manager_fds(self) -> list[int]:
        """Descriptors a child must not keep: the wakeup pipe, the selector, inotify."""
        fds = [*self._signals.fds, self._selector.fileno()]
        return fds + ([self._watch.fd] if self._watch is not None else [])

    def _release_quietly(self, claim: Claim, reason: str) -> None:
        try:
            self.queue.release(claim, reason=reason)
        except (OSError, JobsError) as exc:
            log.error("cannot put job %s back: %s; the next heartbeat returns it", claim.job_id, exc)

    def _finish_unstarted(self, claim: Claim, exc: Exception) -> None:
        error = {"type": type(exc).__name__, "message": str(exc)}
        try:
            self.queue.record_outcome(claim, {"run": claim.run, "started": False, "error": error})
            self.queue.fail(claim, error, permanent=True)
        except (OSError, JobsError) as failure:
            log.error("cannot record why job %s cannot start: %s", claim.job_id, failure)
        log.warning("job %s cannot run: %s", claim.job_id, exc)

    def _reap_children(self) -> None:
        for status in forking.reap_nowait():
            if status.pid == self._sweeper.pid:
                self._sweeper.died(status, time.monotonic())
                continue
            running = self.running.pop(status.pid, None)
            if running is not None:
                if running.limit is not None:  # we stopped it: its leftovers go too, even if they ignore SIGTERM
                    forking.signal_tree(running.pid, signal.SIGKILL, running.descendants)
                else:  # a job ends with its child: what it left in its process group goes too
                    forking.kill_group(running.pid)
                self._harvest(running, status)

    def _harvest(self, running: Running, status: forking.ExitStatus) -> None:
        claim = running.claim
        outcome = harvest.outcome_of(running, status, time.time())
        if running.lost:
            log.warning("job %s pid %d %s after its claim was lost", claim.job_id, status.pid, status.describe())
            try:
                self.queue.note_lost(claim, status.describe())
            except OSError as exc:  # the note is only informative
                log.error("cannot note the lost claim in job %s: %s", claim.job_id, exc)
            return
        if not self._record(running, status, outcome, report=True):
            self._stranded.append((running, status, outcome))
            return
        if log.isEnabledFor(logging.INFO):
            log.info("%s %s in %.3fs", _job(claim), _verdict(running, status), outcome["wall_time"])

    def _retry_stranded(self) -> None:
        """Try again to record harvests that failed (disk full, say); the job stays ours meanwhile."""
        stranded, self._stranded = self._stranded, []
        self._stranded = [entry for entry in stranded if not self._record(*entry, report=False)]

    def _record(self, running: Running, status: forking.ExitStatus, outcome: dict[str, Any], report: bool) -> bool:
        """Record the attempt's outcome and move the job on; False if the store failed."""
        try:
            self.queue.record_outcome(running.claim, outcome)
            self._move_on(running, status, outcome)
            self._store_worked()
        except ClaimLost as exc:
            log.warning("job %s: %s", running.claim.job_id, exc)
        except (OSError, JobsError) as exc:
            self._store_failed(exc)
            if report:
                log.error(
                    "cannot record the outcome of %s (pid %d, %s): %s; will retry",
                    _job(running.claim),
                    status.pid,
                    status.describe(),
                    exc,
                )
            return False
        return True

    def _move_on(self, running: Running, status: forking.ExitStatus, outcome: dict[str, Any]) -> None:
        retry = harvest.settle(self.queue, running, status, outcome)
        if retry is not None:
            heapq.heappush(self._retries_due, retry)

    # -- limits ----------------------------------------------------------------------

    def _enforce_limits(self, now: float) -> None:
        check_memory = now >= self._next_memory_check
        if check_memory:
            self._next_memory_check = now + self.settings.memory_poll
        for running in list(self.running.values()):
            if running.limit is not None:
                limits.escalate(running, now)
            elif (limit := limits.limit_hit(running, now, check_memory)) is not None:
                limits.stop(running, limit, now, self.settings.kill_grace)
        if self._drain_deadline is not None and now >= self._drain_deadline:
            self._drain_deadline = None  # done once: kill_at takes it from here
            for running in self.running.values():
                if running.limit is None:
                    limits.stop(running, "drain", now, self.settings.kill_grace)

    def _stop_everything(self, signum: signal.Signals) -> None:
        for running in self.running.values():
            if running.limit is None:
                running.limit = "drain"
            limits.signal_job(running, signum)
        deadline = time.monotonic() + self.settings.kill_grace + 5
        while self.running and time.monotonic() < deadline:
            self._selector.select(0.05)
            self._reap_children()

    # -- lease and sweeper -------------------------------------------------------------

    def _keep_lease(self, now: float) -> None:
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.settings.lease / 3
        self._check_folders()
        if not self._registered:
            self._register()
            return
        try:
            self.queue.heartbeat(self.owner.name)
            held = {r.claim.job_id for r in self.running.values()} | {r.claim.job_id for r, _, _ in self._stranded}
            self.queue.return_unheld(self.owner.name, held, functions=self.functions)
        except ClaimLost:
            self._recover_from_reaping()
            return
        except (OSError, JobsError) as exc:
            self._store_failed(exc)
            log.error("cannot renew the lease of %s: %s", self.owner.name, exc)
        self._check_claims(now)

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

    def _check_claims(self, now: float) -> None:
        """Stop children whose claim a sweeper took back, and those an operator cancelled."""
        for running in self.running.values():
            try:
                held, cancelled = self.queue.claim_state(running.claim)
            except OSError as exc:  # its folder cannot be looked at now: look again at the next heartbeat
                log.warning("cannot check the claim of job %s: %s", running.claim.job_id, exc)
                continue
            if not running.lost and not held:
                running.lost = True
                limits.signal_job(running, signal.SIGKILL)
            elif running.limit is None and cancelled:
                limits.stop(running, "cancelled", now, self.settings.kill_grace)

    def _recover_from_reaping(self) -> None:
        """A sweeper judged us dead: our claims are void; start over as a new owner."""
        log.warning(
            "owner %s was reaped by a sweeper; stopping %d job(s) and registering anew",
            self.owner.name,
            len(self.running),
        )
        for running in self.running.values():
            running.lost = True
            limits.signal_job(running, signal.SIGKILL)
        if self._replaced is None:  # a queue replaced under us is left, not served anew
            self._register()

    def _register(self) -> None:
        """Register as a new owner; on failure claim nothing and try again at the next heartbeat."""
        try:
            self.owner = liveness.this_owner(self.settings.lease, self.queue.filesystem_now())
            self.queue.register_owner(self.owner, self.functions)
            self._registered = True
            self._skips_recorded = {}  # a new owner folder: what it skips is written there anew
        except (OSError, JobsError) as exc:
            self._store_failed(exc)
            log.error("cannot register as an owner of %s: %s; claiming nothing until it works", self.queue.path, exc)
            self._registered = False

    def _keep_sweeper(self, now: float) -> None:
        if not self.stopping_now:
            self._sweeper.keep(now, self._manager_fds())

    def _owner_name(self) -> str:
        """This manager's owner name now (it changes when a sweeper reaped it and it registered anew)."""
        return self.owner.name

    @property
    def sweeper_pid(self) -> int | None:
        return self._sweeper.pid

    # -- status ---------------------------------------------------------------------

    def _nothing_left(self) -> bool:
        """For --burst: nothing claimed anywhere, nothing ready that this manager can run,
        nothing scheduled within the horizon. A queue it cannot look at counts as not empty."""
        try:
            return self._queue_is_done()
        except (OSError, JobsError) as exc:
            self._store_failed(exc)
            log.error("cannot tell whether %s has work left: %s", self.queue.path, exc)
            return False

    def _queue_is_done(self) -> bool:
        counts = self.queue.counts()
        if counts["claimed"] or counts["incoming"] or (counts["ready"] and self.queue.has_claimable()):
            return False  # (members' submissions are taken in first: they may be this manager's to run)
        if not counts["scheduled"]:
            return True
        self.left_scheduled = self.queue.scheduled_after(time.time() + self.settings.horizon)
        return self.left_scheduled == counts["scheduled"]

    def status_line(self) -> str:
        jobs = ", ".join(f"{r.claim.job_id} pid {r.pid}" for r in self.running.values()) or "none"
        return f"{len(self.running)}/{self.settings.concurrency} busy, draining={self.draining}, running: {jobs}"

    def _set_title(self) -> None:
        """Show how busy the manager is in `ps`; only when that changed, since it runs every turn."""
        state = " draining" if self.draining else ""
        title = f"{self._title_prefix} {len(self.running)}/{self.settings.concurrency} busy{state}"
        if title != self._title:
            setproctitle(title)
            self._title = title


def _job(claim: Claim) -> str:
    """How every log line names a job's attempt."""
    return f"job {claim.job_id} {claim.spec.function} attempt {claim.attempt}/{claim.policy.max_attempts}"


def _verdict(running: Running, status: forking.ExitStatus) -> str:
    if harvest.is_success(running, status):
        return "succeeded"
    return f"failed ({running.limit or status.describe()})"
