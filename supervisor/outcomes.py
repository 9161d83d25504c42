"""Recording what became of each claimed job, and moving it on.

A reaped child's end is decoded once (`harvest.run_end`) and handed to the store in
one call (`queue.serving.finish`), which writes its outcome and moves the job on (done, back to
ready, a retry, dead) as `jobs.fate` decides. When the store fails (a full disk), the
harvest is kept and tried again at every turn: the job stays this manager's
meanwhile, and its heartbeat keeps the claim. A retry due soon is promoted by
name when due, rather than waiting for a sweep (which would find it too).

A cluster's cancel (Slurm's `scancel`, a container runtime's stop) sends SIGTERM to
every process of the allocation, often the jobs' children before their manager. A
child that dies of SIGTERM, SIGINT or SIGHUP that its manager did not send is suspended
for `CANCEL_WINDOW` seconds: if the manager drains by then (its own SIGTERM came),
or was draining already, the run is released (its attempt not counted) like every
run a drain stops; otherwise it is a failed attempt, as any crash. The manager
starts no job while it holds one (the cancel is not over).
"""

from __future__ import annotations

import heapq
import logging
import os
import signal
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from jobs import Claim, ClaimLost, Finished, JobsError, Queue, Retry, RunCost, RunEnd, State, Tally, Verdict
from supervisor import forking, harvest
from supervisor.health import StoreHealth
from supervisor.running import Running, Stop

log = logging.getLogger(__name__)
SETTLE_PER_HARVEST = 100  # dependents settled at once; a sweep settles a larger fan-out
CANCEL_WINDOW = 2.0  # seconds between a child's death by an outside SIGTERM and the manager's own
OUTSIDE_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Suspended(NamedTuple):
    """A child killed by a signal its manager did not send, until a drain says it was a cancel's."""

    running: Running
    status: forking.ExitStatus
    until: float  # the end of its window, on the monotonic clock
    ended: float  # when it was reaped (epoch seconds): its outcome's end


class Outcomes:
    """Records outcomes; keeps the harvests the store refused and the retries to promote."""

    def __init__(self, queue: Queue, health: StoreHealth, tally: Tally, label: str = "") -> None:
        """`tally` counts each recorded run (`jobs.stats`); `label` names the queue in log
        lines where the manager serves several."""
        self.queue = queue
        self.health = health
        self.tally = tally
        self.label = label
        self._stranded: list[tuple[Running, forking.ExitStatus, RunEnd]] = []
        self._retries: list[Retry] = []  # a heap: the earliest due first
        self._suspended: list[Suspended] = []  # killed from outside: judged when their window ends

    def unrecorded(self) -> set[str]:
        """Jobs whose harvest waits to be recorded: still claimed by this manager."""
        stranded = {running.claim.job_id for running, *_ in self._stranded}
        return stranded | {entry.running.claim.job_id for entry in self._suspended}

    @property
    def awaiting_cancel(self) -> bool:
        """A child killed from outside waits to be judged: a cancel may be under way."""
        return bool(self._suspended)

    def harvest(self, running: Running, status: forking.ExitStatus, draining: bool) -> None:
        """Record a reaped child's run and move its job on (or keep it to try again)."""
        if running.stopped is None and status.signal in OUTSIDE_STOPS:
            if draining:
                running.stopped = Stop.DRAIN  # stopped from outside while we drain: released
            else:
                log.warning(
                    "job %s pid %d %s, not by this manager: holding it %gs in case a cancel follows",
                    running.claim.job_id,
                    status.pid,
                    status.describe(),
                    CANCEL_WINDOW,
                )
                self._suspended.append(Suspended(running, status, time.monotonic() + CANCEL_WINDOW, time.time()))
                return
        self._harvest(running, status, time.time())

    def release_suspended(self) -> None:
        """The manager drains: the children killed from outside were a cancel's; release them."""
        suspended, self._suspended = self._suspended, []
        for running, status, _, ended in suspended:
            running.stopped = Stop.DRAIN
            self._harvest(running, status, ended)

    def judge_suspended(self, now: float) -> None:
        """No drain followed within the window: those children failed their attempt."""
        if not self._suspended:
            return
        due = [entry for entry in self._suspended if entry.until <= now]
        self._suspended = [entry for entry in self._suspended if entry.until > now]
        for running, status, _, ended in due:
            self._harvest(running, status, ended)

    def _harvest(self, running: Running, status: forking.ExitStatus, ended: float) -> None:
        claim = running.claim
        if running.shut_out:  # let go at its gate: nothing of its run happened, and it has no run folder
            if not running.lost:  # (lost: a sweep has the job already, and its run number may be the next claim's)
                self.release(claim, "its count could not be put on disk")  # back, no attempt used, no run recorded
            return
        if running.lost:
            log.warning("job %s pid %d %s after its claim was lost", claim.job_id, status.pid, status.describe())
            self._note_lost(running, status)
            return
        run = harvest.open_run(claim)  # once, for its outcome and its record
        try:
            end = harvest.run_end(running, status, ended, run)
            if not self._record(running, status, end, report=True, run=run):
                self._stranded.append((running, status, end))
        finally:
            if run is not None:
                os.close(run)

    def _note_lost(self, running: Running, status: forking.ExitStatus) -> None:
        """Say in the job (wherever it is now) how the run whose claim was lost ended."""
        try:
            self.queue.serving.note_lost(running.claim, status.describe())
        except OSError as exc:  # the note is only informative
            log.error("cannot note the lost claim in job %s: %s", running.claim.job_id, exc)

    def retry_stranded(self) -> None:
        """Try again to record harvests that failed (disk full, say)."""
        if not self._stranded:
            return  # the usual case: no lists made at every turn
        stranded, self._stranded = self._stranded, []
        self._stranded = [entry for entry in stranded if not self._record(*entry, report=False)]

    def promote_retries(self) -> None:
        """Promote this manager's scheduled retries that are due, by name."""
        now = time.time()
        while self._retries and self._retries[0][0] <= now:
            due, job_id, priority = heapq.heappop(self._retries)
            try:
                self.queue.serving.promote(job_id, priority, due, now)
            except (OSError, JobsError) as exc:
                log.error("cannot promote the retry of job %s: %s; a sweep will", job_id, exc)

    def next_deadline(self, now: float) -> float:
        """When the next retry is due or a suspended child is judged (on the monotonic clock of `now`)."""
        soonest = min((entry.until for entry in self._suspended), default=float("inf"))
        if not self._retries:
            return soonest
        return min(soonest, now + max(0.0, self._retries[0][0] - time.time()))

    def unstarted(self, claim: Claim, exc: Exception) -> None:
        """A job that cannot start here at all (unknown function, bad command, no such submitter): dead."""
        error = {"type": type(exc).__name__, "message": str(exc)}
        try:
            self.queue.serving.record_outcome(claim, {"run": claim.run, "started": False, "error": error})
            self.queue.serving.fail(claim, error, permanent=True)
        except (OSError, JobsError) as failure:
            log.error("cannot record why job %s cannot start: %s", claim.job_id, failure)
        log.warning(
            "job %s cannot run here: %s; dead",
            claim.job_id,
            exc,
            extra={"fields": job_fields(claim, self.queue, "dead")},
        )

    def fork_failed(self, claim: Claim, exc: OSError) -> None:
        """The host could not fork: the job goes back, its attempt not counted."""
        error = {"type": "ForkFailed", "message": f"cannot fork: {exc}"}
        try:
            self.queue.serving.record_outcome(
                claim, {"run": claim.run, "started": False, "released": True, "error": error}
            )
        except (OSError, JobsError):
            pass  # the release below still gives the attempt back
        self.release(claim, f"fork failed: {exc}")

    def release(self, claim: Claim, reason: str) -> None:
        try:
            self.queue.serving.release(claim, reason=reason)
        except (OSError, JobsError) as exc:
            log.error("cannot put job %s back: %s; the next heartbeat returns it", claim.job_id, exc)

    def _record(
        self, running: Running, status: forking.ExitStatus, end: RunEnd, report: bool, run: int | None = None
    ) -> bool:
        """Finish the run in the store (its outcome, its job's next place; `run`: its folder,
        if opened) and say so; False if the store failed."""
        try:
            finished = self.queue.serving.finish(running.claim, end, run=run)
            self.health.worked()
        except ClaimLost as exc:
            log.warning("job %s: %s", running.claim.job_id, exc)
            self._note_lost(running, status)
            return True
        except (OSError, JobsError) as exc:
            self.health.failed(exc)
            if report:
                log.error(
                    "cannot record the outcome of %s (pid %d, %s): %s; will retry",
                    describe(running.claim, self.label),
                    status.pid,
                    status.describe(),
                    exc,
                )
            return False
        if finished.retry is not None:
            heapq.heappush(self._retries, finished.retry)
        ended = _ended(finished)
        outcome = end.outcome
        self.tally.run_ended(running.claim.spec.function, ended, outcome["wall_time"], RunCost.of(outcome["cost"]))
        if log.isEnabledFor(logging.INFO):  # per job: build the words only if they are wanted
            self._say(running, status, end, finished, ended)
        if finished.state.terminal:
            self._settle_dependents(running.claim.job_id)
        return True

    def _settle_dependents(self, job_id: str) -> None:
        """Move on the jobs waiting for this one (a second step: the sweep repairs a crash
        between the two, and finishes a fan-out larger than one turn's share)."""
        try:
            self.queue.serving.settle_dependents(job_id, budget=SETTLE_PER_HARVEST)
        except (OSError, JobsError) as exc:
            log.error("cannot settle the jobs waiting for %s: %s; a sweep will", job_id, exc)

    def _say(self, running: Running, status: forking.ExitStatus, end: RunEnd, finished: Finished, ended: str) -> None:
        """One line per harvested run, in the user's words, with its fields for JSON logs."""
        claim = running.claim
        event = "retrying" if ended == "retried" else ended  # the logs' word for a run that failed, not its job
        words = _what_happened(running, status, end.outcome, finished.retry, ended)
        fields = job_fields(claim, self.queue, event)
        fields.update(duration=end.outcome["wall_time"], exit=status.describe(), state=finished.state.value)
        log.info("%s %s", describe(claim, self.label), words, extra={"fields": fields})


def _ended(finished: Finished) -> str:
    """How the run ended, as `jobs.OUTCOMES` names it (the metrics' label; the log's event):
    a job in dead/ is dead even if a drain released its run (an operator cancelled it)."""
    if finished.state is State.DONE:
        return "succeeded"
    if finished.state is State.DEAD:
        return "dead"
    return "released" if finished.verdict is Verdict.RELEASED else "retried"


def describe(claim: Claim, label: str = "") -> str:
    """How every log line names a job's attempt (and its queue, `label`, if the manager serves several)."""
    attempt = f"job {claim.job_id} {claim.spec.function} attempt {claim.attempt}/{claim.policy.max_attempts}"
    return f"{attempt} from {label}" if label else attempt


def job_fields(claim: Claim, queue: Queue, event: str) -> dict[str, Any]:
    """The fields every log line about a job's run carries (JSON logs show them)."""
    return {
        "event": event,
        "queue": str(queue.path),
        "job_id": claim.job_id,
        "function": claim.spec.function,
        "attempt": claim.attempt,
        "max_attempts": claim.policy.max_attempts,
        "owner": claim.owner,
    }


def _what_happened(
    running: Running,
    status: forking.ExitStatus,
    outcome: Mapping[str, Any],
    retry: Retry | None,
    ended: str,
) -> str:
    """What happened to the run that `ended` so (see `_ended`), in the user's words."""
    took = f"{outcome['wall_time']:.3f}s"
    if ended == "succeeded":
        return f"succeeded in {took}"
    if ended == "released":
        return f"released after {took} ({status.describe()} by a drain; attempt not counted)"
    error = outcome.get("error") or {}
    if error.get("type") == "CannotComplete" or status.code == forking.EXIT_CANNOT_COMPLETE:
        why = error.get("message") or status.describe()
        return f"cannot be completed, after {took} ({why}); dead, not retried"
    if running.stopped is Stop.CANCELLED or (running.released and ended == "dead"):
        return f"cancelled by an operator after {took}; dead"
    why = running.stopped.value if running.stopped else status.describe()
    if error.get("type") and running.stopped is None and error["type"] not in ("CommandFailed", "Crashed"):
        why += f": {error['type']}"
    if ended == "dead":
        return f"failed after {took} ({why}); dead, its {running.claim.attempt} attempt(s) used up"
    when = "now" if retry is None else f"in {max(0.0, retry.due - time.time()):.1f}s"
    return f"failed after {took} ({why}); retrying {when}"
