"""Where a job goes next: the one place that decides what a run's end means and whether
the job is buried in `dead/`.

A run's end, as its manager decoded it once (`RunEnd`), has one `verdict`: done,
released (a drain stopped it, with no result: its attempt is not counted) or failed.
Four moments move a job on, and each asks here first:

    before_run   a claim is about to start a run (counted before the fork)
    after_failure   a run failed: retry, or dead
    after_release   a run was stopped by a shutdown: back to ready/, not counted
    after_lost_run  a run's owner died or was fenced: the run counts, as it may have done work

The answer is a `Cause` to bury the job with, or None to let it go on. A cancel
wins at every moment: a cancelled job never runs again. Words: a *run* is one
`attempt-N` folder (N, its run number, only grows); an *attempt* is a run that
counts against `max_attempts` (a released run does not). `error.json` keeps the
format-1 keys: `reason`, `message`, `attempt`, `run`, and the run's own error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Reason(Enum):
    """Why a job is in `dead/`; the value is what `error.json` says."""

    INVALID = "invalid"  # its job.json or counter cannot be read as a job
    CANCELLED = "cancelled"  # an operator cancelled it
    EXHAUSTED = "attempts exhausted"  # every attempt its policy allows failed or was lost
    CANNOT_COMPLETE = "cannot be completed"  # the job said so (CannotComplete), or it cannot start here
    DUPLICATE = "duplicate key"  # a member's submission whose key a live job took first (`jobs.keys`)
    DEPENDENCY = "dependency dead"  # a job it depends on is dead (`jobs.depends`)


@dataclass(frozen=True)
class Cause:
    """Why a job was buried: its `error.json`."""

    reason: Reason
    message: str
    attempt: int | None = None  # the attempt that ended it, when one did
    run: int | None = None
    error: Mapping[str, Any] = field(default_factory=dict)  # the run's own error (type, traceback, ...)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"reason": self.reason.value, "message": self.message}
        if self.attempt is not None:
            document["attempt"] = self.attempt
        if self.run is not None:
            document["run"] = self.run
        return document | {key: value for key, value in self.error.items() if key not in document}


class Verdict(Enum):
    """What a run's end means for its job."""

    DONE = "done"  # it succeeded: to done/, with its result
    RELEASED = "released"  # a drain stopped it before it returned: back to ready/, its attempt not counted
    FAILED = "failed"  # a failed attempt: a retry, or dead (`after_failure`)


DRAIN = "drain"  # the stop of a run by its manager's drain (`RunEnd.stop`)
CANCELLED = "cancelled"  # by an operator's cancel


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, decoded once by its manager from the child's exit and its run folder."""

    exited_ok: bool  # its first process exited 0
    stop: str | None  # why its manager stopped it ("timeout", "memory", "output", "cancelled", "drain") or None
    has_result: bool  # its run folder holds a result (a job a drain stopped may have returned first)
    cannot_complete: bool  # it said it can never be completed (CannotComplete)
    error: Mapping[str, Any]  # why it failed, for error.json (empty when it succeeded)
    outcome: Mapping[str, Any]  # its outcome.json, but for "released" and "succeeded": the verdict's

    @property
    def verdict(self) -> Verdict:
        """Done only if it exited 0 and nobody stopped it, or a drain stopped it after it
        returned; a run stopped for a limit or a cancel failed, whatever its exit status."""
        if self.exited_ok and (self.stop is None or (self.stop == DRAIN and self.has_result)):
            return Verdict.DONE
        return Verdict.RELEASED if self.stop == DRAIN else Verdict.FAILED

    @property
    def permanent(self) -> bool:
        """A failure no retry can mend: the job said so, or an operator cancelled it."""
        return self.cannot_complete or self.stop == CANCELLED

    def record(self) -> dict[str, Any]:
        """Its `outcome.json`, with the verdict's fields."""
        verdict = self.verdict
        return {**self.outcome, "released": verdict is Verdict.RELEASED, "succeeded": verdict is Verdict.DONE}


def invalid(message: str) -> Cause:
    return Cause(Reason.INVALID, message)


def duplicate(key: str, holder: str) -> Cause:
    return Cause(Reason.DUPLICATE, f"key {key!r} is held by job {holder}, which is not finished")


def dependency_dead(parent: str) -> Cause:
    return Cause(Reason.DEPENDENCY, f"job {parent}, which it depends on, is dead (allow_failure would have run it)")


def dependency_lost(parent: str) -> Cause:
    return Cause(
        Reason.DEPENDENCY,
        f"job {parent}, which it depends on, is in no state folder and was never purged (refused, or lost): "
        "it will never end",
    )


def cancelled(detail: str = "") -> Cause:
    return Cause(Reason.CANCELLED, "cancelled by an operator" + (f"; {detail}" if detail else ""))


def before_run(cancel_requested: bool, used: int, limit: int) -> Cause | None:
    """A claim about to count attempt `used + 1`: None to run it."""
    if cancel_requested:
        return cancelled()
    if used >= limit:
        return Cause(
            Reason.EXHAUSTED, f"all {limit} attempts were used (the last one's owner died before recording it)", used
        )
    return None


def after_failure(
    cancel_requested: bool, attempt: int, limit: int, run: int, error: Mapping[str, Any], permanent: bool
) -> Cause | None:
    """Run `run` (attempt `attempt`) failed with `error`: None to retry it."""
    if cancel_requested:
        return cancelled()
    if not permanent and attempt < limit:
        return None
    reason = Reason.CANNOT_COMPLETE if permanent else Reason.EXHAUSTED
    message = str(error.get("message") or reason.value)
    return Cause(reason, message, attempt, run, error)


def after_release(cancel_requested: bool) -> Cause | None:
    """A run stopped by a shutdown: None to put the job back in `ready/`, attempt not counted."""
    return cancelled() if cancel_requested else None


def after_lost_run(cancel_requested: bool, used: int, limit: int | None, why: str) -> Cause | None:
    """A run whose owner was lost (`why`) counts: None to put the job back in `ready/`.
    `limit` is None for a job this forkvisor cannot read (a newer format): it goes back."""
    if cancel_requested:
        return cancelled(why)
    if limit is not None and used >= limit:
        return Cause(Reason.EXHAUSTED, f"attempt {used}/{limit} was lost: {why}", used)
    return None
